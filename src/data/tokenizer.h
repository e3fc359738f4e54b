// Tokenizer interface, the built-in byte-level tokenizer (--tokenizer bytes), and the loader of a
// GLM-4 tokenizer.model (tiktoken_tokenizer.h; the tiny configuration's is data/sample/tokenizer.model).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

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
// The special token spelled exactly `text` ("<|user|>"), if any.
std::optional<SpecialToken> special_token_from_text(std::string_view text);

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Ordinary text: special-token strings inside it are encoded as text, never as specials.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual int32_t special_id(SpecialToken t) const = 0;
  virtual int64_t vocab_size() const = 0;  // ids are in [0, vocab_size)
  // Where it came from: the rank file's path, or "bytes" for the built-in byte tokenizer.
  virtual std::string source() const = 0;
  // Equal hashes, equal ids for every text: token shards and dataset caches record it.
  virtual std::string content_hash() const = 0;
  // "SOURCE: vocab N (R ranks + 14 special tokens), content hash H", as prepare and train print it.
  virtual std::string describe() const = 0;
  // A special token by its text: the only way text becomes a special id, since encode never does.
  Result<int32_t> encode_special(std::string_view text) const;
};

// The tokens that end a GLM-4 reply, <|endoftext|>, <|user|> and <|observation|> (GLM4_SPEC.md 5.3
// and 6.1; the first is also the padding): the tokenizer's ids, else without one GLM-4's own where a
// vocabulary of vocab_size holds them, else none.
std::vector<int32_t> glm4_end_ids(const Tokenizer* tokenizer, int64_t vocab_size);

// Bytes are ids 0..255; the special tokens follow at 256.. (vocab 270).
class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t special_id(SpecialToken t) const override { return 256 + static_cast<int32_t>(t); }
  int64_t vocab_size() const override { return 256 + static_cast<int64_t>(SpecialToken::count); }
  std::string source() const override { return "bytes"; }
  std::string content_hash() const override;
  std::string describe() const override;
};

// The tokenizer of a model: `path` is a tiktoken rank file (GLM-4's tokenizer.model) or a model
// directory holding one. Defined with TiktokenTokenizer.
Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& path);

}  // namespace glm
