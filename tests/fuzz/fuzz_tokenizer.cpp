// A tiktoken rank file (tokenizer.model), then text encoded with the tokenizer it makes: decoding
// must give the text back byte for byte, whatever the ranks and the text. The input is the rank
// file, a NUL, and the text (without a NUL, the rank file is the text too).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "data/bpe.h"
#include "data/tiktoken_tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  glm::fuzz::abort_on_fatal();
  const auto parts = glm::fuzz::split_input(data, size, 2);
  auto ranks = glm::BpeRanks::parse(parts[0], "tokenizer.model");
  glm::fuzz::expect_user_error(ranks.status());
  if (!ranks.is_ok()) return 0;
  auto tokenizer = glm::TiktokenTokenizer::create(ranks.take());
  if (!tokenizer.is_ok()) std::abort();  // the pattern is fixed: only the ranks could be wrong
  const std::string_view text = parts.size() > 1 ? parts[1] : parts[0];
  const std::vector<int32_t> ids = tokenizer.value().encode(text);
  for (const int32_t id : ids)
    if (id < 0 || id >= tokenizer.value().ranks().size()) std::abort();
  if (tokenizer.value().decode(ids) != text) std::abort();
  return 0;
}
