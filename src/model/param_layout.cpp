// Builds the flat layout in forward order: embedding, layers 0..L-1, final norm + lm_head.
#include "model/param_layout.h"

namespace glm {
namespace {
int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }
}  // namespace

ParamLayout::ParamLayout(const ModelConfig& c, int shards) : shards_(shards < 1 ? 1 : shards) {
  const int64_t h = c.hidden_size;
  begin_unit();
  embedding_ = add("transformer.embedding.word_embeddings.weight", {c.vocab_size, h}, ParamKind::embedding);
  end_unit();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "transformer.encoder.layers." + std::to_string(l) + ".";
    begin_unit();
    LayerEntries e{};
    e.input_norm = add(p + "input_layernorm.weight", {h}, ParamKind::norm);
    e.qkv_weight = add(p + "self_attention.query_key_value.weight", {c.qkv_width(), h}, ParamKind::weight);
    e.qkv_bias = add(p + "self_attention.query_key_value.bias", {c.qkv_width()}, ParamKind::bias);
    e.dense = add(p + "self_attention.dense.weight", {h, c.q_width()}, ParamKind::weight);
    e.post_norm = add(p + "post_attention_layernorm.weight", {h}, ParamKind::norm);
    e.h_to_4h = add(p + "mlp.dense_h_to_4h.weight", {2 * c.intermediate_size, h}, ParamKind::weight);
    e.four_h_to_h = add(p + "mlp.dense_4h_to_h.weight", {h, c.intermediate_size}, ParamKind::weight);
    layers_.push_back(e);
    end_unit();
  }
  begin_unit();
  final_norm_ = add("transformer.encoder.final_layernorm.weight", {h}, ParamKind::norm);
  output_ = add("transformer.output_layer.weight", {c.vocab_size, h}, ParamKind::weight);
  end_unit();
}

void ParamLayout::begin_unit() {
  ParamUnit u;
  u.offset = total_;
  units_.push_back(u);
}

void ParamLayout::end_unit() {
  total_ = units_.back().offset + align_up(total_ - units_.back().offset, kAlignment * shards_);
  units_.back().numel = total_ - units_.back().offset;
}

int ParamLayout::add(const std::string& name, std::vector<int64_t> shape, ParamKind kind) {
  ParamEntry e;
  e.name = name;
  e.numel = 1;
  for (int64_t s : shape) e.numel *= s;
  e.shape = std::move(shape);
  e.kind = kind;
  e.offset = align_up(total_, kAlignment);
  e.unit = static_cast<int>(units_.size()) - 1;
  total_ = e.offset + e.numel;
  entries_.push_back(std::move(e));
  const int index = static_cast<int>(entries_.size()) - 1;
  units_.back().entries.push_back(index);
  return index;
}

int64_t ParamLayout::parameter_count() const {
  int64_t n = 0;
  for (const auto& e : entries_) n += e.numel;
  return n;
}

int ParamLayout::find(const std::string& name) const {
  for (size_t i = 0; i < entries_.size(); ++i)
    if (entries_[i].name == name) return static_cast<int>(i);
  return -1;
}

}  // namespace glm
