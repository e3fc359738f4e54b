// Builds the flat layout in forward order: embedding, layers 0..L-1, final norm + lm_head, then the
// persistent tensors (if any) in the same order.
#include "model/param_layout.h"

namespace glm {

ParamLayout::ParamLayout(const ModelConfig& c, int shards, const PersistencePolicy& persistence)
    : shards_(shards < 1 ? 1 : shards) {
  const int64_t h = c.hidden_size;
  embedding_ = add("transformer.embedding.word_embeddings.weight", {c.vocab_size, h}, ParamKind::embedding);
  ++home_units_;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "transformer.encoder.layers." + std::to_string(l) + ".";
    LayerEntries e{};
    e.input_norm = add(p + "input_layernorm.weight", {h}, ParamKind::norm);
    e.qkv_weight = add(p + "self_attention.query_key_value.weight", {c.qkv_width(), h}, ParamKind::weight);
    e.qkv_bias = add(p + "self_attention.query_key_value.bias", {c.qkv_width()}, ParamKind::bias);
    e.dense = add(p + "self_attention.dense.weight", {h, c.q_width()}, ParamKind::weight);
    e.post_norm = add(p + "post_attention_layernorm.weight", {h}, ParamKind::norm);
    e.h_to_4h = add(p + "mlp.dense_h_to_4h.weight", {2 * c.intermediate_size, h}, ParamKind::weight);
    e.four_h_to_h = add(p + "mlp.dense_4h_to_h.weight", {h, c.intermediate_size}, ParamKind::weight);
    layers_.push_back(e);
    ++home_units_;
  }
  final_norm_ = add("transformer.encoder.final_layernorm.weight", {h}, ParamKind::norm);
  output_ = add("transformer.output_layer.weight", {c.vocab_size, h}, ParamKind::weight);
  ++home_units_;

  // Offsets inside the home units as if nothing were persistent (the same at every shard count).
  std::vector<int64_t> home_end(static_cast<size_t>(home_units_), 0);
  for (auto& e : entries_) {
    int64_t& end = home_end[static_cast<size_t>(e.home_unit)];
    e.home_offset = end;
    end = align_up(end + e.numel, kAlignment);
  }
  // DeepSpeed's mark_persistent_parameters: a tensor that would pass the model-wide budget is
  // skipped, a later smaller one may still fit.
  int64_t persistent_total = 0;
  for (auto& e : entries_) {
    if (e.numel > persistence.max_total_numel - persistent_total) continue;
    if (e.numel <= persistence.max_tensor_numel) {
      e.persistent = true;
      persistent_total += e.numel;
    }
  }
  for (int u = 0; u < home_units_; ++u) {
    begin_unit();
    for (size_t i = 0; i < entries_.size(); ++i)
      if (entries_[i].home_unit == u && !entries_[i].persistent) place(static_cast<int>(i));
    end_unit();
  }
  if (persistent_total > 0) {
    persistent_unit_ = home_units_;
    begin_unit();
    for (size_t i = 0; i < entries_.size(); ++i)
      if (entries_[i].persistent) place(static_cast<int>(i));
    end_unit();
  }
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
  e.home_unit = home_units_;
  entries_.push_back(std::move(e));
  return static_cast<int>(entries_.size()) - 1;
}

void ParamLayout::place(int index) {
  ParamEntry& e = entries_[static_cast<size_t>(index)];
  e.offset = align_up(total_, kAlignment);
  e.unit = static_cast<int>(units_.size()) - 1;
  total_ = e.offset + e.numel;
  units_.back().entries.push_back(index);
}

int ParamLayout::persistent_tensors() const {
  int n = 0;
  for (const auto& e : entries_) n += e.persistent ? 1 : 0;
  return n;
}

int64_t ParamLayout::persistent_parameter_count() const {
  int64_t n = 0;
  for (const auto& e : entries_) n += e.persistent ? e.numel : 0;
  return n;
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
