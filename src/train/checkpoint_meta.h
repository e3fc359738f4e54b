// meta.json of a checkpoint (see checkpoint.h): written from the engine and the run's state, read
// and validated back, for resuming and for export.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "train/checkpoint.h"
#include "train/train_config.h"

namespace glm {

// What resuming must match: the model's shape.
nlohmann::json model_shape_json(const ModelConfig& c);
// The unit sizes without world-size padding: what a checkpoint must cover.
std::vector<int64_t> unpadded_units(const ModelConfig& c);
TrainType train_type_of(const TrainingEngine& engine);
nlohmann::json lora_json(const LoraConfig& c, int64_t numel);
// The base a LoRA checkpoint's adapters were trained on.
nlohmann::json base_json(const std::string& base_model, uint64_t seed, double sum_squares);

// The whole meta.json of a save by `world` ranks; base_sum_squares is the LoRA base's fingerprint.
nlohmann::json checkpoint_meta_json(const TrainingEngine& engine, const CheckpointState& state, int world,
                                    double base_sum_squares);

// A checkpoint's meta.json as read back: every field checked for its type and for the range a save
// could have written, a user error naming the file and the field otherwise.
struct CheckpointMeta {
  std::filesystem::path path;  // dir/meta.json, for messages
  nlohmann::json json;         // the whole file: its model, model_config, lora and base objects
  int version = 0;
  int world_size = 1;
  int context_parallel_size = 1;  // ranks that shared each row (they read the same samples)
  int zero_stage = 0;
  int64_t optimizer_steps = 0;
  std::vector<int64_t> units;
  TrainType train_type = TrainType::full;
  CheckpointState state;  // step, consumed_samples, seed, tokenizer, evaluation, LoRA base
};

// Most ranks a checkpoint may name: a bound far above any machine, far below what overflows.
inline constexpr int64_t kMaxCheckpointWorldSize = 1'000'000;

// dir/meta.json: its format, a readable version, and every field (see CheckpointMeta).
Result<CheckpointMeta> read_checkpoint_meta(const std::filesystem::path& dir);

// saved[field] (meta.json's model) against ours[field], a user error naming both when they differ.
Status check_model_field(const nlohmann::json& saved, const nlohmann::json& ours, const std::string& field,
                         const std::filesystem::path& meta_path);

// meta.json's model_config; without it (an older checkpoint) the run's args.json gives the model.
Result<ModelConfig> saved_model_config(const CheckpointMeta& meta, const nlohmann::json& args);
// meta.json's lora and base objects (written as lora_json and base_json), checked.
Result<LoraCheckpointInfo> saved_lora(const CheckpointMeta& meta, const ModelConfig& config);

}  // namespace glm
