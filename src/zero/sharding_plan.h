// What a ZeRO stage shards over how many ranks, decided once: the pieces (zero/grad_reducer.h,
// zero/param_gatherer.h, zero/persistent_unit.h) ask these questions instead of comparing stages.
#pragma once

namespace glm {

struct ShardingPlan {
  int stage = 0;
  int world = 1;
  int rank = 0;  // of this process, in the host communicator
  bool frozen = false;           // LoRA's base: parameters only, no gradients
  bool shard_optimizer = false;  // stages 1-3
  bool shard_grads = false;      // stages 2-3
  bool shard_params = false;     // stage 3

  static ShardingPlan make(int stage, int world, int rank, bool frozen) {
    return ShardingPlan{stage, world, rank, frozen, stage >= 1, stage >= 2, stage >= 3};
  }
  bool distributed() const { return world > 1; }
  // Stages 0-1: a full gradient buffer; each bucket is reduced once, when the last micro-batch's
  // backward completed it. Stages 2-3 reduce every bucket of every micro-batch into the shards.
  bool full_grads() const { return !frozen && !shard_grads; }
  // Stage 0 all-reduces gradients; the others reduce-scatter them.
  bool all_reduce_grads() const { return !shard_optimizer; }
  // Stages 1-2 over several ranks: the updated shards are all-gathered after the optimizer.
  bool gathers_after_update() const { return !frozen && shard_optimizer && !shard_params && distributed(); }
  // A unit's owned gradient is final when the last backward finished it (nothing reduces it after).
  bool grads_final_in_backward() const { return !frozen && !shard_optimizer && !distributed(); }
};

}  // namespace glm
