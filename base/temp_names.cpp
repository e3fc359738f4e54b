// Unique, recognisable temporary names (see temp_names.h).
#include "base/temp_names.h"

#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <random>

#include "base/status.h"

namespace glm {
namespace {

constexpr std::string_view kMarker = ".tmp-";
constexpr size_t kRandomDigits = 16;

bool all_of(std::string_view text, int (*accept)(int)) {
  if (text.empty()) return false;
  for (const char c : text)
    if (accept(static_cast<unsigned char>(c)) == 0) return false;
  return true;
}

int is_host_char(int c) { return std::isalnum(c) != 0 || c == '_' ? 1 : 0; }

}  // namespace

std::string temp_name_host() {
  char raw[256] = {0};
  if (::gethostname(raw, sizeof(raw) - 1) != 0 || raw[0] == '\0') return "host";
  std::string host;
  for (const char* p = raw; *p != '\0' && host.size() < 64; ++p)
    host += std::isalnum(static_cast<unsigned char>(*p)) != 0 ? *p : '_';
  return host;
}

std::filesystem::path temp_path_for(const std::filesystem::path& target) {
  thread_local std::mt19937_64 random{std::random_device{}()};
  char digits[kRandomDigits + 1];
  std::snprintf(digits, sizeof(digits), "%016llx", static_cast<unsigned long long>(random()));
  const std::string name =
      concat(".", target.filename().string(), kMarker, temp_name_host(), "-", ::getpid(), "-", digits);
  return target.parent_path() / name;
}

std::filesystem::path aside_path_for(const std::filesystem::path& target) {
  return temp_path_for(target.parent_path() / (target.filename().string() + ".old"));
}

std::optional<std::string> temp_target_of(std::string_view name) {
  // ".<target>.tmp-<host>-<pid>-<hex>", read from the end: hex, pid and host hold no '-'.
  if (name.size() > 1 && name.front() == '.') {
    const size_t last = name.rfind('-');
    const size_t middle =
        last == std::string_view::npos || last == 0 ? std::string_view::npos : name.rfind('-', last - 1);
    const size_t first =
        middle == std::string_view::npos || middle == 0 ? std::string_view::npos : name.rfind('-', middle - 1);
    if (first != std::string_view::npos && first + 1 >= kMarker.size() &&
        name.substr(first + 1 - kMarker.size(), kMarker.size()) == kMarker) {
      const std::string_view random = name.substr(last + 1), pid = name.substr(middle + 1, last - middle - 1),
                             host = name.substr(first + 1, middle - first - 1);
      const size_t target_end = first + 1 - kMarker.size();
      if (random.size() == kRandomDigits && all_of(random, isxdigit) && all_of(pid, isdigit) &&
          all_of(host, is_host_char) && target_end > 1)
        return std::string(name.substr(1, target_end - 1));
    }
  }
  // Fixed names, which directories written by older builds may hold: "<target>.tmp", ".<target>.tmp".
  constexpr std::string_view kOld = ".tmp";
  if (name.size() > kOld.size() && name.substr(name.size() - kOld.size()) == kOld) {
    std::string_view target = name.substr(0, name.size() - kOld.size());
    if (target.front() == '.') target.remove_prefix(1);
    if (!target.empty()) return std::string(target);
  }
  return std::nullopt;
}

}  // namespace glm
