// The ZeRO facade: the pieces put together, the model's ParameterProvider and the step protocol.
#include "zero/zero_engine.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "zero/comm_buckets.h"

namespace glm {
namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

Result<std::unique_ptr<ZeroEngine>> ZeroEngine::create(const ParamLayout& layout, Backend& backend,
                                                       Communicator& comm, int stage, Communicator* data,
                                                       const ZeroOptions& options, bool frozen) {
  if (stage < 0 || stage > 3) return GLM_USER_ERROR("--zero_stage must be 0, 1, 2 or 3, got ", stage);
  if (options.offload_params && stage != 3)
    return GLM_USER_ERROR("--offload_param cpu needs --zero_stage 3 (as DeepSpeed's offload_param does): below it "
                          "every rank holds the whole model");
  if (layout.shards() != comm.size())
    return GLM_INTERNAL_ERROR("layout has ", layout.shards(), " shards for ", comm.size(), " ranks");
  if (data != nullptr && data->size() != comm.size())
    return GLM_INTERNAL_ERROR("data communicator of ", data->size(), " ranks beside ", comm.size());
  if (options.reduce_bucket_size <= 0)
    return GLM_INTERNAL_ERROR("reduce_bucket_size ", options.reduce_bucket_size, " (auto must be resolved first)");
  if (options.allgather_bucket_size <= 0 || options.prefetch_bucket_size < 0)
    return GLM_INTERNAL_ERROR("allgather_bucket_size ", options.allgather_bucket_size, ", prefetch_bucket_size ",
                              options.prefetch_bucket_size);
  if (options.grad_reduce_dtype != DType::f32 && options.grad_reduce_dtype != DType::bf16)
    return GLM_INTERNAL_ERROR("grad_reduce_dtype must be f32 or bf16");
  const ShardingPlan plan = ShardingPlan::make(stage, comm.size(), comm.rank(), frozen);
  ZeroOptions effective = options;
  effective.grad_reduce_dtype = effective_reduce_dtype(options, backend.compute_dtype(), comm.size());
  Communicator& wire = data != nullptr ? *data : comm;
  std::unique_ptr<ZeroEngine> z(new ZeroEngine(layout, backend, wire, plan));
  const ZeroBufferSizes sizes = zero_buffer_sizes(layout, stage, effective, backend.compute_dtype(), frozen);
  // Allocated in this order: parameters (stage 3: shards, gathered units, persistent unit), then
  // the persistent gradients and the reducer's buffers.
  GLM_ASSIGN_OR_RETURN(z->gatherer_, ParamGatherer::create(layout, backend, wire, plan, effective, sizes, z->waits_));
  GLM_ASSIGN_OR_RETURN(z->persistent_, PersistentUnit::create(layout, backend, wire, plan, effective.overlap_comm,
                                                              z->waits_));
  if (frozen) return z;
  if (z->persistent_) GLM_RETURN_IF_ERROR(z->persistent_->allocate_grads());
  GLM_ASSIGN_OR_RETURN(z->reducer_, GradReducer::create(layout, backend, comm, wire, plan, effective, sizes,
                                                        z->waits_, z->persistent_.get()));
  return z;
}

bool ZeroEngine::overwrite_grads() const { return !plan_.frozen && (plan_.shard_grads || step_.first_micro_batch); }

Result<Tensor> ZeroEngine::acquire_params(int unit) {
  if (persistent(unit)) return persistent_->params();  // whole on every rank
  return gatherer_->acquire(unit);
}

Status ZeroEngine::prefetch_params(int unit) { return persistent(unit) ? Status::ok() : gatherer_->prefetch(unit); }

Result<Tensor> ZeroEngine::unit_grads(int unit) {
  if (!reducer_) return Tensor{};
  return reducer_->unit_grads(unit);
}

Status ZeroEngine::grads_ready_from(int unit, int64_t from) {
  if (!reducer_ || !hook_active()) return Status::ok();
  if (from <= 0 || from >= layout_.units()[static_cast<size_t>(unit)].numel)
    return GLM_INTERNAL_ERROR("gradients of unit ", unit, " final from element ", from);
  return step_.on_grads_final(unit, from);
}

Status ZeroEngine::grads_ready(int unit) {
  if (!reducer_) return Status::ok();
  if (hook_active()) return step_.on_grads_final(unit, 0);
  return reducer_->grads_ready(unit, step_.last_micro_batch);
}

Tensor ZeroEngine::owned_params(int unit) const {
  return persistent(unit) ? persistent_->owned_params() : gatherer_->owned_params(unit);
}

int64_t ZeroEngine::owned_offset(int unit) const {
  if (!plan_.shard_optimizer) return layout_.units()[static_cast<size_t>(unit)].offset;
  return layout_.shard_offset(unit, plan_.rank);
}

Result<ZeroStep> ZeroEngine::begin_step(StepSchedule schedule) {
  if (step_.open) return GLM_INTERNAL_ERROR("begin_step() while a step is open");
  if (schedule.micro_batches <= 0) return GLM_INTERNAL_ERROR("a step of ", schedule.micro_batches, " micro-batches");
  if (grads_on_host() && schedule.micro_batches != 1)
    return GLM_INTERNAL_ERROR("gradients in host memory take one micro-batch a step, not ", schedule.micro_batches);
  step_ = OpenStep{};
  step_.open = true;
  step_.micro_batches = schedule.micro_batches;
  step_.on_grads_final = std::move(schedule.on_grads_final);
  ZeroStep step(*this);
  waits_.take();  // waits outside a step (evaluation, checkpoints) are not its exposed communication
  if (reducer_) GLM_RETURN_IF_ERROR(reducer_->zero_grads(schedule.caller_zeroed_unit));
  return step;
}

void ZeroEngine::end_step() { step_ = OpenStep{}; }

ZeroStep::~ZeroStep() {
  if (engine_ != nullptr) engine_->end_step();
}

Status ZeroStep::begin_micro_batch(int index) {
  ZeroEngine::OpenStep& s = engine_->step_;
  if (index < 0 || index >= s.micro_batches)
    return GLM_INTERNAL_ERROR("micro-batch ", index, " of a step of ", s.micro_batches);
  s.first_micro_batch = index == 0;
  s.last_micro_batch = index + 1 == s.micro_batches;
  return Status::ok();
}

Status ZeroStep::finish_backward() {
  ZeroEngine& z = *engine_;
  // Waits for overlapped buckets during backward are exposed; so is all of finish_backward's time.
  z.step_.exposed_seconds += z.waits_.take();
  if (!z.reducer_) return Status::ok();
  const auto start = std::chrono::steady_clock::now();
  const Status s = z.reducer_->finish_backward();
  z.step_.exposed_seconds += seconds_since(start);
  z.waits_.take();  // inside the time above
  return s;
}

Status ZeroStep::finish_update() {
  ZeroEngine& z = *engine_;
  const auto start = std::chrono::steady_clock::now();
  const Status s = z.finish_update();
  z.step_.exposed_seconds += seconds_since(start);
  z.waits_.take();  // inside the time above, or the updates' (which overlap)
  return s;
}

Result<StepStats> ZeroStep::finish() {
  ZeroEngine& z = *engine_;
  StepStats stats;
  stats.host_exposed_comm_seconds = z.step_.exposed_seconds;
  GLM_ASSIGN_OR_RETURN(stats.device_exposed_comm_seconds, z.data_.take_device_exposed_seconds());
  return stats;
}

Status ZeroEngine::unit_updated(int unit) {
  if (plan_.frozen) return GLM_INTERNAL_ERROR("unit_updated(", unit, ") on frozen parameters");
  if (persistent(unit)) return persistent_->unit_updated();
  return gatherer_->unit_updated(unit);
}

Status ZeroEngine::finish_update() {
  if (!plan_.frozen) {
    GLM_RETURN_IF_ERROR(gatherer_->finish_update());
    if (persistent_) GLM_RETURN_IF_ERROR(persistent_->finish_update());
  }
  return forget_gathered();
}

// Gathered copies are stale once parameters change: finish any gather in flight, then drop them.
Status ZeroEngine::forget_gathered() {
  if (persistent_) GLM_RETURN_IF_ERROR(persistent_->settle());
  return gatherer_->forget_gathered();
}

Result<double> ZeroStep::grad_norm_squared() {
  if (!engine_->reducer_) return 0.0;
  return engine_->reducer_->grad_norm_squared();
}

Result<double> ZeroStep::global_grad_norm_squared(double local) {
  if (!engine_->reducer_) return 0.0;
  return engine_->reducer_->global_grad_norm_squared(local);
}

Status ZeroEngine::fill_stored(const std::function<Status(Tensor dst, int64_t global_begin)>& fill, int64_t begin,
                               int64_t end) {
  GLM_RETURN_IF_ERROR(settle_gathers());
  GLM_RETURN_IF_ERROR(forget_gathered());
  GLM_RETURN_IF_ERROR(gatherer_->fill_stored(fill, begin, end));
  if (!persistent_) return Status::ok();
  return fill(persistent_->params(), layout_.units()[static_cast<size_t>(persistent_->unit())].offset);
}

Status ZeroEngine::read_stored(int unit, const std::function<Status(Tensor stored)>& read) {
  if (!params_on_host(unit)) return read(owned_params(unit));
  GLM_RETURN_IF_ERROR(settle_gathers());
  GLM_RETURN_IF_ERROR(forget_gathered());
  return gatherer_->read_stored(unit, read);
}

Status ZeroEngine::set_range(int64_t begin, std::span<const float> values) {
  const int64_t end = begin + static_cast<int64_t>(values.size());
  return fill_stored(
      [&](Tensor dst, int64_t dst_begin) -> Status {
        const int64_t lo = std::max(begin, dst_begin), hi = std::min(end, dst_begin + dst.numel);
        if (lo >= hi) return Status::ok();
        GLM_ASSIGN_OR_RETURN(Buffer staging, backend_.allocate(hi - lo, DType::f32));
        GLM_RETURN_IF_ERROR(backend_.upload(staging.tensor(), values.data() + (lo - begin)));
        return backend_.convert(dst.slice(lo - dst_begin, hi - lo), staging.tensor());
      },
      begin, end);
}

ZeroMemory ZeroEngine::memory() const {
  ZeroMemory m;
  m.parameter_bytes = gatherer_->param_bytes() + (persistent_ ? persistent_->param_bytes() : 0);
  m.host_parameter_bytes = gatherer_->host_param_bytes();
  m.gradient_bytes = reducer_ ? reducer_->grad_bytes() : 0;
  m.host_gradient_bytes = reducer_ ? reducer_->host_grad_bytes() : 0;
  m.buffer_bytes = gatherer_->buffer_bytes() + (reducer_ ? reducer_->buffer_bytes() : 0) +
                   (persistent_ ? persistent_->grad_bytes() : 0);
  return m;
}

}  // namespace glm
