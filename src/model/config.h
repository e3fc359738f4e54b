// GLM-4 model configuration (GLM4_SPEC.md section 1) and its consistency checks.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace glm {

// Bounds checked before anything is allocated from a shape. Every rank keeps a named view of each
// layer's tensors (GLM-4-9B has 40 layers); a model of more than 2^44 parameters would need 256 TiB
// for its training state at 16 bytes a parameter (bf16 weights and gradients, fp32 master weights
// and Adam moments), more than any cluster's GPUs hold.
inline constexpr int64_t kMaxHiddenLayers = int64_t{1} << 16;
inline constexpr int64_t kMaxParameters = int64_t{1} << 44;

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

  // Resolves head_dim and checks every relation the architecture needs and the bounds above. The
  // message starts with the field's name.
  Status finalize_and_validate();
};

}  // namespace glm
