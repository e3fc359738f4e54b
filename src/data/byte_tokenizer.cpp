// Byte-level tokenizer: exact round trip for any byte string, specials rendered as their text.
#include "data/content_hash.h"
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

std::string ByteTokenizer::content_hash() const {
  return ContentHash().field("byte-level tokenizer").field(std::to_string(vocab_size())).hex();
}

std::string ByteTokenizer::describe() const {
  return concat("bytes (built in): vocab ", vocab_size(), " (256 bytes + 14 special tokens), content hash ",
                content_hash());
}

}  // namespace glm
