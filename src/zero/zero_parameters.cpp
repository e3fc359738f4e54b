// ZeRO bookkeeping and collectives; collectives of one rank become copies.
#include "zero/zero_parameters.h"

#include <algorithm>

#include "mpi/fatal.h"

namespace glm {
namespace {
CommType comm_type(DType d) {
  switch (d) {
    case DType::f64:
      return CommType::f64;
    case DType::bf16:
      return CommType::bf16;
    case DType::i32:
      return CommType::i32;
    case DType::f32:
      break;
  }
  return CommType::f32;
}
}  // namespace

Result<std::unique_ptr<ZeroParameters>> ZeroParameters::create(const ParamLayout& layout, Backend& backend,
                                                               Communicator& comm, int stage, Communicator* data) {
  if (stage < 0 || stage > 3) return GLM_USER_ERROR("--zero_stage must be 0, 1, 2 or 3, got ", stage);
  if (layout.shards() != comm.size())
    return GLM_INTERNAL_ERROR("layout has ", layout.shards(), " shards for ", comm.size(), " ranks");
  if (data != nullptr && data->size() != comm.size())
    return GLM_INTERNAL_ERROR("data communicator of ", data->size(), " ranks beside ", comm.size());
  std::unique_ptr<ZeroParameters> z(new ZeroParameters(layout, backend, comm, data != nullptr ? *data : comm, stage));
  const DType dt = backend.compute_dtype();
  const int units = static_cast<int>(layout.units().size());
  int64_t shard_total = 0, largest_unit = 0, largest_shard = 0;
  for (int u = 0; u < units; ++u) {
    z->shard_base_.push_back(shard_total);
    shard_total += layout.shard_numel(u);
    largest_unit = std::max(largest_unit, layout.units()[static_cast<size_t>(u)].numel);
    largest_shard = std::max(largest_shard, layout.shard_numel(u));
  }
  auto alloc = [&](Buffer& b, int64_t n) -> Status {
    GLM_ASSIGN_OR_RETURN(b, backend.allocate(n, dt));
    return Status::ok();
  };
  if (stage <= 2) GLM_RETURN_IF_ERROR(alloc(z->params_, layout.total_numel()));
  if (stage == 3) {
    GLM_RETURN_IF_ERROR(alloc(z->param_shards_, shard_total));
    for (auto& g : z->gathered_) GLM_RETURN_IF_ERROR(alloc(g.params, largest_unit));
  }
  if (stage <= 1) GLM_RETURN_IF_ERROR(alloc(z->grads_, layout.total_numel()));
  if (stage >= 1) GLM_RETURN_IF_ERROR(alloc(z->grad_shards_, shard_total));
  if (stage >= 2) {
    for (auto& b : z->buckets_) {
      GLM_RETURN_IF_ERROR(alloc(b.grads, largest_unit));
      GLM_RETURN_IF_ERROR(alloc(b.scattered, largest_shard));
    }
  }
  return z;
}

Tensor ZeroParameters::shard_slice(const Buffer& shards, int unit) const {
  return shards.slice(shard_base_[static_cast<size_t>(unit)], layout_.shard_numel(unit));
}

Status ZeroParameters::copy(Tensor dst, Tensor src) { return backend_.convert(dst, src); }

Status ZeroParameters::all_gather_unit(Tensor shard, Tensor full) {
  if (comm_.size() == 1) return copy(full, shard);
  return data_.all_gather(shard.data, full.data, static_cast<size_t>(shard.numel), comm_type(shard.dtype));
}

Status ZeroParameters::reduce_scatter_unit(Tensor full, Tensor shard) {
  if (comm_.size() == 1) return copy(shard, full);
  return data_.reduce_scatter(full.data, shard.data, static_cast<size_t>(shard.numel), comm_type(full.dtype),
                              ReduceOp::sum);
}

Result<Tensor> ZeroParameters::acquire_params(int unit) {
  const ParamUnit& u = layout_.units()[static_cast<size_t>(unit)];
  if (stage_ <= 2) return params_.slice(u.offset, u.numel);
  // Stage 3: the prefetched (or still held) copy, else gather now.
  int slot = gathered_[0].unit == unit ? 0 : (gathered_[1].unit == unit ? 1 : -1);
  if (slot < 0) {
    slot = held_slot_ < 0 ? 0 : held_slot_ ^ 1;
    GLM_RETURN_IF_ERROR(gather_into(slot, unit));
  }
  GLM_RETURN_IF_ERROR(settle_slot(gathered_[slot]));
  held_slot_ = slot;
  return gathered_[slot].params.slice(0, u.numel);
}

Status ZeroParameters::prefetch_params(int unit) {
  if (stage_ != 3 || gathered_[0].unit == unit || gathered_[1].unit == unit) return Status::ok();
  // Into the slot the model does not hold. On a device communicator the gather is ordered after
  // all compute enqueued so far, so it cannot overwrite parameters a queued kernel still reads.
  return gather_into(held_slot_ < 0 ? 0 : held_slot_ ^ 1, unit);
}

Status ZeroParameters::gather_into(int slot, int unit) {
  Gathered& g = gathered_[slot];
  GLM_RETURN_IF_ERROR(settle_slot(g));  // a prefetch nobody used must finish before reuse
  const ParamUnit& u = layout_.units()[static_cast<size_t>(unit)];
  Tensor shard = shard_slice(param_shards_, unit), full = g.params.slice(0, u.numel);
  g.unit = unit;
  if (comm_.size() == 1) return copy(full, shard);
  if (!data_.device_buffers()) GLM_RETURN_IF_ERROR(backend_.synchronize());
  g.in_flight = data_.start_all_gather(shard.data, full.data, static_cast<size_t>(shard.numel), comm_type(shard.dtype));
  return Status::ok();
}

Status ZeroParameters::wait_timed(std::unique_ptr<CommRequest>& request) {
  if (!request) return Status::ok();
  const auto start = std::chrono::steady_clock::now();
  Status s = request->wait();
  exposed_comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  request.reset();
  return s;
}

Status ZeroParameters::settle_slot(Gathered& g) { return wait_timed(g.in_flight); }

// Gathered copies are stale once parameters change: finish any gather in flight, then drop them.
Status ZeroParameters::forget_gathered() {
  for (auto& g : gathered_) {
    GLM_RETURN_IF_ERROR(settle_slot(g));
    g.unit = -1;
  }
  held_slot_ = -1;
  return Status::ok();
}

Tensor ZeroParameters::unit_grads(int unit) {
  const ParamUnit& u = layout_.units()[static_cast<size_t>(unit)];
  if (stage_ <= 1) return grads_.slice(u.offset, u.numel);
  // Stages 2-3: a free bucket; the model accumulates this micro-batch's gradient of the unit into it.
  Bucket& bucket = buckets_[current_bucket_];
  const Status drained = drain(bucket);
  if (!drained.is_ok()) fatal_status(drained);  // a collective failed: the job cannot go on
  Tensor b = bucket.grads.slice(0, u.numel);
  const Status zeroed = backend_.zero(b);
  if (!zeroed.is_ok()) fatal_status(zeroed);
  return b;
}

// Waits for a bucket's reduce-scatter and adds the result to this rank's gradient shard.
Status ZeroParameters::drain(Bucket& b) {
  if (b.unit < 0) return Status::ok();
  Tensor shard = shard_slice(grad_shards_, b.unit);
  GLM_RETURN_IF_ERROR(wait_timed(b.in_flight));
  b.unit = -1;
  return backend_.add(shard, shard, b.scattered.slice(0, shard.numel), shard.numel);  // accumulate
}

Status ZeroParameters::grads_ready(int unit) {
  const ParamUnit& u = layout_.units()[static_cast<size_t>(unit)];
  if (stage_ <= 1) {
    // The unit's gradient is final once the last micro-batch's backward finished it: reduce it
    // now, overlapping the rest of backward.
    if (!last_micro_batch_ || comm_.size() == 1) return Status::ok();
    if (!data_.device_buffers()) GLM_RETURN_IF_ERROR(backend_.synchronize());
    Tensor g = grads_.slice(u.offset, u.numel);
    if (stage_ == 0) {
      pending_.push_back(
          data_.start_all_reduce(g.data, g.data, static_cast<size_t>(g.numel), comm_type(g.dtype), ReduceOp::sum));
    } else {
      Tensor shard = shard_slice(grad_shards_, unit);
      pending_.push_back(data_.start_reduce_scatter(g.data, shard.data, static_cast<size_t>(shard.numel),
                                                    comm_type(g.dtype), ReduceOp::sum));
    }
    return Status::ok();
  }
  Bucket& b = buckets_[current_bucket_];
  Tensor full = b.grads.slice(0, u.numel), shard = b.scattered.slice(0, layout_.shard_numel(unit));
  b.unit = unit;
  if (comm_.size() == 1) {
    GLM_RETURN_IF_ERROR(copy(shard, full));
  } else {
    // MPI reads host memory: the backward's results must be there first. NCCL orders itself
    // after the compute stream.
    if (!data_.device_buffers()) GLM_RETURN_IF_ERROR(backend_.synchronize());
    b.in_flight = data_.start_reduce_scatter(full.data, shard.data, static_cast<size_t>(shard.numel),
                                             comm_type(full.dtype), ReduceOp::sum);
  }
  current_bucket_ ^= 1;  // backward continues into the other bucket while this one reduces
  return Status::ok();
}

double ZeroParameters::take_exposed_comm_seconds() {
  const double s = exposed_comm_seconds_;
  exposed_comm_seconds_ = 0;
  return s;
}

Result<double> ZeroParameters::take_device_exposed_comm_seconds() { return data_.take_device_exposed_seconds(); }

Tensor ZeroParameters::owned_params(int unit) const {
  const ParamUnit& u = layout_.units()[static_cast<size_t>(unit)];
  if (stage_ == 0) return params_.slice(u.offset, u.numel);
  if (stage_ == 3) return shard_slice(param_shards_, unit);
  return params_.slice(layout_.shard_offset(unit, comm_.rank()), layout_.shard_numel(unit));
}

Tensor ZeroParameters::owned_grads(int unit) const {
  const ParamUnit& u = layout_.units()[static_cast<size_t>(unit)];
  if (stage_ == 0) return grads_.slice(u.offset, u.numel);
  return shard_slice(grad_shards_, unit);
}

int64_t ZeroParameters::owned_offset(int unit) const {
  return stage_ == 0 ? layout_.units()[static_cast<size_t>(unit)].offset : layout_.shard_offset(unit, comm_.rank());
}

Status ZeroParameters::zero_grads() {
  if (grads_.numel() > 0) GLM_RETURN_IF_ERROR(backend_.zero(grads_.tensor()));
  if (grad_shards_.numel() > 0) GLM_RETURN_IF_ERROR(backend_.zero(grad_shards_.tensor()));
  return Status::ok();
}

Status ZeroParameters::finish_backward() {
  for (auto& b : buckets_) GLM_RETURN_IF_ERROR(drain(b));
  const int units = static_cast<int>(layout_.units().size());
  if (stage_ <= 1 && comm_.size() > 1) {
    // Started by grads_ready during the last micro-batch; every unit must have been reduced.
    if (static_cast<int>(pending_.size()) != units)
      return GLM_INTERNAL_ERROR(pending_.size(), " gradient reductions started for ", units,
                                " units (set_last_micro_batch not called before the last backward?)");
    for (auto& r : pending_) GLM_RETURN_IF_ERROR(wait_timed(r));
    pending_.clear();
  }
  if (stage_ == 1 && comm_.size() == 1) {
    for (int u = 0; u < units; ++u) {
      const ParamUnit& unit = layout_.units()[static_cast<size_t>(u)];
      GLM_RETURN_IF_ERROR(reduce_scatter_unit(grads_.slice(unit.offset, unit.numel), shard_slice(grad_shards_, u)));
    }
  }
  return Status::ok();
}

Result<double> ZeroParameters::grad_norm_squared() {
  if (stage_ == 0) return backend_.sum_squares(grads_.tensor());
  GLM_ASSIGN_OR_RETURN(double local, backend_.sum_squares(grad_shards_.tensor()));
  GLM_RETURN_IF_ERROR(comm_.all_reduce(&local, &local, 1, CommType::f64, ReduceOp::sum));
  return local;
}

Status ZeroParameters::unit_updated(int u) {
  if ((stage_ != 1 && stage_ != 2) || comm_.size() == 1) return Status::ok();  // one rank: the shard is the unit
  const ParamUnit& unit = layout_.units()[static_cast<size_t>(u)];
  Tensor full = params_.slice(unit.offset, unit.numel);
  if (!data_.device_buffers()) GLM_RETURN_IF_ERROR(backend_.synchronize());
  // In place: this rank's shard already sits at its block of the unit.
  pending_.push_back(data_.start_all_gather(owned_params(u).data, full.data,
                                            static_cast<size_t>(layout_.shard_numel(u)), comm_type(full.dtype)));
  return Status::ok();
}

Status ZeroParameters::after_update() {
  for (auto& r : pending_) GLM_RETURN_IF_ERROR(wait_timed(r));
  pending_.clear();
  return forget_gathered();
}

Status ZeroParameters::fill_stored(const std::function<Status(Tensor dst, int64_t global_begin)>& fill) {
  GLM_RETURN_IF_ERROR(forget_gathered());
  if (stage_ <= 2) return fill(params_.tensor(), 0);
  const int units = static_cast<int>(layout_.units().size());
  for (int u = 0; u < units; ++u)
    GLM_RETURN_IF_ERROR(fill(shard_slice(param_shards_, u), layout_.shard_offset(u, comm_.rank())));
  return Status::ok();
}

Status ZeroParameters::set_range(int64_t begin, std::span<const float> values) {
  const int64_t end = begin + static_cast<int64_t>(values.size());
  return fill_stored([&](Tensor dst, int64_t dst_begin) -> Status {
    const int64_t lo = std::max(begin, dst_begin), hi = std::min(end, dst_begin + dst.numel);
    if (lo >= hi) return Status::ok();
    GLM_ASSIGN_OR_RETURN(Buffer staging, backend_.allocate(hi - lo, DType::f32));
    GLM_RETURN_IF_ERROR(backend_.upload(staging.tensor(), values.data() + (lo - begin)));
    return backend_.convert(dst.slice(lo - dst_begin, hi - lo), staging.tensor());
  });
}

ZeroMemory ZeroParameters::memory() const {
  ZeroMemory m;
  m.parameter_bytes = static_cast<int64_t>(params_.tensor().bytes() + param_shards_.tensor().bytes());
  m.gradient_bytes = static_cast<int64_t>(grads_.tensor().bytes() + grad_shards_.tensor().bytes());
  m.buffer_bytes = 0;
  for (const auto& g : gathered_) m.buffer_bytes += static_cast<int64_t>(g.params.tensor().bytes());
  for (const auto& b : buckets_)
    m.buffer_bytes += static_cast<int64_t>(b.grads.tensor().bytes() + b.scattered.tensor().bytes());
  return m;
}

}  // namespace glm
