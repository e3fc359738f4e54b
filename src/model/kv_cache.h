// The keys and values of sequences being generated (glm_hpc infer): per layer, rows of k | v
// (2 x kv_heads x head_dim elements in the compute dtype) in one backend buffer of `capacity` rows.
// Any row may hold any token of any sequence: train/cached_generator.h hands rows out and names
// them in each forward. A forward of new tokens (Glm4Model with the cache attached) writes their
// k | v into their rows (MicroBatch::cache_rows), then their queries attend to the rows that
// MicroBatch::kv_rows names for their sequence's positions, with the backend's gathered attention
// (the context-parallel kernels): a paged cache, continuous batching and chunked prefill without
// an attention kernel of their own. Decode steps take the backend's decode kernel; prompts whose
// whole context is new take the training attention over qkv itself, and a row whose cache rows are
// one run (MicroBatch::kv_run_start) the gathered kernels without a row index per key. GQA keeps it
// small: GLM-4-9B-Chat's 2 KV heads take 40 KiB a token over its 40 layers in bf16.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/backend.h"
#include "model/config.h"

namespace glm {

struct MicroBatch;

// One forward of new tokens through a KV cache, on the host. Sequences follow one another in a
// "row" of positions (each sequence's tokens so far, then its new ones), as a context-parallel
// row does: new token i is at row_position[i], attends to [doc_start[i], row_position[i]], and
// kv_rows maps every row position to its cache row. New tokens come in row order.
struct HostDecodeBatch {
  std::vector<int32_t> tokens;        // [n]
  std::vector<int32_t> positions;     // [n] RoPE position in its sequence
  std::vector<int32_t> row_position;  // [n]
  std::vector<int32_t> doc_start;     // [n] row position of its sequence's first token
  std::vector<int32_t> cache_rows;    // [n] where its k | v go
  std::vector<int32_t> kv_rows;       // [row tokens]
  std::vector<int32_t> logit_rows;    // the new tokens whose logits are wanted, ascending
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
};

class KvCache {
 public:
  // capacity: rows (tokens) per layer; max_new: the most new tokens of one forward.
  static Result<std::unique_ptr<KvCache>> create(Backend& backend, const ModelConfig& config, int64_t capacity,
                                                 int64_t max_new);
  // Backend bytes of one token's rows over every layer.
  static int64_t bytes_per_token(const ModelConfig& config, int64_t element_size);
  // Unique in the process (graphs of decode steps are keyed by it); the backend's graphs go with
  // the cache, whose rows they address.
  uint64_t id() const { return id_; }
  ~KvCache();
  int64_t capacity() const { return capacity_; }
  int64_t max_new() const { return max_new_; }
  int64_t bytes() const;
  AttentionShape shape() const { return shape_; }

  // Where layer `layer`'s RoPE of the batch's new tokens writes their k | v
  // (Backend::rope_store, alone or after the q | k | v linear in Backend::normed_linear_forward).
  Result<RopeStore> rope_store(int64_t layer, const MicroBatch& b, int64_t rotary_dim, double rope_base);
  // Layer `layer`'s attention of the batch's new tokens (qkv their fused rows after rope_store's
  // RoPE, their k | v stored): out [n, q_width] and lse [n, heads] over the cached rows.
  Status attend(int64_t layer, Tensor out, Tensor lse, Tensor qkv, const MicroBatch& b);

 private:
  KvCache(Backend& backend, AttentionShape shape) : backend_(backend), shape_(shape) {}
  int64_t width() const { return 2 * shape_.kv_heads * shape_.head_dim; }
  Status check(const MicroBatch& b) const;

  Backend& backend_;
  AttentionShape shape_;
  int64_t capacity_ = 0, max_new_ = 0;
  uint64_t id_ = 0;
  std::vector<Buffer> layers_;  // [capacity, width] each
  Buffer staging_;              // [max_new, width]: Backend::rope_store's scratch, where it stages
};

}  // namespace glm
