// GLM-4 model configuration (GLM4_SPEC.md section 1) and its consistency checks.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace glm {

struct ModelConfig {
  int64_t vocab_size = 0;  // padded_vocab_size
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // ffn_hidden_size (SwiGLU inner width)
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // multi_query_group_num
  int64_t head_dim = 0;             // kv_channels; 0 = hidden_size / num_attention_heads
  int64_t max_position_embeddings = 0;
  double rope_theta = 0;  // 10000 x rope_ratio
  double partial_rotary_factor = 0.5;
  double rms_norm_eps = 1.5625e-07;
  double initializer_range = 0.02;
  // The embedding row that never trains and starts at zero (transformers' GlmModel builds its
  // embedding with padding_idx = pad_token_id; THUDM's remote code has none): -1 for none.
  int64_t pad_token_id = -1;

  int64_t rotary_dim() const { return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor); }
  int64_t q_width() const { return num_attention_heads * head_dim; }
  int64_t qkv_width() const { return (num_attention_heads + 2 * num_key_value_heads) * head_dim; }
  int64_t parameter_count() const;

  // Resolves head_dim and checks every relation the architecture needs. The message names the field.
  Status finalize_and_validate();
};

}  // namespace glm
