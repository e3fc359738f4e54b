// ZeRO-3's persistent unit (DeepSpeed's persistent parameters): small tensors every rank keeps
// whole, never gathered per layer. Their gradients are held whole through backward (every unit's
// backward adds to them) and reduced as the last bucket; after the optimizer updated this rank's
// shard in place, one all-gather refreshes every rank's copy.
#pragma once

#include <memory>

#include "model/backend.h"
#include "model/param_layout.h"
#include "mpi/communicator.h"
#include "zero/collectives.h"
#include "zero/sharding_plan.h"

namespace glm {

class PersistentUnit {
 public:
  // nullptr when the layout has no persistent unit. Parameters only: allocate_grads() adds the
  // gradient buffer (not for a frozen model), keeping ZeRO's order of allocations.
  static Result<std::unique_ptr<PersistentUnit>> create(const ParamLayout& layout, Backend& backend,
                                                        Communicator& data, const ShardingPlan& plan,
                                                        bool overlap_comm, CommWaits& waits);
  ~PersistentUnit() = default;
  PersistentUnit(const PersistentUnit&) = delete;
  PersistentUnit& operator=(const PersistentUnit&) = delete;

  Status allocate_grads();
  int unit() const { return unit_; }
  Tensor params() const { return params_.tensor(); }  // whole
  Tensor owned_params() const;                         // this rank's shard, inside params()
  Tensor grads() const { return grads_.tensor(); }    // whole, during backward
  // After the optimizer wrote owned_params(): with --overlap_comm the all-gather starts here.
  Status unit_updated();
  // After every unit's update: without --overlap_comm the all-gather runs (and is waited for) here.
  Status finish_update();
  // Waits for the all-gather, if one is in flight.
  Status settle() { return waits_.wait(gather_); }
  int64_t param_bytes() const { return static_cast<int64_t>(params_.tensor().bytes()); }
  int64_t grad_bytes() const { return static_cast<int64_t>(grads_.tensor().bytes()); }

 private:
  PersistentUnit(const ParamLayout& layout, Backend& backend, Communicator& data, const ShardingPlan& plan,
                 bool overlap_comm, CommWaits& waits, int unit)
      : layout_(layout), backend_(backend), data_(data), plan_(plan), overlap_comm_(overlap_comm), waits_(waits),
        unit_(unit) {}
  Status start_gather();

  const ParamLayout& layout_;
  Backend& backend_;
  Communicator& data_;
  ShardingPlan plan_;
  bool overlap_comm_;
  CommWaits& waits_;
  int unit_;
  CommType type_ = CommType::f32;
  Buffer params_, grads_;
  std::unique_ptr<CommRequest> gather_;
};

}  // namespace glm
