// meta.json (see checkpoint_meta.h): the schema written at every save, read back and validated.
#include "train/checkpoint_meta.h"

#include <algorithm>
#include <fstream>
#include <optional>

#include "base/input_path.h"
#include "train/checkpoint_format.h"

namespace glm {
namespace {

namespace fs = std::filesystem;

// Everything export needs to describe the model (model_shape_json() is what resuming must match).
nlohmann::json model_config_json(const ModelConfig& c) {
  nlohmann::json j = model_shape_json(c);
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rope_theta"] = c.rope_theta;
  j["partial_rotary_factor"] = c.partial_rotary_factor;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["initializer_range"] = c.initializer_range;
  return j;
}

std::optional<double> optional_number(const nlohmann::json& m, const char* field) {
  if (!m.contains(field) || !m[field].is_number()) return std::nullopt;
  return m[field].get<double>();
}

}  // namespace

nlohmann::json model_shape_json(const ModelConfig& c) {
  return {{"vocab_size", c.vocab_size},
          {"hidden_size", c.hidden_size},
          {"intermediate_size", c.intermediate_size},
          {"num_hidden_layers", c.num_hidden_layers},
          {"num_attention_heads", c.num_attention_heads},
          {"num_key_value_heads", c.num_key_value_heads},
          {"head_dim", c.head_dim}};
}

std::vector<int64_t> unpadded_units(const ModelConfig& c) {
  std::vector<int64_t> sizes;
  const ParamLayout layout(c, 1);
  for (const auto& u : layout.units()) sizes.push_back(u.numel);
  return sizes;
}

TrainType train_type_of(const TrainingEngine& engine) {
  return engine.lora_layout() != nullptr ? TrainType::lora : TrainType::full;
}

nlohmann::json lora_json(const LoraConfig& c, int64_t numel) {
  std::vector<LoraTarget> sorted = c.targets;  // the order of --target_modules does not matter
  std::sort(sorted.begin(), sorted.end());
  nlohmann::json targets = nlohmann::json::array();
  for (LoraTarget t : sorted) targets.push_back(lora_target_name(t));
  // dropout is recorded but not compared on resume: it changes no shape or value of the adapters, and
  // HF/ms-swift let a resumed run change lora_dropout too.
  return {{"rank", c.rank}, {"alpha", c.alpha}, {"dropout", c.dropout}, {"targets", targets}, {"numel", numel}};
}

nlohmann::json base_json(const std::string& base_model, uint64_t seed, double sum_squares) {
  return {{"model_id_or_path", base_model.empty() ? nlohmann::json(nullptr) : nlohmann::json(base_model)},
          {"random_init_seed", base_model.empty() ? nlohmann::json(seed) : nlohmann::json(nullptr)},
          {"sum_squares", sum_squares}};
}

nlohmann::json checkpoint_meta_json(const TrainingEngine& engine, const CheckpointState& state, int world,
                                    double base_sum_squares) {
  const bool ranges = engine.layout().persistent_unit() >= 0;  // write_rank_file's choice
  const LoraLayout* lora = engine.lora_layout();
  nlohmann::json meta = {{"format", kCheckpointFormat},
                         {"version", ranges ? kCheckpointVersion : kCheckpointVersionWithoutRanges},
                         {"step", state.step},
                         {"consumed_samples", state.consumed_samples},
                         {"seed", state.seed},
                         {"world_size", world},
                         {"zero_stage", engine.zero_stage()},
                         {"optimizer_steps", engine.optimizer_steps()},
                         {"model", model_shape_json(engine.config())},
                         {"model_config", model_config_json(engine.config())},
                         {"units", unpadded_units(engine.config())},
                         {"train_type", enum_name(train_type_of(engine))}};
  if (lora != nullptr) {
    meta["lora"] = lora_json(lora->config(), lora->total_numel());
    meta["base"] = base_json(state.base_model, state.seed, base_sum_squares);
  }
  meta["tokenizer"] = state.tokenizer_hash.empty()
                          ? nlohmann::json(nullptr)
                          : nlohmann::json{{"path", state.tokenizer}, {"content_hash", state.tokenizer_hash}};
  meta["eval_loss"] = state.eval_loss ? nlohmann::json(*state.eval_loss) : nlohmann::json(nullptr);
  // Hugging Face's trainer_state.json names.
  meta["best_metric"] = state.best ? nlohmann::json(state.best->loss) : nlohmann::json(nullptr);
  meta["best_global_step"] = state.best ? nlohmann::json(state.best->step) : nlohmann::json(nullptr);
  meta["best_model_checkpoint"] =
      state.best && !state.best->checkpoint.empty() ? nlohmann::json(state.best->checkpoint) : nlohmann::json(nullptr);
  return meta;
}

Result<nlohmann::json> read_checkpoint_meta(const fs::path& dir) {
  const fs::path path = dir / "meta.json";
  GLM_RETURN_IF_ERROR(check_input_path(path.string()));
  std::ifstream in(path);
  if (!in) return GLM_USER_ERROR("checkpoint '", dir.string(), "' has no readable meta.json");
  nlohmann::json meta = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (meta.is_discarded() || !meta.is_object()) return GLM_USER_ERROR(path.string(), " is not valid JSON");
  if (meta.value("format", "") != kCheckpointFormat)
    return GLM_USER_ERROR(path.string(), " is not a glm_hpc checkpoint (its format field is not '", kCheckpointFormat,
                          "')");
  const int version = meta.contains("version") && meta["version"].is_number_integer() ? meta["version"].get<int>() : -1;
  if (version < kOldestReadableCheckpointVersion || version > kCheckpointVersion)
    return GLM_USER_ERROR(
        path.string(), ": checkpoint version ", meta.contains("version") ? meta["version"].dump() : "(none)",
        " is not one this glm_hpc reads (", kOldestReadableCheckpointVersion, " to ", kCheckpointVersion, ")");
  for (const char* field : {"step", "world_size", "units", "model", "consumed_samples", "seed", "optimizer_steps"})
    if (!meta.contains(field)) return GLM_USER_ERROR(path.string(), ": field '", field, "' is missing");
  return meta;
}

Status check_model_field(const nlohmann::json& saved, const nlohmann::json& ours, const std::string& field,
                         const fs::path& meta) {
  if (!saved.contains(field)) return GLM_USER_ERROR(meta.string(), ": field '", field, "' is missing");
  if (saved[field] != ours[field])
    return GLM_USER_ERROR(meta.string(), ": the checkpoint's ", field, " is ", saved[field].dump(), ", this run's ",
                          ours[field].dump(), " (a checkpoint of another model shape)");
  return Status::ok();
}

CheckpointState checkpoint_state_from_meta(const nlohmann::json& m) {
  CheckpointState state;
  state.step = m["step"].get<int64_t>();
  state.consumed_samples = m["consumed_samples"].get<int64_t>();
  state.seed = m["seed"].get<uint64_t>();
  if (m.contains("base") && m["base"].is_object() && m["base"].contains("model_id_or_path") &&
      m["base"]["model_id_or_path"].is_string())
    state.base_model = m["base"]["model_id_or_path"].get<std::string>();
  if (m.contains("tokenizer") && m["tokenizer"].is_object()) {
    state.tokenizer = m["tokenizer"].value("path", "");
    state.tokenizer_hash = m["tokenizer"].value("content_hash", "");
  }
  state.eval_loss = optional_number(m, "eval_loss");
  const std::optional<double> best = optional_number(m, "best_metric");
  if (best && m.contains("best_global_step") && m["best_global_step"].is_number_integer()) {
    state.best = EvalRecord{m["best_global_step"].get<int64_t>(), *best,
                            m.contains("best_model_checkpoint") && m["best_model_checkpoint"].is_string()
                                ? m["best_model_checkpoint"].get<std::string>()
                                : std::string()};
  }
  return state;
}

Result<ModelConfig> saved_model_config(const nlohmann::json& meta, const nlohmann::json& args,
                                       const fs::path& meta_path) {
  const bool has_config = meta.contains("model_config") && meta["model_config"].is_object();
  const nlohmann::json* options = args.is_object() && args.contains("options") ? &args["options"] : nullptr;
  if (!has_config && options == nullptr)
    return GLM_USER_ERROR(meta_path.string(),
                          " has no model_config (an older glm_hpc wrote it) and no args.json is "
                          "beside the checkpoint to take RoPE and norm settings from");
  auto number = [&](const char* field) -> Result<double> {
    const nlohmann::json* v = nullptr;
    if (has_config && meta["model_config"].contains(field)) {
      v = &meta["model_config"][field];
    } else if (!has_config && meta["model"].contains(field)) {
      v = &meta["model"][field];
    } else if (!has_config && options->contains(field) && (*options)[field].contains("value")) {
      v = &(*options)[field]["value"];
    }
    if (v == nullptr || !v->is_number())
      return GLM_USER_ERROR(meta_path.string(), ": model_config field '", field, "' is missing or not a number");
    return v->get<double>();
  };
  ModelConfig c;
  int64_t* integers[] = {
      &c.vocab_size,          &c.hidden_size,         &c.intermediate_size, &c.num_hidden_layers,
      &c.num_attention_heads, &c.num_key_value_heads, &c.head_dim,          &c.max_position_embeddings};
  const char* integer_names[] = {
      "vocab_size",          "hidden_size",         "intermediate_size", "num_hidden_layers",
      "num_attention_heads", "num_key_value_heads", "head_dim",          "max_position_embeddings"};
  for (size_t i = 0; i < std::size(integers); ++i) {
    GLM_ASSIGN_OR_RETURN(const double v, number(integer_names[i]));
    *integers[i] = static_cast<int64_t>(v);
  }
  GLM_ASSIGN_OR_RETURN(c.rope_theta, number("rope_theta"));
  GLM_ASSIGN_OR_RETURN(c.partial_rotary_factor, number("partial_rotary_factor"));
  GLM_ASSIGN_OR_RETURN(c.rms_norm_eps, number("rms_norm_eps"));
  GLM_ASSIGN_OR_RETURN(c.initializer_range, number("initializer_range"));
  Status valid = c.finalize_and_validate();
  if (!valid.is_ok()) return GLM_USER_ERROR(meta_path.string(), ": invalid model configuration: ", valid.message());
  return c;
}

// meta.json's lora and base objects (written by save_checkpoint: lora_json, base_json).
Result<LoraCheckpointInfo> saved_lora(const nlohmann::json& meta, const ModelConfig& config,
                                      const fs::path& meta_path) {
  if (!meta.contains("lora") || !meta["lora"].is_object() || !meta.contains("base") || !meta["base"].is_object())
    return GLM_USER_ERROR(meta_path.string(), ": a LoRA checkpoint without the 'lora' or 'base' object");
  const nlohmann::json& l = meta["lora"];
  const nlohmann::json& b = meta["base"];
  LoraCheckpointInfo out;
  if (!l.contains("rank") || !l["rank"].is_number_integer() || l["rank"].get<int64_t>() < 1)
    return GLM_USER_ERROR(meta_path.string(), ": field 'lora.rank' is missing or not a positive integer");
  if (!l.contains("alpha") || !l["alpha"].is_number() || !(l["alpha"].get<double>() > 0))
    return GLM_USER_ERROR(meta_path.string(), ": field 'lora.alpha' is missing or not a positive number");
  if (!l.contains("targets") || !l["targets"].is_array() || l["targets"].empty())
    return GLM_USER_ERROR(meta_path.string(), ": field 'lora.targets' is missing or not a list of module names");
  out.config.rank = l["rank"].get<int64_t>();
  out.config.alpha = l["alpha"].get<double>();
  // A meta.json without lora.dropout (an older checkpoint) trained without dropout.
  out.config.dropout = l.contains("dropout") && l["dropout"].is_number() ? l["dropout"].get<double>() : 0.0;
  std::string names;
  for (const auto& t : l["targets"]) {
    if (!t.is_string()) return GLM_USER_ERROR(meta_path.string(), ": field 'lora.targets' holds a non-string");
    names += (names.empty() ? "" : ",") + t.get<std::string>();
  }
  auto targets = parse_lora_targets(names);
  if (!targets.is_ok()) return GLM_USER_ERROR(meta_path.string(), ": lora.targets: ", targets.status().message());
  out.config.targets = targets.take();
  const int64_t numel = LoraLayout(config, out.config).total_numel();
  if (l.value("numel", nlohmann::json()) != nlohmann::json(numel))
    return GLM_USER_ERROR(meta_path.string(), ": lora.numel is ", l.value("numel", nlohmann::json()).dump(),
                          ", the LoRA layout of its model and configuration has ", numel);
  const nlohmann::json path = b.value("model_id_or_path", nlohmann::json());
  const nlohmann::json seed = b.value("random_init_seed", nlohmann::json());
  if (path.is_string() && !path.get<std::string>().empty()) {
    out.base_model = path.get<std::string>();
  } else if (seed.is_number_unsigned() || seed.is_number_integer()) {
    out.random_init_seed = seed.get<uint64_t>();
  } else {
    return GLM_USER_ERROR(meta_path.string(), ": field 'base' names neither a model_id_or_path nor a random_init_seed");
  }
  if (!b.contains("sum_squares") || !b["sum_squares"].is_number())
    return GLM_USER_ERROR(meta_path.string(), ": field 'base.sum_squares' is missing or not a number");
  out.base_sum_squares = b["sum_squares"].get<double>();
  return out;
}

}  // namespace glm
