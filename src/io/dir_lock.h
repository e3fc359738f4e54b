// An exclusive lock on a directory that one glm_hpc run writes, held for the run's whole life.
//
// The lock is a file (base/temp_names.h's kDirectoryLockFile) naming its holder: host, pid, start
// time, the boot id, pid namespace and kernel start time of the process (so that a reused pid is
// not mistaken for the holder), and a random token. It appears atomically and whole: written to a
// temporary, synced, then link(2)ed to its name, which fails when the name exists, also on NFS
// and the other shared filesystems where flock may not work (O_CREAT|O_EXCL where links are not
// supported). A lock whose holder is gone is taken over:
//   - on the same machine (same host name, boot id and pid namespace): when the pid is dead (or a
//     zombie), or alive but another process (its start time differs); a holder that looks alive is
//     looked at again for two seconds before the refusal, since a launcher that has just exited
//     may leave its ranks dying for a moment;
//   - from another machine, whose processes cannot be seen: when the holder's heartbeat (the lock
//     file's mtime, refreshed every kHeartbeatSeconds) is older than kStaleSeconds, measured on
//     the filesystem's own clock. Until then the run is refused with a message that says how to
//     remove the lock by hand when its holder is known to be dead.
// Taking over is done by one run at a time (holding a record lock on <lock>.takeover, which the
// kernel releases if the run dies): it reads the lock again and removes it only while it is still
// the very file it judged; then every run tries link(2) again, and of runs taking over at once
// only one gets the lock.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "base/status.h"

namespace glm {

class DirectoryLock {
 public:
  static constexpr int kHeartbeatSeconds = 30;
  static constexpr int kStaleSeconds = 300;

  // Takes lock_file (in a directory that exists) for `command`. A live holder is a user error
  // naming it: "<option> '<shown_dir>' is in use by another glm_hpc run: ...".
  static Result<std::shared_ptr<DirectoryLock>> acquire(const std::filesystem::path& lock_file,
                                                        const std::string& option, const std::string& shown_dir,
                                                        const std::string& command);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

  // Stops the heartbeat and removes the lock file while it is still this run's. Idempotent.
  void release();
  const std::filesystem::path& path() const { return path_; }
  // Set when a stale lock was taken over: whose, and why it was judged stale.
  const std::string& takeover_note() const { return note_; }

 private:
  DirectoryLock(std::filesystem::path path, std::string content, std::string note);
  void beat();

  std::filesystem::path path_;
  std::string content_;  // the lock file's bytes: the file is ours while it holds them
  std::string note_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::atomic<bool> released_{false};
  std::thread heartbeat_;
};

}  // namespace glm
