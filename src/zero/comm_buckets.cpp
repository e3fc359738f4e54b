// Bucket planning and the buffer sizes that follow from it.
#include "zero/comm_buckets.h"

#include <algorithm>

namespace glm {

std::vector<CommBucket> plan_comm_buckets(const ParamLayout& layout, int64_t bucket_size, bool backward) {
  const int units = static_cast<int>(layout.units().size());
  std::vector<CommBucket> buckets;
  std::vector<int64_t> shard_base(static_cast<size_t>(units), 0);
  for (int u = 1; u < units; ++u) shard_base[static_cast<size_t>(u)] = shard_base[static_cast<size_t>(u - 1)] +
                                                                        layout.shard_numel(u - 1);
  auto unit_numel = [&](int u) { return layout.units()[static_cast<size_t>(u)].numel; };
  int open_first = -1, open_last = -1;
  int64_t open_numel = 0;
  auto close = [&] {
    if (open_first < 0) return;
    CommBucket b;
    b.first = open_first;
    b.last = open_last;
    b.offset = layout.units()[static_cast<size_t>(open_first)].offset;
    b.numel = open_numel;
    b.shard_offset = shard_base[static_cast<size_t>(open_first)];
    buckets.push_back(b);
    open_first = open_last = -1;
    open_numel = 0;
  };
  const int persistent = layout.persistent_unit();
  auto add = [&](int u) {
    if (open_first < 0) open_first = open_last = u;
    open_first = std::min(open_first, u);
    open_last = std::max(open_last, u);
    open_numel += unit_numel(u);
  };
  for (int i = 0; i < units; ++i) {
    const int u = backward ? units - 1 - i : i;
    if (u == persistent) continue;
    if (open_first >= 0 && open_numel + unit_numel(u) > bucket_size) close();
    add(u);
  }
  close();
  if (persistent >= 0) {
    add(persistent);
    close();
  }
  return buckets;
}

std::vector<int64_t> shard_offsets(const ParamLayout& layout) {
  const int units = static_cast<int>(layout.units().size());
  std::vector<int64_t> offsets(static_cast<size_t>(units) + 1, 0);
  for (int u = 0; u < units; ++u)
    offsets[static_cast<size_t>(u) + 1] = offsets[static_cast<size_t>(u)] + layout.shard_numel(u);
  return offsets;
}

DType effective_reduce_dtype(const ZeroOptions& options, DType compute, int world) {
  if (options.grad_reduce_dtype == DType::bf16) return DType::bf16;
  if (compute == DType::bf16 && world == 2) return DType::bf16;
  return compute == DType::f64 ? DType::f64 : DType::f32;
}

int64_t ZeroBufferSizes::bytes() const {
  const int64_t c = static_cast<int64_t>(dtype_size(compute)), r = static_cast<int64_t>(dtype_size(reduce));
  return c * (grad_bucket_numel * grad_bucket_count + reduce_convert_numel + 2 * gathered_unit_numel +
              persistent_grad_numel) +
         r * 2 * (reduce_send_numel + reduce_recv_numel);
}

ZeroBufferSizes zero_buffer_sizes(const ParamLayout& layout, int stage, const ZeroOptions& options, DType compute,
                                  bool frozen) {
  ZeroBufferSizes s;
  s.compute = compute;
  const int world = layout.shards();
  s.reduce = effective_reduce_dtype(options, compute, world);
  const int units = static_cast<int>(layout.units().size());
  const int persistent = layout.persistent_unit();
  int64_t largest_unit = 0;  // of those gathered: the persistent unit is whole everywhere
  for (int u = 0; u < units; ++u)
    if (u != persistent) largest_unit = std::max(largest_unit, layout.units()[static_cast<size_t>(u)].numel);
  if (stage == 3) s.gathered_unit_numel = largest_unit;
  if (frozen) return s;
  if (stage == 3 && persistent >= 0) s.persistent_grad_numel = layout.units()[static_cast<size_t>(persistent)].numel;
  // The persistent unit's bucket is reduced from its own buffer, not from a gradient bucket.
  int64_t largest_bucket = 0, largest_written_bucket = 0;
  for (const CommBucket& b : plan_comm_buckets(layout, options.reduce_bucket_size, true)) {
    largest_bucket = std::max(largest_bucket, b.numel);
    if (b.first != persistent) largest_written_bucket = std::max(largest_written_bucket, b.numel);
  }
  const bool convert = s.reduce != compute;
  // Collectives read the gradient where backward wrote it (a multi-unit bucket as one group of
  // per-unit collectives), unless it must be converted to the reduce dtype first. Parameter
  // all-gathers are in place, one group per bucket: no staging either.
  const bool pack = world > 1 && convert;
  if (stage >= 2) {
    s.grad_bucket_numel = largest_written_bucket;
    // A packed bucket is free again as soon as it is copied out; one rank only adds it to its shards,
    // unless it copies it to host memory (offload_grads): backward then fills the other meanwhile.
    s.grad_bucket_count = pack || (world == 1 && !options.offload_grads) ? 1 : 2;
  }
  if (world == 1) return s;  // nothing is communicated: stages 2-3 add the bucket to the shards
  if (pack) s.reduce_send_numel = largest_bucket;
  if (stage >= 2 || (stage == 1 && convert)) s.reduce_recv_numel = largest_bucket / world;
  if (stage >= 2 && convert) s.reduce_convert_numel = largest_bucket / world;
  return s;
}

}  // namespace glm
