// Tokenizer interface (the GLM-4 tiktoken tokenizer arrives with the data issue) and the byte-level
// tokenizer used by the tiny configuration until then.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace glm {

// The 14 GLM-4 special tokens in id order (GLM4_SPEC.md 5.3).
enum class SpecialToken : int {
  endoftext,
  mask,
  gmask,
  smask,
  sop,
  eop,
  system,
  user,
  assistant,
  observation,
  begin_of_image,
  end_of_image,
  begin_of_video,
  end_of_video,
  count
};
const char* special_token_text(SpecialToken t);

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Ordinary text: special-token strings inside it are encoded as text, never as specials.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual int32_t special_id(SpecialToken t) const = 0;
  virtual int64_t vocab_size() const = 0;  // ids are in [0, vocab_size)
};

// Bytes are ids 0..255; the special tokens follow at 256.. (vocab 270).
class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t special_id(SpecialToken t) const override { return 256 + static_cast<int32_t>(t); }
  int64_t vocab_size() const override { return 256 + static_cast<int64_t>(SpecialToken::count); }
};

}  // namespace glm
