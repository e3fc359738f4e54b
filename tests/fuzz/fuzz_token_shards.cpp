// A directory written by `glm_hpc prepare`: prepared.json and its shard file, validated and mapped
// as training maps them. The input is prepared.json, a NUL, and shard_00000.bin. A shard whose
// first reserved header byte is 0 gets its checksum recomputed, so that the fuzzer reaches the
// checks behind it; any other value keeps the checksum as given.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "data/token_shards.h"
#include "fuzz_dataset.h"
#include "fuzz_util.h"

namespace {

constexpr size_t kHeaderBytes = 64, kChecksumAt = 40, kReservedAt = 48;
// The tiny configuration's vocab_size, which the seeds' prepare runs recorded.
constexpr int64_t kModelVocab = 1536;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  glm::fuzz::abort_on_fatal();
  const glm::Tokenizer& tokenizer = glm::fuzz::sample_tokenizer();
  const auto parts = glm::fuzz::split_input(data, size, 2);
  const auto dir = glm::fuzz::fresh_dir("prepared");
  glm::fuzz::write_file(dir / "prepared.json", parts[0]);
  if (parts.size() > 1) {
    std::string shard(parts[1]);
    if (shard.size() >= kHeaderBytes && (shard.size() - kHeaderBytes) % 8 == 0 && shard[kReservedAt] == 0) {
      const uint64_t sum = glm::token_shard_checksum(shard.data() + kHeaderBytes, shard.size() - kHeaderBytes);
      std::memcpy(shard.data() + kChecksumAt, &sum, sizeof sum);
    }
    glm::fuzz::write_file(dir / "shard_00000.bin", shard);
  }
  for (const glm::Tokenizer* t : {static_cast<const glm::Tokenizer*>(nullptr), &tokenizer}) {
    auto d = glm::load_prepared(dir.string(), kModelVocab, t);
    glm::fuzz::expect_user_error(d.status());
    if (d.is_ok()) glm::fuzz::check_samples(d.value(), kModelVocab);
  }
  return 0;
}
