// Per-GPU memory prediction for the CUDA backend (bf16 parameters, gradients and activations;
// fp32 master weights, moments and statistics) from the same layout and buffer sizes the trainer
// allocates: `glm_hpc plan`.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/lora.h"
#include "model/recompute.h"
#include "zero/zero_options.h"

namespace glm {

struct MemoryPlanInput {
  ModelConfig model;
  int world_size = 1;
  int zero_stage = 0;
  int64_t micro_batch_tokens = 4096;  // per_device_train_batch_size x max_length
  Recompute recompute = Recompute::none;
  bool offload_activations = false;  // --offload_activations: the layers' inputs in pinned host memory
  ZeroOptions zero_options;  // bucket sizes and reduce dtype (a --reduce_bucket_size auto plans with 5e8)
  // --train_type lora: the base frozen (no gradients, no optimizer state; partitioned only at
  // stage 3), the adapters trained and replicated. nullopt: full training.
  std::optional<LoraConfig> lora;
  // AdamWOptions::split_master: the fp32 master's low halves beside the bf16 parameters (2 bytes a
  // parameter) instead of a whole fp32 copy (4).
  bool split_master = true;
  // The embedding's deferred rows (stage 0, full training): a step per row and the step's rows, i32
  // each.
  bool defer_embedding = true;
  int64_t lm_head_scratch_bytes = int64_t{2} << 30;  // BackendConfig::lm_head_scratch_bytes
  // --context_parallel_size: each GPU holds a share of every row (2 of 2C chunks of the row padded
  // to a multiple of 2C) and the whole row's gathered keys and values with their gradients.
  int context_parallel_size = 1;
  // --offload_optimizer cpu (stages 1-3, full training): the fp32 master and moments in host memory
  // (train/optimizer_offload.h), none of them on the GPU.
  bool offload_optimizer = false;
  // --offload_param cpu (stage 3, with the optimizer offloaded): the bf16 parameter shards of the
  // units offloaded_param_units(zero_options.offload_param_ratio) names in host memory; the GPU
  // keeps the other shards, the persistent tensors and the gathered units.
  bool offload_param = false;
  // --gradient_accumulation_steps: at 1 with the optimizer offloaded (stages 2-3) the gradient
  // shards live in host memory (offloads_gradients()).
  int64_t gradient_accumulation_steps = 1;
  bool offload_gradients = true;  // --offload_gradients
  // --offload_delayed_update: the step's gradient and new working copy in host memory too.
  bool offload_delayed_update = false;
  int gpus_per_node = 8;  // host memory is reported per node of this many GPUs (at most world_size)
};

struct MemoryPlanRow {
  std::string what;
  int64_t bytes = 0;
};

struct MemoryPlan {
  std::vector<MemoryPlanRow> rows;
  int64_t total = 0;
  // What one rank keeps in host memory beyond its process (the offloaded optimizer).
  std::vector<MemoryPlanRow> host_rows;
  int64_t host_total = 0;
};

// The CUDA context, cuBLASLt handles and allocator slack, not allocated by us. Calibrated on an
// H200 (12-layer GLM-4-9B shapes at seq 4096: 57.1 GiB measured by nvidia-smi and planned).
constexpr int64_t kCudaRuntimeReserveBytes = int64_t{600} << 20;

MemoryPlan plan_cuda_memory(const MemoryPlanInput& in);
// The most micro_batch_tokens (per_device_train_batch_size x max_length) whose plan fits in
// gpu_memory_gib, everything else as `in` says; 0 when not even the smallest row fits.
int64_t longest_fitting_tokens(const MemoryPlanInput& in, double gpu_memory_gib);
// The cheapest settings whose plan fits in gpu_memory_gib, `in` otherwise: nothing offloaded before
// the optimizer before the optimizer and parameters (stage 3; the smallest --offload_param_ratio
// that fits, in steps of 0.05), then no recomputation before selective before full, then the lowest
// ZeRO stage (full training; LoRA keeps its own stage and offloads nothing). nullopt: nothing fits.
std::optional<MemoryPlanInput> cheapest_fitting_settings(const MemoryPlanInput& in, double gpu_memory_gib);
std::string format_memory_plan(const MemoryPlanInput& in, const MemoryPlan& plan, double gpu_memory_gib);

}  // namespace glm
