// LoRA options, layout, PEFT initialisation and the merge into base weights.
#include "model/lora.h"

#include <algorithm>
#include <cmath>

#include "base/counter_rng.h"
#include "model/param_layout.h"

namespace glm {
namespace {

constexpr std::array<LoraTarget, kLoraTargetCount> kAllTargets = {LoraTarget::query_key_value, LoraTarget::dense,
                                                                  LoraTarget::dense_h_to_4h, LoraTarget::dense_4h_to_h};

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

const char* lora_target_name(LoraTarget target) {
  switch (target) {
    case LoraTarget::query_key_value:
      return "query_key_value";
    case LoraTarget::dense:
      return "dense";
    case LoraTarget::dense_h_to_4h:
      return "dense_h_to_4h";
    case LoraTarget::dense_4h_to_h:
      return "dense_4h_to_h";
  }
  return "?";
}

Result<std::vector<LoraTarget>> parse_lora_targets(std::string_view text) {
  text = trim(text);
  if (text == "all-linear" || text == "all_linear")
    return std::vector<LoraTarget>(kAllTargets.begin(), kAllTargets.end());
  std::vector<LoraTarget> out;
  while (true) {
    const size_t comma = text.find(',');
    const std::string_view name = trim(text.substr(0, comma));
    bool known = false;
    for (LoraTarget t : kAllTargets) {
      if (name != lora_target_name(t)) continue;
      known = true;
      if (std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
    }
    if (!known)
      return GLM_USER_ERROR("unknown module '", name,
                            "'; use all-linear or a comma list of query_key_value, dense, dense_h_to_4h, "
                            "dense_4h_to_h (the lm_head is not a LoRA target)");
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string lora_targets_text(const std::vector<LoraTarget>& targets) {
  std::string s;
  for (LoraTarget t : targets) {
    if (!s.empty()) s.push_back(',');
    s.append(lora_target_name(t));
  }
  return s;
}

bool LoraConfig::targets_module(LoraTarget t) const {
  return std::find(targets.begin(), targets.end(), t) != targets.end();
}

Status LoraConfig::validate() const {
  if (rank < 1) return GLM_USER_ERROR("--lora_rank must be >= 1, got ", rank);
  if (!(alpha > 0) || !std::isfinite(alpha))
    return GLM_USER_ERROR("--lora_alpha must be a positive number, got ", alpha);
  if (!(dropout >= 0 && dropout < 1)) return GLM_USER_ERROR("--lora_dropout must be in [0, 1), got ", dropout);
  if (targets.empty()) return GLM_USER_ERROR("--target_modules names no module");
  return Status::ok();
}

std::string LoraEntry::module_name() const {
  const bool attention = target == LoraTarget::query_key_value || target == LoraTarget::dense;
  std::string name = "transformer.encoder.layers.";
  name.append(std::to_string(layer)).append(attention ? ".self_attention." : ".mlp.").append(lora_target_name(target));
  return name;
}

LoraLayout::LoraLayout(const ModelConfig& c, const LoraConfig& lora) : lora_(lora) {
  const int64_t h = c.hidden_size, f = c.intermediate_size, a = ParamLayout::kAlignment;
  index_.assign(static_cast<size_t>(c.num_hidden_layers), {-1, -1, -1, -1});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    for (LoraTarget t : kAllTargets) {
      if (!lora.targets_module(t)) continue;
      LoraEntry e;
      e.layer = l;
      e.target = t;
      switch (t) {
        case LoraTarget::query_key_value:
          e.in_features = h, e.out_features = c.qkv_width();
          break;
        case LoraTarget::dense:
          e.in_features = c.q_width(), e.out_features = h;
          break;
        case LoraTarget::dense_h_to_4h:
          e.in_features = h, e.out_features = 2 * f;
          break;
        case LoraTarget::dense_4h_to_h:
          e.in_features = f, e.out_features = h;
          break;
      }
      e.a_offset = align_up(total_, a);
      e.b_offset = align_up(e.a_offset + lora.rank * e.in_features, a);
      total_ = e.b_offset + lora.rank * e.out_features;
      index_[static_cast<size_t>(l)][static_cast<size_t>(t)] = static_cast<int>(entries_.size());
      entries_.push_back(e);
    }
  }
  total_ = align_up(total_, a);
}

int64_t LoraLayout::max_in_features() const {
  int64_t m = 0;
  for (const LoraEntry& e : entries_) m = std::max(m, e.in_features);
  return m;
}

int64_t LoraLayout::parameter_count() const {
  int64_t n = 0;
  for (const LoraEntry& e : entries_) n += lora_.rank * (e.in_features + e.out_features);
  return n;
}

uint64_t lora_dropout_key(uint64_t seed, int64_t step, int64_t micro_batch, int rank) {
  // Chained mixing: (step, micro-batch, rank) tuples that xor alike still get unrelated keys.
  uint64_t k = splitmix64_mix(seed ^ 0x4c6f5244726f70ULL);  // "LoRDrop"
  k = splitmix64_mix(k ^ static_cast<uint64_t>(step));
  k = splitmix64_mix(k ^ static_cast<uint64_t>(micro_batch));
  return splitmix64_mix(k ^ static_cast<uint64_t>(rank));
}

uint64_t lora_dropout_entry_key(uint64_t micro_batch_key, const LoraEntry& e) {
  const uint64_t entry = static_cast<uint64_t>(e.layer) * kLoraTargetCount + static_cast<uint64_t>(e.target);
  return splitmix64_mix(micro_batch_key ^ splitmix64_mix(entry));
}

std::vector<float> initial_lora_values(const LoraLayout& layout, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(layout.total_numel()), 0.0f);
  const int64_t r = layout.rank();
  for (const LoraEntry& e : layout.entries()) {
    // torch.nn.init.kaiming_uniform_(a=sqrt(5)) on [r, in]: gain sqrt(2 / 6), bound gain * sqrt(3 / in).
    const double bound = 1.0 / std::sqrt(static_cast<double>(e.in_features));
    const uint64_t key = splitmix64_mix(seed ^ 0x4c6f5241ULL) ^
                         splitmix64_mix(static_cast<uint64_t>(e.layer) * 8 + static_cast<uint64_t>(e.target));
    for (int64_t i = 0; i < r * e.in_features; ++i)
      v[static_cast<size_t>(e.a_offset + i)] =
          static_cast<float>(bound * (2.0 * counter_uniform(key, static_cast<uint64_t>(i)) - 1.0));
  }
  return v;
}

void merge_lora_entry(const LoraLayout& layout, const LoraEntry& e, std::span<const float> adapters,
                      std::span<float> weight) {
  const int64_t r = layout.rank();
  const double s = layout.config().scale();
  const float* a = adapters.data() + e.a_offset;
  const float* bt = adapters.data() + e.b_offset;
  for (int64_t o = 0; o < e.out_features; ++o)
    for (int64_t i = 0; i < e.in_features; ++i) {
      double d = 0;
      for (int64_t k = 0; k < r; ++k) d += static_cast<double>(bt[k * e.out_features + o]) * a[k * e.in_features + i];
      float& w = weight[static_cast<size_t>(o * e.in_features + i)];
      w = static_cast<float>(static_cast<double>(w) + s * d);
    }
}

}  // namespace glm
