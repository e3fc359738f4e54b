// ZeRO stages 0-3 over the flat layout: which rank holds which parameters, gradients and optimizer
// state, and the step protocol the trainer drives. Every unit (embedding, each layer, head) is
// split into equal shards, rank r owning the r-th (ParamLayout with shards = world size).
//   0: everything replicated; gradients all-reduced in buckets.
//   1: optimizer state sharded; gradients reduce-scattered in buckets; each rank updates its
//      shards, then parameters are all-gathered in buckets.
//   2: gradients sharded too: each bucket is reduce-scattered as soon as backward filled it and
//      accumulated into this rank's shards; only bucket-sized gradient buffers exist.
//   3: parameters sharded too: a unit is all-gathered just before its forward and its backward,
//      the next unit's gather prefetched into a second buffer while the current one computes;
//      small tensors may be persistent instead (zero/persistent_unit.h).
// The pieces: GradReducer (zero/grad_reducer.h), ParamGatherer (zero/param_gatherer.h) and
// PersistentUnit; this facade implements the model's ParameterProvider over them.
// With --overlap_comm, stages 0-1 start each bucket's reduction during the last micro-batch's
// backward as soon as its units are complete, stages 2-3 as soon as the bucket is full, and
// stages 1-2 each bucket's parameter all-gather as soon as the optimizer updated its units.
// Without it every collective is issued after its producer finished and waited for at once.
//
// One optimizer step:
//   ZeroStep step = begin_step(schedule)      zeroes the gradients
//   step.begin_micro_batch(i); model backward  (per micro-batch)
//   step.finish_backward()                    every reduction done (then grad_norm_squared())
//   step.update_units(fn); step.finish_update()  fn(u) writes owned_params(u); gathers follow
//   step.finish()                             the step's exposed communication
// Destroying the ZeroStep ends the step, finished or failed (the update hook is dropped).
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "model/glm4_model.h"
#include "mpi/communicator.h"
#include "zero/collectives.h"
#include "zero/grad_reducer.h"
#include "zero/param_gatherer.h"
#include "zero/persistent_unit.h"
#include "zero/sharding_plan.h"
#include "zero/zero_options.h"

namespace glm {

struct ZeroMemory {
  int64_t parameter_bytes = 0, gradient_bytes = 0, buffer_bytes = 0;
  int64_t host_parameter_bytes = 0;  // --offload_param cpu: the shards in host memory
  int64_t host_gradient_bytes = 0;   // ZeroOptions::offload_grads: the gradient shards in host memory
};

struct StepSchedule {
  int micro_batches = 1;
  // A unit whose gradient the caller zeroes itself (the embedding's deferred rows: the last
  // step's rows, not the whole table); -1: none.
  int caller_zeroed_unit = -1;
  // Where grads_final_in_backward(): called during the last micro-batch's backward with each unit
  // as backward finishes it, from = 0 (the optimizer then updates it beside the rest of backward),
  // and with the unit's elements from `from` on when backward finishes those first (a layer's MLP
  // half). Empty: nothing is called.
  std::function<Status(int unit, int64_t from)> on_grads_final;
};

struct StepStats {
  double host_exposed_comm_seconds = 0;    // this rank waiting on collectives, nothing overlapping
  double device_exposed_comm_seconds = 0;  // compute waiting on device-ordered collectives (NCCL)
  double exposed_comm_seconds() const { return host_exposed_comm_seconds + device_exposed_comm_seconds; }
};

class ZeroEngine;

class ZeroStep {
 public:
  ZeroStep(ZeroStep&& other) noexcept : engine_(other.engine_) { other.engine_ = nullptr; }
  ZeroStep& operator=(ZeroStep&&) = delete;
  ZeroStep(const ZeroStep&) = delete;
  ZeroStep& operator=(const ZeroStep&) = delete;
  ~ZeroStep();

  // Before micro-batch `index`'s backward (the first writes weight gradients afresh; the last's
  // backward starts the stage 0-1 reductions).
  Status begin_micro_batch(int index);
  // After the last micro-batch: stage 0 all-reduces, stage 1 reduce-scatters what backward did not.
  Status finish_backward();
  // After finish_backward(): the sum of squares of the whole (global) gradient, equal on every rank.
  Result<double> grad_norm_squared();
  // The same from this rank's sum over owned_grads() of every unit (summed by the optimizer).
  Result<double> global_grad_norm_squared(double local);
  // update(u) for every unit in forward order (none when frozen), each followed by the start of
  // the collectives that wait for it (stages 1-2: its bucket's all-gather; stage 3: the persistent
  // unit's). update(u) writes owned_params(u).
  template <class Update>
  Status update_units(Update&& update);
  // After update_units() and any other update: without --overlap_comm waits for the all-gathers;
  // with it they stay in flight until acquire_params() of one of their units or settle_gathers().
  Status finish_update();
  // The step's exposed communication (synchronizes with device-ordered collectives).
  Result<StepStats> finish();

 private:
  friend class ZeroEngine;
  explicit ZeroStep(ZeroEngine& engine) : engine_(&engine) {}
  ZeroEngine* engine_;
};

class ZeroEngine final : public ParameterProvider {
 public:
  // comm carries host scalars (norms, counts); data, when given, the parameter and gradient
  // buffers (NCCL over device memory), otherwise comm does both (MPI over host memory).
  // frozen (LoRA's base model): parameters only, no gradient buffers and no gradient collectives;
  // unit_grads() is empty. Stage 3 still partitions the parameters and gathers them just in time;
  // stages 0-2 keep them replicated (they shard only gradients and optimizer state, which a frozen
  // model has none of).
  static Result<std::unique_ptr<ZeroEngine>> create(const ParamLayout& layout, Backend& backend, Communicator& comm,
                                                    int stage, Communicator* data = nullptr,
                                                    const ZeroOptions& options = ZeroOptions{}, bool frozen = false);
  ~ZeroEngine() override = default;
  ZeroEngine(const ZeroEngine&) = delete;
  ZeroEngine& operator=(const ZeroEngine&) = delete;

  // ParameterProvider
  Result<Tensor> acquire_params(int unit) override;
  Status prefetch_params(int unit) override;
  Result<Tensor> unit_grads(int unit) override;
  Status grads_ready(int unit) override;
  Status grads_ready_from(int unit, int64_t from) override;
  bool overwrite_grads() const override;

  int stage() const { return plan_.stage; }
  bool frozen() const { return plan_.frozen; }
  const ShardingPlan& plan() const { return plan_; }
  int units() const { return static_cast<int>(layout_.units().size()); }
  // Parameters and gradients this rank updates: the whole unit (stage 0) or its shard; in host
  // memory where params_on_host(unit) (--offload_param cpu: the units of offloaded_param_units(),
  // never the persistent one).
  Tensor owned_params(int unit) const;
  bool params_on_host(int unit) const { return !persistent(unit) && gatherer_->params_on_host(unit); }
  Tensor owned_grads(int unit) const { return reducer_ ? reducer_->owned_grads(unit) : Tensor{}; }
  bool grads_on_host() const { return reducer_ && reducer_->grads_on_host(); }  // ZeroOptions::offload_grads
  Tensor owned_grads_all() const { return reducer_ ? reducer_->full_grads() : Tensor{}; }  // stages 0-1
  int64_t owned_offset(int unit) const;  // global layout offset of owned_params(unit)
  // Whether a unit's owned gradient is final as soon as the last micro-batch's backward finished
  // it (one rank at stage 0: nothing reduces it afterwards), so that its update can start there.
  bool grads_final_in_backward() const { return plan_.grads_final_in_backward(); }

  // Opens one optimizer step (see the file comment); zeroes the gradients.
  Result<ZeroStep> begin_step(StepSchedule schedule);

  // Outside a step, after the owned parameters were written (checkpoint load): write(u) for units
  // [0, units) (those this rank's optimizer holds: every unit, or none), each followed by its
  // gathers, then the parameters are gathered again where ZeRO keeps full copies.
  template <class Write>
  Status params_written(int units, Write&& write);
  // Waits for every parameter all-gather still in flight (before reading or writing the full
  // parameters from outside the model's forward).
  Status settle_gathers() { return gatherer_->settle(); }
  // Writes global layout range [begin, begin + values.size()) from host f32 values, keeping only
  // what this rank stores.
  Status set_range(int64_t begin, std::span<const float> values);
  // read(stored) over owned_params(unit) in backend memory: the parameters themselves, or (host
  // memory) a copy in a gathered buffer, which drops the gathered units.
  Status read_stored(int unit, const std::function<Status(Tensor stored)>& read);
  // Fills what this rank stores through fill(dst, global_begin) (dst in backend memory), where it
  // meets the global range [begin, end).
  Status fill_stored(const std::function<Status(Tensor dst, int64_t global_begin)>& fill, int64_t begin = 0,
                     int64_t end = INT64_MAX);
  ZeroMemory memory() const;

 private:
  friend class ZeroStep;
  ZeroEngine(const ParamLayout& layout, Backend& backend, Communicator& data, const ShardingPlan& plan)
      : layout_(layout), backend_(backend), data_(data), plan_(plan) {}
  bool persistent(int unit) const { return persistent_ && unit == persistent_->unit(); }
  Status unit_updated(int unit);
  Status finish_update();  // untimed: the all-gathers' serial path, then the stale copies dropped
  Status forget_gathered();
  void end_step();
  bool hook_active() const { return step_.on_grads_final && step_.last_micro_batch && grads_final_in_backward(); }

  const ParamLayout& layout_;
  Backend& backend_;
  Communicator& data_;  // the wire of parameters and gradients (device-exposed waits)
  ShardingPlan plan_;
  CommWaits waits_;  // before the pieces, which wait through it until they are gone
  std::unique_ptr<ParamGatherer> gatherer_;
  std::unique_ptr<PersistentUnit> persistent_;  // stage 3 with persistent tensors
  std::unique_ptr<GradReducer> reducer_;        // none when frozen

  // The open step (begin_step() to ~ZeroStep).
  struct OpenStep {
    bool open = false;
    int micro_batches = 1;
    std::function<Status(int, int64_t)> on_grads_final;
    bool first_micro_batch = false, last_micro_batch = true;
    double exposed_seconds = 0;  // host waits of backward, finish_backward's and finish_update's time
  };
  OpenStep step_;
};

template <class Update>
Status ZeroStep::update_units(Update&& update) {
  if (engine_->frozen()) return Status::ok();
  for (int u = 0; u < engine_->units(); ++u) {
    GLM_RETURN_IF_ERROR(update(u));
    GLM_RETURN_IF_ERROR(engine_->unit_updated(u));
  }
  return Status::ok();
}

template <class Write>
Status ZeroEngine::params_written(int units, Write&& write) {
  for (int u = 0; u < units; ++u) {
    GLM_RETURN_IF_ERROR(write(u));
    GLM_RETURN_IF_ERROR(unit_updated(u));
  }
  GLM_RETURN_IF_ERROR(finish_update());
  waits_.take();  // not a step's
  return Status::ok();
}

}  // namespace glm
