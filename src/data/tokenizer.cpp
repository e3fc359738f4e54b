// What every tokenizer shares: the special tokens' text and their lookup by text.
#include "data/tokenizer.h"

namespace glm {
namespace {
constexpr const char* kSpecialText[] = {"<|endoftext|>",
                                        "[MASK]",
                                        "[gMASK]",
                                        "[sMASK]",
                                        "<sop>",
                                        "<eop>",
                                        "<|system|>",
                                        "<|user|>",
                                        "<|assistant|>",
                                        "<|observation|>",
                                        "<|begin_of_image|>",
                                        "<|end_of_image|>",
                                        "<|begin_of_video|>",
                                        "<|end_of_video|>"};
static_assert(std::size(kSpecialText) == static_cast<size_t>(SpecialToken::count));
}  // namespace

const char* special_token_text(SpecialToken t) {
  const int i = static_cast<int>(t);
  return i >= 0 && i < static_cast<int>(SpecialToken::count) ? kSpecialText[i] : "<?>";
}

std::optional<SpecialToken> special_token_from_text(std::string_view text) {
  for (int i = 0; i < static_cast<int>(SpecialToken::count); ++i)
    if (text == kSpecialText[i]) return static_cast<SpecialToken>(i);
  return std::nullopt;
}

std::vector<int32_t> glm4_end_ids(const Tokenizer* tokenizer, int64_t vocab_size) {
  if (tokenizer != nullptr)
    return {tokenizer->special_id(SpecialToken::endoftext), tokenizer->special_id(SpecialToken::user),
            tokenizer->special_id(SpecialToken::observation)};
  constexpr int32_t kEndOfText = 151329, kUser = 151336, kObservation = 151338;
  if (vocab_size > kObservation) return {kEndOfText, kUser, kObservation};
  return {};
}

Result<int32_t> Tokenizer::encode_special(std::string_view text) const {
  const std::optional<SpecialToken> t = special_token_from_text(text);
  if (!t) return GLM_USER_ERROR("'", text, "' is not a GLM-4 special token");
  return special_id(*t);
}

}  // namespace glm
