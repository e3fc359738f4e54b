// ZeRO stages 0-3 over the flat layout: which rank holds which parameters, gradients and optimizer
// state, and the collectives that move them. Every unit (embedding, each layer, head) is split into
// equal shards, rank r owning the r-th (ParamLayout with shards = world size).
//   0: everything replicated; gradients all-reduced in buckets.
//   1: optimizer state sharded; gradients reduce-scattered in buckets; each rank updates its
//      shards, then parameters are all-gathered in buckets.
//   2: gradients sharded too: each bucket is reduce-scattered as soon as backward filled it and
//      accumulated into this rank's shards; only bucket-sized gradient buffers exist.
//   3: parameters sharded too: a unit is all-gathered just before its forward and its backward,
//      the next unit's gather prefetched into a second buffer while the current one computes.
//      The layout's persistent unit (small tensors, --param_persistence_threshold) is whole on
//      every rank instead, as DeepSpeed's persistent parameters: never gathered per layer; its
//      gradients are held whole through backward and reduce-scattered once at its end (the last
//      bucket), its optimizer state is sharded like any unit's, and after the optimizer step one
//      in-place all-gather of its shards refreshes every rank's copy.
// Buckets (zero/comm_buckets.h) coalesce consecutive units up to --reduce_bucket_size /
// --allgather_bucket_size elements. A multi-unit bucket is one group of per-unit collectives (NCCL
// launches a group together), each unit reduced or gathered where it lies: no packed copy, unlike
// FSDP2's rank-major pack; only a conversion to --grad_reduce_dtype copies the bucket first.
// With --overlap_comm, stages 0-1 start each bucket's reduction during the last micro-batch's
// backward as soon as its units are complete, stages 2-3 as soon as the bucket is full, and
// stages 1-2 each bucket's parameter all-gather as soon as the optimizer updated its units.
// Without it every collective is issued after its producer finished and waited for at once.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "model/glm4_model.h"
#include "mpi/communicator.h"
#include "zero/comm_buckets.h"
#include "zero/zero_options.h"

namespace glm {

struct ZeroMemory {
  int64_t parameter_bytes = 0, gradient_bytes = 0, buffer_bytes = 0;
};

class ZeroParameters final : public ParameterProvider {
 public:
  // comm carries host scalars (norms, counts); data, when given, the parameter and gradient
  // buffers (NCCL over device memory), otherwise comm does both (MPI over host memory).
  // frozen (LoRA's base model): parameters only, no gradient buffers and no gradient collectives;
  // unit_grads() is empty. Stage 3 still partitions the parameters and gathers them just in time;
  // stages 0-2 keep them replicated (they shard only gradients and optimizer state, which a frozen
  // model has none of).
  static Result<std::unique_ptr<ZeroParameters>> create(const ParamLayout& layout, Backend& backend, Communicator& comm,
                                                        int stage, Communicator* data = nullptr,
                                                        const ZeroOptions& options = ZeroOptions{},
                                                        bool frozen = false);

  // Parameter all-gathers still in flight (stages 1-2 with --overlap_comm) finish first.
  ~ZeroParameters() override;
  ZeroParameters(const ZeroParameters&) = delete;
  ZeroParameters& operator=(const ZeroParameters&) = delete;

  // ParameterProvider
  Result<Tensor> acquire_params(int unit) override;
  Status prefetch_params(int unit) override;
  Tensor unit_grads(int unit) override;
  Status grads_ready(int unit) override;
  Status grads_ready_from(int unit, int64_t from) override;
  bool overwrite_grads() const override;

  int stage() const { return stage_; }
  bool frozen() const { return frozen_; }
  const ZeroOptions& options() const { return options_; }
  const std::vector<CommBucket>& reduce_buckets() const { return reduce_buckets_; }
  // Parameters and gradients this rank updates: the whole unit (stage 0) or its shard.
  Tensor owned_params(int unit) const;
  Tensor owned_grads(int unit) const;
  Tensor owned_grads_all() const { return grads_.tensor(); }  // stages 0-1: the full gradient
  int64_t owned_offset(int unit) const;                       // global layout offset of owned_params(unit)

  // Whether a unit's owned gradient is final as soon as the last micro-batch's backward finished
  // it (one rank at stage 0: nothing reduces it afterwards), so that its update can start there.
  bool grads_final_in_backward() const { return stage_ == 0 && comm_.size() == 1 && !frozen_; }
  // Where grads_final_in_backward(): called from grads_ready() of the last micro-batch with each
  // unit as backward finishes it, from = 0 (the optimizer then updates it beside the rest of
  // backward), and from grads_ready_from() with the unit's elements from `from` on when backward
  // finishes those first (a layer's MLP half). Empty: nothing is called.
  void set_on_grads_final(std::function<Status(int unit, int64_t from)> fn) { on_grads_final_ = std::move(fn); }

  Status zero_grads();
  // While skip, zero_grads() leaves `unit`'s gradient alone: the caller zeroes what backward added
  // to (the embedding's deferred rows: the last step's rows, not the whole table).
  void set_zeroed_by_caller(int unit, bool skip) {
    if (zeroed_by_caller_.size() < layout_.units().size()) zeroed_by_caller_.assign(layout_.units().size(), 0);
    zeroed_by_caller_[static_cast<size_t>(unit)] = skip ? 1 : 0;
  }
  // Before each micro-batch's backward: whether it is the last of the optimizer step (stages 0-1
  // then reduce each bucket as soon as backward completes its units).
  void set_last_micro_batch(bool last) { last_micro_batch_ = last; }
  // Before each micro-batch's backward: whether it is the first of the optimizer step (stages 0-1
  // then let the model write the weight gradients instead of adding to zeros).
  void set_first_micro_batch(bool first) { first_micro_batch_ = first; }
  // After the last micro-batch: stage 0 all-reduces, stage 1 reduce-scatters, stages 2-3 have done
  // their part during backward.
  Status finish_backward();
  // Sum of squares of the whole (global) gradient, equal on every rank.
  Result<double> grad_norm_squared();
  // The same from this rank's sum over owned_grads() of every unit (summed by the optimizer).
  Result<double> global_grad_norm_squared(double local);
  // After the optimizer wrote owned_params(unit), units in forward order: stages 1-2 start the
  // all-gather of the bucket that unit completes.
  Status unit_updated(int unit);
  // After every unit_updated(). Without --overlap_comm waits for the all-gathers; with it they stay
  // in flight until acquire_params() of one of their units (the next forward) or settle_gathers().
  Status after_update();
  // Waits for every parameter all-gather still in flight (before reading or writing the full
  // parameters from outside the model's forward).
  Status settle_gathers();
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
  ZeroParameters(const ParamLayout& layout, Backend& backend, Communicator& comm, Communicator& data, int stage,
                 const ZeroOptions& options)
      : layout_(layout), backend_(backend), comm_(comm), data_(data), stage_(stage), options_(options) {}
  Status copy(Tensor dst, Tensor src);
  Tensor shard_slice(const Buffer& shards, int unit) const;
  CommType reduce_type() const;

  const ParamLayout& layout_;
  Backend& backend_;
  Communicator& comm_;
  Communicator& data_;
  int stage_;
  bool frozen_ = false;
  ZeroOptions options_;
  ZeroBufferSizes sizes_;
  std::vector<int64_t> shard_base_;  // local offset of each unit's shard inside shard buffers
  Buffer params_;                    // stages 0-2: the full parameters
  Buffer param_shards_;              // stage 3: this rank's shards (of every unit but the persistent one)
  // Stage 3's persistent unit: its parameters whole (this rank's shard inside, where the optimizer
  // writes), its gradients during backward, and the all-gather after the optimizer step.
  int persistent_ = -1;
  Buffer persistent_params_, persistent_grads_;
  std::unique_ptr<CommRequest> persistent_gather_;
  Status gather_persistent();
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
  std::function<Status(int unit, int64_t from)> on_grads_final_;
  bool last_micro_batch_ = true;
  bool first_micro_batch_ = false;
  // Per unit, the ranges (relative to the unit) that backward adds to: all but the weight tensors.
  struct ZeroRange {
    int64_t begin, numel;
  };
  std::vector<std::vector<ZeroRange>> zero_ranges_;
  std::vector<char> zeroed_by_caller_;  // per unit: set_zeroed_by_caller()
  void plan_zeroing();
  // What backward adds to in a unit's gradient laid out at `unit_grads` (zero_ranges_), appended
  // to parts; zero_added_parts() zeroes them (one launch for the small ones on a device).
  void added_parts(int unit, Tensor unit_grads, std::vector<Tensor>& parts) const;
  Status zero_added_parts(int unit, Tensor unit_grads);
  Buffer grads_;        // stages 0-1: the full gradients
  Buffer grad_shards_;  // stages 1-3: this rank's gradient shards

  // Gradient reduction. Buckets in backward order; bucket_of_unit_ maps a unit to its bucket.
  std::vector<CommBucket> reduce_buckets_;
  std::vector<int> bucket_of_unit_;
  bool pack_ = false;  // collectives read a packed / converted copy of the bucket
  // Stages 2-3: where backward writes the open bucket (two when collectives read them directly).
  Buffer grad_buckets_[2];
  // Two reductions in flight at most; a slot is drained (waited, its result stored) before reuse.
  struct ReduceSlot {
    Buffer send, recv;
    std::unique_ptr<CommRequest> in_flight;
    int bucket = -1;
  };
  ReduceSlot reduce_slots_[2];
  int next_slot_ = 0;
  Buffer reduce_convert_;                           // stages 2-3 with another reduce dtype: recv in compute dtype
  int buckets_reduced_ = 0;                         // this step, to check every bucket was reduced exactly once
  Tensor bucket_source(const CommBucket& b) const;  // the bucket's gradient in flat-layout order
  Status reduce_bucket(int bucket);
  Status drain(ReduceSlot& slot);

  // Stages 1-2: parameter all-gathers after the optimizer, buckets in forward order.
  std::vector<CommBucket> gather_buckets_;
  std::vector<int> gather_bucket_of_unit_;
  struct GatherInFlight {
    std::unique_ptr<CommRequest> request;
    int bucket = -1;
  };
  std::vector<GatherInFlight> gathers_;
  Status gather_bucket(int bucket);
  Status finish_gather(GatherInFlight& g);
  Status finish_gather_of(int unit);  // the in-flight gather of unit's bucket, if any
  double exposed_comm_seconds_ = 0;   // time spent waiting for collectives (not overlapped)
};

}  // namespace glm
