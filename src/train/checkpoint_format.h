// What a checkpoint directory holds (see checkpoint.h): meta.json's format and versions, the file
// and group names, and the runs a rank file's unit group records.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/checkpoint_file.h"
#include "base/status.h"

namespace glm {

inline constexpr const char* kCheckpointFormat = "glm_hpc-checkpoint";
// 3: a unit's slice of a rank may be several runs (attribute `ranges` instead of `begin_count`):
// written only where ZeRO-3 keeps persistent tensors apart (elsewhere 2, which older glm_hpc reads).
// 2: contiguous datasets written with O_DIRECT, CRC32C per block (io/checkpoint_file.h). 1: chunked
// datasets with Fletcher-32; still read.
inline constexpr int kCheckpointVersion = 3;
inline constexpr int kCheckpointVersionWithoutRanges = 2;
inline constexpr int kOldestReadableCheckpointVersion = 1;
inline constexpr const char* kCheckpointDatasets[3] = {"master", "exp_avg", "exp_avg_sq"};
// LoRA checkpoints: the adapters' optimizer state, replicated, in one file written by rank 0.
inline constexpr const char* kLoraCheckpointFile = "adapters.h5";
inline constexpr const char* kLoraCheckpointGroup = "lora";

// "rank_<rank>.h5", "unit_<unit>", zero-padded to 5 digits.
std::string checkpoint_rank_file(int rank);
std::string checkpoint_unit_group(int unit);

// A run of a unit in a rank file: unit-relative [begin, begin + count), stored from element
// `stored` of the group's datasets.
struct FileRun {
  int64_t begin = 0, count = 0, stored = 0;
};

// The runs of one unit group: attribute ranges (version 3), else begin_count (one run).
Result<std::vector<FileRun>> file_runs(const CheckpointGroupReader& group, const std::string& path, int unit);

}  // namespace glm
