// Byte-level tokenizer: exact round trip for any byte string, specials rendered as their text.
#include "data/tokenizer.h"

namespace glm {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) ids.push_back(static_cast<int32_t>(c));
  return ids;
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id >= 0 && id < 256)
      out.push_back(static_cast<char>(id));
    else if (id >= 256 && id < vocab_size())
      out += special_token_text(static_cast<SpecialToken>(id - 256));
    else
      out += "<|unk|>";
  }
  return out;
}

}  // namespace glm
