// Names inside a checkpoint directory and the unit groups' run attributes (see checkpoint_format.h).
#include "train/checkpoint_format.h"

#include <cstdio>

namespace glm {

std::string checkpoint_rank_file(int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank_%05d.h5", rank);
  return name;
}

std::string checkpoint_unit_group(int unit) {
  char name[32];
  std::snprintf(name, sizeof(name), "unit_%05d", unit);
  return name;
}

Result<std::vector<FileRun>> file_runs(const CheckpointGroupReader& group, const std::string& path, int unit) {
  const bool has_ranges = group.has_attribute("ranges");
  const char* name = has_ranges ? "ranges" : "begin_count";
  const std::optional<std::vector<int64_t>> values = group.int64_attribute(name);
  if (!values || values->size() % 2 != 0 || (!has_ranges && values->size() != 2))
    return GLM_USER_ERROR(path, ": ", checkpoint_unit_group(unit), " has no readable ", name, " attribute");
  std::vector<FileRun> runs;
  int64_t stored = 0;
  for (size_t i = 0; i < values->size(); i += 2) {
    const int64_t begin = (*values)[i], count = (*values)[i + 1];
    if (begin < 0 || count < 0)
      return GLM_USER_ERROR(path, ": ", checkpoint_unit_group(unit), " has a negative ", name, " attribute");
    runs.push_back({begin, count, stored});
    stored += count;
  }
  return runs;
}

}  // namespace glm
