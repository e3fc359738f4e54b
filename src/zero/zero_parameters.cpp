// ZeRO bookkeeping and collectives; collectives of one rank become copies.
#include "zero/zero_parameters.h"

#include <algorithm>
#include <cstdio>

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
    case DType::i16:  // split masters' low halves: never communicated (options allow f32 or bf16)
      GLM_FATAL("no collective type for i16");
  }
  return CommType::f32;
}
}  // namespace

Result<std::unique_ptr<ZeroParameters>> ZeroParameters::create(const ParamLayout& layout, Backend& backend,
                                                               Communicator& comm, int stage, Communicator* data,
                                                               const ZeroOptions& options, bool frozen) {
  if (stage < 0 || stage > 3) return GLM_USER_ERROR("--zero_stage must be 0, 1, 2 or 3, got ", stage);
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
  const int persistent = layout.persistent_unit();
  if (persistent >= 0 && stage != 3)
    return GLM_INTERNAL_ERROR("a layout with persistent tensors at ZeRO stage ", stage, " (only stage 3 has them)");
  std::unique_ptr<ZeroParameters> z(
      new ZeroParameters(layout, backend, comm, data != nullptr ? *data : comm, stage, options));
  const DType dt = backend.compute_dtype();
  z->frozen_ = frozen;
  z->persistent_ = persistent;
  z->options_.grad_reduce_dtype = effective_reduce_dtype(options, dt, comm.size());
  const DType rt = z->options_.grad_reduce_dtype;
  const int units = static_cast<int>(layout.units().size());
  int64_t shard_total = 0;
  for (int u = 0; u < units; ++u) {
    z->shard_base_.push_back(shard_total);
    shard_total += layout.shard_numel(u);
  }
  z->sizes_ = zero_buffer_sizes(layout, stage, z->options_, dt, frozen);
  const ZeroBufferSizes& sz = z->sizes_;
  auto alloc = [&](Buffer& b, int64_t n, DType type) -> Status {
    GLM_ASSIGN_OR_RETURN(b, backend.allocate(n, type));
    return Status::ok();
  };
  // Stage 3: the partitioned units' shards (the persistent unit is last, so the others' shard_base_
  // index both shard buffers), the gathered units, the persistent unit whole.
  auto alloc_stage3_params = [&]() -> Status {
    const int64_t persistent_shard = persistent >= 0 ? layout.shard_numel(persistent) : 0;
    GLM_RETURN_IF_ERROR(alloc(z->param_shards_, shard_total - persistent_shard, dt));
    for (auto& g : z->gathered_) GLM_RETURN_IF_ERROR(alloc(g.params, sz.gathered_unit_numel, dt));
    if (persistent >= 0)
      GLM_RETURN_IF_ERROR(alloc(z->persistent_params_, layout.units()[static_cast<size_t>(persistent)].numel, dt));
    return Status::ok();
  };
  if (frozen) {
    if (stage <= 2) GLM_RETURN_IF_ERROR(alloc(z->params_, layout.total_numel(), dt));
    if (stage == 3) GLM_RETURN_IF_ERROR(alloc_stage3_params());
    return z;
  }
  z->reduce_buckets_ = plan_comm_buckets(layout, options.reduce_bucket_size, true);
  z->bucket_of_unit_.assign(static_cast<size_t>(units), -1);
  for (size_t b = 0; b < z->reduce_buckets_.size(); ++b)
    for (int u = z->reduce_buckets_[b].first; u <= z->reduce_buckets_[b].last; ++u)
      z->bucket_of_unit_[static_cast<size_t>(u)] = static_cast<int>(b);
  z->pack_ = sz.reduce_send_numel > 0;
  if (comm.size() > 1 && (stage == 1 || stage == 2)) {
    z->gather_buckets_ = plan_comm_buckets(layout, options.allgather_bucket_size, false);
    z->gather_bucket_of_unit_.assign(static_cast<size_t>(units), -1);
    for (size_t b = 0; b < z->gather_buckets_.size(); ++b)
      for (int u = z->gather_buckets_[b].first; u <= z->gather_buckets_[b].last; ++u)
        z->gather_bucket_of_unit_[static_cast<size_t>(u)] = static_cast<int>(b);
  }
  if (stage <= 2) GLM_RETURN_IF_ERROR(alloc(z->params_, layout.total_numel(), dt));
  if (stage == 3) GLM_RETURN_IF_ERROR(alloc_stage3_params());
  z->plan_zeroing();
  if (sz.persistent_grad_numel > 0) GLM_RETURN_IF_ERROR(alloc(z->persistent_grads_, sz.persistent_grad_numel, dt));
  if (stage <= 1) GLM_RETURN_IF_ERROR(alloc(z->grads_, layout.total_numel(), dt));
  if (stage >= 1) GLM_RETURN_IF_ERROR(alloc(z->grad_shards_, shard_total, dt));
  for (int i = 0; i < sz.grad_bucket_count; ++i)
    GLM_RETURN_IF_ERROR(alloc(z->grad_buckets_[i], sz.grad_bucket_numel, dt));
  for (auto& slot : z->reduce_slots_) {
    if (sz.reduce_send_numel > 0) GLM_RETURN_IF_ERROR(alloc(slot.send, sz.reduce_send_numel, rt));
    if (sz.reduce_recv_numel > 0) GLM_RETURN_IF_ERROR(alloc(slot.recv, sz.reduce_recv_numel, rt));
  }
  if (sz.reduce_convert_numel > 0) GLM_RETURN_IF_ERROR(alloc(z->reduce_convert_, sz.reduce_convert_numel, dt));
  return z;
}

// The parts of each unit that backward adds to (norms, biases, the embedding, alignment padding):
// everything but the non-persistent ParamKind::weight tensors, which the first micro-batch writes.
void ZeroParameters::plan_zeroing() {
  const int units = static_cast<int>(layout_.units().size());
  zero_ranges_.assign(static_cast<size_t>(units), {});
  for (int u = 0; u < units; ++u) {
    const ParamUnit& unit = layout_.units()[static_cast<size_t>(u)];
    std::vector<std::pair<int64_t, int64_t>> written;  // [begin, end) inside the unit
    for (int index : unit.entries) {
      const ParamEntry& e = layout_.entry(index);
      const int64_t begin = e.offset - unit.offset;
      if (e.unit == u && e.kind == ParamKind::weight) written.emplace_back(begin, begin + e.numel);
    }
    std::sort(written.begin(), written.end());
    int64_t pos = 0;
    for (const auto& [b, e] : written) {
      if (b > pos) zero_ranges_[static_cast<size_t>(u)].push_back({pos, b - pos});
      pos = std::max(pos, e);
    }
    if (pos < unit.numel) zero_ranges_[static_cast<size_t>(u)].push_back({pos, unit.numel - pos});
  }
}

void ZeroParameters::added_parts(int unit, Tensor unit_grads, std::vector<Tensor>& parts) const {
  for (const ZeroRange& r : zero_ranges_[static_cast<size_t>(unit)]) parts.push_back(unit_grads.slice(r.begin, r.numel));
}

Status ZeroParameters::zero_added_parts(int unit, Tensor unit_grads) {
  std::vector<Tensor> parts;
  added_parts(unit, unit_grads, parts);
  return backend_.zero_all(parts);
}

bool ZeroParameters::overwrite_grads() const { return !frozen_ && (stage_ >= 2 || first_micro_batch_); }

ZeroParameters::~ZeroParameters() {
  const Status settled = settle_gathers();
  if (!settled.is_ok()) std::fprintf(stderr, "glm_hpc: %s\n", settled.message().c_str());
}

Tensor ZeroParameters::shard_slice(const Buffer& shards, int unit) const {
  return shards.slice(shard_base_[static_cast<size_t>(unit)], layout_.shard_numel(unit));
}

Status ZeroParameters::copy(Tensor dst, Tensor src) { return backend_.convert(dst, src); }

CommType ZeroParameters::reduce_type() const { return comm_type(options_.grad_reduce_dtype); }

Result<Tensor> ZeroParameters::acquire_params(int unit) {
  const ParamUnit& u = layout_.units()[static_cast<size_t>(unit)];
  if (stage_ <= 2) {
    // Stages 1-2: the previous step's all-gather of this unit's bucket may still be in flight.
    if (!gathers_.empty()) GLM_RETURN_IF_ERROR(finish_gather_of(unit));
    return params_.slice(u.offset, u.numel);
  }
  if (unit == persistent_) return persistent_params_.tensor();  // whole on every rank
  if (u.numel == 0) return Tensor{};                            // every tensor of the unit is persistent
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
  if (stage_ != 3 || unit == persistent_ || gathered_[0].unit == unit || gathered_[1].unit == unit) return Status::ok();
  // --prefetch_bucket_size bounds the elements gathered ahead; without --overlap_comm nothing is.
  const int64_t numel = layout_.units()[static_cast<size_t>(unit)].numel;
  if (!options_.overlap_comm || numel == 0 || numel > options_.prefetch_bucket_size) return Status::ok();
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
  GLM_RETURN_IF_ERROR(wait_timed(persistent_gather_));
  for (auto& g : gathered_) {
    GLM_RETURN_IF_ERROR(settle_slot(g));
    g.unit = -1;
  }
  held_slot_ = -1;
  return Status::ok();
}

Tensor ZeroParameters::unit_grads(int unit) {
  if (frozen_) return Tensor{};
  const ParamUnit& u = layout_.units()[static_cast<size_t>(unit)];
  if (unit == persistent_) {
    // Every unit's backward adds to it; the previous micro-batch's reduction may still read it.
    for (auto& slot : reduce_slots_) {
      if (slot.bucket != bucket_of_unit_[static_cast<size_t>(unit)]) continue;
      const Status drained = drain(slot);
      if (!drained.is_ok()) fatal_status(drained);
    }
    const Status zeroed = backend_.zero(persistent_grads_.tensor());
    if (!zeroed.is_ok()) fatal_status(zeroed);
    return persistent_grads_.tensor();
  }
  if (stage_ <= 1) return grads_.slice(u.offset, u.numel);
  // Stages 2-3: the open bucket's buffer; backward reaches a bucket's units from `last` down.
  const CommBucket& bucket = reduce_buckets_[static_cast<size_t>(bucket_of_unit_[static_cast<size_t>(unit)])];
  const int index = pack_ ? 0 : next_slot_;
  if (unit == bucket.last && !pack_ && comm_.size() > 1) {
    // Unpacked, a collective reads this buffer directly: it must have finished.
    const Status drained = drain(reduce_slots_[index]);
    if (!drained.is_ok()) fatal_status(drained);  // a collective failed: the job cannot go on
  }
  // Each micro-batch writes its weight gradients afresh (overwrite_grads()); the rest is added to.
  Tensor g = grad_buckets_[index].slice(u.offset - bucket.offset, u.numel);
  const Status zeroed = zero_added_parts(unit, g);
  if (!zeroed.is_ok()) fatal_status(zeroed);
  return g;
}

Tensor ZeroParameters::bucket_source(const CommBucket& b) const {
  if (b.first == persistent_) return persistent_grads_.slice(0, b.numel);
  if (stage_ <= 1) return grads_.slice(b.offset, b.numel);
  return grad_buckets_[pack_ ? 0 : next_slot_].slice(0, b.numel);
}

// Starts bucket `index`'s all-reduce (stage 0) or reduce-scatter (stages 1-3) in the next slot.
Status ZeroParameters::reduce_bucket(int index) {
  const CommBucket& b = reduce_buckets_[static_cast<size_t>(index)];
  if (b.numel == 0) {  // units whose tensors are all persistent: nothing to reduce
    ++buckets_reduced_;
    return Status::ok();
  }
  ReduceSlot& slot = reduce_slots_[next_slot_];
  GLM_RETURN_IF_ERROR(drain(slot));
  Tensor src = bucket_source(b);
  const int64_t shard_numel = b.shard_numel(comm_.size());
  Tensor send = src;
  if (pack_) {
    send = slot.send.slice(0, b.numel);
    GLM_RETURN_IF_ERROR(copy(send, src));  // the reduce dtype, in flat-layout order
  }
  // MPI reads host memory: the backward's results must be there first. NCCL orders itself after
  // the compute stream.
  if (!data_.device_buffers()) GLM_RETURN_IF_ERROR(backend_.synchronize());
  if (stage_ == 0) {
    slot.in_flight =
        data_.start_all_reduce(send.data, send.data, static_cast<size_t>(b.numel), reduce_type(), ReduceOp::sum);
  } else {
    const bool direct = stage_ == 1 && options_.grad_reduce_dtype == src.dtype;
    Tensor recv = direct ? grad_shards_.slice(b.shard_offset, shard_numel) : slot.recv.slice(0, shard_numel);
    // One group of per-unit reduce-scatters, each unit where it lies: its rank-r shard is the r-th
    // slice of its range, and this rank's shards of the bucket's units sit side by side in recv as
    // in the shard buffers (a one-unit bucket is a group of one).
    std::vector<CommPart> parts;
    int64_t from = 0, to = 0;
    for (int unit = b.first; unit <= b.last; ++unit) {
      const int64_t n = layout_.units()[static_cast<size_t>(unit)].numel, shard = layout_.shard_numel(unit);
      if (n > 0) parts.push_back({send.slice(from, n).data, recv.slice(to, shard).data, static_cast<size_t>(shard)});
      from += n;
      to += shard;
    }
    slot.in_flight = data_.start_reduce_scatter_group(parts, reduce_type(), ReduceOp::sum);
  }
  slot.bucket = index;
  ++buckets_reduced_;
  next_slot_ ^= 1;
  if (!options_.overlap_comm) return drain(slot);  // the serial baseline: nothing overlaps
  return Status::ok();
}

// Waits for a slot's reduction and stores the result: converted back (stages 0-1) or added to this
// rank's gradient shards (stages 2-3 accumulate one reduction per micro-batch).
Status ZeroParameters::drain(ReduceSlot& slot) {
  if (slot.bucket < 0) return Status::ok();
  const CommBucket& b = reduce_buckets_[static_cast<size_t>(slot.bucket)];
  slot.bucket = -1;
  GLM_RETURN_IF_ERROR(wait_timed(slot.in_flight));
  const int64_t shard_numel = b.shard_numel(comm_.size());
  const bool converted = options_.grad_reduce_dtype != backend_.compute_dtype();
  if (stage_ == 0) return pack_ ? copy(grads_.slice(b.offset, b.numel), slot.send.slice(0, b.numel)) : Status::ok();
  Tensor shards = grad_shards_.slice(b.shard_offset, shard_numel);
  if (stage_ == 1) return converted ? copy(shards, slot.recv.slice(0, shard_numel)) : Status::ok();
  Tensor part = slot.recv.slice(0, shard_numel);
  if (converted) {
    Tensor c = reduce_convert_.slice(0, shard_numel);
    GLM_RETURN_IF_ERROR(copy(c, part));
    part = c;
  }
  return backend_.add(shards, shards, part, shard_numel);
}

Status ZeroParameters::grads_ready_from(int unit, int64_t from) {
  if (frozen_ || !on_grads_final_ || !last_micro_batch_ || !grads_final_in_backward()) return Status::ok();
  if (from <= 0 || from >= layout_.units()[static_cast<size_t>(unit)].numel)
    return GLM_INTERNAL_ERROR("gradients of unit ", unit, " final from element ", from);
  return on_grads_final_(unit, from);
}

Status ZeroParameters::grads_ready(int unit) {
  if (frozen_) return Status::ok();
  if (on_grads_final_ && last_micro_batch_ && grads_final_in_backward()) return on_grads_final_(unit, 0);
  const int index = bucket_of_unit_[static_cast<size_t>(unit)];
  const CommBucket& b = reduce_buckets_[static_cast<size_t>(index)];
  if (unit != b.first) return Status::ok();  // backward completes a bucket with its first unit
  if (stage_ <= 1) {
    // The bucket's gradient is final once the last micro-batch's backward finished it: reduce it
    // now, overlapping the rest of backward (without overlap: after backward, finish_backward).
    if (!last_micro_batch_ || comm_.size() == 1 || !options_.overlap_comm) return Status::ok();
    return reduce_bucket(index);
  }
  if (comm_.size() == 1) {  // shards are whole units: accumulate the bucket directly
    if (b.numel == 0) return Status::ok();
    Tensor shards = grad_shards_.slice(b.shard_offset, b.numel);
    return backend_.add(shards, shards, bucket_source(b), b.numel);
  }
  return reduce_bucket(index);
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
  if (unit == persistent_)
    return persistent_params_.slice(comm_.rank() * layout_.shard_numel(unit), layout_.shard_numel(unit));
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
  // Stages 0-1: the first micro-batch writes the weight gradients (overwrite_grads()); units tile
  // the flat buffer, so zeroing their added-to parts leaves nothing stale.
  if (grads_.numel() > 0) {
    const int units = static_cast<int>(layout_.units().size());
    std::vector<Tensor> parts;  // zeroed together: one launch for the many small ones on a device
    for (int u = 0; u < units; ++u) {
      if (static_cast<size_t>(u) < zeroed_by_caller_.size() && zeroed_by_caller_[static_cast<size_t>(u)]) continue;
      const ParamUnit& unit = layout_.units()[static_cast<size_t>(u)];
      added_parts(u, grads_.slice(unit.offset, unit.numel), parts);
    }
    GLM_RETURN_IF_ERROR(backend_.zero_all(parts));
  }
  if (grad_shards_.numel() > 0) GLM_RETURN_IF_ERROR(backend_.zero(grad_shards_.tensor()));
  return Status::ok();
}

Status ZeroParameters::finish_backward() {
  if (frozen_) return Status::ok();
  const int world = comm_.size();
  const int buckets = static_cast<int>(reduce_buckets_.size());
  if (stage_ <= 1 && world > 1 && !options_.overlap_comm)
    for (int b = 0; b < buckets; ++b) GLM_RETURN_IF_ERROR(reduce_bucket(b));  // each waited at once
  for (auto& slot : reduce_slots_) GLM_RETURN_IF_ERROR(drain(slot));
  const int reduced = buckets_reduced_;
  buckets_reduced_ = 0;
  if (stage_ <= 1 && world > 1 && reduced != buckets)
    return GLM_INTERNAL_ERROR(reduced, " gradient buckets reduced of ", buckets,
                              " (set_last_micro_batch not called before the last backward?)");
  if (stage_ == 1 && world == 1) GLM_RETURN_IF_ERROR(copy(grad_shards_.tensor(), grads_.tensor()));
  return Status::ok();
}

Result<double> ZeroParameters::grad_norm_squared() {
  if (frozen_) return 0.0;
  if (stage_ == 0) return backend_.sum_squares(grads_.tensor());
  GLM_ASSIGN_OR_RETURN(double local, backend_.sum_squares(grad_shards_.tensor()));
  GLM_RETURN_IF_ERROR(comm_.all_reduce(&local, &local, 1, CommType::f64, ReduceOp::sum));
  return local;
}

Result<double> ZeroParameters::global_grad_norm_squared(double local) {
  if (frozen_) return 0.0;
  if (stage_ == 0) return local;  // every rank holds the whole reduced gradient
  GLM_RETURN_IF_ERROR(comm_.all_reduce(&local, &local, 1, CommType::f64, ReduceOp::sum));
  return local;
}

Status ZeroParameters::unit_updated(int u) {
  if (frozen_) return GLM_INTERNAL_ERROR("unit_updated(", u, ") on frozen parameters");
  if (comm_.size() == 1) return Status::ok();  // one rank: the shard is the unit
  if (stage_ == 3) return u == persistent_ && options_.overlap_comm ? gather_persistent() : Status::ok();
  if (stage_ != 1 && stage_ != 2) return Status::ok();
  const int index = gather_bucket_of_unit_[static_cast<size_t>(u)];
  if (u != gather_buckets_[static_cast<size_t>(index)].last || !options_.overlap_comm) return Status::ok();
  return gather_bucket(index);
}

// Starts bucket `index`'s parameter all-gather: one group of in-place per-unit gathers (this rank's
// shard already sits at its block of each unit; a one-unit bucket is a group of one).
Status ZeroParameters::gather_bucket(int index) {
  const CommBucket& b = gather_buckets_[static_cast<size_t>(index)];
  for (auto& other : gathers_)  // the previous step's gather of this bucket, if nothing waited for it
    if (other.bucket == index) GLM_RETURN_IF_ERROR(finish_gather(other));
  GatherInFlight g;
  g.bucket = index;
  if (!data_.device_buffers()) GLM_RETURN_IF_ERROR(backend_.synchronize());
  std::vector<CommPart> parts;
  for (int unit = b.first; unit <= b.last; ++unit) {
    const ParamUnit& u = layout_.units()[static_cast<size_t>(unit)];
    if (u.numel == 0) continue;
    parts.push_back({owned_params(unit).data, params_.slice(u.offset, u.numel).data,
                     static_cast<size_t>(layout_.shard_numel(unit))});
  }
  g.request = data_.start_all_gather_group(parts, comm_type(params_.tensor().dtype));
  gathers_.push_back(std::move(g));
  if (!options_.overlap_comm) return finish_gather(gathers_.back());
  return Status::ok();
}

Status ZeroParameters::finish_gather(GatherInFlight& g) {
  if (g.bucket < 0) return Status::ok();
  g.bucket = -1;
  return wait_timed(g.request);
}

// One collective for every persistent tensor: this rank's updated shard sits in place inside the
// whole unit, as DeepSpeed's post-step all-gather of its persistent parameters.
Status ZeroParameters::gather_persistent() {
  if (persistent_gather_) return GLM_INTERNAL_ERROR("persistent all-gather started twice");
  if (!data_.device_buffers()) GLM_RETURN_IF_ERROR(backend_.synchronize());
  Tensor full = persistent_params_.tensor();
  persistent_gather_ =
      data_.start_all_gather(owned_params(persistent_).data, full.data,
                             static_cast<size_t>(layout_.shard_numel(persistent_)), comm_type(full.dtype));
  if (!options_.overlap_comm) return wait_timed(persistent_gather_);
  return Status::ok();
}

Status ZeroParameters::after_update() {
  if (frozen_) return forget_gathered();
  if ((stage_ == 1 || stage_ == 2) && comm_.size() > 1 && !options_.overlap_comm)
    for (size_t b = 0; b < gather_buckets_.size(); ++b) GLM_RETURN_IF_ERROR(gather_bucket(static_cast<int>(b)));
  if (stage_ == 3 && persistent_ >= 0 && comm_.size() > 1 && !options_.overlap_comm)
    GLM_RETURN_IF_ERROR(gather_persistent());
  // With --overlap_comm the parameter all-gathers (stages 1-2) stay in flight into the next step:
  // acquire_params() waits for a unit's bucket just before its forward, so the last buckets'
  // gathers (the head's, issued last) overlap the first layers' compute, as Megatron's
  // overlap_param_gather. Everything else that touches the parameters settles them first.
  if (!options_.overlap_comm) GLM_RETURN_IF_ERROR(settle_gathers());
  return forget_gathered();
}

Status ZeroParameters::settle_gathers() {
  for (auto& g : gathers_) GLM_RETURN_IF_ERROR(finish_gather(g));
  gathers_.clear();
  return Status::ok();
}

Status ZeroParameters::finish_gather_of(int unit) {
  const int bucket = gather_bucket_of_unit_.empty() ? -1 : gather_bucket_of_unit_[static_cast<size_t>(unit)];
  bool pending = false;
  for (auto& g : gathers_) {
    if (g.bucket == bucket) GLM_RETURN_IF_ERROR(finish_gather(g));
    pending = pending || g.bucket >= 0;
  }
  if (!pending) gathers_.clear();
  return Status::ok();
}

Status ZeroParameters::fill_stored(const std::function<Status(Tensor dst, int64_t global_begin)>& fill) {
  GLM_RETURN_IF_ERROR(settle_gathers());
  GLM_RETURN_IF_ERROR(forget_gathered());
  if (stage_ <= 2) return fill(params_.tensor(), 0);
  const int units = static_cast<int>(layout_.units().size());
  for (int u = 0; u < units; ++u) {
    if (u == persistent_) {
      GLM_RETURN_IF_ERROR(fill(persistent_params_.tensor(), layout_.units()[static_cast<size_t>(u)].offset));
    } else {
      GLM_RETURN_IF_ERROR(fill(shard_slice(param_shards_, u), layout_.shard_offset(u, comm_.rank())));
    }
  }
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
  m.parameter_bytes = static_cast<int64_t>(params_.tensor().bytes() + param_shards_.tensor().bytes() +
                                           persistent_params_.tensor().bytes());
  m.gradient_bytes = static_cast<int64_t>(grads_.tensor().bytes() + grad_shards_.tensor().bytes());
  m.buffer_bytes = 0;
  auto add = [&](const Buffer& b) { m.buffer_bytes += static_cast<int64_t>(b.tensor().bytes()); };
  for (const auto& g : gathered_) add(g.params);
  for (const auto& b : grad_buckets_) add(b);
  for (const auto& slot : reduce_slots_) {
    add(slot.send);
    add(slot.recv);
  }
  add(reduce_convert_);
  add(persistent_grads_);
  return m;
}

}  // namespace glm
