// Line-level scan of an INI config file: which key sits on which line, so that errors from
// Boost.Program_options (which knows no line numbers) can name file:line.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace glm {

struct IniEntry {
  std::string key;  // "section.key" inside [section], else "key"
  std::string value;
  int line = 0;
};

// Same syntax as boost::program_options::parse_config_file: `key = value`, `[section]`,
// `#` starts a comment. A line of another shape is a user error naming file:line.
Result<std::vector<IniEntry>> scan_ini_file(const std::string& path);

}  // namespace glm
