// Files that are whole or absent: written to a temporary beside the target, flushed and synced,
// then renamed over it, so that a kill or a full disk never leaves a torn file under the real name.
#pragma once

#include <filesystem>
#include <string_view>

#include "base/status.h"

namespace glm {

// fsync(2) of a file or directory (a directory's sync makes the renames inside it durable).
Status fsync_path(const std::filesystem::path& path);

// `bytes` to path through path + ".tmp", synced before the rename.
Status write_file_durably(const std::filesystem::path& path, std::string_view bytes);

}  // namespace glm
