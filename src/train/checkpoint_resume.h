// Whether a checkpoint may resume this run (see checkpoint.h's ResumeExpectation): the model's
// shape and layout, the tokenizer, full or LoRA training, and a LoRA checkpoint's configuration and base.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "train/checkpoint.h"
#include "train/checkpoint_meta.h"

namespace glm {

// meta.json against this run; units: the model's unpadded unit sizes; base_sum_squares: this run's
// LoRA base fingerprint. The first mismatch is a user error naming the field.
Status check_resume_compatible(const CheckpointMeta& meta, const TrainingEngine& engine,
                               const ResumeExpectation& expect, const std::vector<int64_t>& units,
                               double base_sum_squares);

}  // namespace glm
