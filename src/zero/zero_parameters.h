// ZeRO stages 0-3 over the flat layout: which rank holds which parameters, gradients and optimizer
// state, and the collectives that move them. Every unit (embedding, each layer, head) is split into
// equal shards, rank r owning the r-th (ParamLayout with shards = world size).
//   0: everything replicated; gradients all-reduced per unit after backward.
//   1: optimizer state sharded; gradients reduce-scattered per unit after backward; each rank
//      updates its shards, then parameters are all-gathered.
//   2: gradients sharded too: each unit's gradient is reduce-scattered as soon as backward
//      finished it and accumulated into this rank's shard; only one unit-sized bucket is kept.
//   3: parameters sharded too: a unit is all-gathered just before its forward and its backward,
//      the next unit's gather prefetched into a second buffer while the current one computes.
// Stages 0-1 start each unit's all-reduce / reduce-scatter during the last micro-batch's backward,
// as soon as the unit's gradient is complete; stages 1-2 start each unit's parameter all-gather as
// soon as the optimizer updated it.
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <vector>

#include "model/glm4_model.h"
#include "mpi/communicator.h"

namespace glm {

struct ZeroMemory {
  int64_t parameter_bytes = 0, gradient_bytes = 0, buffer_bytes = 0;
};

class ZeroParameters final : public ParameterProvider {
 public:
  // comm carries host scalars (norms, counts); data, when given, the parameter and gradient
  // buffers (NCCL over device memory), otherwise comm does both (MPI over host memory).
  static Result<std::unique_ptr<ZeroParameters>> create(const ParamLayout& layout, Backend& backend, Communicator& comm,
                                                        int stage, Communicator* data = nullptr);

  // ParameterProvider
  Result<Tensor> acquire_params(int unit) override;
  Status prefetch_params(int unit) override;
  Tensor unit_grads(int unit) override;
  Status grads_ready(int unit) override;

  int stage() const { return stage_; }
  // Parameters and gradients this rank updates: the whole unit (stage 0) or its shard.
  Tensor owned_params(int unit) const;
  Tensor owned_grads(int unit) const;
  Tensor owned_grads_all() const { return grads_.tensor(); }  // stages 0-1: the full gradient
  int64_t owned_offset(int unit) const;                       // global layout offset of owned_params(unit)

  Status zero_grads();
  // Before each micro-batch's backward: whether it is the last of the optimizer step (stages 0-1
  // then reduce each unit as soon as backward completes it).
  void set_last_micro_batch(bool last) { last_micro_batch_ = last; }
  // After the last micro-batch: stage 0 all-reduces, stage 1 reduce-scatters, stages 2-3 have done
  // their part during backward.
  Status finish_backward();
  // Sum of squares of the whole (global) gradient, equal on every rank.
  Result<double> grad_norm_squared();
  // After the optimizer wrote owned_params(unit): stages 1-2 start the unit's all-gather.
  Status unit_updated(int unit);
  // After every unit_updated(): waits for the all-gathers.
  Status after_update();
  // Writes global layout range [begin, begin + values.size()) from host f32 values, keeping only
  // what this rank stores.
  Status set_range(int64_t begin, std::span<const float> values);
  // Fills what this rank stores through fill(dst, global_begin).
  Status fill_stored(const std::function<Status(Tensor dst, int64_t global_begin)>& fill);
  ZeroMemory memory() const;
  // Seconds this rank waited on collectives since the last call (exposed communication).
  double take_exposed_comm_seconds();
  // Seconds compute waited on device-ordered collectives (NCCL) since the last call; synchronizes.
  Result<double> take_device_exposed_comm_seconds();

 private:
  ZeroParameters(const ParamLayout& layout, Backend& backend, Communicator& comm, Communicator& data, int stage)
      : layout_(layout), backend_(backend), comm_(comm), data_(data), stage_(stage) {}
  Status copy(Tensor dst, Tensor src);
  Status all_gather_unit(Tensor shard, Tensor full);
  Status reduce_scatter_unit(Tensor full, Tensor shard);
  Tensor shard_slice(const Buffer& shards, int unit) const;

  const ParamLayout& layout_;
  Backend& backend_;
  Communicator& comm_;
  Communicator& data_;
  int stage_;
  std::vector<int64_t> shard_base_;  // local offset of each unit's shard inside shard buffers
  Buffer params_;                    // stages 0-2: the full parameters
  Buffer param_shards_;              // stage 3: this rank's shards
  // Stage 3: two unit-sized buffers of gathered parameters, the one in use and the prefetch.
  struct Gathered {
    Buffer params;
    int unit = -1;
    std::unique_ptr<CommRequest> in_flight;
  };
  Gathered gathered_[2];
  int held_slot_ = -1;  // the slot of the unit the model acquired last
  Status gather_into(int slot, int unit);
  Status settle_slot(Gathered& g);
  Status forget_gathered();
  Status wait_timed(std::unique_ptr<CommRequest>& request);
  bool last_micro_batch_ = true;
  std::vector<std::unique_ptr<CommRequest>> pending_;  // stage 0-1 reductions, stage 1-2 gathers
  Buffer grads_;                     // stages 0-1: the full gradients
  Buffer grad_shards_;               // stages 1-3: this rank's gradient shards
  // Stages 2-3: two unit-sized gradient buckets. While backward fills one, the other's
  // reduce-scatter runs (non-blocking); it is waited for only when its bucket is needed again.
  struct Bucket {
    Buffer grads, scattered;
    std::unique_ptr<CommRequest> in_flight;
    int unit = -1;
  };
  Status drain(Bucket& b);
  Bucket buckets_[2];
  int current_bucket_ = 0;
  double exposed_comm_seconds_ = 0;  // time spent waiting for collectives (not overlapped)
};

}  // namespace glm
