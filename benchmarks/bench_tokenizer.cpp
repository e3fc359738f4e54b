// Encoding throughput of the GLM-4 tokenizer on one core, in the same form as
// tools/tiktoken_peer/peer.cjs bench prints it, for benchmarks/checks/tokenizer_vs_tiktoken.sh.
//   bench_tokenizer RANK_FILE TEXT_FILE [repeats]
//   -> "ours_mb_per_s X tokens N bytes B regex_only_mb_per_s R" (R: the pre-tokenization alone)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "data/tiktoken_tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: %s RANK_FILE TEXT_FILE [repeats]\n", argv[0]);
    return 2;
  }
  auto tokenizer = glm::TiktokenTokenizer::load(argv[1]);
  if (!tokenizer.is_ok()) {
    std::fprintf(stderr, "bench_tokenizer: %s\n", tokenizer.status().message().c_str());
    return 2;
  }
  std::ifstream in(argv[2], std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "bench_tokenizer: cannot open %s\n", argv[2]);
    return 2;
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  const std::string text = contents.str();
  const int repeats = argc == 4 ? std::max(1, std::atoi(argv[3])) : 5;

  // Like the peer: one warm-up, then the best of `repeats` whole-text encodes.
  size_t tokens = tokenizer.value().encode(text).size();
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    tokens = tokenizer.value().encode(text).size();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  double best_regex = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    size_t pieces = 0;
    tokenizer.value().pretokenize(text, [&](std::string_view) { ++pieces; });
    best_regex = std::min(best_regex, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (pieces == 0 && !text.empty()) return 1;
  }
  const double megabytes = static_cast<double>(text.size()) / 1e6;
  std::printf("ours_mb_per_s %.2f tokens %zu bytes %zu regex_only_mb_per_s %.2f\n", megabytes / best, tokens,
              text.size(), megabytes / best_regex);
  return 0;
}
