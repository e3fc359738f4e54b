// LoRA adapters (Hu et al. 2021, as PEFT implements them) on the linears of every layer: options,
// the flat adapter layout and the host-side merge W + (alpha / r) B A.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"
#include "base/status.h"

namespace glm {

// The targetable linears, named as in THUDM's checkpoints (ms-swift's --target_modules names).
enum class LoraTarget : int { query_key_value = 0, dense = 1, dense_h_to_4h = 2, dense_4h_to_h = 3 };
constexpr int kLoraTargetCount = 4;
const char* lora_target_name(LoraTarget target);
// "all-linear" (every target; the lm_head is never one) or a comma list of target names; the
// error names the unknown module (the caller names the option or file line).
Result<std::vector<LoraTarget>> parse_lora_targets(std::string_view text);
std::string lora_targets_text(const std::vector<LoraTarget>& targets);

struct LoraConfig {
  int64_t rank = 8;
  double alpha = 32;
  // PEFT's lora_dropout: during training steps the adapter sees dropout(x) (each element zeroed with
  // probability p, the kept ones scaled by 1 / (1 - p)), the base x; evaluation uses no dropout.
  // 0.05 is ms-swift's default; 0 takes exactly the dropout-free path.
  double dropout = 0.05;
  std::vector<LoraTarget> targets{LoraTarget::query_key_value, LoraTarget::dense, LoraTarget::dense_h_to_4h,
                                  LoraTarget::dense_4h_to_h};
  double scale() const { return alpha / static_cast<double>(rank); }  // PEFT's scaling (no rsLoRA)
  bool targets_module(LoraTarget t) const;
  // Messages name the options (--lora_rank, --lora_alpha, --lora_dropout, --target_modules).
  Status validate() const;
};

// One adapted linear y = W x (+ b) + scale * B (A x), W [out, in]. A [r, in] is stored as PEFT's
// lora_A; B is stored transposed, Bt [r, out], so that adding u Bt to the base output is one
// accumulating GEMM with the existing ops (PEFT's lora_B.weight [out, r] is its transpose).
struct LoraEntry {
  int64_t layer = 0;
  LoraTarget target = LoraTarget::query_key_value;
  int64_t in_features = 0, out_features = 0;
  int64_t a_offset = 0, b_offset = 0;  // elements, aligned like ParamLayout; A has r x in, Bt r x out
  std::string module_name() const;  // transformer.encoder.layers.N.self_attention.query_key_value
};

class LoraLayout {
 public:
  LoraLayout(const ModelConfig& model, const LoraConfig& lora);
  const LoraConfig& config() const { return lora_; }
  int64_t rank() const { return lora_.rank; }
  const std::vector<LoraEntry>& entries() const { return entries_; }
  int64_t max_in_features() const;  // the widest adapter input (the dropout scratch's row)
  int64_t total_numel() const { return total_; }  // padded
  int64_t parameter_count() const;               // unpadded
  // Index into entries() of layer l's adapter on `target`, -1 when not targeted.
  int find(int64_t layer, LoraTarget target) const {
    return index_[static_cast<size_t>(layer)][static_cast<size_t>(target)];
  }

 private:
  LoraConfig lora_;
  std::vector<LoraEntry> entries_;
  std::vector<std::array<int, kLoraTargetCount>> index_;
  int64_t total_ = 0;
};

// Keys of the dropout masks (base/counter_rng.h), never stored: one micro-batch's key is a function
// of (seed, optimizer step, micro-batch within the step, rank) only, so that every rank draws its own
// masks, a resumed run the straight run's (the step is the global one) and recomputation in backward
// the forward's. Element t * in_features + i of an adapter's input [n, in_features] is masked by
// element t * in_features + i of its entry's stream.
uint64_t lora_dropout_key(uint64_t seed, int64_t step, int64_t micro_batch, int rank);
uint64_t lora_dropout_entry_key(uint64_t micro_batch_key, const LoraEntry& entry);

// PEFT's initialisation: A ~ kaiming_uniform(a = sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)) from a
// counter-based stream per (seed, layer, target), so every rank and backend draws the same; B = 0.
std::vector<float> initial_lora_values(const LoraLayout& layout, uint64_t seed);

// weight [out, in] (row-major, the base tensor of entry's linear) += scale * Bt^T A, in double.
void merge_lora_entry(const LoraLayout& layout, const LoraEntry& entry, std::span<const float> adapters,
                      std::span<float> weight);

}  // namespace glm
