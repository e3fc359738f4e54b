// ZeRO's parameter storage and all-gathers: after the update (stages 1-2), just in time (stage 3).
#include "zero/param_gatherer.h"

#include <cstdio>

namespace glm {

std::vector<bool> offloaded_param_units(const ParamLayout& layout, double ratio) {
  const int units = static_cast<int>(layout.units().size());
  std::vector<bool> host(static_cast<size_t>(units), false);
  int64_t seen = 0, on_host = 0;
  for (int u = 0; u < units; ++u) {
    const int64_t n = layout.shard_numel(u);
    if (u == layout.persistent_unit() || n == 0) continue;
    seen += n;
    // Offloaded when on_host + n lies nearer ratio x seen than on_host does.
    if (static_cast<double>(on_host) + 0.5 * static_cast<double>(n) <= ratio * static_cast<double>(seen)) {
      host[static_cast<size_t>(u)] = true;
      on_host += n;
    }
  }
  return host;
}

Result<std::unique_ptr<ParamGatherer>> ParamGatherer::create(const ParamLayout& layout, Backend& backend,
                                                             Communicator& data, const ShardingPlan& plan,
                                                             const ZeroOptions& options, const ZeroBufferSizes& sizes,
                                                             CommWaits& waits) {
  std::unique_ptr<ParamGatherer> g(new ParamGatherer(layout, backend, data, plan, options, waits));
  AllocationPurpose purpose(backend, plan.shard_params ? "ZeRO-3's parameter shards and gathered units" : "the parameters");
  const DType dt = backend.compute_dtype();
  GLM_ASSIGN_OR_RETURN(g->type_, comm_type(dt));
  if (plan.gathers_after_update()) {
    g->buckets_ = plan_comm_buckets(layout, options.allgather_bucket_size, false);
    g->bucket_of_unit_.assign(layout.units().size(), -1);
    for (size_t b = 0; b < g->buckets_.size(); ++b)
      for (int u = g->buckets_[b].first; u <= g->buckets_[b].last; ++u)
        g->bucket_of_unit_[static_cast<size_t>(u)] = static_cast<int>(b);
  }
  if (!plan.shard_params) {
    GLM_ASSIGN_OR_RETURN(g->params_, backend.allocate(layout.total_numel(), dt));
    return g;
  }
  // Two stores of consecutive shards, every unit's but the persistent one's: the device's and
  // (--offload_param cpu) the host's.
  const size_t units = layout.units().size();
  g->on_host_ = options.offload_params ? offloaded_param_units(layout, options.offload_param_ratio)
                                       : std::vector<bool>(units, false);
  g->stored_offsets_.assign(units, 0);
  int64_t stored[2] = {0, 0};
  for (size_t u = 0; u < units; ++u) {
    if (static_cast<int>(u) == layout.persistent_unit()) continue;
    int64_t& end = stored[g->on_host_[u] ? 1 : 0];
    g->stored_offsets_[u] = end;
    end += layout.shard_numel(static_cast<int>(u));
  }
  GLM_ASSIGN_OR_RETURN(g->param_shards_, backend.allocate(stored[0], dt));
  if (stored[1] > 0) {
    GLM_ASSIGN_OR_RETURN(g->host_shards_, backend.allocate_host(stored[1], dt, options.offload_pin_memory));
  }
  for (auto& slot : g->gathered_) {
    GLM_ASSIGN_OR_RETURN(slot.params, backend.allocate(sizes.gathered_unit_numel, dt));
  }
  return g;
}

ParamGatherer::~ParamGatherer() {
  const Status settled = settle();
  if (!settled.is_ok()) std::fprintf(stderr, "glm_hpc: %s\n", settled.message().c_str());
}

Result<Tensor> ParamGatherer::acquire(int unit) {
  const ParamUnit& u = layout_.units()[static_cast<size_t>(unit)];
  if (!plan_.shard_params) {
    // Stages 1-2: the previous step's all-gather of this unit's bucket may still be in flight.
    if (!in_flight_.empty()) GLM_RETURN_IF_ERROR(finish_bucket_of(unit));
    return params_.slice(u.offset, u.numel);
  }
  if (u.numel == 0) return Tensor{};  // every tensor of the unit is persistent
  // Stage 3: the prefetched (or still held) copy, else gather now.
  int slot = gathered_[0].unit == unit ? 0 : (gathered_[1].unit == unit ? 1 : -1);
  if (slot < 0) {
    slot = held_slot_ < 0 ? 0 : held_slot_ ^ 1;
    GLM_RETURN_IF_ERROR(gather_into(slot, unit));
  }
  GLM_RETURN_IF_ERROR(waits_.wait(gathered_[slot].in_flight));
  if (gathered_[slot].upload) GLM_RETURN_IF_ERROR(backend_.wait_for(*gathered_[slot].upload));
  held_slot_ = slot;
  return gathered_[slot].params.slice(0, u.numel);
}

Status ParamGatherer::prefetch(int unit) {
  if (!plan_.shard_params || gathered_[0].unit == unit || gathered_[1].unit == unit) return Status::ok();
  // --prefetch_bucket_size bounds the elements gathered ahead; without --overlap_comm nothing is.
  const int64_t numel = layout_.units()[static_cast<size_t>(unit)].numel;
  if (!options_.overlap_comm || numel == 0 || numel > options_.prefetch_bucket_size) return Status::ok();
  // Into the slot the model does not hold. On a device communicator the gather is ordered after
  // all compute enqueued so far, so it cannot overwrite parameters a queued kernel still reads.
  return gather_into(held_slot_ < 0 ? 0 : held_slot_ ^ 1, unit);
}

Status ParamGatherer::gather_into(int slot, int unit) {
  Gathered& g = gathered_[slot];
  GLM_RETURN_IF_ERROR(waits_.wait(g.in_flight));  // a prefetch nobody used must finish before reuse
  const ParamUnit& u = layout_.units()[static_cast<size_t>(unit)];
  Tensor from = shard(unit), full = g.params.slice(0, u.numel);
  g.unit = unit;
  if (params_on_host(unit)) return upload_and_gather(g, unit);
  if (!plan_.distributed()) return backend_.convert(full, from);
  if (!data_.device_buffers()) GLM_RETURN_IF_ERROR(backend_.synchronize());
  g.in_flight = data_.start_all_gather(from.data, full.data, static_cast<size_t>(from.numel), type_);
  return Status::ok();
}

Status ParamGatherer::upload_and_gather(Gathered& g, int unit) {
  const int64_t n = layout_.shard_numel(unit);
  const Tensor block = g.params.slice(plan_.distributed() ? plan_.rank * n : 0, n);
  GLM_ASSIGN_OR_RETURN(g.upload, backend_.start_upload(block, shard(unit).data));
  if (!plan_.distributed()) return Status::ok();  // acquire() orders compute after the upload
  if (data_.device_buffers()) {
    GLM_RETURN_IF_ERROR(data_.order_next_after(g.upload->device_event()));
  } else {
    GLM_RETURN_IF_ERROR(g.upload->finish());
  }
  g.in_flight = data_.start_all_gather(block.data, g.params.tensor().data, static_cast<size_t>(n), type_);
  return Status::ok();
}

Status ParamGatherer::forget_gathered() {
  for (auto& g : gathered_) {
    GLM_RETURN_IF_ERROR(waits_.wait(g.in_flight));
    if (g.upload) GLM_RETURN_IF_ERROR(g.upload->finish());
    g.upload.reset();
    g.unit = -1;
  }
  held_slot_ = -1;
  return Status::ok();
}

Tensor ParamGatherer::owned_params(int unit) const {
  const ParamUnit& u = layout_.units()[static_cast<size_t>(unit)];
  if (!plan_.shard_optimizer) return params_.slice(u.offset, u.numel);
  if (plan_.shard_params) return shard(unit);
  return params_.slice(layout_.shard_offset(unit, plan_.rank), layout_.shard_numel(unit));
}

Status ParamGatherer::unit_updated(int unit) {
  if (!plan_.gathers_after_update()) return Status::ok();
  const int index = bucket_of_unit_[static_cast<size_t>(unit)];
  if (unit != buckets_[static_cast<size_t>(index)].last || !options_.overlap_comm) return Status::ok();
  return gather_bucket(index);
}

Status ParamGatherer::finish_update() {
  if (options_.overlap_comm) return Status::ok();
  if (plan_.gathers_after_update())
    for (size_t b = 0; b < buckets_.size(); ++b) GLM_RETURN_IF_ERROR(gather_bucket(static_cast<int>(b)));
  // With --overlap_comm the all-gathers stay in flight into the next step: acquire() waits for a
  // unit's bucket just before its forward, so the last buckets' gathers (the head's, issued last)
  // overlap the first layers' compute, as Megatron's overlap_param_gather. Everything else that
  // touches the parameters settles them first.
  return settle();
}

// Starts bucket `index`'s parameter all-gather: one group of in-place per-unit gathers (this rank's
// shard already sits at its block of each unit; a one-unit bucket is a group of one).
Status ParamGatherer::gather_bucket(int index) {
  const CommBucket& b = buckets_[static_cast<size_t>(index)];
  for (auto& other : in_flight_)  // the previous step's gather of this bucket, if nothing waited for it
    if (other.bucket == index) GLM_RETURN_IF_ERROR(finish(other));
  InFlight g;
  g.bucket = index;
  if (!data_.device_buffers()) GLM_RETURN_IF_ERROR(backend_.synchronize());
  std::vector<CommPart> parts;
  for (int unit = b.first; unit <= b.last; ++unit) {
    const ParamUnit& u = layout_.units()[static_cast<size_t>(unit)];
    if (u.numel == 0) continue;
    parts.push_back({owned_params(unit).data, params_.slice(u.offset, u.numel).data,
                     static_cast<size_t>(layout_.shard_numel(unit))});
  }
  g.request = data_.start_all_gather_group(parts, type_);
  in_flight_.push_back(std::move(g));
  if (!options_.overlap_comm) return finish(in_flight_.back());
  return Status::ok();
}

Status ParamGatherer::finish(InFlight& g) {
  if (g.bucket < 0) return Status::ok();
  g.bucket = -1;
  return waits_.wait(g.request);
}

Status ParamGatherer::settle() {
  for (auto& g : in_flight_) GLM_RETURN_IF_ERROR(finish(g));
  in_flight_.clear();
  return Status::ok();
}

Status ParamGatherer::finish_bucket_of(int unit) {
  const int bucket = bucket_of_unit_.empty() ? -1 : bucket_of_unit_[static_cast<size_t>(unit)];
  bool pending = false;
  for (auto& g : in_flight_) {
    if (g.bucket == bucket) GLM_RETURN_IF_ERROR(finish(g));
    pending = pending || g.bucket >= 0;
  }
  if (!pending) in_flight_.clear();
  return Status::ok();
}

Status ParamGatherer::fill_stored(const std::function<Status(Tensor dst, int64_t global_begin)>& fill, int64_t begin,
                                  int64_t end) {
  if (!plan_.shard_params) return fill(params_.tensor(), 0);
  const int units = static_cast<int>(layout_.units().size());
  for (int u = 0; u < units; ++u) {
    if (u == layout_.persistent_unit()) continue;
    const Tensor stored = shard(u);
    const int64_t at = layout_.shard_offset(u, plan_.rank);
    if (stored.numel == 0 || at >= end || at + stored.numel <= begin) continue;
    if (!params_on_host(u)) {
      GLM_RETURN_IF_ERROR(fill(stored, at));
      continue;
    }
    // Through the first gathered buffer (free: the caller forgot the gathered units).
    const Tensor staging = gathered_[0].params.slice(0, stored.numel);
    if (begin > at || end < at + stored.numel) GLM_RETURN_IF_ERROR(backend_.upload(staging, stored.data));
    GLM_RETURN_IF_ERROR(fill(staging, at));
    GLM_RETURN_IF_ERROR(backend_.download(stored.data, staging));
  }
  return Status::ok();
}

Status ParamGatherer::read_stored(int unit, const std::function<Status(Tensor stored)>& read) {
  const Tensor stored = shard(unit), staging = gathered_[0].params.slice(0, stored.numel);
  GLM_RETURN_IF_ERROR(backend_.upload(staging, stored.data));
  return read(staging);
}

int64_t ParamGatherer::param_bytes() const {
  return static_cast<int64_t>(params_.tensor().bytes() + param_shards_.tensor().bytes());
}

int64_t ParamGatherer::host_param_bytes() const { return static_cast<int64_t>(host_shards_.tensor().bytes()); }

int64_t ParamGatherer::buffer_bytes() const {
  int64_t bytes = 0;
  for (const auto& g : gathered_) bytes += static_cast<int64_t>(g.params.tensor().bytes());
  return bytes;
}

}  // namespace glm
