// Model configuration checks: every rejected value is named so the user can fix the config.
#include "model/config.h"

#include <cmath>
#include <cstdint>

namespace glm {

int64_t ModelConfig::parameter_count() const {
  const int64_t h = hidden_size;
  const int64_t per_layer = 2 * h + qkv_width() * (h + 1) + q_width() * h + 3 * intermediate_size * h;
  return 2 * vocab_size * h + h + num_hidden_layers * per_layer;
}

Status ModelConfig::finalize_and_validate() {
  auto positive = [](const char* name, int64_t v) -> Status {
    if (v <= 0) return GLM_USER_ERROR(name, " must be positive, got ", v);
    return Status::ok();
  };
  GLM_RETURN_IF_ERROR(positive("vocab_size", vocab_size));
  GLM_RETURN_IF_ERROR(positive("hidden_size", hidden_size));
  GLM_RETURN_IF_ERROR(positive("intermediate_size", intermediate_size));
  GLM_RETURN_IF_ERROR(positive("num_hidden_layers", num_hidden_layers));
  GLM_RETURN_IF_ERROR(positive("num_attention_heads", num_attention_heads));
  GLM_RETURN_IF_ERROR(positive("num_key_value_heads", num_key_value_heads));
  GLM_RETURN_IF_ERROR(positive("max_position_embeddings", max_position_embeddings));
  if (vocab_size > INT32_MAX) return GLM_USER_ERROR("vocab_size ", vocab_size, " does not fit 32-bit token ids");
  if (max_position_embeddings > INT32_MAX)
    return GLM_USER_ERROR("max_position_embeddings ", max_position_embeddings,
                          " does not fit the 32-bit positions of a micro-batch (at most ", INT32_MAX, ")");
  if (num_hidden_layers > kMaxHiddenLayers)
    return GLM_USER_ERROR("num_hidden_layers ", num_hidden_layers, " exceeds ", kMaxHiddenLayers,
                          ", the most glm_hpc builds (GLM-4-9B has 40)");
  if (num_attention_heads % num_key_value_heads != 0)
    return GLM_USER_ERROR("num_attention_heads (", num_attention_heads, ") must be divisible by num_key_value_heads (",
                          num_key_value_heads, ")");
  if (head_dim == 0) {
    // Without an explicit head_dim the heads must tile the hidden size exactly.
    if (hidden_size % num_attention_heads != 0)
      return GLM_USER_ERROR("hidden_size (", hidden_size, ") must be divisible by num_attention_heads (",
                            num_attention_heads, ") when head_dim is not set");
    head_dim = hidden_size / num_attention_heads;
  }
  GLM_RETURN_IF_ERROR(positive("head_dim", head_dim));
  {
    // In double, so that a huge shape is measured, not overflowed; within the bound every product
    // that parameter_count() and the layout form fits int64.
    const double h = static_cast<double>(hidden_size), layers = static_cast<double>(num_hidden_layers);
    const double heads = static_cast<double>(num_attention_heads), kv = static_cast<double>(num_key_value_heads);
    const double dim = static_cast<double>(head_dim), ffn = static_cast<double>(intermediate_size);
    const double per_layer = 2 * h + (heads + 2 * kv) * dim * (h + 1) + heads * dim * h + 3 * ffn * h;
    const double parameters = 2 * static_cast<double>(vocab_size) * h + h + layers * per_layer;
    if (parameters > static_cast<double>(kMaxParameters))
      return GLM_USER_ERROR("hidden_size ", hidden_size, " with intermediate_size ", intermediate_size, ", ",
                            num_hidden_layers, " layers, ", num_attention_heads, " heads of ", head_dim,
                            " and vocab_size ", vocab_size, " makes ", parameters, " parameters, more than the 2^44 (",
                            kMaxParameters, ") whose training state (16 bytes each) any cluster could hold");
  }
  if (!(partial_rotary_factor > 0.0 && partial_rotary_factor <= 1.0))
    return GLM_USER_ERROR("partial_rotary_factor must be in (0, 1], got ", partial_rotary_factor);
  const double rot = static_cast<double>(head_dim) * partial_rotary_factor;
  // Below 2^53 a double holds every integer exactly (and converting a larger one to int64 is undefined).
  if (!(rot < 0x1p53) || rot != std::floor(rot) || static_cast<int64_t>(rot) % 2 != 0)
    return GLM_USER_ERROR("partial_rotary_factor x head_dim = ", partial_rotary_factor, " x ", head_dim, " = ", rot,
                          " (the rotary dimension) must be an even integer");
  if (!(rope_theta > 1.0) || !std::isfinite(rope_theta))
    return GLM_USER_ERROR("rope_theta (10000 x rope_ratio) must be > 1, got ", rope_theta);
  if (!(rms_norm_eps > 0.0) || !std::isfinite(rms_norm_eps))
    return GLM_USER_ERROR("rms_norm_eps must be positive, got ", rms_norm_eps);
  if (!(initializer_range > 0.0)) return GLM_USER_ERROR("initializer_range must be positive, got ", initializer_range);
  if (pad_token_id < -1 || pad_token_id >= vocab_size)
    return GLM_USER_ERROR("pad_token_id must be a row of the vocabulary (0 to ", vocab_size - 1,
                          ") or -1 for none, got ", pad_token_id);
  return Status::ok();
}

}  // namespace glm
