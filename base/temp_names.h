// Names of the temporary files and directories written beside a target and renamed over it: unique
// per writer (host, pid and a random number), so that two processes, on one host or on several
// sharing a filesystem, never write the same temporary; and recognisable, so that the next run
// holding a directory removes what a killed or failed one left there.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace glm {

// The lock file that marks a directory as held by one run (io/dir_lock.h).
inline constexpr std::string_view kDirectoryLockFile = ".glm_hpc.lock";

// <target's directory>/.<target's name>.tmp-<host>-<pid>-<16 hex digits>
std::filesystem::path temp_path_for(const std::filesystem::path& target);

// Where an existing target is moved while its replacement is renamed in: a temporary of
// "<target's name>.old", so that a run killed between the two renames leaves it recognisable.
std::filesystem::path aside_path_for(const std::filesystem::path& target);

// The target's name when `name` (a file name, no directory) is a temporary that temp_path_for
// makes, or a fixed "<target>.tmp" / ".<target>.tmp", which directories written by older builds
// may hold; nothing otherwise. An aside's target ends with ".old".
std::optional<std::string> temp_target_of(std::string_view name);

// This host's name as temporary names carry it: letters, digits and '_', at most 64 characters.
std::string temp_name_host();

}  // namespace glm
