// PEFT adapter names, adapter_config.json and adapter_model.safetensors (see peft_adapter.h).
#include "io/peft_adapter.h"

#include <cmath>

namespace glm {
namespace {

// PEFT's state-dict prefix of a causal LM: PeftModelForCausalLM.base_model (LoraModel).model.
constexpr const char* kPeftPrefix = "base_model.model.";

// transformers' GlmForCausalLM module of each of our targets (query_key_value is three modules).
std::vector<std::string> glm_modules(LoraTarget target) {
  switch (target) {
    case LoraTarget::query_key_value:
      return {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"};
    case LoraTarget::dense:
      return {"self_attn.o_proj"};
    case LoraTarget::dense_h_to_4h:
      return {"mlp.gate_up_proj"};
    case LoraTarget::dense_4h_to_h:
      return {"mlp.down_proj"};
  }
  return {};
}

std::string leaf(const std::string& module) { return module.substr(module.rfind('.') + 1); }

}  // namespace

std::vector<std::string> peft_target_modules(const std::vector<LoraTarget>& targets, HfLayout format) {
  std::vector<std::string> names;
  for (LoraTarget t : targets) {
    if (format == HfLayout::chatglm) {
      names.emplace_back(lora_target_name(t));
    } else {
      for (const std::string& m : glm_modules(t)) names.push_back(leaf(m));
    }
  }
  return names;
}

std::vector<PeftTensor> peft_tensors(const LoraLayout& layout, const ModelConfig& c, HfLayout format,
                                     bool fused_qkv_a) {
  const int64_t r = layout.rank();
  std::vector<PeftTensor> out;
  for (int i = 0; i < static_cast<int>(layout.entries().size()); ++i) {
    const LoraEntry& e = layout.entries()[static_cast<size_t>(i)];
    auto add = [&](const std::string& module, bool is_b, int64_t first_row, int64_t rows) {
      PeftTensor t;
      t.name = kPeftPrefix + module + (is_b ? ".lora_B.weight" : ".lora_A.weight");
      t.shape = is_b ? std::vector<int64_t>{rows, r} : std::vector<int64_t>{r, e.in_features};
      t.entry = i;
      t.is_b = is_b;
      t.first_row = first_row;
      out.push_back(std::move(t));
    };
    if (format == HfLayout::chatglm) {
      add(e.module_name(), false, 0, 0);
      add(e.module_name(), true, 0, e.out_features);
      continue;
    }
    const std::string layer = "model.layers." + std::to_string(e.layer) + ".";
    const std::vector<std::string> modules = glm_modules(e.target);
    if (modules.size() == 1) {
      add(layer + modules[0], false, 0, 0);
      add(layer + modules[0], true, 0, e.out_features);
      continue;
    }
    // q | k | v rows of the fused output (GLM4_SPEC.md 2.4), as hf_pieces splits the base weight.
    const int64_t q = c.q_width(), kv = c.num_key_value_heads * c.head_dim;
    const int64_t first[3] = {0, q, q + kv}, rows[3] = {q, kv, kv};
    if (fused_qkv_a) add(layer + "self_attn.q_proj+k_proj+v_proj", false, 0, 0);
    for (int part = 0; part < 3; ++part) {
      if (!fused_qkv_a) add(layer + modules[static_cast<size_t>(part)], false, 0, 0);
      add(layer + modules[static_cast<size_t>(part)], true, first[part], rows[part]);
    }
  }
  return out;
}

void peft_tensor_values(const LoraLayout& layout, const PeftTensor& t, std::span<const float> flat,
                        std::vector<float>& out) {
  const LoraEntry& e = layout.entries()[static_cast<size_t>(t.entry)];
  const int64_t r = layout.rank();
  if (!t.is_b) {
    const float* a = flat.data() + e.a_offset;
    out.assign(a, a + r * e.in_features);
    return;
  }
  // We store Bt [r, out]; PEFT's lora_B.weight is B [out, r]: rows of B are columns of Bt.
  const int64_t rows = t.shape[0];
  const float* bt = flat.data() + e.b_offset;
  out.resize(static_cast<size_t>(rows * r));
  for (int64_t o = 0; o < rows; ++o)
    for (int64_t k = 0; k < r; ++k) out[static_cast<size_t>(o * r + k)] = bt[k * e.out_features + t.first_row + o];
}

nlohmann::ordered_json peft_adapter_config(const LoraConfig& lora, HfLayout format, const std::string& base_model) {
  // The fields PEFT's LoraConfig has written since 0.10 (keys sorted, as save_pretrained sorts them),
  // at their defaults where we have no counterpart. Newer PEFT versions add fields with defaults
  // and read configs without them; peft_version is PEFT's own provenance and is left out.
  const double rounded = std::round(lora.alpha);
  const nlohmann::ordered_json alpha = rounded == lora.alpha && std::abs(rounded) < 1e15
                                           ? nlohmann::ordered_json(static_cast<int64_t>(rounded))
                                           : nlohmann::ordered_json(lora.alpha);
  return nlohmann::ordered_json{
      {"alpha_pattern", nlohmann::ordered_json::object()},
      {"auto_mapping", nullptr},
      {"base_model_name_or_path", base_model.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(base_model)},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"layer_replication", nullptr},
      {"layers_pattern", nullptr},
      {"layers_to_transform", nullptr},
      {"loftq_config", nlohmann::ordered_json::object()},
      {"lora_alpha", alpha},
      {"lora_dropout", lora.dropout},
      {"megatron_config", nullptr},
      {"megatron_core", "megatron.core"},
      {"modules_to_save", nullptr},
      {"peft_type", "LORA"},
      {"r", lora.rank},
      {"rank_pattern", nlohmann::ordered_json::object()},
      {"revision", nullptr},
      {"target_modules", peft_target_modules(lora.targets, format)},
      {"task_type", "CAUSAL_LM"},
      {"use_dora", false},
      {"use_rslora", false}};
}

Status write_peft_safetensors(const std::string& path, const LoraLayout& layout, const ModelConfig& config,
                              HfLayout format, std::span<const float> flat, bool fused_qkv_a,
                              const std::vector<StTensorView>& extra) {
  if (static_cast<int64_t>(flat.size()) != layout.total_numel())
    return GLM_INTERNAL_ERROR("write_peft_safetensors: ", flat.size(), " values for a layout of ",
                              layout.total_numel());
  const std::vector<PeftTensor> tensors = peft_tensors(layout, config, format, fused_qkv_a);
  std::vector<std::vector<float>> values(tensors.size());
  std::vector<StTensorView> views;
  for (size_t i = 0; i < tensors.size(); ++i) {
    peft_tensor_values(layout, tensors[i], flat, values[i]);
    views.push_back({tensors[i].name, StDType::F32, tensors[i].shape, values[i].data()});
  }
  views.insert(views.end(), extra.begin(), extra.end());
  return write_safetensors(path, views);
}

}  // namespace glm
