// LoRA checkpoint files (see lora_checkpoint.h).
#include "train/lora_checkpoint.h"

#include <vector>

#include "io/checkpoint_file.h"
#include "train/checkpoint_format.h"

namespace glm {

namespace fs = std::filesystem;

Status write_lora_file(const TrainingEngine& engine, Backend& backend, const fs::path& path, bool model_only) {
  const TrainingEngine::OptimizerShard s = engine.lora_optimizer_state();
  const Tensor sources[3] = {s.master, s.exp_avg, s.exp_avg_sq};
  for (const Tensor& t : sources)
    if (t.dtype != DType::f32)
      return GLM_INTERNAL_ERROR("LoRA checkpoints store fp32 optimizer state, the backend keeps ", dtype_name(t.dtype));
  std::vector<CheckpointFileGroup> groups(1);
  groups[0].name = kLoraCheckpointGroup;
  groups[0].attributes = {{"numel", {s.master.numel}}};
  for (int d = 0; d < (model_only ? 1 : 3); ++d) groups[0].datasets.emplace_back(kCheckpointDatasets[d], s.master.numel);
  auto fill = [&](size_t, size_t dataset, int64_t first, std::span<float> dst) -> Status {
    return backend.download(dst.data(), sources[dataset].slice(first, static_cast<int64_t>(dst.size())));
  };
  auto written = write_checkpoint_file(path.string(), groups, fill);
  return written.is_ok() ? Status::ok() : written.status();
}

Status read_lora_file(const fs::path& dir, int64_t expected_numel, int datasets,
                      const std::function<Status(int dataset, std::span<const float> values)>& sink) {
  const fs::path path = dir / kLoraCheckpointFile;
  if (!fs::exists(path)) return GLM_USER_ERROR("checkpoint '", dir.string(), "' misses ", kLoraCheckpointFile);
  GLM_ASSIGN_OR_RETURN(const CheckpointFileReader file, CheckpointFileReader::open(path.string()));
  GLM_ASSIGN_OR_RETURN(const CheckpointGroupReader group, file.group(kLoraCheckpointGroup));
  const std::optional<std::vector<int64_t>> numel = group.int64_attribute("numel");
  if (!numel || numel->size() != 1)
    return GLM_USER_ERROR(path.string(), ": ", kLoraCheckpointGroup, " has no readable numel attribute");
  if (numel->front() != expected_numel)
    return GLM_USER_ERROR(path.string(), ": ", numel->front(), " adapter elements, the LoRA layout has ",
                          expected_numel);
  std::vector<float> host(static_cast<size_t>(expected_numel));
  for (int d = 0; d < datasets; ++d) {
    GLM_RETURN_IF_ERROR(group.read(kCheckpointDatasets[d], 0, host));
    GLM_RETURN_IF_ERROR(sink(d, host));
  }
  return Status::ok();
}

Status load_lora_file(TrainingEngine& engine, const fs::path& dir, bool weights_only) {
  const TrainingEngine::OptimizerShard mine = engine.lora_optimizer_state();
  Backend& backend = engine.backend();
  const Tensor targets[3] = {mine.master, mine.exp_avg, mine.exp_avg_sq};
  GLM_RETURN_IF_ERROR(
      read_lora_file(dir, mine.master.numel, weights_only ? 1 : 3,
                     [&](int d, std::span<const float> values) { return backend.upload(targets[d], values.data()); }));
  if (weights_only) {  // Adam starts over: zero moments, as a fresh optimizer has
    GLM_RETURN_IF_ERROR(backend.zero(mine.exp_avg));
    GLM_RETURN_IF_ERROR(backend.zero(mine.exp_avg_sq));
  }
  return backend.synchronize();
}

}  // namespace glm
