// Resume compatibility (see checkpoint_resume.h): what a checkpoint's meta.json must agree with.
#include "train/checkpoint_resume.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "train/checkpoint_meta.h"

namespace glm {
namespace {

namespace fs = std::filesystem;

// The tokenizer recorded in meta.json against this run's: another vocabulary mapping would make the
// trained embeddings mean other tokens.
Status check_tokenizer(const CheckpointState& saved, const ResumeExpectation& expect, const fs::path& meta) {
  if (expect.tokenizer_hash.empty() || saved.tokenizer_hash.empty() || saved.tokenizer_hash == expect.tokenizer_hash)
    return Status::ok();
  return GLM_USER_ERROR(meta.string(), ": the checkpoint was trained with the tokenizer '", saved.tokenizer,
                        "' (content hash ", saved.tokenizer_hash, "), this run's tokenizer '", expect.tokenizer,
                        "' has content hash ", expect.tokenizer_hash,
                        ": resume with the tokenizer the checkpoint was trained with");
}

// The adapters' configuration recorded in meta.json against this run's.
Status check_lora_config(const nlohmann::json& m, const LoraLayout& lora, const fs::path& meta) {
  const nlohmann::json mine = lora_json(lora.config(), lora.total_numel());
  const char* options[] = {"--lora_rank", "--lora_alpha", "--target_modules", "--lora_rank"};
  const char* fields[] = {"rank", "alpha", "targets", "numel"};
  for (size_t i = 0; i < std::size(fields); ++i) {
    const nlohmann::json& v = m["lora"].contains(fields[i]) ? m["lora"][fields[i]] : nlohmann::json(nullptr);
    if (v != mine[fields[i]])
      return GLM_USER_ERROR(meta.string(), ": the checkpoint's lora.", fields[i], " is ", v.dump(), ", this run's (",
                            options[i], ") is ", mine[fields[i]].dump(),
                            ": resume with the LoRA configuration it was trained with");
  }
  return Status::ok();
}

// The base recorded in meta.json against this run's: the same kind and seed, and the fingerprint.
Status check_lora_base(const nlohmann::json& base, const ResumeExpectation& expect, double base_sum_squares,
                       const fs::path& meta) {
  const bool saved_random = base.contains("random_init_seed") && base["random_init_seed"].is_number_integer();
  const bool ours_random = expect.base_model.empty();
  const auto describe = [](bool random, const nlohmann::json& seed, const nlohmann::json& path) {
    return random ? concat("random init with seed ", seed.dump()) : concat("--model_id_or_path ", path.dump());
  };
  const nlohmann::json our_base = base_json(expect.base_model, expect.base_seed, base_sum_squares);
  if (saved_random != ours_random || (saved_random && base["random_init_seed"] != our_base["random_init_seed"]))
    return GLM_USER_ERROR(meta.string(), ": the checkpoint's base is ",
                          describe(saved_random, base.value("random_init_seed", nlohmann::json()),
                                   base.value("model_id_or_path", nlohmann::json())),
                          ", this run's base is ",
                          describe(ours_random, our_base["random_init_seed"], our_base["model_id_or_path"]),
                          " (field base): the adapters only make sense on the base they were trained on");
  if (!base.contains("sum_squares") || !base["sum_squares"].is_number())
    return GLM_USER_ERROR(meta.string(), ": field 'base.sum_squares' is missing or not a number");
  const double theirs = base["sum_squares"].get<double>();
  if (!lora_base_fingerprint_matches(theirs, base_sum_squares))
    return GLM_USER_ERROR(meta.string(), ": the checkpoint's base.sum_squares (a fingerprint of the base weights) is ",
                          theirs, ", this run's base gives ", base_sum_squares,
                          ": these are other base weights than the adapters were trained on");
  return Status::ok();
}

// train_type, and for LoRA the adapters' configuration and the base, against this run's.
Status check_training_kind(const CheckpointMeta& saved, const TrainingEngine& engine, const ResumeExpectation& expect,
                           double base_sum_squares) {
  const fs::path& meta = saved.path;
  const TrainType ours = train_type_of(engine);
  if (saved.train_type != ours)
    return GLM_USER_ERROR(meta.string(), ": the checkpoint's train_type is ", enum_name(saved.train_type),
                          ", this run's --train_type is ", enum_name(ours),
                          saved.train_type == TrainType::lora
                              ? " (a LoRA checkpoint holds only adapters, not the full weights)"
                              : " (a full-training checkpoint holds no LoRA adapters)");
  const LoraLayout* lora = engine.lora_layout();
  if (lora == nullptr) return Status::ok();
  // read_checkpoint_meta checked that a LoRA checkpoint has both objects.
  GLM_RETURN_IF_ERROR(check_lora_config(saved.json, *lora, meta));
  return check_lora_base(saved.json["base"], expect, base_sum_squares, meta);
}

}  // namespace

Status check_resume_compatible(const CheckpointMeta& meta, const TrainingEngine& engine,
                               const ResumeExpectation& expect, const std::vector<int64_t>& units,
                               double base_sum_squares) {
  const nlohmann::json ours = model_shape_json(engine.config());
  for (const auto& [field, value] : ours.items())
    GLM_RETURN_IF_ERROR(check_model_field(meta.json["model"], ours, field, meta.path));
  if (meta.units != units) return GLM_USER_ERROR(meta.path.string(), ": unit sizes differ from this model's layout");
  if (meta.state.model_only && !expect.weights_only)
    return GLM_USER_ERROR(meta.path.parent_path().string(),
                          " holds the weights only (saved with --save_only_model true): no optimizer state to resume; "
                          "add --resume_only_model true to start from its weights with a fresh optimizer");
  GLM_RETURN_IF_ERROR(check_tokenizer(meta.state, expect, meta.path));
  return check_training_kind(meta, engine, expect, base_sum_squares);
}

bool lora_base_fingerprint_matches(double recorded, double computed) {
  // A weak fingerprint: it tells other weights apart, not a base changed by a tiny fraction.
  return std::abs(recorded - computed) <= kLoraBaseFingerprintTolerance * std::max(std::abs(recorded), 1.0);
}

}  // namespace glm
