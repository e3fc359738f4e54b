// The directory each command writes, held by one run at a time (io/dir_lock.h) and cleared, once
// held, of the temporaries that killed or failed runs left there (io/durable_file.h):
//   train    --output_dir: args.json, logging.jsonl, checkpoint-N, latest, run_status.json
//   prepare  --output_dir, when given: the token shards and prepared.json
//   export   --save_dir: its lock file lies beside it (.<name>.glm_hpc.lock in its parent), since
//            the directory itself appears by one rename at the end
//   eval, plan: nothing.
// Under mpirun rank 0 alone claims; the ranks agree on its outcome before going on.
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "cli/options.h"
#include "io/dir_lock.h"

namespace glm {

class RunDirectory {
 public:
  ~RunDirectory();
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  // What claiming did beside taking the lock (a take-over, a clean-up), one line each; may be empty.
  const std::string& report() const { return report_; }
  // train with --overwrite_output_dir true: removes the earlier run's log and checkpoints found at
  // the claim (called once the run's inputs are read and checked, before its first record); the
  // line that says so, or "" when there was nothing to remove.
  Result<std::string> replace_earlier_run();
  // train: output_dir/run_status.json (see write_run_status); other commands: nothing.
  Status record_status(const nlohmann::json& fields);
  // Releases the lock; a directory the claim created and nothing was written to is removed.
  void release();

 private:
  friend Result<std::unique_ptr<RunDirectory>> claim_run_directory(const CliOptions& options);
  RunDirectory() = default;

  std::shared_ptr<DirectoryLock> lock_;
  std::filesystem::path dir_;
  bool created_ = false;
  bool records_status_ = false;
  std::string report_;
  std::vector<std::filesystem::path> doomed_;  // the earlier run's files --overwrite_output_dir replaces
  std::string doomed_description_;
};

// Rank 0's claim for options.command; null when the command writes no directory. A live holder is
// a user error (exit 2) naming its host, pid and start time.
Result<std::unique_ptr<RunDirectory>> claim_run_directory(const CliOptions& options);

// output_dir/run_status.json, written durably, for job scripts: the launcher's exit code is not
// always glm_hpc's (Open MPI's mpirun exits 1 after a SIGTERM of its own, whatever the ranks
// returned). {"status": "running" | "completed" | "preempted" | "failed", "exit_code": the code
// every rank exits with (null while running), ...}. A "running" status after the launcher has
// exited means the run died without ending itself (SIGKILL, a crash, another rank's fatal error).
Status write_run_status(const std::filesystem::path& output_dir, const nlohmann::json& fields);

}  // namespace glm
