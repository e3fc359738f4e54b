// The system's reason for a failed call, for messages that name a file and say why.
#pragma once

#include <string>

namespace glm {

// strerror(err), thread-safe; "error <err>" when the system has no text for it.
std::string errno_text(int err);

}  // namespace glm
