// FNV-1a over bytes, and over files read in large blocks.
#include "data/content_hash.h"

#include <cstdio>
#include <fstream>
#include <vector>

#include "base/input_path.h"
#include "base/stop_signal.h"

namespace glm {

ContentHash& ContentHash::update(std::string_view bytes) {
  uint64_t h = hash_;
  for (const char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  hash_ = h;
  return *this;
}

ContentHash& ContentHash::field(std::string_view bytes) {
  const uint64_t n = bytes.size();
  char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  update(std::string_view(length, 8));
  return update(bytes);
}

std::string ContentHash::hex() const {
  char text[32];
  std::snprintf(text, sizeof text, "fnv1a64:%016llx", static_cast<unsigned long long>(hash_));
  return text;
}

Result<std::string> hash_file(const std::string& path) {
  GLM_RETURN_IF_ERROR(check_input_path(path));
  std::ifstream in(path, std::ios::binary);
  if (!in) return GLM_USER_ERROR("cannot open '", path, "'");
  ContentHash h;
  std::vector<char> block(1 << 20);
  while (in) {
    if (stop_signal() != 0) return stopped_status(concat("while hashing '", path, "'"));
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    h.update(std::string_view(block.data(), static_cast<size_t>(in.gcount())));
  }
  if (in.bad()) return GLM_USER_ERROR("error reading '", path, "'");
  return h.hex();
}

}  // namespace glm
