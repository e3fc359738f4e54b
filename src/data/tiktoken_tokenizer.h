// GLM-4's tokenizer (GLM4_SPEC.md 5): the spec's regex splits text into pieces, byte-level BPE
// over tokenizer.model's ranks encodes each piece, and the 14 special tokens follow the ranks.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/bpe.h"
#include "data/tokenizer.h"
#include "base/status.h"

namespace glm {

// The pre-tokenization regex exactly as GLM-4 (and cl100k_base) spell it, in Python `regex`
// syntax. It is compiled with \s and \S spelled out as Unicode White_Space (see the .cpp).
inline constexpr std::string_view kGlm4PretokenizePattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

class TiktokenTokenizer final : public Tokenizer {
 public:
  static Result<TiktokenTokenizer> create(BpeRanks ranks);
  // `path`: a tiktoken rank file, or a model directory holding tokenizer.model.
  static Result<TiktokenTokenizer> load(const std::string& path);

  TiktokenTokenizer(TiktokenTokenizer&&) noexcept;
  TiktokenTokenizer& operator=(TiktokenTokenizer&&) noexcept;
  ~TiktokenTokenizer() override;

  // Valid UTF-8 is encoded as tiktoken encodes the same string. Bytes that are not valid UTF-8
  // (which tiktoken's string API cannot receive) stop the regex like the end of the text would:
  // each maximal run of them is one piece of its own, so decode still returns the input exactly.
  // Safe to call from several threads at once: every buffer belongs to the call.
  std::vector<int32_t> encode(std::string_view text) const override;
  void encode_append(std::string_view text, std::vector<int32_t>& out) const;
  // Exact bytes; special ids give their text, ids outside the vocabulary "<|unk|>".
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t special_id(SpecialToken t) const override { return ranks_.size() + static_cast<int32_t>(t); }
  int64_t vocab_size() const override {
    return static_cast<int64_t>(ranks_.size()) + static_cast<int64_t>(SpecialToken::count);
  }

  // The rank file's path when loaded from one, else "ranks built in memory".
  std::string source() const override { return source_; }
  // Over the ranks' bytes in rank order (and the pattern): the same table read from differently
  // formatted files hashes the same.
  std::string content_hash() const override { return content_hash_; }
  std::string describe() const override;

  const BpeRanks& ranks() const { return ranks_; }
  // The pieces that encode merges one by one (for tests, diagnostics and timing the regex alone).
  std::vector<std::string_view> pretokenize(std::string_view text) const;
  void pretokenize(std::string_view text, const std::function<void(std::string_view)>& on_piece) const;

 private:
  struct Regex;  // PCRE2's compiled pattern; pcre2.h stays out of this header
  TiktokenTokenizer(BpeRanks ranks, std::unique_ptr<Regex> regex);
  template <typename OnPiece>
  void for_each_piece(std::string_view text, OnPiece&& on_piece) const;

  BpeRanks ranks_;
  std::unique_ptr<Regex> regex_;
  std::string source_ = "ranks built in memory";
  std::string content_hash_;
};

}  // namespace glm
