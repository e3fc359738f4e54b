// ZeRO communication options with DeepSpeed's names and meanings (sizes in elements, not bytes).
#pragma once

#include <cstdint>
#include <vector>

#include "base/tensor.h"
#include "model/param_layout.h"

namespace glm {

struct ZeroOptions {
  // --reduce_bucket_size: consecutive units' gradients (backward order) are coalesced into one
  // reduce-scatter / all-reduce of up to this many elements; a larger unit is a bucket of its own.
  // kAutoBucketSize: measured at start (zero/bucket_autotune.h); where nothing is measured (one
  // rank, the memory planner) auto is DeepSpeed's default, kDefaultBucketSize.
  static constexpr int64_t kAutoBucketSize = -1;
  static constexpr int64_t kDefaultBucketSize = 500'000'000;
  int64_t reduce_bucket_size = kDefaultBucketSize;
  // --allgather_bucket_size: stages 1-2 all-gather updated parameters in buckets of consecutive units.
  int64_t allgather_bucket_size = kDefaultBucketSize;
  // --overlap_comm: collectives start as soon as their bucket is complete and overlap backward /
  // the optimizer / the next unit's forward; false issues them after the producer, one at a time.
  bool overlap_comm = true;
  // --prefetch_bucket_size (stage 3): the next unit is gathered ahead when it has at most this
  // many elements (one unit ahead at most: two gathered buffers). 0 disables prefetching.
  int64_t prefetch_bucket_size = kDefaultBucketSize;
  // --grad_reduce_dtype: the dtype gradients travel and are summed in (PyTorch FSDP2's reduce_dtype).
  DType grad_reduce_dtype = DType::f32;
  // --param_persistence_threshold / --model_persistence_threshold (stage 3; DeepSpeed's
  // stage3_param_persistence_threshold and stage3_model_persistence_threshold): tensors of at most
  // this many elements, in layout order while their total stays within the model threshold, are
  // not partitioned: every rank keeps them whole (ParamLayout's persistent unit), never gathered
  // per layer; their gradients and optimizer state stay partitioned, and the updated tensors are
  // all-gathered once after the optimizer step. 0 here keeps every tensor partitioned (what
  // library callers and tests get); the command line's default is DeepSpeed's 1e5.
  static constexpr int64_t kDeepSpeedParamPersistenceThreshold = 100'000;
  int64_t param_persistence_threshold = 0;
  int64_t model_persistence_threshold = PersistencePolicy::kUnlimited;
  // --offload_param cpu (stage 3; DeepSpeed's offload_param): this rank's parameter shards live in
  // host memory (page-locked with offload_pin_memory) and each is uploaded into its gathered
  // buffer when its unit is gathered; the persistent tensors stay on the device.
  bool offload_params = false;
  bool offload_pin_memory = true;
  // --offload_param_ratio: the share of those shards (by elements) in host memory; the other units'
  // shards stay on the device, spread evenly among the offloaded ones (offloaded_param_units()),
  // and are gathered without an upload. 1: every unit's.
  double offload_param_ratio = 1.0;
  // With the optimizer offloaded at stages 2-3 and one micro-batch a step (the trainer sets it at
  // --gradient_accumulation_steps 1): this rank's gradient shards live in host memory, each
  // bucket's reduced gradient copied there during backward as soon as its reduction is done (its
  // squares summed on the device first, for the norm); the device keeps only the bucket buffers.
  bool offload_grads = false;

  // reduce_bucket_size with auto taken as the default: what a run that measures nothing uses.
  int64_t unmeasured_reduce_bucket_size() const {
    return reduce_bucket_size == kAutoBucketSize ? kDefaultBucketSize : reduce_bucket_size;
  }
};

// --offload_param cpu at ratio r: true for the units whose shards live in host memory. In forward
// order a unit goes to the host when that keeps the host's share of the elements seen so far
// nearest r, so resident and offloaded units interleave (an upload overlaps a resident unit's
// compute) and the host's share of the whole is within half a unit of r. The persistent unit and
// empty units are never offloaded.
std::vector<bool> offloaded_param_units(const ParamLayout& layout, double ratio);

// Whether a run keeps its gradient shards in host memory (ZeroOptions::offload_grads): asked for
// (--offload_gradients), the optimizer offloaded (full training, stages 2-3) and one micro-batch a
// step, so nothing accumulates there.
inline bool offloads_gradients(bool wanted, bool offload_optimizer, int64_t gradient_accumulation_steps, int stage,
                               bool lora) {
  return wanted && offload_optimizer && gradient_accumulation_steps == 1 && stage >= 2 && !lora;
}

// The tensors ZeRO keeps whole on every rank: none below stage 3.
inline PersistencePolicy persistence_policy(const ZeroOptions& options, int stage) {
  if (stage != 3) return PersistencePolicy{};
  return PersistencePolicy{options.param_persistence_threshold, options.model_persistence_threshold};
}

// The parameter layout ZeRO `stage` over `world` ranks works on: units padded into equal shards,
// the persistent tensors (stage 3) in their own unit. The model is built on it.
inline ParamLayout zero_param_layout(const ModelConfig& config, int world, int stage, const ZeroOptions& options) {
  return ParamLayout(config, world, persistence_policy(options, stage));
}

}  // namespace glm
