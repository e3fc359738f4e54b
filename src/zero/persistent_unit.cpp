// ZeRO-3's persistent unit: its buffers and its one all-gather after the optimizer step.
#include "zero/persistent_unit.h"

namespace glm {

Result<std::unique_ptr<PersistentUnit>> PersistentUnit::create(const ParamLayout& layout, Backend& backend,
                                                               Communicator& data, const ShardingPlan& plan,
                                                               bool overlap_comm, CommWaits& waits) {
  const int unit = layout.persistent_unit();
  if (unit < 0) return std::unique_ptr<PersistentUnit>();
  if (!plan.shard_params)
    return GLM_INTERNAL_ERROR("a layout with persistent tensors at ZeRO stage ", plan.stage, " (only stage 3 has them)");
  std::unique_ptr<PersistentUnit> p(new PersistentUnit(layout, backend, data, plan, overlap_comm, waits, unit));
  const DType dt = backend.compute_dtype();
  GLM_ASSIGN_OR_RETURN(p->type_, comm_type(dt));
  const int64_t numel = layout.units()[static_cast<size_t>(unit)].numel;
  GLM_ASSIGN_OR_RETURN(p->params_, backend.allocate(numel, dt));
  return p;
}

Status PersistentUnit::allocate_grads() {
  GLM_ASSIGN_OR_RETURN(grads_, backend_.allocate(params_.numel(), backend_.compute_dtype()));
  return Status::ok();
}

Tensor PersistentUnit::owned_params() const {
  const int64_t shard = layout_.shard_numel(unit_);
  return params_.slice(plan_.rank * shard, shard);
}

Status PersistentUnit::unit_updated() {
  if (!plan_.distributed() || !overlap_comm_) return Status::ok();
  return start_gather();
}

Status PersistentUnit::finish_update() {
  if (!plan_.distributed() || overlap_comm_) return Status::ok();
  return start_gather();
}

// One collective for every persistent tensor: this rank's updated shard sits in place inside the
// whole unit, as DeepSpeed's post-step all-gather of its persistent parameters.
Status PersistentUnit::start_gather() {
  if (gather_) return GLM_INTERNAL_ERROR("persistent all-gather started twice");
  if (!data_.device_buffers()) GLM_RETURN_IF_ERROR(backend_.synchronize());
  gather_ = data_.start_all_gather(owned_params().data, params_.tensor().data,
                                   static_cast<size_t>(layout_.shard_numel(unit_)), type_);
  if (!overlap_comm_) return waits_.wait(gather_);
  return Status::ok();
}

}  // namespace glm
