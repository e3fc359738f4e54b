// A LoRA checkpoint's base, streamed unit by unit and checked against its fingerprint (lora_base.h).
#include "train/lora_base.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "io/hf_export.h"
#include "io/hf_import.h"
#include "model/backend.h"
#include "train/trainer.h"

namespace glm {
namespace {

float bf16_rounded(float x) {
  const uint32_t bits = static_cast<uint32_t>(float_to_bf16_bits(x)) << 16;
  float y;
  std::memcpy(&y, &bits, 4);
  return y;
}

// Fingerprints that differ in the 7th digit must not print alike.
std::string precise(double v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.12g", v);
  return text;
}

// The base as it was trained: fp32, or rounded to bf16.
void round_if(bool bf16, std::span<float> values) {
  if (!bf16) return;
  for (float& x : values) x = bf16_rounded(x);
}

}  // namespace

std::string LoraBaseSource::describe() const {
  return model_dir.empty() ? concat("the random initialisation with seed ", seed)
                           : concat("the Hugging Face model '", model_dir, "'");
}

Result<LoraBaseSource> lora_base_source(const CheckpointInfo& info, const std::string& model_dir) {
  if (!info.lora) return GLM_INTERNAL_ERROR("lora_base_source on a full-training checkpoint");
  LoraBaseSource source;
  source.model_dir = model_dir.empty() ? info.lora->base_model : model_dir;
  source.seed = info.lora->random_init_seed;
  if (source.model_dir.empty()) return source;
  const std::string what = model_dir.empty() ? "the base recorded in meta.json" : "--model_id_or_path";
  auto hf = read_hf_config(source.model_dir);
  if (!hf.is_ok()) return hf.status().with_context(concat("the base of LoRA checkpoint '", info.dir, "' (", what, ")"));
  const ModelConfig& theirs = hf.value().config;
  const ModelConfig& ours = info.config;
  const std::pair<const char*, std::pair<int64_t, int64_t>> fields[] = {
      {"vocab_size", {theirs.vocab_size, ours.vocab_size}},
      {"hidden_size", {theirs.hidden_size, ours.hidden_size}},
      {"intermediate_size", {theirs.intermediate_size, ours.intermediate_size}},
      {"num_hidden_layers", {theirs.num_hidden_layers, ours.num_hidden_layers}},
      {"num_attention_heads", {theirs.num_attention_heads, ours.num_attention_heads}},
      {"num_key_value_heads", {theirs.num_key_value_heads, ours.num_key_value_heads}},
      {"head_dim", {theirs.head_dim, ours.head_dim}}};
  for (const auto& [field, values] : fields)
    if (values.first != values.second)
      return GLM_USER_ERROR(what, " '", source.model_dir, "' has ", field, " ", values.first, ", the LoRA checkpoint '",
                            info.dir, "' was trained on a base with ", field, " ", values.second,
                            ": not the base of these adapters");
  return source;
}

Status read_lora_base(const CheckpointInfo& info, const LoraBaseSource& source,
                      const std::function<Status(int unit, std::span<float> values)>& sink) {
  const ParamLayout layout(info.config, 1);
  std::vector<float> unit_values;
  if (source.model_dir.empty()) {
    // The trainer's own initialisation, unit by unit: the same values at any layout padding.
    auto backend = make_cpu_backend(DType::f32);
    for (int u = 0; u < static_cast<int>(layout.units().size()); ++u) {
      const ParamUnit& unit = layout.units()[static_cast<size_t>(u)];
      unit_values.assign(static_cast<size_t>(unit.numel), 0.0f);
      GLM_RETURN_IF_ERROR(initialize_parameter_range(layout, info.config, source.seed, *backend,
                                                     Tensor{unit_values.data(), unit.numel, DType::f32}, unit.offset));
      round_if(source.bf16, unit_values);
      GLM_RETURN_IF_ERROR(sink(u, unit_values));
    }
    return Status::ok();
  }
  GLM_ASSIGN_OR_RETURN(HfModel model, read_hf_config(source.model_dir));
  // The import delivers entries in layout order; a unit is complete with its last entry.
  int current = -1;
  return load_hf_weights(model, layout, [&](int entry, std::span<const float> values) -> Status {
    const ParamEntry& e = layout.entry(entry);
    const ParamUnit& unit = layout.units()[static_cast<size_t>(e.unit)];
    if (e.unit != current) {
      current = e.unit;
      unit_values.assign(static_cast<size_t>(unit.numel), 0.0f);
    }
    std::copy(values.begin(), values.end(), unit_values.begin() + (e.offset - unit.offset));
    if (entry != unit.entries.back()) return Status::ok();
    round_if(source.bf16, unit_values);
    return sink(e.unit, unit_values);
  });
}

Status verify_lora_base(const CheckpointInfo& info, LoraBaseSource& source) {
  if (!info.lora) return GLM_INTERNAL_ERROR("verify_lora_base on a full-training checkpoint");
  double as_stored = 0, as_bf16 = 0;
  LoraBaseSource stored = source;
  stored.bf16 = false;
  GLM_RETURN_IF_ERROR(read_lora_base(info, stored, [&](int, std::span<float> values) {
    for (float x : values) {
      as_stored += static_cast<double>(x) * x;
      const double r = bf16_rounded(x);
      as_bf16 += r * r;
    }
    return Status::ok();
  }));
  const double recorded = info.lora->base_sum_squares;
  const bool stored_ok = lora_base_fingerprint_matches(recorded, as_stored);
  const bool bf16_ok = lora_base_fingerprint_matches(recorded, as_bf16);
  if (!stored_ok && !bf16_ok)
    return GLM_USER_ERROR("LoRA checkpoint '", info.dir,
                          "': its base.sum_squares (a fingerprint of the base weights) is ", precise(recorded), ", ",
                          source.describe(), " gives ", precise(as_stored), " (", precise(as_bf16),
                          " rounded to bf16): not the base these adapters were trained on");
  source.bf16 = bf16_ok && (!stored_ok || std::abs(as_bf16 - recorded) < std::abs(as_stored - recorded));
  return Status::ok();
}

}  // namespace glm
