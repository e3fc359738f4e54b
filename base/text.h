// Text that reaches a message, a log or a JSON file: user bytes (a dataset line, a path, a parser's
// excerpt of either) made valid UTF-8, so printing or serialising them never fails.
#pragma once

#include <string>
#include <string_view>

namespace glm {

// `bytes` with every byte that is not part of a well-formed UTF-8 sequence (a stray continuation
// byte, a truncated or overlong sequence, a surrogate, a code point above U+10FFFF) written as
// \xNN; well-formed text, control characters included, is kept as it is. The result is valid UTF-8.
std::string printable_text(std::string_view bytes);

// True when `bytes` is well-formed UTF-8.
bool is_valid_utf8(std::string_view bytes);

// The first line of a file, its newline left out; empty where the file is missing or unreadable
// (how sysfs, /proc and a tool's log are read).
std::string first_line_of(const std::string& path);

}  // namespace glm
