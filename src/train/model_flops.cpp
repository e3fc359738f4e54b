// Model FLOPs (see model_flops.h).
#include "train/model_flops.h"

namespace glm {

double matmul_parameters(const ModelConfig& c) {
  const double h = static_cast<double>(c.hidden_size), d = static_cast<double>(c.head_dim);
  const double heads = static_cast<double>(c.num_attention_heads), kv = static_cast<double>(c.num_key_value_heads);
  const double ffn = static_cast<double>(c.intermediate_size);
  const double layer = h * (heads + 2 * kv) * d + heads * d * h + h * 2 * ffn + ffn * h;
  return static_cast<double>(c.num_hidden_layers) * layer + static_cast<double>(c.vocab_size) * h;
}

double step_model_flops(const ModelConfig& c, std::span<const HostMicroBatch> micro_batches, bool lora) {
  double tokens = 0, pairs = 0;
  for (const HostMicroBatch& b : micro_batches) {
    tokens += static_cast<double>(b.size());
    // A query at row position p attends to the keys doc_start .. p of its document.
    const bool share = !b.row_position.empty();
    for (size_t t = 0; t < b.tokens.size(); ++t) {
      const int64_t p = share ? b.row_position[t] : static_cast<int64_t>(t);
      pairs += static_cast<double>(p - b.doc_start[t] + 1);
    }
  }
  const double attention = 12.0 * static_cast<double>(c.num_hidden_layers) *
                           static_cast<double>(c.num_attention_heads) * static_cast<double>(c.head_dim) * pairs;
  return (lora ? 4.0 : 6.0) * matmul_parameters(c) * tokens + attention;
}

}  // namespace glm
