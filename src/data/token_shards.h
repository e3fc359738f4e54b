// Token shards: the tokenized dataset `glm_hpc prepare --output_dir D` writes and training
// memory-maps (`--dataset D`), so a large corpus is tokenized once and read without copies.
//
// D/prepared.json names the shards and holds the dataset report and the options that produced
// them. Each shard file (little-endian, every array aligned to its element size):
//   0   char[8]  magic "GLMTOKSH"
//   8   uint32   version (1)
//   12  uint32   header bytes (64)
//   16  int64    vocab size (every token and label is below it)
//   24  int64    sample count S
//   32  int64    token count T
//   40  uint64   checksum of everything after the header (64-bit FNV-1a over 8-byte words)
//   48  int64[2] reserved, 0
//   64  int64[S + 1] sample offsets into the token arrays (0, ..., T)
//       int32[T] tokens
//       int32[T] target mask as labels: -1 = no loss, else the id to predict (the token itself
//                except where pre-tokenized data gives another label)
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "data/dataset.h"

namespace glm {

inline constexpr int64_t kDefaultShardTokens = int64_t{1} << 28;  // 2 GiB of tokens and labels per file

// What produced the shards (written to prepared.json and printed when training reads them).
struct PrepareInfo {
  std::vector<std::string> datasets;
  int64_t max_length = 0;
  Truncation truncation = Truncation::remove;
  LossScale loss_scale = LossScale::assistant;
  std::string system;
  // The tokenizer's source() and content_hash(); both empty when there was none (pre-tokenized).
  std::string tokenizer, tokenizer_hash;
};

// Writes `dataset` (in memory or mapped) as shards of at most max_shard_tokens tokens (a sample is
// never split) and prepared.json into `dir`, which must be absent, empty (but for the lock of the
// run writing it) or an earlier prepared directory (replaced). Files are written under temporary
// names and renamed, prepared.json last.
Status write_token_shards(const Dataset& dataset, int64_t vocab_size, const PrepareInfo& info, const std::string& dir,
                          int64_t max_shard_tokens = kDefaultShardTokens);

// True for the names write_token_shards writes: prepared.json and the shard files.
bool is_token_shards_file(std::string_view name);

// The checksum a shard's header holds: over the `bytes` after the header (a whole number of words).
uint64_t token_shard_checksum(const void* payload, size_t bytes);

// True when `path` is a directory holding prepared.json.
bool is_prepared_dir(const std::string& path);

// Memory-maps every shard of a prepared directory after validating it completely (header,
// size, checksum, offsets, ids below vocab_size); any defect is a user error naming the file.
// With a tokenizer, shards tokenized by another one (a different content hash) are refused.
Result<Dataset> load_prepared(const std::string& dir, int64_t vocab_size, const Tokenizer* tokenizer = nullptr);

// One memory-mapped shard file (read-only); unmapped on destruction.
class MappedShard {
 public:
  static Result<std::unique_ptr<MappedShard>> open(const std::string& path, int64_t vocab_size);
  ~MappedShard();
  MappedShard(const MappedShard&) = delete;
  MappedShard& operator=(const MappedShard&) = delete;

  int64_t samples() const { return static_cast<int64_t>(offsets_.size()) - 1; }
  int64_t tokens() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t vocab_size() const { return vocab_size_; }
  SampleView sample(int64_t i) const;

 private:
  MappedShard() = default;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  int64_t vocab_size_ = 0;
  std::span<const int64_t> offsets_;
  std::span<const int32_t> tokens_, labels_;
};

// The shards of one prepared directory as one sample sequence.
class MappedShards {
 public:
  explicit MappedShards(std::vector<std::unique_ptr<MappedShard>> shards);
  int64_t samples() const { return first_.empty() ? 0 : first_.back(); }
  SampleView sample(int64_t i) const;

 private:
  std::vector<std::unique_ptr<MappedShard>> shards_;
  std::vector<int64_t> first_;  // first_[k] = samples before shard k; first_.back() = all
};

}  // namespace glm
