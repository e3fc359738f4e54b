// ZeRO's gradients and their reduction over the data-parallel ranks:
//   stages 0-1: full gradients; each bucket is all-reduced (0) or reduce-scattered (1) once, when
//     the last micro-batch's backward completed it (with --overlap_comm), else after backward;
//   stages 2-3: only bucket-sized gradient buffers; every micro-batch's bucket is reduce-scattered
//     as soon as backward filled it and accumulated into this rank's gradient shards. With
//     offload_grads (one micro-batch a step) the shards are host memory: each reduced bucket is
//     copied there on a copy stream once its reduction is done, while backward goes on; the device
//     sums its squares first, so the norm needs no pass over host memory.
// Buckets (zero/comm_buckets.h) coalesce consecutive units up to --reduce_bucket_size elements. A
// multi-unit bucket is one group of per-unit collectives, each unit reduced where it lies (no
// packed copy); only a conversion to --grad_reduce_dtype copies the bucket first. At most two
// reductions are in flight, in two slots; a slot is drained (waited, its result stored) before reuse.
#pragma once

#include <memory>
#include <vector>

#include "model/backend.h"
#include "model/param_layout.h"
#include "mpi/communicator.h"
#include "zero/collectives.h"
#include "zero/comm_buckets.h"
#include "zero/sharding_plan.h"
#include "zero/zero_options.h"

namespace glm {

class PersistentUnit;

class GradReducer {
 public:
  // comm carries host scalars (norms), data the gradient buffers. options.grad_reduce_dtype is the
  // effective one (effective_reduce_dtype). persistent (may be null) holds stage 3's persistent
  // gradients, reduced as the last bucket.
  static Result<std::unique_ptr<GradReducer>> create(const ParamLayout& layout, Backend& backend, Communicator& comm,
                                                     Communicator& data, const ShardingPlan& plan,
                                                     const ZeroOptions& options, const ZeroBufferSizes& sizes,
                                                     CommWaits& waits, const PersistentUnit* persistent);
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Zeroes what backward adds to (all but the weights, which the first micro-batch writes) and the
  // gradient shards; `caller_zeroed` (a unit, or -1) is left to the caller.
  Status zero_grads(int caller_zeroed);
  // Where backward accumulates `unit`'s gradient of this micro-batch.
  Result<Tensor> unit_grads(int unit);
  // Backward finished `unit` in this micro-batch (the last of the step when last_micro_batch).
  Status grads_ready(int unit, bool last_micro_batch);
  // After the last micro-batch: the reductions not started during backward, and every one drained.
  Status finish_backward();
  Result<double> grad_norm_squared();
  Result<double> global_grad_norm_squared(double local);
  Tensor owned_grads(int unit) const;  // host memory where grads_on_host()
  bool grads_on_host() const { return host_grads_; }
  Tensor full_grads() const { return grads_.tensor(); }  // stages 0-1
  const std::vector<CommBucket>& buckets() const { return buckets_; }
  int64_t grad_bytes() const;       // backend memory
  int64_t host_grad_bytes() const;  // host memory (offload_grads)
  int64_t buffer_bytes() const;

 private:
  GradReducer(const ParamLayout& layout, Backend& backend, Communicator& comm, Communicator& data,
              const ShardingPlan& plan, const ZeroOptions& options, CommWaits& waits)
      : layout_(layout), backend_(backend), comm_(comm), data_(data), plan_(plan), options_(options), waits_(waits) {}
  Status allocate(const ZeroBufferSizes& sizes);
  void plan_zeroing();
  // What backward adds to in a unit's gradient laid out at `unit_grads` (zero_ranges_), appended to parts.
  void added_parts(int unit, Tensor unit_grads, std::vector<Tensor>& parts) const;
  Result<Tensor> persistent_grads();
  Tensor bucket_source(const CommBucket& b) const;  // the bucket's gradient in flat-layout order
  Status reduce_bucket(int bucket);
  struct ReduceSlot;
  Status drain(ReduceSlot& slot);
  Status accumulate_alone(const CommBucket& b);  // one rank, stages 2-3
  // host_grads_: shards (host) = src, the range's reduced gradient (backend memory), its squares
  // added to squares_ first; the copy is waited for by finish_backward.
  Result<const AsyncCopy*> store_on_host(Tensor shards, Tensor src);

  const ParamLayout& layout_;
  Backend& backend_;
  Communicator& comm_;
  Communicator& data_;
  ShardingPlan plan_;
  ZeroOptions options_;
  CommWaits& waits_;
  CommType reduce_type_ = CommType::f32;
  int persistent_ = -1;
  Tensor persistent_grads_;  // PersistentUnit's, whole
  std::vector<int64_t> shard_offsets_;

  // Per unit, the ranges (relative to the unit) that backward adds to: all but the weight tensors.
  struct ZeroRange {
    int64_t begin, numel;
  };
  std::vector<std::vector<ZeroRange>> zero_ranges_;
  Buffer grads_;        // stages 0-1: the full gradients
  Buffer grad_shards_;  // stages 1-3: this rank's gradient shards (host memory where host_grads_)
  bool host_grads_ = false;
  Buffer squares_;  // host_grads_: the step's sum of squares of the reduced gradient (f64, backend)
  std::vector<std::unique_ptr<AsyncCopy>> downloads_;         // host_grads_: this step's copies
  const AsyncCopy* bucket_download_[2] = {nullptr, nullptr};  // one rank: the copy reading grad_buckets_[i]
  const AsyncCopy* convert_download_ = nullptr;               // the copy reading reduce_convert_

  // Buckets in backward order; bucket_of_unit_ maps a unit to its bucket.
  std::vector<CommBucket> buckets_;
  std::vector<int> bucket_of_unit_;
  bool pack_ = false;  // collectives read a packed / converted copy of the bucket
  // Stages 2-3: where backward writes the open bucket (two when collectives read them directly).
  Buffer grad_buckets_[2];
  struct ReduceSlot {
    Buffer send, recv;
    std::unique_ptr<CommRequest> in_flight;
    int bucket = -1;
    const AsyncCopy* download = nullptr;  // host_grads_: the copy reading recv
  };
  ReduceSlot slots_[2];
  int next_slot_ = 0;
  Buffer reduce_convert_;    // stages 2-3 with another reduce dtype: recv in compute dtype
  int buckets_reduced_ = 0;  // this step, to check every bucket was reduced exactly once
};

}  // namespace glm
