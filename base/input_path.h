// The one check every reader of a user's path makes before opening it: a FIFO blocks its reader
// forever and a device such as /dev/zero never ends, so anything but the regular file (or the
// directory) the option expects is refused by name, without opening it.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace glm {

enum class InputKind { file, directory, file_or_directory };

// Ok when `path` (links followed) is of `kind`, or does not exist (the reader's open then says so);
// else a user error such as "'/dev/zero' is a character device, not a regular file". Readers add
// the option or the file that named the path with Status::with_context.
Status check_input_path(const std::string& path, InputKind kind = InputKind::file);

// check_input_path(path, file), and a regular file of at most max_bytes (a whole-file reader's
// bound: the message says it and why, from `bound_reason`).
Status check_input_file_size(const std::string& path, int64_t max_bytes, const std::string& bound_reason);

}  // namespace glm
