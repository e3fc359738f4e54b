// The checkpoint directory protocol (see checkpoint.h): checkpoint-<step> is assembled under a
// temporary name, published by one rename after meta.json and the COMPLETE marker, named by
// <output_dir>/latest, and older ones pruned to save_total_limit.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "base/status.h"

namespace glm {

std::filesystem::path checkpoint_dir_path(const std::filesystem::path& output_dir, int64_t step);
// N for a directory name "checkpoint-N", else -1.
int64_t checkpoint_step_of(std::string_view name);

// The directory where a checkpoint is assembled before its rename (a temporary of its own,
// base/temp_names.h: what a killed save leaves is removed when the next run takes the directory).
Status make_checkpoint_temp_dir(const std::filesystem::path& tmp);

// Rank 0, after every rank file is on disk: meta.json (and the run's args.json), the COMPLETE
// marker, the rename into place, latest, pruning (never final_dir, nor best_checkpoint's).
Status publish_checkpoint(const std::filesystem::path& tmp, const std::filesystem::path& final_dir,
                          const std::filesystem::path& output_dir, const nlohmann::json& meta, int64_t save_total_limit,
                          const std::string& best_checkpoint);

}  // namespace glm
