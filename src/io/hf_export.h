// Hugging Face checkpoints out, both layouts (GLM4_SPEC.md 1 and 4): the inverse of hf_import,
// named by the same table (hf_pieces), bf16 safetensors streamed one tensor at a time.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/bf16.h"
#include "io/hf_import.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/param_layout.h"
#include "base/status.h"

namespace glm {

// Token ids the configs carry: pad, bos (GLM-4 has none) and the generation stop ids.
struct HfTokenIds {
  std::optional<int64_t> pad, bos;
  std::vector<int64_t> eos;
};

// config.json of `format`: transformers' GlmConfig (model_type glm) or THUDM's ChatGLMConfig
// (model_type chatglm), both with torch_dtype bfloat16. The THUDM layout rotates exactly half of
// every head: another partial_rotary_factor is a user error.
Result<nlohmann::ordered_json> hf_export_config(const ModelConfig& config, HfLayout format, const HfTokenIds& ids);
// generation_config.json: the stop ids, pad and bos.
nlohmann::ordered_json hf_generation_config(const HfTokenIds& ids);

// "5GB", "500MB", "2GiB", "100KiB", "1000" (bytes): transformers' max_shard_size spellings (decimal
// units are powers of 1000, *iB ones powers of 1024; a lower-case b means bits, as there).
Result<uint64_t> parse_byte_size(const std::string& text);

// The model's weights as bf16 safetensors in `dir`: units arrive in layout order with their fp32
// values (as read_checkpoint_masters delivers them) and leave as the format's tensors.
class HfWeightWriter {
 public:
  static Result<HfWeightWriter> create(const std::string& dir, const ModelConfig& config, HfLayout format,
                                       uint64_t max_shard_bytes);
  // `values`: the unit's elements laid out as ParamLayout(config, 1) lays them out.
  Status add_unit(int unit, std::span<const float> values);
  // After the last unit (the THUDM layout's inv_freq buffer goes last); the files and bytes written.
  Status finish();
  const std::vector<std::string>& files() const { return writer_.files(); }
  uint64_t total_bytes() const { return writer_.total_bytes(); }
  int64_t tensor_count() const { return static_cast<int64_t>(tensor_count_); }

 private:
  HfWeightWriter(ParamLayout layout, HfModel model, SafetensorsShardWriter writer)
      : layout_(std::move(layout)), model_(std::move(model)), writer_(std::move(writer)) {}

  ParamLayout layout_;
  HfModel model_;
  SafetensorsShardWriter writer_;
  int next_unit_ = 0;
  size_t tensor_count_ = 0;
  std::vector<uint16_t> bf16_;
};

// THUDM's unused rotary buffer (GLM4_SPEC.md 4.1): 1 / 10000^(2i / d) for d = head_dim / 2.
std::vector<float> chatglm_inv_freq(const ModelConfig& config);

}  // namespace glm
