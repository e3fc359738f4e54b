// Sharded loader: a seeded shuffle per epoch over one global sample stream; each rank reads its
// slice of every global batch, so the global batch does not depend on the world size.
#pragma once

#include <cstdint>
#include <vector>

#include "data/dataset.h"
#include "data/packing.h"

namespace glm {

// Host-side micro-batch: documents packed back to back (see MicroBatch in model/glm4_model.h).
struct HostMicroBatch {
  std::vector<int32_t> tokens, targets, positions, doc_start;
  int64_t target_count = 0;
  // A rank's share of a row under context parallelism (data/context_split.h), else empty: the
  // row's length, each token's position in the row (doc_start then holds row positions too), and
  // each row position's row in the group's gathered keys and values.
  int64_t row_tokens = 0;
  std::vector<int32_t> row_position;
  std::vector<int32_t> kv_rows;
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
};

// Appends one sample as its own document; targets[t] = labels[t + 1] (the transformers shift).
void append_document(HostMicroBatch& batch, SampleView sample);

// The stream's unit is a sample, or with a packing plan a packed row (several samples, each its
// own document); batch sizes count units.
class ShardedLoader {
 public:
  ShardedLoader(const Dataset& dataset, uint64_t seed, int rank, int world_size, int64_t per_device_batch,
                int64_t gradient_accumulation_steps, const PackingPlan* packing = nullptr);

  int64_t global_batch_size() const { return per_device_batch_ * world_size_ * accumulation_; }
  // Units (samples or packed rows) of one epoch.
  int64_t epoch_size() const;
  // Units consumed by the first `steps` optimizer steps (the loader position a checkpoint saves).
  int64_t consumed_samples(int64_t steps) const { return steps * global_batch_size(); }
  // This rank's micro-batch `micro` (0 <= micro < accumulation) of optimizer step `step`.
  HostMicroBatch micro_batch(int64_t step, int64_t micro);

 private:
  int64_t unit_at(int64_t stream_index);  // stream index -> unit index through the epoch's shuffle

  const Dataset& dataset_;
  const PackingPlan* packing_;
  uint64_t seed_;
  int rank_, world_size_;
  int64_t per_device_batch_, accumulation_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> order_;
};

// Deterministic 64-bit generator (splitmix64): identical on every platform, unlike std distributions.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next();
  double uniform();  // [0, 1)
 private:
  uint64_t state_;
};

}  // namespace glm
