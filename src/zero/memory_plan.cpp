// Memory planner arithmetic; every row mirrors an allocation in the engine or the CUDA backend.
#include "zero/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "model/glm4_model.h"
#include "model/param_layout.h"
#include "zero/comm_buckets.h"

namespace glm {

MemoryPlan plan_cuda_memory(const MemoryPlanInput& in) {
  const int stage = in.zero_stage;
  const ParamLayout layout(in.model, in.world_size, persistence_policy(in.zero_options, stage));
  const int units = static_cast<int>(layout.units().size());
  const int persistent = layout.persistent_unit();
  int64_t shard_total = 0, persistent_numel = 0;
  for (int u = 0; u < units; ++u) {
    shard_total += layout.shard_numel(u);
    if (u == persistent) persistent_numel = layout.units()[static_cast<size_t>(u)].numel;
  }
  const int64_t total = layout.total_numel(), n = in.micro_batch_tokens;
  // ZeRO-3 keeps the persistent unit whole on every rank (its shard inside it).
  const int64_t stage3_params = shard_total - (persistent >= 0 ? layout.shard_numel(persistent) : 0) + persistent_numel;
  MemoryPlan p;
  auto add = [&](const char* what, int64_t bytes) {
    p.rows.push_back({what, bytes});
    p.total += bytes;
  };
  add("parameters (bf16)", stage == 3 ? 2 * stage3_params : 2 * total);
  add("gradients (bf16)", stage == 0 ? 2 * total : (stage == 1 ? 2 * total + 2 * shard_total : 2 * shard_total));
  add("optimizer: fp32 master + Adam moments", 12 * (stage == 0 ? total : shard_total));
  ZeroOptions zero = in.zero_options;
  if (zero.reduce_bucket_size == ZeroOptions::kAutoBucketSize) zero.reduce_bucket_size = ZeroOptions{}.reduce_bucket_size;
  // Gradient buckets, packed send and receive slots, gathered units: what ZeroParameters allocates.
  add("communication buffers", zero_buffer_sizes(layout, stage, zero, DType::bf16).bytes());
  add("activations and backward scratch", Glm4Model::planned_activation_bytes(in.model, n, 2, 4, in.recompute) + 16 * n);
  const int64_t vocab = in.model.vocab_size;
  const int64_t chunk = lm_head_chunk_rows(n, vocab);
  const ModelConfig& c = in.model;
  const bool flash = c.head_dim == 32 || c.head_dim == 64 || c.head_dim == 128;
  const int64_t attention =
      4 * (flash ? n * c.num_attention_heads * (c.head_dim + 1) + 2 * n * c.num_key_value_heads * c.head_dim
                 : n * c.num_attention_heads);
  add("kernel scratch: logits chunk, attention, GEMM workspace",
      chunk * vocab * 6 + attention + 4 * c.hidden_size + (int64_t{32} << 20));
  add("CUDA context and libraries (calibrated)", kCudaRuntimeReserveBytes);
  return p;
}

std::string format_memory_plan(const MemoryPlanInput& in, const MemoryPlan& plan, double gpu_memory_gib) {
  const double gib = 1024.0 * 1024.0 * 1024.0;
  std::string out;
  char line[256];
  std::snprintf(line, sizeof(line),
                "memory plan per GPU: %lld parameters, %lld layers, world size %d, ZeRO-%d, %lld tokens per "
                "micro-batch, recompute %s\n",
                static_cast<long long>(in.model.parameter_count()), static_cast<long long>(in.model.num_hidden_layers),
                in.world_size, in.zero_stage, static_cast<long long>(in.micro_batch_tokens),
                recompute_name(in.recompute));
  out += line;
  const ParamLayout layout(in.model, in.world_size, persistence_policy(in.zero_options, in.zero_stage));
  if (layout.persistent_unit() >= 0) {
    std::snprintf(line, sizeof(line),
                  "ZeRO-3 persistent tensors (--param_persistence_threshold %lld): %d tensors, %lld parameters "
                  "whole on every GPU\n",
                  static_cast<long long>(in.zero_options.param_persistence_threshold), layout.persistent_tensors(),
                  static_cast<long long>(layout.persistent_parameter_count()));
    out += line;
  }
  for (const auto& r : plan.rows) {
    std::snprintf(line, sizeof(line), "  %-58s %9.2f GiB\n", r.what.c_str(), static_cast<double>(r.bytes) / gib);
    out += line;
  }
  const double total = static_cast<double>(plan.total) / gib;
  std::snprintf(line, sizeof(line), "  %-58s %9.2f GiB\n", "total (predicted peak)", total);
  out += line;
  std::snprintf(line, sizeof(line), "fits in %.1f GiB: %s (%.1f GiB %s)\n", gpu_memory_gib,
                total <= gpu_memory_gib ? "yes" : "no", std::abs(gpu_memory_gib - total),
                total <= gpu_memory_gib ? "to spare" : "short");
  out += line;
  return out;
}

}  // namespace glm
