// Files that are whole or absent: written to a temporary beside the target, flushed and synced,
// then renamed over it, so that a kill or a full disk never leaves a torn file under the real name.
// Every failure names the file and the system's reason (strerror), e.g. "No space left on device".
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace glm {

// fsync(2) of a file or directory (a directory's sync makes the renames inside it durable).
Status fsync_path(const std::filesystem::path& path);

// `bytes` to path through a temporary of its own (base/temp_names.h), synced before the rename;
// the temporary is removed when anything fails.
Status write_file_durably(const std::filesystem::path& path, std::string_view bytes);

// "<what> '<path>': <strerror(err)>" as an io error.
Status file_error(const char* file, int line, std::string_view what, const std::filesystem::path& path, int err);
#define GLM_FILE_ERROR(what, path, err) ::glm::file_error(__FILE__, __LINE__, (what), (path), (err))

// What remove_stale_temporaries did, one entry per name ("checkpoint-4 (directory)").
struct TemporaryCleanup {
  std::vector<std::string> removed;
  std::vector<std::string> restored;  // asides renamed back over a target that was missing
  bool empty() const { return removed.empty() && restored.empty(); }
  std::string describe(const std::filesystem::path& dir) const;
};

// Removes from dir the temporaries (base/temp_names.h) whose target `ours` accepts: what killed or
// failed writers left. Only for a directory this process holds (io/dir_lock.h): nobody else is
// writing there. An aside whose target is missing (a kill between the two renames of a replacement)
// is renamed back instead, so the last published target comes back.
Result<TemporaryCleanup> remove_stale_temporaries(const std::filesystem::path& dir,
                                                  const std::function<bool(std::string_view target)>& ours);

}  // namespace glm
