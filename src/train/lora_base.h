// The base model a LoRA checkpoint's adapters were trained on, rebuilt on the host from what its
// meta.json records (a Hugging Face directory through the HF import, or the random initialisation
// from its seed) and checked against the recorded fingerprint (base.sum_squares) before use:
// glm_hpc export --merge_lora and glm_dump_logits read it unit by unit.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "base/status.h"
#include "train/checkpoint.h"

namespace glm {

struct LoraBaseSource {
  std::string model_dir;  // a Hugging Face model directory; empty: random init with `seed`
  uint64_t seed = 0;
  // The weights rounded to bf16: a CUDA run keeps bf16 parameters, so its fingerprint (and the
  // model its adapters were trained on) is of the rounded weights. Set by verify_lora_base.
  bool bf16 = false;
  std::string describe() const;  // "the Hugging Face model DIR" / "the random initialisation with seed N"
};

// Where the base of `info` (a LoRA checkpoint) comes from: meta.json's base, or `model_dir` when
// given (--model_id_or_path: a base that moved). A directory's config.json must describe the
// checkpoint's model shape (a user error naming the field otherwise).
Result<LoraBaseSource> lora_base_source(const CheckpointInfo& info, const std::string& model_dir = "");

// Streams the base weights unit by unit in layout order, each unit's elements laid out as
// ParamLayout(info.config, 1) lays them out (as read_checkpoint_masters delivers a full
// checkpoint's); the sink may change them (a merge) before passing them on.
Status read_lora_base(const CheckpointInfo& info, const LoraBaseSource& source,
                      const std::function<Status(int unit, std::span<float> values)>& sink);

// Reads the base once and compares its sum of squares with meta.json's base.sum_squares, as
// stored (a CPU run) and rounded to bf16 (a CUDA run): the closer of the two that matches within
// kLoraBaseFingerprintTolerance sets source.bf16. Neither: a user error naming both values.
Status verify_lora_base(const CheckpointInfo& info, LoraBaseSource& source);

}  // namespace glm
