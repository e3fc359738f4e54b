// ZeRO's gradient buffers, buckets and reductions (all-reduce or reduce-scatter) during backward.
#include "zero/grad_reducer.h"

#include <algorithm>
#include <utility>

#include "zero/persistent_unit.h"

namespace glm {

Result<std::unique_ptr<GradReducer>> GradReducer::create(const ParamLayout& layout, Backend& backend,
                                                         Communicator& comm, Communicator& data,
                                                         const ShardingPlan& plan, const ZeroOptions& options,
                                                         const ZeroBufferSizes& sizes, CommWaits& waits,
                                                         const PersistentUnit* persistent) {
  if (plan.frozen) return GLM_INTERNAL_ERROR("a gradient reducer for frozen parameters");
  if (options.offload_grads && !plan.shard_grads)
    return GLM_INTERNAL_ERROR("gradients in host memory at ZeRO stage ", plan.stage, " (stages 2-3 only)");
  std::unique_ptr<GradReducer> r(new GradReducer(layout, backend, comm, data, plan, options, waits));
  r->host_grads_ = options.offload_grads;
  GLM_ASSIGN_OR_RETURN(r->reduce_type_, comm_type(options.grad_reduce_dtype));
  if (persistent != nullptr) {
    r->persistent_ = persistent->unit();
    r->persistent_grads_ = persistent->grads();
  }
  r->shard_offsets_ = shard_offsets(layout);
  r->buckets_ = plan_comm_buckets(layout, options.reduce_bucket_size, true);
  r->bucket_of_unit_.assign(layout.units().size(), -1);
  for (size_t b = 0; b < r->buckets_.size(); ++b)
    for (int u = r->buckets_[b].first; u <= r->buckets_[b].last; ++u)
      r->bucket_of_unit_[static_cast<size_t>(u)] = static_cast<int>(b);
  r->pack_ = sizes.reduce_send_numel > 0;
  r->plan_zeroing();
  GLM_RETURN_IF_ERROR(r->allocate(sizes));
  return r;
}

Status GradReducer::allocate(const ZeroBufferSizes& sizes) {
  AllocationPurpose purpose(backend_, "the gradients and their reduction buckets");
  const DType dt = backend_.compute_dtype(), rt = options_.grad_reduce_dtype;
  auto alloc = [&](Buffer& b, int64_t n, DType type) -> Status {
    GLM_ASSIGN_OR_RETURN(b, backend_.allocate(n, type));
    return Status::ok();
  };
  if (!plan_.shard_grads) GLM_RETURN_IF_ERROR(alloc(grads_, layout_.total_numel(), dt));
  if (host_grads_) {
    GLM_ASSIGN_OR_RETURN(grad_shards_, backend_.allocate_host(shard_offsets_.back(), dt, options_.offload_pin_memory));
    GLM_RETURN_IF_ERROR(alloc(squares_, 1, DType::f64));
  } else if (plan_.shard_optimizer) {
    GLM_RETURN_IF_ERROR(alloc(grad_shards_, shard_offsets_.back(), dt));
  }
  for (int i = 0; i < sizes.grad_bucket_count; ++i) GLM_RETURN_IF_ERROR(alloc(grad_buckets_[i], sizes.grad_bucket_numel, dt));
  for (auto& slot : slots_) {
    if (sizes.reduce_send_numel > 0) GLM_RETURN_IF_ERROR(alloc(slot.send, sizes.reduce_send_numel, rt));
    if (sizes.reduce_recv_numel > 0) GLM_RETURN_IF_ERROR(alloc(slot.recv, sizes.reduce_recv_numel, rt));
  }
  if (sizes.reduce_convert_numel > 0) GLM_RETURN_IF_ERROR(alloc(reduce_convert_, sizes.reduce_convert_numel, dt));
  return Status::ok();
}

// The parts of each unit that backward adds to (norms, biases, the embedding, alignment padding):
// everything but the non-persistent ParamKind::weight tensors, which the first micro-batch writes.
void GradReducer::plan_zeroing() {
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

void GradReducer::added_parts(int unit, Tensor unit_grads, std::vector<Tensor>& parts) const {
  for (const ZeroRange& r : zero_ranges_[static_cast<size_t>(unit)]) parts.push_back(unit_grads.slice(r.begin, r.numel));
}

Status GradReducer::zero_grads(int caller_zeroed) {
  // Stages 0-1: the first micro-batch writes the weight gradients (overwrite_grads()); units tile
  // the flat buffer, so zeroing their added-to parts leaves nothing stale.
  if (grads_.numel() > 0) {
    const int units = static_cast<int>(layout_.units().size());
    std::vector<Tensor> parts;  // zeroed together: one launch for the many small ones on a device
    for (int u = 0; u < units; ++u) {
      if (u == caller_zeroed) continue;
      const ParamUnit& unit = layout_.units()[static_cast<size_t>(u)];
      added_parts(u, grads_.slice(unit.offset, unit.numel), parts);
    }
    GLM_RETURN_IF_ERROR(backend_.zero_all(parts));
  }
  if (host_grads_) {
    // Every element of the host shards is written by this step's copies (the buckets tile them).
    downloads_.clear();  // a failed step's, if any: their destructors wait for them
    bucket_download_[0] = bucket_download_[1] = convert_download_ = nullptr;
    for (auto& slot : slots_) slot.download = nullptr;
    return backend_.zero(squares_.tensor());
  }
  if (grad_shards_.numel() > 0) GLM_RETURN_IF_ERROR(backend_.zero(grad_shards_.tensor()));
  return Status::ok();
}

// Every unit's backward adds to the persistent gradients; the previous micro-batch's reduction
// may still read them.
Result<Tensor> GradReducer::persistent_grads() {
  for (auto& slot : slots_)
    if (slot.bucket == bucket_of_unit_[static_cast<size_t>(persistent_)]) GLM_RETURN_IF_ERROR(drain(slot));
  GLM_RETURN_IF_ERROR(backend_.zero(persistent_grads_));
  return persistent_grads_;
}

Result<Tensor> GradReducer::unit_grads(int unit) {
  if (unit == persistent_) return persistent_grads();
  const ParamUnit& u = layout_.units()[static_cast<size_t>(unit)];
  if (!plan_.shard_grads) return grads_.slice(u.offset, u.numel);
  // Stages 2-3: the open bucket's buffer; backward reaches a bucket's units from `last` down.
  const CommBucket& bucket = buckets_[static_cast<size_t>(bucket_of_unit_[static_cast<size_t>(unit)])];
  const int index = pack_ ? 0 : next_slot_;
  // Unpacked, a collective reads this buffer directly: it must have finished. One rank copying
  // its gradients to the host: so must the copy of the bucket it held before.
  if (unit == bucket.last && !pack_ && plan_.distributed()) GLM_RETURN_IF_ERROR(drain(slots_[index]));
  if (unit == bucket.last && bucket_download_[index] != nullptr) {
    GLM_RETURN_IF_ERROR(backend_.wait_for(*bucket_download_[index]));
    bucket_download_[index] = nullptr;
  }
  // Each micro-batch writes its weight gradients afresh (overwrite_grads()); the rest is added to.
  Tensor g = grad_buckets_[index].slice(u.offset - bucket.offset, u.numel);
  std::vector<Tensor> parts;
  added_parts(unit, g, parts);
  GLM_RETURN_IF_ERROR(backend_.zero_all(parts));
  return g;
}

Tensor GradReducer::bucket_source(const CommBucket& b) const {
  if (b.first == persistent_) return persistent_grads_.slice(0, b.numel);
  if (!plan_.shard_grads) return grads_.slice(b.offset, b.numel);
  return grad_buckets_[pack_ ? 0 : next_slot_].slice(0, b.numel);
}

// Starts bucket `index`'s all-reduce (stage 0) or reduce-scatter (stages 1-3) in the next slot.
Status GradReducer::reduce_bucket(int index) {
  const CommBucket& b = buckets_[static_cast<size_t>(index)];
  if (b.numel == 0) {  // units whose tensors are all persistent: nothing to reduce
    ++buckets_reduced_;
    return Status::ok();
  }
  ReduceSlot& slot = slots_[next_slot_];
  GLM_RETURN_IF_ERROR(drain(slot));
  if (slot.download != nullptr) {  // the reduction writes recv once its last copy to the host read it
    GLM_RETURN_IF_ERROR(data_.order_next_after(slot.download->device_event()));
    slot.download = nullptr;
  }
  Tensor src = bucket_source(b);
  const int64_t shard_numel = b.shard_numel(plan_.world);
  Tensor send = src;
  if (pack_) {
    send = slot.send.slice(0, b.numel);
    GLM_RETURN_IF_ERROR(backend_.convert(send, src));  // the reduce dtype, in flat-layout order
  }
  // MPI reads host memory: the backward's results must be there first. NCCL orders itself after
  // the compute stream.
  if (!data_.device_buffers()) GLM_RETURN_IF_ERROR(backend_.synchronize());
  if (plan_.all_reduce_grads()) {
    slot.in_flight =
        data_.start_all_reduce(send.data, send.data, static_cast<size_t>(b.numel), reduce_type_, ReduceOp::sum);
  } else {
    const bool direct = !plan_.shard_grads && options_.grad_reduce_dtype == src.dtype;
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
    slot.in_flight = data_.start_reduce_scatter_group(parts, reduce_type_, ReduceOp::sum);
  }
  slot.bucket = index;
  ++buckets_reduced_;
  next_slot_ ^= 1;
  if (!options_.overlap_comm) return drain(slot);  // the serial baseline: nothing overlaps
  return Status::ok();
}

// Waits for a slot's reduction and stores the result: converted back (stages 0-1) or added to this
// rank's gradient shards (stages 2-3 accumulate one reduction per micro-batch).
Status GradReducer::drain(ReduceSlot& slot) {
  if (slot.bucket < 0) return Status::ok();
  const CommBucket& b = buckets_[static_cast<size_t>(slot.bucket)];
  slot.bucket = -1;
  GLM_RETURN_IF_ERROR(waits_.wait(slot.in_flight));
  const int64_t shard_numel = b.shard_numel(plan_.world);
  const bool converted = options_.grad_reduce_dtype != backend_.compute_dtype();
  if (plan_.all_reduce_grads())
    return pack_ ? backend_.convert(grads_.slice(b.offset, b.numel), slot.send.slice(0, b.numel)) : Status::ok();
  Tensor shards = grad_shards_.slice(b.shard_offset, shard_numel);
  if (!plan_.shard_grads) return converted ? backend_.convert(shards, slot.recv.slice(0, shard_numel)) : Status::ok();
  Tensor part = slot.recv.slice(0, shard_numel);
  if (converted) {
    Tensor c = reduce_convert_.slice(0, shard_numel);
    if (convert_download_ != nullptr) GLM_RETURN_IF_ERROR(backend_.wait_for(*convert_download_));
    GLM_RETURN_IF_ERROR(backend_.convert(c, part));
    part = c;
  }
  if (host_grads_) {  // the step's only micro-batch: its reduction is the gradient
    GLM_ASSIGN_OR_RETURN(const AsyncCopy* copy, store_on_host(shards, part));
    (converted ? convert_download_ : slot.download) = copy;
    return Status::ok();
  }
  return backend_.add(shards, shards, part, shard_numel);
}

Status GradReducer::accumulate_alone(const CommBucket& b) {
  if (b.numel == 0) return Status::ok();
  Tensor shards = grad_shards_.slice(b.shard_offset, b.numel);
  if (!host_grads_) return backend_.add(shards, shards, bucket_source(b), b.numel);
  GLM_ASSIGN_OR_RETURN(const AsyncCopy* copy, store_on_host(shards, bucket_source(b)));
  if (b.first != persistent_) {  // backward fills the other bucket buffer while this one is copied
    bucket_download_[next_slot_] = copy;
    next_slot_ ^= 1;
  }
  return Status::ok();
}

Result<const AsyncCopy*> GradReducer::store_on_host(Tensor shards, Tensor src) {
  GLM_RETURN_IF_ERROR(backend_.accumulate_squares(src, squares_.tensor()));
  GLM_ASSIGN_OR_RETURN(std::unique_ptr<AsyncCopy> copy, backend_.start_download(shards.data, src));
  downloads_.push_back(std::move(copy));
  return downloads_.back().get();
}

Status GradReducer::grads_ready(int unit, bool last_micro_batch) {
  const int index = bucket_of_unit_[static_cast<size_t>(unit)];
  const CommBucket& b = buckets_[static_cast<size_t>(index)];
  if (unit != b.first) return Status::ok();  // backward completes a bucket with its first unit
  if (!plan_.shard_grads) {
    // The bucket's gradient is final once the last micro-batch's backward finished it: reduce it
    // now, overlapping the rest of backward (without overlap: after backward, finish_backward).
    if (!last_micro_batch || !plan_.distributed() || !options_.overlap_comm) return Status::ok();
    return reduce_bucket(index);
  }
  if (!plan_.distributed()) return accumulate_alone(b);  // shards are whole units
  return reduce_bucket(index);
}

Status GradReducer::finish_backward() {
  const int buckets = static_cast<int>(buckets_.size());
  const bool once_per_step = !plan_.shard_grads && plan_.distributed();
  if (once_per_step && !options_.overlap_comm)
    for (int b = 0; b < buckets; ++b) GLM_RETURN_IF_ERROR(reduce_bucket(b));  // each waited at once
  for (auto& slot : slots_) GLM_RETURN_IF_ERROR(drain(slot));
  const int reduced = buckets_reduced_;
  buckets_reduced_ = 0;
  if (once_per_step && reduced != buckets)
    return GLM_INTERNAL_ERROR(reduced, " gradient buckets reduced of ", buckets,
                              " (no begin_micro_batch() of the last micro-batch before its backward?)");
  if (plan_.shard_optimizer && !plan_.shard_grads && !plan_.distributed())
    GLM_RETURN_IF_ERROR(backend_.convert(grad_shards_.tensor(), grads_.tensor()));
  for (auto& copy : downloads_) GLM_RETURN_IF_ERROR(copy->finish());  // the host shards are complete
  return Status::ok();
}

Result<double> GradReducer::grad_norm_squared() {
  if (!plan_.shard_optimizer) return backend_.sum_squares(grads_.tensor());
  double local = 0;
  if (host_grads_) {
    GLM_RETURN_IF_ERROR(backend_.download(&local, squares_.tensor()));
  } else {
    GLM_ASSIGN_OR_RETURN(local, backend_.sum_squares(grad_shards_.tensor()));
  }
  GLM_RETURN_IF_ERROR(comm_.all_reduce(&local, &local, 1, CommType::f64, ReduceOp::sum));
  return local;
}

Result<double> GradReducer::global_grad_norm_squared(double local) {
  if (!plan_.shard_optimizer) return local;  // every rank holds the whole reduced gradient
  GLM_RETURN_IF_ERROR(comm_.all_reduce(&local, &local, 1, CommType::f64, ReduceOp::sum));
  return local;
}

Tensor GradReducer::owned_grads(int unit) const {
  const ParamUnit& u = layout_.units()[static_cast<size_t>(unit)];
  if (!plan_.shard_optimizer) return grads_.slice(u.offset, u.numel);
  return grad_shards_.slice(shard_offsets_[static_cast<size_t>(unit)], layout_.shard_numel(unit));
}

int64_t GradReducer::grad_bytes() const {
  return static_cast<int64_t>(grads_.tensor().bytes() + (host_grads_ ? 0 : grad_shards_.tensor().bytes()));
}

int64_t GradReducer::host_grad_bytes() const {
  return host_grads_ ? static_cast<int64_t>(grad_shards_.tensor().bytes()) : 0;
}

int64_t GradReducer::buffer_bytes() const {
  int64_t bytes = 0;
  auto add = [&](const Buffer& b) { bytes += static_cast<int64_t>(b.tensor().bytes()); };
  for (const auto& b : grad_buckets_) add(b);
  for (const auto& slot : slots_) {
    add(slot.send);
    add(slot.recv);
  }
  add(reduce_convert_);
  return bytes;
}

}  // namespace glm
