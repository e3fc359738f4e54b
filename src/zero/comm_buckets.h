// Communication buckets: runs of consecutive ZeRO units coalesced into one collective. A bucket
// covers units [first, last], one contiguous range of the flat layout and, on every rank, one
// contiguous range of its shard buffers (shards are laid out unit after unit).
#pragma once

#include <cstdint>
#include <vector>

#include "model/param_layout.h"
#include "zero/zero_options.h"

namespace glm {

struct CommBucket {
  int first = 0, last = 0;     // units, inclusive, first <= last
  int64_t offset = 0;          // flat layout offset of unit `first`
  int64_t numel = 0;           // elements of all its units (padded, so divisible by the world size)
  int64_t shard_offset = 0;    // offset of unit first's shard in a rank's shard buffer
  int units() const { return last - first + 1; }
  int64_t shard_numel(int world) const { return numel / world; }
};

// Buckets over all units in the order collectives are issued: backward order (the head first,
// the embedding last) when `backward`, else forward order. A unit joins the open bucket while the
// bucket stays within bucket_size elements; a unit larger than bucket_size is a bucket of its own
// (units are never split: backward finishes a unit's gradient all at once, so splitting would not
// start any collective earlier, and one large collective moves data faster than several parts).
// The persistent unit, if any, is a bucket of its own, last in either order: backward completes
// its gradient only after the embedding's, and the optimizer updates it last.
std::vector<CommBucket> plan_comm_buckets(const ParamLayout& layout, int64_t bucket_size, bool backward);

// Where each unit's shard starts in a rank's shard buffer (shards laid out unit after unit), and
// (last element) the buffer's size.
std::vector<int64_t> shard_offsets(const ParamLayout& layout);

// The buffers ZeRO allocates besides parameters, gradients and optimizer state, in elements of
// each dtype; shared by the engine's allocation and the memory planner so the two cannot drift.
struct ZeroBufferSizes {
  int64_t grad_bucket_numel = 0;    // compute dtype: where backward writes a bucket (stages 2-3)
  int grad_bucket_count = 0;        // 2 when collectives read them directly, 1 when packed out
  int64_t reduce_send_numel = 0;    // reduce dtype, x2 slots: the bucket converted to the reduce dtype
  int64_t reduce_recv_numel = 0;    // reduce dtype, x2 slots: this rank's reduced part
  int64_t reduce_convert_numel = 0;  // compute dtype, x1: reduced part converted before accumulation
  int64_t gathered_unit_numel = 0;  // compute dtype, x2: stage 3's gathered unit and the prefetched one
  int64_t persistent_grad_numel = 0;  // compute dtype, x1: stage 3's persistent gradients during backward
  DType compute = DType::f32, reduce = DType::f32;
  int64_t bytes() const;
};

// The dtype gradients travel in over `world` ranks: bf16 when asked, else fp32, or fp64 on the
// fp64 oracle backend (fp32 means "no narrower than fp32"). One exception keeps fp32's meaning:
// with bf16 compute every reduced gradient is rounded back to bf16, and over two ranks each element
// is the sum of two bf16 values; their fp32 sum rounded to bf16 is the correctly rounded bf16 sum
// that NCCL's bf16 reduction computes (test_nccl checks it bit for bit), so the wire is bf16 then:
// half the bytes and no conversion passes, the same bits.
DType effective_reduce_dtype(const ZeroOptions& options, DType compute, int world);

// frozen (LoRA's base): no gradients, so only stage 3's gathered units.
ZeroBufferSizes zero_buffer_sizes(const ParamLayout& layout, int stage, const ZeroOptions& options, DType compute,
                                  bool frozen = false);

}  // namespace glm
