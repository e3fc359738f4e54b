// A jsonl dataset file in every supported line shape (messages, sharegpt, alpaca, pre-tokenized),
// read as training reads it: with the sample tokenizer, with length control and with
// --on_bad_sample skip, and without a tokenizer. Every sample read must be well formed.
#include <cstddef>
#include <cstdint>
#include <string>

#include "data/dataset.h"
#include "fuzz_dataset.h"
#include "fuzz_util.h"

namespace {

void load(const std::string& path, const glm::Tokenizer* tokenizer, int64_t vocab_size, int64_t max_length,
          bool skip_bad, glm::Truncation truncation, const glm::ConversationOptions& conversation) {
  auto d = glm::load_dataset({path}, tokenizer, max_length, vocab_size, skip_bad, truncation, conversation);
  glm::fuzz::expect_user_error(d.status());
  if (d.is_ok()) glm::fuzz::check_samples(d.value(), vocab_size, max_length);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  glm::fuzz::abort_on_fatal();
  const glm::Tokenizer& tokenizer = glm::fuzz::sample_tokenizer();
  const std::string path = (glm::fuzz::scratch_dir() / "data.jsonl").string();
  glm::fuzz::write_file(path, {reinterpret_cast<const char*>(data), size});
  const int64_t vocab = tokenizer.vocab_size();
  load(path, &tokenizer, vocab, 0, false, glm::Truncation::remove, {});
  load(path, &tokenizer, vocab, 24, true, glm::Truncation::left, {glm::LossScale::last_round, "be brief"});
  load(path, &tokenizer, vocab, 16, true, glm::Truncation::right, {glm::LossScale::all, ""});
  load(path, nullptr, 300, 0, false, glm::Truncation::remove, {});
  return 0;
}
