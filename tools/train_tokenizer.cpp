// glm_train_tokenizer: learns a byte-level BPE rank file (tiktoken format) from conversation jsonl.
// The embedded tiny configuration's tokenizer is made, and checked by test_tokenizer, with
//   build/glm_train_tokenizer --ranks 1500 --output data/sample/tokenizer.model data/sample/*.jsonl
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "data/bpe_trainer.h"
#include "data/tiktoken_tokenizer.h"

namespace {

int usage() {
  std::fprintf(stderr, "usage: glm_train_tokenizer --ranks N --output FILE DATA.jsonl...\n");
  return 2;
}

int fail(const glm::Status& s) {
  std::fprintf(stderr, "glm_train_tokenizer: error: %s\n", s.message().c_str());
  return s.exit_code();
}

}  // namespace

int main(int argc, char** argv) {
  int32_t ranks = 0;
  std::string output;
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--ranks" && i + 1 < argc)
      ranks = static_cast<int32_t>(std::strtol(argv[++i], nullptr, 10));
    else if (arg == "--output" && i + 1 < argc)
      output = argv[++i];
    else if (!arg.empty() && arg[0] == '-')
      return usage();
    else
      inputs.push_back(arg);
  }
  if (ranks <= 0 || output.empty() || inputs.empty()) return usage();
  auto texts = glm::conversation_texts(inputs);
  if (!texts.is_ok()) return fail(texts.status());
  auto tokens = glm::learn_bpe_tokens(texts.value(), ranks);
  if (!tokens.is_ok()) return fail(tokens.status());
  const std::string file = glm::format_rank_file(tokens.value());
  {
    std::ofstream out(output, std::ios::binary | std::ios::trunc);
    if (!out || !out.write(file.data(), static_cast<std::streamsize>(file.size())).flush())
      return fail(GLM_USER_ERROR("cannot write '", output, "'"));
  }
  // Read back through the loader training uses: the file must be a valid rank file.
  auto tokenizer = glm::TiktokenTokenizer::load(output);
  if (!tokenizer.is_ok()) return fail(tokenizer.status());
  int64_t bytes = 0, ids = 0;
  for (const auto& t : texts.value()) {
    bytes += static_cast<int64_t>(t.size());
    ids += static_cast<int64_t>(tokenizer.value().encode(t).size());
  }
  std::printf(
      "glm_train_tokenizer: %s: %d ranks (+ 14 special tokens = vocab %lld) from %zu texts; %.2f bytes per "
      "token on them\n",
      output.c_str(), tokenizer.value().ranks().size(), static_cast<long long>(tokenizer.value().vocab_size()),
      texts.value().size(), ids > 0 ? static_cast<double>(bytes) / static_cast<double>(ids) : 0.0);
  return 0;
}
