// A LoRA checkpoint's adapters.h5 (see checkpoint.h): the adapters' fp32 master weights and Adam
// moments, replicated on every rank, written once by rank 0 and read whole by every rank.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>

#include "train/engine.h"

namespace glm {

Status write_lora_file(const TrainingEngine& engine, Backend& backend, const std::filesystem::path& path,
                       bool model_only);

// The first `datasets` of master, exp_avg, exp_avg_sq of dir/adapters.h5, whole, checked.
Status read_lora_file(const std::filesystem::path& dir, int64_t expected_numel, int datasets,
                      const std::function<Status(int dataset, std::span<const float> values)>& sink);

// Every rank reads the whole replicated LoRA state (weights_only: the master weights; zero moments).
Status load_lora_file(TrainingEngine& engine, const std::filesystem::path& dir, bool weights_only);

}  // namespace glm
