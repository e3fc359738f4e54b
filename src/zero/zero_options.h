// ZeRO communication options with DeepSpeed's names and meanings (sizes in elements, not bytes).
#pragma once

#include <cstdint>

#include "kernels/tensor.h"

namespace glm {

struct ZeroOptions {
  // --reduce_bucket_size: consecutive units' gradients (backward order) are coalesced into one
  // reduce-scatter / all-reduce of up to this many elements; a larger unit is a bucket of its own.
  // kAutoBucketSize: measured at start (zero/bucket_autotune.h).
  static constexpr int64_t kAutoBucketSize = -1;
  int64_t reduce_bucket_size = 500'000'000;
  // --allgather_bucket_size: stages 1-2 all-gather updated parameters in buckets of consecutive units.
  int64_t allgather_bucket_size = 500'000'000;
  // --overlap_comm: collectives start as soon as their bucket is complete and overlap backward /
  // the optimizer / the next unit's forward; false issues them after the producer, one at a time.
  bool overlap_comm = true;
  // --prefetch_bucket_size (stage 3): the next unit is gathered ahead when it has at most this
  // many elements (one unit ahead at most: two gathered buffers). 0 disables prefetching.
  int64_t prefetch_bucket_size = 500'000'000;
  // --grad_reduce_dtype: the dtype gradients travel and are summed in (PyTorch FSDP2's reduce_dtype).
  DType grad_reduce_dtype = DType::f32;
};

}  // namespace glm
