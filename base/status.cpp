// Status construction and context chaining.
#include "base/status.h"

#include <cstring>

#include "base/text.h"

namespace glm {

Status Status::error(ErrorKind kind, std::string message, const char* file, int line) {
  Status s;
  s.kind_ = kind == ErrorKind::ok ? ErrorKind::internal : kind;
  // Messages quote user bytes (lines, paths, parser excerpts); they reach terminals, logs and JSON.
  s.message_ = is_valid_utf8(message) ? std::move(message) : printable_text(message);
  if (file != nullptr) {
    const char* base = std::strrchr(file, '/');
    s.location_ = concat(base != nullptr ? base + 1 : file, ":", line);
  }
  return s;
}

Status Status::with_context(const std::string& context) const {
  if (is_ok()) return *this;
  Status s = *this;
  s.message_ = printable_text(context) + ": " + message_;
  return s;
}

}  // namespace glm
