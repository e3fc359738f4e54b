// Hugging Face checkpoints in, both layouts (GLM4_SPEC.md 1 and 4): transformers `glm`
// (GlmForCausalLM, separate q/k/v) and THUDM remote code `chatglm` (fused query_key_value).
#pragma once

#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/enum_names.h"
#include "base/status.h"
#include "model/config.h"
#include "model/param_layout.h"

namespace glm {

enum class HfLayout { glm, chatglm };

// As --export_format spells them.
template <>
struct EnumNames<HfLayout> {
  static constexpr std::pair<HfLayout, std::string_view> table[] = {{HfLayout::glm, "hf"},
                                                                    {HfLayout::chatglm, "chatglm"}};
};

struct HfModel {
  std::string dir;
  HfLayout layout = HfLayout::glm;
  ModelConfig config;
  bool tie_word_embeddings = false;  // lm_head read from the embedding
  bool attention_bias = true;        // false: the q/k/v bias starts at zero
};

// Reads DIR/config.json into our configuration; unsupported variants and missing fields are user
// errors naming the file and field.
Result<HfModel> read_hf_config(const std::string& dir);

// Where one of our flat-layout tensors lives in an HF checkpoint: consecutive row blocks.
struct HfPiece {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // first element of this piece inside our tensor
};
std::vector<HfPiece> hf_pieces(const HfModel& model, const ParamLayout& layout, int entry);

// Reads every parameter of the checkpoint (F32, BF16, F16 or F64) and hands it to sink as f32.
// A missing tensor, a wrong shape, a tensor the model does not use or a NaN or infinity in a weight
// (as f32) is a user error naming it.
Status load_hf_weights(const HfModel& model, const ParamLayout& layout,
                       const std::function<Status(int entry, std::span<const float> values)>& sink);
// The same checks as load_hf_weights (names, shapes, dtypes, unused tensors) without reading data,
// so every rank can agree on bad input before any collective starts.
Status verify_hf_weights(const HfModel& model, const ParamLayout& layout);

}  // namespace glm
