// Which directory each command holds, what it may remove there at start, and run_status.json.
#include "cli/run_directory.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <vector>

#include "base/temp_names.h"
#include "cli/prepare.h"
#include "data/token_shards.h"
#include "io/durable_file.h"
#include "io/run_plots.h"
#include "train/checkpoint_dir.h"

namespace glm {
namespace {

namespace fs = std::filesystem;

constexpr const char* kRunStatusFile = "run_status.json";

// The names train writes in its output directory (temporaries of these are its own).
bool written_by_train(std::string_view name) {
  constexpr std::string_view kAside = ".old";
  if (name.ends_with(kAside)) name.remove_suffix(kAside.size());
  return name == "args.json" || name == "latest" || name == "logging.jsonl" || name == "runs" || name == kRunStatusFile ||
         checkpoint_step_of(name) >= 0;
}

// What an earlier training run left in its output directory that a new run would overwrite or
// confuse with its own: its step log and its checkpoints (a run stopped before its first step left
// neither, and nothing of it is lost).
struct PreviousRun {
  int64_t log_records = 0;
  int64_t logged_steps = 0;  // the records with a training loss
  std::vector<fs::path> checkpoints;  // checkpoint-N directories, by step
  std::vector<fs::path> files;        // logging.jsonl, latest, runs/, the charts: removed with the checkpoints
  bool empty() const { return log_records == 0 && checkpoints.empty(); }
  std::string describe() const {
    std::string out;
    if (log_records > 0)
      out = concat("logging.jsonl with ", logged_steps, " logged step", logged_steps == 1 ? "" : "s");
    if (!checkpoints.empty()) {
      if (!out.empty()) out += " and ";
      out += concat(checkpoints.size(), " checkpoint", checkpoints.size() == 1 ? "" : "s", " (",
                    checkpoints.front().filename().string());
      if (checkpoints.size() > 1) out += " .. " + checkpoints.back().filename().string();
      out += ")";
    }
    return out;
  }
};

Result<PreviousRun> find_previous_run(const fs::path& dir) {
  PreviousRun previous;
  std::error_code ec;
  std::vector<std::pair<int64_t, fs::path>> steps;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (const int64_t step = checkpoint_step_of(name); step >= 0) steps.emplace_back(step, it->path());
    if (name == "latest") previous.files.push_back(it->path());
  }
  if (ec) return GLM_USER_ERROR("cannot list --output_dir '", dir.string(), "': ", ec.message());
  std::sort(steps.begin(), steps.end());
  for (auto& [step, path] : steps) previous.checkpoints.push_back(std::move(path));
  std::ifstream log(dir / "logging.jsonl");
  for (std::string line; std::getline(log, line);)
    if (!line.empty()) {
      ++previous.log_records;
      if (line.find("\"loss\"") != std::string::npos) ++previous.logged_steps;
    }
  if (previous.log_records > 0) previous.files.push_back(dir / "logging.jsonl");
  // TensorBoard's event files and the charts go with the log they show (a new run writes its own);
  // anything else in images/ is the user's.
  if (fs::is_directory(dir / "runs", ec)) previous.files.push_back(dir / "runs");
  for (const std::string& chart : chart_file_names())
    if (fs::exists(dir / "images" / chart, ec)) previous.files.push_back(dir / "images" / chart);
  return previous;
}

// True when the run continues the one in `dir`: a full resume (not --resume_only_model, which starts
// over at step 0) from latest or from a checkpoint inside dir.
bool continues_run_in(const CliOptions& options, const fs::path& dir) {
  const std::string& spec = options.train.resume_from_checkpoint;
  if (spec.empty() || options.train.resume_only_model) return false;
  if (spec == "latest") return true;
  std::error_code ec;
  const fs::path parent = fs::weakly_canonical(fs::path(spec).lexically_normal(), ec).parent_path();
  return !ec && fs::equivalent(parent, dir, ec);
}

// A training run into a directory that holds an earlier run's results continues it (a full
// resume from one of its checkpoints), replaces it (--overwrite_output_dir true: its log and
// checkpoints are removed once the run's inputs have been read and checked: replace_earlier_run),
// or is refused (transformers' rule; nothing is overwritten unasked).
Status settle_previous_run(const CliOptions& options, const fs::path& dir, std::vector<fs::path>& doomed,
                           std::string& doomed_description) {
  GLM_ASSIGN_OR_RETURN(const PreviousRun previous, find_previous_run(dir));
  if (previous.empty() || continues_run_in(options, dir)) return Status::ok();
  if (!options.overwrite_output_dir)
    return GLM_USER_ERROR("--output_dir '", options.train.output_dir, "' holds an earlier run's ", previous.describe(),
                          ": continue it with --resume_from_checkpoint latest, replace it with --overwrite_output_dir "
                          "true, or choose another --output_dir");
  doomed = previous.checkpoints;
  doomed.insert(doomed.end(), previous.files.begin(), previous.files.end());
  doomed_description = previous.describe();
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<RunDirectory>> claim_run_directory(const CliOptions& options) {
  const std::string& command = options.command;
  fs::path dir, lock_file;
  std::string option, shown;
  std::function<bool(std::string_view)> ours;
  if ((command == "train" || (command == "prepare" && prepare_writes_shards(options))) &&
      !options.train.output_dir.empty()) {
    option = "--output_dir";
    shown = options.train.output_dir;
    dir = fs::path(options.train.output_dir);
    lock_file = dir / kDirectoryLockFile;
    if (command == "train")
      ours = written_by_train;
    else
      ours = is_token_shards_file;
  } else if (command == "export" && !options.save_dir.empty()) {
    option = "--save_dir";
    shown = options.save_dir;
    fs::path save = fs::path(options.save_dir).lexically_normal();
    if (save.filename().empty()) save = save.parent_path();  // a trailing slash
    dir = save.has_parent_path() ? save.parent_path() : fs::path(".");
    const std::string name = save.filename().string();
    lock_file = dir / concat(".", name, kDirectoryLockFile);
    ours = [name](std::string_view target) { return target == name || target == name + ".old"; };
  } else {
    return std::unique_ptr<RunDirectory>();
  }
  std::unique_ptr<RunDirectory> claimed(new RunDirectory());
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    return GLM_USER_ERROR(option, " '", shown, "' exists and is not a directory");
  claimed->created_ = fs::create_directories(dir, ec);
  if (ec) return GLM_USER_ERROR("cannot create ", option, " '", dir.string(), "': ", ec.message());
  claimed->dir_ = dir;
  claimed->records_status_ = command == "train";
  auto lock = DirectoryLock::acquire(lock_file, option, shown, command);
  if (!lock.is_ok()) {
    claimed->release();
    return lock.status();
  }
  claimed->lock_ = lock.take();
  if (!claimed->lock_->takeover_note().empty())
    claimed->report_ += "glm_hpc: " + claimed->lock_->takeover_note() + "\n";
  GLM_ASSIGN_OR_RETURN(const TemporaryCleanup cleaned, remove_stale_temporaries(dir, ours));
  if (!cleaned.empty()) claimed->report_ += "glm_hpc: " + cleaned.describe(dir) + "\n";
  if (command == "train") GLM_RETURN_IF_ERROR(settle_previous_run(options, dir, claimed->doomed_, claimed->doomed_description_));
  if (claimed->records_status_) {
    char host[256] = {0};
    ::gethostname(host, sizeof(host) - 1);
    GLM_RETURN_IF_ERROR(
        claimed->record_status({{"status", "running"}, {"exit_code", nullptr}, {"host", host}, {"pid", ::getpid()}}));
  }
  return claimed;
}

Result<std::string> RunDirectory::replace_earlier_run() {
  if (doomed_.empty()) return std::string();
  std::error_code ec;
  for (const fs::path& path : doomed_) {
    fs::remove_all(path, ec);
    if (ec) return GLM_USER_ERROR("--overwrite_output_dir: cannot remove '", path.string(), "': ", ec.message());
  }
  doomed_.clear();
  return concat("glm_hpc: --overwrite_output_dir: removed the earlier run's ", doomed_description_, " from ",
                dir_.string(), "\n");
}

Status RunDirectory::record_status(const nlohmann::json& fields) {
  if (!records_status_) return Status::ok();
  return write_run_status(dir_, fields);
}

void RunDirectory::release() {
  if (lock_) lock_->release();
  lock_.reset();
  std::error_code ec;
  if (created_ && fs::is_empty(dir_, ec)) fs::remove(dir_, ec);
  created_ = false;
}

RunDirectory::~RunDirectory() { release(); }

Status write_run_status(const fs::path& output_dir, const nlohmann::json& fields) {
  GLM_RETURN_IF_ERROR(write_file_durably(output_dir / kRunStatusFile, fields.dump(2) + "\n"));
  return fsync_path(output_dir);
}

}  // namespace glm
