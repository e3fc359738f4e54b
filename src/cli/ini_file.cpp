// INI scanner mirroring Boost.Program_options' config-file grammar.
#include "cli/ini_file.h"

#include <fstream>

#include "base/input_path.h"

namespace glm {
namespace {
std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}
}  // namespace

Result<std::vector<IniEntry>> scan_ini_file(const std::string& path) {
  GLM_RETURN_IF_ERROR(check_input_path(path).with_context("--config"));
  std::ifstream in(path);
  if (!in) return GLM_USER_ERROR("cannot open config file '", path, "'");
  std::vector<IniEntry> entries;
  std::string raw, section;
  int line_no = 0;
  while (std::getline(in, raw)) {
    ++line_no;
    const auto hash = raw.find('#');
    std::string line = trim(hash == std::string::npos ? raw : raw.substr(0, hash));
    if (line.empty()) continue;
    if (line.front() == '[') {
      if (line.back() != ']') return GLM_USER_ERROR(path, ":", line_no, ": malformed section header '", line, "'");
      section = trim(line.substr(1, line.size() - 2));
      if (!section.empty()) section += ".";
      continue;
    }
    const auto eq = line.find('=');
    if (eq == std::string::npos || trim(line.substr(0, eq)).empty())
      return GLM_USER_ERROR(path, ":", line_no, ": expected 'key = value', got '", line, "'");
    entries.push_back({section + trim(line.substr(0, eq)), trim(line.substr(eq + 1)), line_no});
  }
  return entries;
}

}  // namespace glm
