// The engine's optimizer state in a checkpoint's rank files (see checkpoint.h): each rank writes the
// slices it holds, unit by unit, and reads back the slices it holds now from whichever files have
// them, at any world size and ZeRO stage.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "train/engine.h"

namespace glm {

// This rank's file (the master weights alone when model_only); kill_midway (fault tests): SIGKILL
// this process with half the units written.
Status write_rank_file(const TrainingEngine& engine, Backend& backend, const std::filesystem::path& path, int rank,
                       int world, bool model_only, bool kill_midway);

// Reads this rank's slices from the saved_world rank files of dir into the optimizer state (only
// the master weights when weights_only; the moments are zeroed then). unpadded: the unit sizes.
Status load_rank_slices(TrainingEngine& engine, const std::filesystem::path& dir, int saved_world,
                        const std::vector<int64_t>& unpadded, bool weights_only);

}  // namespace glm
