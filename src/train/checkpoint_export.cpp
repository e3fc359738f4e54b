// The checkpoint readers of glm_hpc export and tools (see checkpoint.h): meta.json and args.json
// without an engine, the full model's master weights reassembled unit by unit, the LoRA adapters.
#include <algorithm>
#include <utility>
#include <vector>

#include "base/json_fields.h"
#include "base/progress.h"
#include "io/checkpoint_file.h"
#include "train/checkpoint.h"
#include "train/checkpoint_format.h"
#include "train/checkpoint_meta.h"
#include "train/lora_checkpoint.h"

namespace glm {
namespace {

namespace fs = std::filesystem;

// Every rank file of a checkpoint, open; a missing or unreadable one is a user error naming it.
Result<std::vector<CheckpointFileReader>> open_rank_files(const fs::path& dir, int world_size) {
  std::vector<CheckpointFileReader> files;
  for (int r = 0; r < world_size; ++r) {
    const fs::path path = dir / checkpoint_rank_file(r);
    if (!fs::exists(path)) return GLM_USER_ERROR("checkpoint '", dir.string(), "' misses ", checkpoint_rank_file(r));
    GLM_ASSIGN_OR_RETURN(CheckpointFileReader file, CheckpointFileReader::open(path.string()));
    files.push_back(std::move(file));
  }
  return files;
}

// Unit u's master weights from every rank file into values (its unpadded size); pieces gets each
// [lo, hi) read.
Status read_unit_masters(const std::vector<CheckpointFileReader>& files, int u, std::vector<float>& values,
                         std::vector<std::pair<int64_t, int64_t>>& pieces) {
  const int64_t size = static_cast<int64_t>(values.size());
  std::vector<float> host;
  for (const CheckpointFileReader& file : files) {
    GLM_ASSIGN_OR_RETURN(const CheckpointGroupReader group, file.group(checkpoint_unit_group(u)));
    GLM_ASSIGN_OR_RETURN(const std::vector<FileRun> runs, file_runs(group, file.path(), u));
    for (const FileRun& run : runs) {
      const int64_t lo = run.begin, hi = std::min(run.begin + run.count, size);  // the tail past `size` is padding
      if (lo >= hi) continue;
      host.resize(static_cast<size_t>(hi - lo));
      GLM_RETURN_IF_ERROR(group.read(kCheckpointDatasets[0], lo - (run.begin - run.stored), host));
      std::copy(host.begin(), host.end(), values.begin() + lo);
      pieces.emplace_back(lo, hi);
    }
  }
  return Status::ok();
}

// The pieces read of unit u cover [0, size) exactly once.
Status check_exact_cover(const CheckpointInfo& info, int u, int64_t size,
                         std::vector<std::pair<int64_t, int64_t>> pieces) {
  std::sort(pieces.begin(), pieces.end());
  int64_t cursor = 0;
  for (const auto& [lo, hi] : pieces) {
    if (lo < cursor)
      return GLM_USER_ERROR("checkpoint '", info.dir, "': ", checkpoint_unit_group(u), " elements [", lo, ", ",
                            std::min(cursor, hi), ") are in two rank files");
    if (lo > cursor) break;
    cursor = hi;
  }
  if (cursor != size)
    return GLM_USER_ERROR("checkpoint '", info.dir, "': ", checkpoint_unit_group(u), " elements from ", cursor,
                          " on are in no rank file (of ", info.world_size, "; meta.json's world_size)");
  return Status::ok();
}

}  // namespace

Result<CheckpointInfo> read_checkpoint_info(const std::string& dir_name) {
  const fs::path dir(dir_name);
  CheckpointInfo info;
  info.dir = dir_name;
  GLM_ASSIGN_OR_RETURN(const CheckpointMeta meta, read_checkpoint_meta(dir));
  for (const fs::path& args : {dir / "args.json", dir.parent_path() / "args.json"}) {
    if (fs::exists(args)) {
      GLM_ASSIGN_OR_RETURN(info.args, read_json_object(args.string()));
      break;
    }
  }
  GLM_ASSIGN_OR_RETURN(info.config, saved_model_config(meta, info.args));
  const nlohmann::json ours = model_shape_json(info.config);
  for (const auto& [field, value] : ours.items())
    GLM_RETURN_IF_ERROR(check_model_field(meta.json["model"], ours, field, meta.path));
  if (meta.units != unpadded_units(info.config))
    return GLM_USER_ERROR(meta.path.string(), ": unit sizes differ from the layout of the model it describes");
  info.world_size = meta.world_size;
  info.zero_stage = meta.zero_stage;
  info.step = meta.state.step;
  info.tokenizer = meta.state.tokenizer;
  if (meta.train_type == TrainType::lora) {
    GLM_ASSIGN_OR_RETURN(info.lora, saved_lora(meta, info.config));
  }
  return info;
}

Result<std::vector<float>> read_checkpoint_adapters(const CheckpointInfo& info) {
  if (!info.lora)
    return GLM_USER_ERROR("checkpoint '", info.dir, "' is a full-training checkpoint: it holds no LoRA adapters");
  const LoraLayout layout(info.config, info.lora->config);
  std::vector<float> adapters;
  GLM_RETURN_IF_ERROR(read_lora_file(info.dir, layout.total_numel(), 1, [&](int, std::span<const float> values) {
    adapters.assign(values.begin(), values.end());
    return Status::ok();
  }));
  return adapters;
}

Status read_checkpoint_masters(const CheckpointInfo& info,
                               const std::function<Status(int unit, std::span<const float> values)>& sink) {
  if (info.lora)
    return GLM_USER_ERROR("checkpoint '", info.dir,
                          "' is a LoRA checkpoint (train_type lora): it holds the adapters, not the model's weights");
  GLM_ASSIGN_OR_RETURN(const std::vector<CheckpointFileReader> files, open_rank_files(info.dir, info.world_size));
  const std::vector<int64_t> units = unpadded_units(info.config);
  std::vector<float> unit_values;
  int64_t total = 0, done = 0;
  for (int64_t size : units) total += size;
  Progress progress("reading the weights of " + info.dir, total, Progress::Unit::items, "parameters");
  for (int u = 0; u < static_cast<int>(units.size()); ++u) {
    const int64_t size = units[static_cast<size_t>(u)];

    unit_values.assign(static_cast<size_t>(size), 0.0f);
    std::vector<std::pair<int64_t, int64_t>> pieces;  // [lo, hi) read, to prove exact coverage
    GLM_RETURN_IF_ERROR(read_unit_masters(files, u, unit_values, pieces));
    GLM_RETURN_IF_ERROR(check_exact_cover(info, u, size, std::move(pieces)));
    GLM_RETURN_IF_ERROR(sink(u, unit_values));
    done += size;
    progress.update(done);
  }
  progress.finish();
  return Status::ok();
}

}  // namespace glm
