// DeepSpeed JSON configs mapped onto glm_hpc's options (see deepspeed_config.h).
#include "cli/deepspeed_config.h"

#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "base/input_path.h"

namespace glm {
namespace {

using Json = nlohmann::ordered_json;
using Outcome = DeepSpeedKey::Outcome;

constexpr int64_t kMaxConfigBytes = int64_t{16} << 20;

bool is_auto(const Json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// What a key's classification sees: its dotted name, its value, and the blocks it may depend on.
struct Context {
  std::string optimizer_offload = "none";
  std::string param_offload = "none";
};

void applied(DeepSpeedKey& k, std::string option, std::string text) {
  k.outcome = Outcome::applied;
  k.option = std::move(option);
  k.text = std::move(text);
}
void no_effect(DeepSpeedKey& k, std::string reason) {
  k.outcome = Outcome::no_effect;
  k.reason = std::move(reason);
}
void refused(DeepSpeedKey& k, std::string reason) {
  k.outcome = Outcome::refused;
  k.reason = std::move(reason);
}

// A number as an option's text: whole numbers without a fraction (5e8 as 500000000).
std::string number_text(const Json& v) {
  const double d = v.get<double>();
  if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e18) return std::to_string(static_cast<int64_t>(d));
  std::ostringstream s;
  s << v.get<double>();
  return s.str();
}

// key -> option for a number, "auto" leaving the option as it is.
void number_option(DeepSpeedKey& k, const Json& v, const char* option) {
  if (is_auto(v)) return no_effect(k, std::string("auto: --") + option + " keeps its value");
  if (!v.is_number()) return refused(k, "must be a number or \"auto\"");
  applied(k, option, number_text(v));
}

void bool_option(DeepSpeedKey& k, const Json& v, const char* option) {
  if (is_auto(v)) return no_effect(k, std::string("auto: --") + option + " keeps its value");
  if (!v.is_boolean()) return refused(k, "must be true, false or \"auto\"");
  applied(k, option, v.get<bool>() ? "true" : "false");
}

// true where the key's value means "on" (a boolean true or a non-empty enabling value).
bool enabled(const Json& v) { return v.is_boolean() && v.get<bool>(); }

// Settings of DeepSpeed features glm_hpc does not have: fine while off, refused when enabled.
void feature_block(DeepSpeedKey& k, const Json& v, std::string_view block, const char* what) {
  const bool on_switch = k.key == std::string(block) + ".enabled";
  if (on_switch && enabled(v)) return refused(k, std::string(what) + " is not part of glm_hpc");
  no_effect(k, std::string(what) + (on_switch ? " is off" : ": a setting of a feature glm_hpc does not have"));
}

void zero_key(DeepSpeedKey& k, const Json& v, const std::string& name, const Context& c) {
  if (name == "stage") {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 3)
      return refused(k, "must be 0, 1, 2 or 3");
    return applied(k, "zero_stage", number_text(v));
  }
  if (name == "reduce_bucket_size") return number_option(k, v, "reduce_bucket_size");
  if (name == "allgather_bucket_size") return number_option(k, v, "allgather_bucket_size");
  if (name == "overlap_comm") return bool_option(k, v, "overlap_comm");
  if (name == "stage3_prefetch_bucket_size") return number_option(k, v, "prefetch_bucket_size");
  if (name == "stage3_param_persistence_threshold") return number_option(k, v, "param_persistence_threshold");
  if (name == "stage3_model_persistence_threshold") return number_option(k, v, "model_persistence_threshold");
  if (name == "contiguous_gradients")
    return no_effect(k, "gradients are always written into contiguous buckets");
  if (name == "reduce_scatter") {
    if (v.is_boolean() && !v.get<bool>()) return refused(k, "false (all-reduce at stages 1-2) is not offered");
    return no_effect(k, "stages 1-3 reduce-scatter gradients");
  }
  if (name == "allgather_partitions") {
    if (v.is_boolean() && !v.get<bool>()) return refused(k, "false (broadcasts instead of all-gathers) is not offered");
    return no_effect(k, "updated shards are all-gathered after the optimizer step");
  }
  if (name == "offload_optimizer.device") {
    const std::string device = v.is_string() ? lower(v.get<std::string>()) : "";
    if (device == "none" || device == "auto" || v.is_null()) return no_effect(k, "no offload");
    if (device == "cpu") return applied(k, "offload_optimizer", "cpu");
    return refused(k, "only \"cpu\" (or \"none\") is offered: the optimizer state goes to host memory, not NVMe");
  }
  if (name == "offload_param.device") {
    const std::string device = v.is_string() ? lower(v.get<std::string>()) : "";
    if (device == "none" || device == "auto" || v.is_null()) return no_effect(k, "no offload");
    if (device == "cpu") return applied(k, "offload_param", "cpu");
    return refused(k, "only \"cpu\" (or \"none\") is offered: the parameter shards go to host memory, not NVMe");
  }
  if (name == "offload_optimizer.pin_memory" && c.optimizer_offload == "cpu")
    return bool_option(k, v, "offload_pin_memory");
  if (name == "offload_param.pin_memory" && c.param_offload == "cpu") {
    if (c.optimizer_offload == "cpu")
      return no_effect(k, "one --offload_pin_memory serves both offloads: offload_optimizer.pin_memory's");
    return bool_option(k, v, "offload_pin_memory");
  }
  if (starts_with(name, "offload_optimizer.") || starts_with(name, "offload_param.")) {
    const bool optimizer = starts_with(name, "offload_optimizer.");
    const std::string& device = optimizer ? c.optimizer_offload : c.param_offload;
    if (device == "none")
      return no_effect(k, std::string("a setting of ") + (optimizer ? "offload_optimizer" : "offload_param") +
                              ", which is off");
    if (device != "cpu") return no_effect(k, "a setting of an offload refused with its device");
    return no_effect(k, "a tuning of DeepSpeed's offload (buffers, NVMe pipelining, partial offload); glm_hpc "
                        "offloads the whole optimizer state or parameter shards and sizes its own staging");
  }
  if (name == "cpu_offload") {
    if (enabled(v)) return applied(k, "offload_optimizer", "cpu");
    return no_effect(k, "no offload");
  }
  if (name == "cpu_offload_params") {
    if (enabled(v)) return applied(k, "offload_param", "cpu");
    return no_effect(k, "no offload");
  }
  if (name == "stage3_max_live_parameters" || name == "stage3_max_reuse_distance")
    return no_effect(k, "stage 3 keeps at most two layers gathered: the one in use and the prefetched one");
  if (name == "stage3_gather_16bit_weights_on_model_save" || name == "stage3_gather_fp16_weights_on_model_save" ||
      name == "gather_16bit_weights_on_model_save")
    return no_effect(k, "`glm_hpc export` writes whole bf16 weights from a checkpoint of any stage");
  if (name == "sub_group_size") return no_effect(k, "the optimizer updates each rank's shard in one pass per layer");
  if (name == "round_robin_gradients" || name == "ignore_unused_parameters" || name == "load_from_fp32_weights" ||
      name == "elastic_checkpoint" || name == "legacy_stage1" || name == "use_multi_rank_bucket_allreduce")
    return no_effect(k, "an internal of DeepSpeed's ZeRO implementation");
  if (name == "zero_hpz_partition_size") {
    if (v.is_number() && v.get<double>() > 1) return refused(k, "hierarchical partitioning (ZeRO++) is not offered");
    return no_effect(k, "ZeRO++ hierarchical partitioning is off");
  }
  if (name == "zero_quantized_weights" || name == "zero_quantized_gradients" || name == "zero_quantized_nontrainable_weights") {
    if (enabled(v)) return refused(k, "quantized collectives (ZeRO++) are not offered");
    return no_effect(k, "ZeRO++ quantization is off");
  }
  refused(k, "not a zero_optimization key glm_hpc knows");
}

void optimizer_key(DeepSpeedKey& k, const Json& v, const std::string& name) {
  if (name == "type") {
    const std::string type = v.is_string() ? lower(v.get<std::string>()) : "";
    if (type == "adamw" || type == "adam" || type == "fusedadam" || type == "auto")
      return no_effect(k, "glm_hpc trains with its AdamW (decoupled weight decay)");
    return refused(k, "glm_hpc's optimizer is AdamW");
  }
  if (name == "params.lr") return number_option(k, v, "learning_rate");
  if (name == "params.eps") return number_option(k, v, "adam_epsilon");
  if (name == "params.weight_decay") return number_option(k, v, "weight_decay");
  if (name == "params.betas[0]") return number_option(k, v, "adam_beta1");
  if (name == "params.betas[1]") return number_option(k, v, "adam_beta2");
  if (name == "params.betas") return no_effect(k, "\"auto\": --adam_beta1 and --adam_beta2 keep their values");
  if (name == "params.adam_w_mode") {
    if (v.is_boolean() && !v.get<bool>()) return refused(k, "false (L2-regularised Adam) is not offered: AdamW only");
    return no_effect(k, "AdamW is glm_hpc's optimizer");
  }
  if (name == "params.torch_adam" || name == "params.bias_correction" || name == "params.amsgrad") {
    if (name == "params.amsgrad" && enabled(v)) return refused(k, "AMSGrad is not offered");
    if (name == "params.bias_correction" && v.is_boolean() && !v.get<bool>())
      return refused(k, "AdamW without bias correction is not offered");
    return no_effect(k, "glm_hpc's AdamW: fused kernel, bias-corrected");
  }
  refused(k, "not an optimizer key glm_hpc knows");
}

void scheduler_key(DeepSpeedKey& k, const Json& v, const std::string& name) {
  if (name == "type") {
    const std::string type = v.is_string() ? v.get<std::string>() : "";
    if (type == "WarmupDecayLR") return applied(k, "lr_scheduler_type", "linear");
    if (type == "WarmupCosineLR") return applied(k, "lr_scheduler_type", "cosine");
    if (type == "WarmupLR") return applied(k, "lr_scheduler_type", "constant_with_warmup");
    if (type == "auto") return no_effect(k, "auto: --lr_scheduler_type keeps its value");
    return refused(k, "glm_hpc's schedules are WarmupDecayLR (linear), WarmupCosineLR (cosine) and WarmupLR "
                      "(constant_with_warmup)");
  }
  if (name == "params.warmup_num_steps") {
    if (v.is_number() && v.get<double>() == 0) return applied(k, "warmup_ratio", "0");  // no warmup at all
    return number_option(k, v, "warmup_steps");
  }
  if (name == "params.warmup_max_lr") return number_option(k, v, "learning_rate");
  if (name == "params.warmup_min_lr" || name == "params.cos_min_ratio" || name == "params.warmup_min_ratio") {
    if (v.is_number() && v.get<double>() != 0) return refused(k, "the schedules start and end at 0");
    return no_effect(k, "the schedules start and end at 0");
  }
  if (name == "params.total_num_steps") return no_effect(k, "the schedule spans --max_steps (or the epochs)");
  if (name == "params.warmup_type") {
    if (v.is_string() && v.get<std::string>() != "linear" && !is_auto(v)) return refused(k, "warmup is linear");
    return no_effect(k, "warmup is linear");
  }
  refused(k, "not a scheduler key glm_hpc knows");
}

void classify(DeepSpeedKey& k, const Json& v, const Context& c) {
  const std::string& key = k.key;
  if (key == "train_micro_batch_size_per_gpu") return number_option(k, v, "per_device_train_batch_size");
  if (key == "gradient_accumulation_steps") return number_option(k, v, "gradient_accumulation_steps");
  if (key == "gradient_clipping") return number_option(k, v, "max_grad_norm");
  if (key == "train_batch_size")
    return no_effect(k, "the global batch is --per_device_train_batch_size x data-parallel ranks x "
                        "--gradient_accumulation_steps (printed at start)");
  if (key == "steps_per_print") return no_effect(k, "--logging_steps sets the step line's interval");
  if (key == "wall_clock_breakdown")
    return no_effect(k, "the step line shows exposed communication; --profile true times every op");
  if (key == "zero_allow_untested_optimizer" || key == "zero_force_ds_cpu_optimizer")
    return no_effect(k, "glm_hpc's optimizer is its own AdamW");
  if (key == "dump_state" || key == "memory_breakdown" || key == "seed")
    return no_effect(k, key == "seed" ? "--seed sets glm_hpc's seed" : "debug output of DeepSpeed's engine");
  if (key == "prescale_gradients") {
    if (enabled(v)) return refused(k, "gradients are summed, then divided by the global target count");
    return no_effect(k, "gradients are summed, then divided by the global target count");
  }
  if (key == "gradient_predivide_factor") {
    if (v.is_number() && v.get<double>() != 1) return refused(k, "gradients are divided once, by the target count");
    return no_effect(k, "gradients are divided once, by the target count");
  }
  if (key == "communication_data_type") {
    const std::string t = v.is_string() ? lower(v.get<std::string>()) : "";
    if (t == "fp32" || t == "float32") return applied(k, "grad_reduce_dtype", "fp32");
    if (t == "bf16" || t == "bfloat16") return applied(k, "grad_reduce_dtype", "bf16");
    if (v.is_null() || is_auto(v)) return no_effect(k, "auto: --grad_reduce_dtype keeps its value");
    return refused(k, "gradients are reduced in fp32 or bf16 (--grad_reduce_dtype)");
  }
  if (key == "bf16.enabled") return bool_option(k, v, "bf16");
  if (starts_with(key, "bf16.")) return no_effect(k, "bf16 training keeps fp32 master weights");
  if (key == "fp16.enabled") {
    if (enabled(v)) return refused(k, "glm_hpc has no fp16 path: GPUs train in bf16 (set \"bf16\": {\"enabled\": true})");
    return no_effect(k, "fp16 is off");
  }
  if (starts_with(key, "fp16.")) return no_effect(k, "fp16 loss scaling: bf16 needs none");
  if (starts_with(key, "amp.")) return feature_block(k, v, "amp", "Apex AMP");
  if (starts_with(key, "zero_optimization.")) return zero_key(k, v, key.substr(18), c);
  if (starts_with(key, "optimizer.")) return optimizer_key(k, v, key.substr(10));
  if (starts_with(key, "scheduler.")) return scheduler_key(k, v, key.substr(10));
  if (starts_with(key, "activation_checkpointing."))
    return no_effect(k, "--recompute (or --gradient_checkpointing true) decides recomputation");
  if (starts_with(key, "data_types.")) return no_effect(k, "gradients accumulate in the compute dtype's buckets");
  if (starts_with(key, "checkpoint."))
    return no_effect(k, "glm_hpc's checkpoints: --save_steps, --save_total_limit, --resume_from_checkpoint");
  for (const char* monitor : {"flops_profiler", "tensorboard", "wandb", "csv_monitor", "comet", "comms_logger", "aio"})
    if (starts_with(key, std::string(monitor) + "."))
      return no_effect(k, "DeepSpeed's own monitoring and I/O settings");
  for (const char* feature : {"elasticity", "pipeline", "sparse_attention", "compression_training", "quantize_training",
                              "data_efficiency", "curriculum_learning", "autotuning", "progressive_layer_drop"})
    if (starts_with(key, std::string(feature) + ".")) return feature_block(k, v, feature, feature);
  refused(k, "not a DeepSpeed key glm_hpc knows");
}

// Leaves of the object in file order, named by dotted paths; arrays of numbers by index.
void flatten(const Json& j, const std::string& prefix, std::vector<std::pair<std::string, const Json*>>& out) {
  for (const auto& [name, value] : j.items()) {
    const std::string key = prefix.empty() ? name : prefix + "." + name;
    if (value.is_object()) {
      flatten(value, key, out);
    } else if (value.is_array() && !value.empty() && value.front().is_number()) {
      for (size_t i = 0; i < value.size(); ++i) out.emplace_back(key + "[" + std::to_string(i) + "]", &value[i]);
    } else {
      out.emplace_back(key, &value);
    }
  }
}

}  // namespace

bool DeepSpeedConfig::refused() const {
  for (const DeepSpeedKey& k : keys)
    if (k.outcome == Outcome::refused) return true;
  return false;
}

std::string DeepSpeedConfig::account() const {
  std::string out;
  for (const DeepSpeedKey& k : keys) {
    out += "  " + k.key + " " + k.value + ": ";
    switch (k.outcome) {
      case Outcome::applied:
        out += "--" + k.option + " " + k.text;
        break;
      case Outcome::no_effect:
        out += "no effect (" + k.reason + ")";
        break;
      case Outcome::refused:
        out += "REFUSED: " + k.reason;
        break;
    }
    out += "\n";
  }
  return out;
}

Result<DeepSpeedConfig> read_deepspeed_config(const std::string& spec) {
  DeepSpeedConfig config;
  config.source = spec;
  Json root;
  if (spec == "zero1" || spec == "zero2" || spec == "zero3") {
    root = Json::parse(std::string("{\"zero_optimization\": {\"stage\": ") + spec.back() + "}}");
  } else {
    GLM_RETURN_IF_ERROR(check_input_file_size(spec, kMaxConfigBytes, "a DeepSpeed config is a small JSON file")
                            .with_context("--deepspeed"));
    std::ifstream in(spec);
    if (!in) return GLM_USER_ERROR("--deepspeed: cannot open '", spec, "' (a JSON file, or zero1, zero2, zero3)");
    root = Json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (root.is_discarded() || !root.is_object())
      return GLM_USER_ERROR("--deepspeed: '", spec, "' is not a JSON object (a DeepSpeed config file)");
  }
  // An offload block's device ("none" when absent or "auto"): its other keys are explained by it.
  auto offload_device = [&root](const char* block) -> std::string {
    const auto z = root.find("zero_optimization");
    if (z == root.end() || !z->is_object()) return "none";
    const auto b = z->find(block);
    if (b == z->end() || !b->is_object()) return "none";
    const auto d = b->find("device");
    if (d == b->end() || !d->is_string()) return "none";
    const std::string device = lower(d->get<std::string>());
    return device == "auto" ? "none" : device;
  };
  Context context;
  context.optimizer_offload = offload_device("offload_optimizer");
  context.param_offload = offload_device("offload_param");
  std::vector<std::pair<std::string, const Json*>> leaves;
  flatten(root, "", leaves);
  for (const auto& [key, value] : leaves) {
    DeepSpeedKey k;
    k.key = key;
    k.value = value->dump();
    classify(k, *value, context);
    config.keys.push_back(std::move(k));
  }
  return config;
}

}  // namespace glm
