// Memory planner arithmetic; every row mirrors an allocation in the engine or the CUDA backend.
#include "zero/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "model/context_attention.h"
#include "model/glm4_model.h"
#include "model/param_layout.h"
#include "zero/comm_buckets.h"

namespace glm {

namespace {

// The full model's optimizer state over `owned` elements: on the GPU, or offloaded to the host.
void add_optimizer_rows(const MemoryPlanInput& in, int64_t owned, MemoryPlan& p) {
  auto add = [&](const char* what, int64_t bytes) {
    p.rows.push_back({what, bytes});
    p.total += bytes;
  };
  if (in.offload_optimizer) {
    // OptimizerOffload: a whole fp32 master and both moments, and two bf16 staging slots of 4M
    // elements each way.
    const int64_t staging = 2 * 2 * 2 * (int64_t{1} << 22);
    p.host_rows.push_back({"offloaded optimizer: fp32 master + Adam moments", 12 * owned});
    p.host_rows.push_back({"offloaded optimizer: staging (bf16 gradients, parameters)", staging});
    p.host_total += 12 * owned + staging;
    if (in.offload_delayed_update) {
      p.host_rows.push_back({"delayed update: the step's gradient + working copy (bf16)", 4 * owned});
      p.host_total += 4 * owned;
    }
  } else if (in.split_master) {  // the masters' high halves are the bf16 parameters
    add("optimizer: fp32 masters' low halves + Adam moments", 10 * owned);
  } else {
    add("optimizer: fp32 master + Adam moments", 12 * owned);
  }
  if (in.defer_embedding && in.zero_stage == 0)
    add("optimizer: deferred embedding rows (row steps, step rows)", 8 * in.model.vocab_size);
}

// The parameters: whole (stages 0-2) or this rank's shards (3) on the GPU; with --offload_param cpu
// the offloaded units' shards (ParamGatherer) in host memory, the persistent unit (whole) and the
// resident units' shards on the GPU.
void add_parameter_rows(const MemoryPlanInput& in, const ParamLayout& layout, int64_t stage3_params,
                        int64_t persistent_numel, bool lora, MemoryPlan& p) {
  auto add = [&](const char* what, int64_t bytes) {
    p.rows.push_back({what, bytes});
    p.total += bytes;
  };
  const int stage = in.zero_stage;
  if (!in.offload_param || stage != 3 || lora) {
    add(lora ? "base parameters (bf16, frozen)" : "parameters (bf16)", stage == 3 ? 2 * stage3_params : 2 * layout.total_numel());
    return;
  }
  const std::vector<bool> host = offloaded_param_units(layout, in.zero_options.offload_param_ratio);
  int64_t offloaded = 0;
  for (size_t u = 0; u < host.size(); ++u)
    if (host[u]) offloaded += layout.shard_numel(static_cast<int>(u));
  add(offloaded + persistent_numel == stage3_params ? "parameters (bf16): persistent tensors"
                                                     : "parameters (bf16): persistent tensors and resident shards",
      2 * (stage3_params - offloaded));
  p.host_rows.push_back({"offloaded parameters: bf16 shards", 2 * offloaded});
  p.host_total += 2 * offloaded;
}

}  // namespace

MemoryPlan plan_cuda_memory(const MemoryPlanInput& in) {
  const int stage = in.zero_stage;
  std::optional<LoraLayout> lora;
  if (in.lora) lora.emplace(in.model, *in.lora);
  const ParamLayout layout = zero_param_layout(in.model, in.world_size, stage, in.zero_options);
  const int units = static_cast<int>(layout.units().size());
  const int persistent = layout.persistent_unit();
  int64_t shard_total = 0, persistent_numel = 0;
  for (int u = 0; u < units; ++u) {
    shard_total += layout.shard_numel(u);
    if (u == persistent) persistent_numel = layout.units()[static_cast<size_t>(u)].numel;
  }
  const int64_t total = layout.total_numel(), n = context_share_tokens(in.micro_batch_tokens, in.context_parallel_size);
  // ZeRO-3 keeps the persistent unit whole on every rank (its shard inside it).
  const int64_t stage3_params = shard_total - (persistent >= 0 ? layout.shard_numel(persistent) : 0) + persistent_numel;
  MemoryPlan p;
  auto add = [&](const char* what, int64_t bytes) {
    p.rows.push_back({what, bytes});
    p.total += bytes;
  };
  add_parameter_rows(in, layout, stage3_params, persistent_numel, lora.has_value(), p);
  ZeroOptions zero = in.zero_options;
  zero.reduce_bucket_size = zero.unmeasured_reduce_bucket_size();
  zero.offload_grads = offloads_gradients(in.offload_gradients, in.offload_optimizer, in.gradient_accumulation_steps,
                                          stage, lora.has_value());
  // Gradient buckets, packed send and receive slots, gathered units: what ZeroEngine allocates
  // (for a frozen base only stage 3's gathered units).
  int64_t buffers = zero_buffer_sizes(layout, stage, zero, DType::bf16, lora.has_value()).bytes();
  if (lora) {
    // TrainingEngine: every rank holds all adapters, their gradients and AdamW state; the gradients
    // are all-reduced from a copy in the reduce dtype unless that is the compute dtype.
    const int64_t adapters = lora->total_numel();
    add("LoRA adapters + gradients (bf16, replicated)", 2 * adapters + 2 * adapters);
    add("LoRA optimizer: fp32 master + Adam moments", 12 * adapters);
    const DType reduce = effective_reduce_dtype(zero, DType::bf16, in.world_size);
    if (in.world_size > 1 && reduce != DType::bf16) buffers += static_cast<int64_t>(dtype_size(reduce)) * adapters;
  } else {
    if (zero.offload_grads) {  // GradReducer's shards in host memory
      p.host_rows.push_back({"offloaded gradients: bf16 shards", 2 * shard_total});
      p.host_total += 2 * shard_total;
    } else {
      add("gradients (bf16)", stage == 0 ? 2 * total : (stage == 1 ? 2 * total + 2 * shard_total : 2 * shard_total));
    }
    add_optimizer_rows(in, stage == 0 ? total : shard_total, p);
  }
  add("communication buffers", buffers);
  // + the engine's i32 micro-batch with its index, and its argmax flags (correct).
  add("activations and backward scratch",
      Glm4Model::planned_activation_bytes(in.model, n, 2, 4, in.recompute, in.offload_activations) +
          4 * (micro_batch_ints(n) + n));
  if (const int64_t host = Glm4Model::planned_host_activation_bytes(in.model, n, 2, in.offload_activations);
      host > 0) {
    p.host_rows.push_back({"offloaded activations: the layers' inputs (bf16)", host});
    p.host_total += host;
  }
  if (lora)
    add(in.lora->dropout > 0 ? "LoRA activations: rank-r intermediates, dropout scratch"
                             : "LoRA activations: rank-r intermediates",
        2 * lora_activation_sizes(*lora, n).numel());
  if (in.context_parallel_size > 1) {
    // model/context_attention.h: the share's k | v, the gathered row's and its gradients (bf16), and
    // the engine's i32 row positions of the share and gathered rows of the row.
    const int64_t row = n * in.context_parallel_size, kv = 2 * in.model.num_key_value_heads * in.model.head_dim;
    add("context parallelism: gathered k | v and their gradients", 2 * kv * (n + 2 * row) + 4 * (n + row));
  }
  const int64_t vocab = in.model.vocab_size;
  const int64_t chunk = lm_head_chunk_rows(n, vocab, in.lm_head_scratch_bytes);
  const ModelConfig& c = in.model;
  const bool flash = c.head_dim == 32 || c.head_dim == 64 || c.head_dim == 128;
  // The flash backward's fp32 dQ, delta and dK | dV; under context parallelism dK | dV cover the
  // whole gathered row (flash_attention_gathered_scratch).
  const int64_t kv_positions = n * in.context_parallel_size;
  const int64_t attention =
      4 * (flash ? n * c.num_attention_heads * (c.head_dim + 1) + 2 * kv_positions * c.num_key_value_heads * c.head_dim
                 : n * c.num_attention_heads);
  add("kernel scratch: logits chunk, attention, GEMM workspace",
      chunk * vocab * 2 + attention + 4 * c.hidden_size + (int64_t{32} << 20));
  add("CUDA context and libraries (calibrated)", kCudaRuntimeReserveBytes);
  return p;
}

int64_t longest_fitting_tokens(const MemoryPlanInput& in, double gpu_memory_gib) {
  const double limit = gpu_memory_gib * 1024.0 * 1024.0 * 1024.0;
  MemoryPlanInput probe = in;
  auto fits = [&](int64_t tokens) {
    probe.micro_batch_tokens = tokens;
    return static_cast<double>(plan_cuda_memory(probe).total) <= limit;
  };
  // Rows are positions of int32 (data/context_split.h); the plan grows with the tokens.
  int64_t lo = 0, hi = int64_t{1} << 31;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

std::optional<MemoryPlanInput> cheapest_fitting_settings(const MemoryPlanInput& in, double gpu_memory_gib) {
  const double limit = gpu_memory_gib * 1024.0 * 1024.0 * 1024.0;
  MemoryPlanInput probe = in;
  auto fits = [&] { return static_cast<double>(plan_cuda_memory(probe).total) <= limit; };
  const bool full = !in.lora.has_value();
  for (const int offload : {0, 1, 2}) {  // nothing, the optimizer, the optimizer and the parameters
    if (offload > 0 && !full) break;
    // Recomputation from none to full, then full with the layers' inputs in host memory.
    for (const auto& [recompute, offload_activations] :
         {std::pair{Recompute::none, false}, std::pair{Recompute::selective, false}, std::pair{Recompute::full, false},
          std::pair{Recompute::full, true}}) {
      for (int stage = full ? 0 : in.zero_stage; stage <= (full ? 3 : in.zero_stage); ++stage) {
        if ((offload == 1 && stage == 0) || (offload == 2 && stage != 3)) continue;  // as the options require
        probe.offload_optimizer = offload >= 1;
        probe.offload_param = offload == 2;
        probe.recompute = recompute;
        probe.offload_activations = offload_activations;
        probe.zero_stage = stage;
        // Offloaded parameters: the smallest share of them in host memory that fits, in steps of 5%.
        for (int twentieths = offload == 2 ? 1 : 20; twentieths <= 20; ++twentieths) {
          probe.zero_options.offload_param_ratio = offload == 2 ? twentieths / 20.0 : in.zero_options.offload_param_ratio;
          if (fits()) return probe;
        }
      }
    }
  }
  return std::nullopt;
}

namespace {
std::string settings_text(const MemoryPlanInput& in) {
  const double ratio = in.zero_options.offload_param_ratio;
  return concat("--zero_stage ", in.zero_stage, " --recompute ", enum_name(in.recompute),
                in.offload_activations ? " --offload_activations true" : "", in.offload_optimizer ? " --offload_optimizer cpu" : "", in.offload_param ? " --offload_param cpu" : "",
                in.offload_param && ratio < 1 ? concat(" --offload_param_ratio ", ratio) : "");
}

int nodes_gpus(const MemoryPlanInput& in) { return std::clamp(in.gpus_per_node, 1, in.world_size); }

// The offloaded optimizer's host memory, per rank and per node.
std::string format_host_rows(const MemoryPlanInput& in, const MemoryPlan& plan) {
  if (plan.host_rows.empty()) return "";
  const double gib = 1024.0 * 1024.0 * 1024.0;
  std::string out = "host memory per GPU's rank (pinned):\n";
  char line[256];
  for (const auto& r : plan.host_rows) {
    std::snprintf(line, sizeof(line), "  %-58s %9.2f GiB\n", r.what.c_str(), static_cast<double>(r.bytes) / gib);
    out += line;
  }
  const int per_node = nodes_gpus(in);
  std::snprintf(line, sizeof(line), "  %-58s %9.2f GiB\n",
                concat("per node of ", per_node, per_node == 1 ? " GPU" : " GPUs").c_str(),
                static_cast<double>(plan.host_total) * per_node / gib);
  return out + line;
}

// The cheapest settings that fit, or what to change when nothing does.
std::string format_cheapest_settings(const MemoryPlanInput& in, double gpu_memory_gib) {
  const double gib = 1024.0 * 1024.0 * 1024.0;
  char line[512];
  const std::optional<MemoryPlanInput> cheapest = cheapest_fitting_settings(in, gpu_memory_gib);
  if (!cheapest) {
    std::snprintf(line, sizeof(line), "%.1f", gpu_memory_gib);
    return concat("nothing fits in ", line, " GiB per GPU at world size ", in.world_size,
                  " even with --zero_stage 3 --recompute full --offload_activations true",
                  in.lora ? "" : " --offload_optimizer cpu --offload_param cpu",
                  ": more GPUs, a shorter max_length", in.lora ? "" : ", or --train_type lora", "\n");
  }
  const MemoryPlan best = plan_cuda_memory(*cheapest);
  const bool same = cheapest->zero_stage == in.zero_stage && cheapest->recompute == in.recompute &&
                    cheapest->offload_activations == in.offload_activations &&
                    cheapest->offload_optimizer == in.offload_optimizer &&
                    cheapest->offload_param == in.offload_param &&
                    (!in.offload_param ||
                     cheapest->zero_options.offload_param_ratio == in.zero_options.offload_param_ratio);
  char host[96] = "";
  if (best.host_total > 0)
    std::snprintf(host, sizeof(host), ", %.2f GiB of host memory per node",
                  static_cast<double>(best.host_total) * nodes_gpus(in) / gib);
  std::snprintf(line, sizeof(line), "cheapest settings that fit in %.1f GiB: %s (%.2f GiB per GPU%s)%s\n",
                gpu_memory_gib, settings_text(*cheapest).c_str(), static_cast<double>(best.total) / gib, host,
                same ? ": these options" : "");
  return line;
}
}  // namespace

std::string format_memory_plan(const MemoryPlanInput& in, const MemoryPlan& plan, double gpu_memory_gib) {
  const double gib = 1024.0 * 1024.0 * 1024.0;
  std::string out;
  char line[256];
  std::snprintf(line, sizeof(line),
                "memory plan per GPU: %lld parameters, %lld layers, world size %d, ZeRO-%d, %lld tokens per "
                "micro-batch, recompute %s%s\n",
                static_cast<long long>(in.model.parameter_count()), static_cast<long long>(in.model.num_hidden_layers),
                in.world_size, in.zero_stage, static_cast<long long>(in.micro_batch_tokens),
                enum_name(in.recompute).data(), in.offload_activations ? ", the layers' inputs offloaded" : "");
  out += line;
  if (in.context_parallel_size > 1) {
    std::snprintf(line, sizeof(line),
                  "context parallelism: groups of %d GPUs share each row; this GPU holds %lld of its tokens and "
                  "gathers the whole row's keys and values\n",
                  in.context_parallel_size,
                  static_cast<long long>(context_share_tokens(in.micro_batch_tokens, in.context_parallel_size)));
    out += line;
  }
  if (in.lora) {
    const LoraLayout lora(in.model, *in.lora);
    std::snprintf(line, sizeof(line),
                  "LoRA rank %lld (alpha %g, dropout %g) on %s: %lld trainable parameters on every GPU; the base is "
                  "frozen (no gradients, no optimizer state)\n",
                  static_cast<long long>(lora.rank()), in.lora->alpha, in.lora->dropout,
                  lora_targets_text(in.lora->targets).c_str(), static_cast<long long>(lora.parameter_count()));
    out += line;
  }
  const ParamLayout layout = zero_param_layout(in.model, in.world_size, in.zero_stage, in.zero_options);
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
  out += format_host_rows(in, plan);
  std::snprintf(line, sizeof(line), "fits in %.1f GiB: %s (%.1f GiB %s)\n", gpu_memory_gib,
                total <= gpu_memory_gib ? "yes" : "no", std::abs(gpu_memory_gib - total),
                total <= gpu_memory_gib ? "to spare" : "short");
  out += line;
  const int64_t longest = longest_fitting_tokens(in, gpu_memory_gib);
  const int64_t positions = in.model.max_position_embeddings;
  std::snprintf(line, sizeof(line),
                "longest micro-batch that fits in %.1f GiB with these options: %lld tokens (per_device_train_batch_size "
                "x max_length)%s\n",
                gpu_memory_gib, static_cast<long long>(longest),
                longest > positions ? concat("; one sequence stops at the model's max_position_embeddings ", positions)
                                          .c_str()
                                    : "");
  out += line;
  out += format_cheapest_settings(in, gpu_memory_gib);
  return out;
}

}  // namespace glm
