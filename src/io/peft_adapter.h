// LoRA adapters in PEFT's format (peft.PeftModel.save_pretrained / from_pretrained): adapter_config.json
// and adapter_model.safetensors, with the names PEFT gives the linears of transformers' GlmForCausalLM
// (HfLayout::glm) or of THUDM's ChatGLMForConditionalGeneration (HfLayout::chatglm, as ms-swift saves
// GLM-4 adapters). Tensors are cut from our flat adapter layout (model/lora.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "io/hf_import.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/lora.h"
#include "base/status.h"

namespace glm {

inline constexpr const char* kPeftConfigFile = "adapter_config.json";
inline constexpr const char* kPeftWeightsFile = "adapter_model.safetensors";

// True when dir is a PEFT adapter directory (it holds adapter_config.json), as opposed to a model
// directory or a glm_hpc checkpoint; false for a missing or unreadable path.
inline bool is_peft_adapter_dir(const std::filesystem::path& dir) {
  std::error_code ec;
  return std::filesystem::exists(dir / kPeftConfigFile, ec);
}

// One PEFT tensor: lora_A.weight [r, in] of an entry, or lora_B.weight [rows, r], rows
// [first_row, first_row + rows) of the entry's B (the q, k and v blocks of query_key_value in the
// glm layout; all of B otherwise).
struct PeftTensor {
  std::string name;  // e.g. base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight
  std::vector<int64_t> shape;
  int entry = 0;  // index into LoraLayout::entries()
  bool is_b = false;
  int64_t first_row = 0;
};

// The module names PEFT's target_modules lists for `targets` in `format`.
std::vector<std::string> peft_target_modules(const std::vector<LoraTarget>& targets, HfLayout format);

// Every tensor of the adapter in the format's names, layer by layer. glm: our fused
// query_key_value adapter (one A, B over q | k | v) is exactly three PEFT adapters on q_proj,
// k_proj and v_proj sharing that A, each with its row block of B. fused_qkv_a (gradients): that A
// appears once, as ...self_attn.q_proj+k_proj+v_proj.lora_A.weight, since the gradients PEFT
// gives its three copies sum to our fused A's gradient.
std::vector<PeftTensor> peft_tensors(const LoraLayout& layout, const ModelConfig& config, HfLayout format,
                                     bool fused_qkv_a = false);

// The tensor's values (row-major `shape`) from `flat`, laid out as `layout` (adapters or their gradients).
void peft_tensor_values(const LoraLayout& layout, const PeftTensor& tensor, std::span<const float> flat,
                        std::vector<float>& out);

// adapter_config.json: PEFT's LoraConfig fields (peft_type LORA, task_type CAUSAL_LM, r,
// lora_alpha, target_modules, ...). base_model: base_model_name_or_path, empty for none (null).
nlohmann::ordered_json peft_adapter_config(const LoraConfig& lora, HfLayout format, const std::string& base_model);

// Writes peft_tensors(...) of `flat` as F32 safetensors to `path` (the fp32 values as they are;
// PEFT keeps adapters in fp32 too), then `extra` tensors.
Status write_peft_safetensors(const std::string& path, const LoraLayout& layout, const ModelConfig& config,
                              HfLayout format, std::span<const float> flat, bool fused_qkv_a = false,
                              const std::vector<StTensorView>& extra = {});

}  // namespace glm
