// meta.json (see checkpoint_meta.h): the schema written at every save, read back and validated.
#include "train/checkpoint_meta.h"

#include <algorithm>
#include <fstream>
#include <optional>

#include "base/json_fields.h"
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
  j["pad_token_id"] = c.pad_token_id;
  return j;
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
                         {"context_parallel_size", engine.context_parallel_size()},
                         {"zero_stage", engine.zero_stage()},
                         {"optimizer_steps", engine.optimizer_steps()},
                         {"model", model_shape_json(engine.config())},
                         {"model_config", model_config_json(engine.config())},
                         {"units", unpadded_units(engine.config())},
                         {"train_type", enum_name(train_type_of(engine))},
                         {"model_only", state.model_only}};
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

namespace {

// The saving run's per_device_train_batch_size x gradient_accumulation_steps, from the args.json
// saved beside meta.json; 0 when the checkpoint has none or it does not record both.
Result<int64_t> saved_batch_per_rank(const fs::path& dir) {
  const fs::path path = dir / "args.json";
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return int64_t{0};
  GLM_ASSIGN_OR_RETURN(const nlohmann::json args, read_json_object(path.string()));
  GLM_ASSIGN_OR_RETURN(const JsonFields f, JsonFields::of(args, path.string()));
  if (!f.has("options")) return int64_t{0};
  GLM_ASSIGN_OR_RETURN(const JsonFields options, f.object("options"));
  int64_t product = 1;
  for (const char* name : {"per_device_train_batch_size", "gradient_accumulation_steps"}) {
    if (!options.has(name)) return int64_t{0};
    GLM_ASSIGN_OR_RETURN(const JsonFields option, options.object(name));  // {"value": ..., "source": ...}
    GLM_ASSIGN_OR_RETURN(const int64_t value, option.integer("value", 1));
    if (__builtin_mul_overflow(product, value, &product))
      return option.error("value", "makes a global batch beyond int64");
  }
  return product;
}

// consumed_samples is step x the saving run's global batch (per_device_train_batch_size x
// world_size x gradient_accumulation_steps, world_size counting data-parallel ranks: the saving
// run's ranks over its context_parallel_size): exactly that when the checkpoint's args.json records
// the batch, else a multiple of step x world_size, or zero (no data stream).
Status check_consumed_samples(const JsonFields& f, const fs::path& dir, int64_t step, int64_t consumed,
                              int world_size) {
  GLM_ASSIGN_OR_RETURN(const int64_t per_rank, saved_batch_per_rank(dir));
  if (per_rank > 0) {
    int64_t global = 0, expected = 0;
    const bool fits = !__builtin_mul_overflow(per_rank, int64_t{world_size}, &global) &&
                      !__builtin_mul_overflow(step, global, &expected);
    if (fits && consumed == expected) return Status::ok();
    return f.error("consumed_samples",
                   concat("is ", consumed, ", but ", step, " steps of the run that saved it consume ",
                          fits ? std::to_string(expected) : std::string("more than int64 holds"),
                          " (per_device_train_batch_size x gradient_accumulation_steps ", per_rank,
                          " in its args.json, x ", world_size, " rank(s))"));
  }
  const int64_t per_step = step > 0 ? consumed / step : 0;
  // 0 at any step: a checkpoint saved without a data stream (the engine's own save); it resumes
  // with the data from its beginning.
  const bool fits =
      consumed == 0 || (step > 0 && consumed % step == 0 && per_step >= world_size && per_step % world_size == 0);
  if (fits) return Status::ok();
  return f.error("consumed_samples",
                 concat("is ", consumed, ", which ", step, " steps on ", world_size,
                        " rank(s) cannot have consumed: a step consumes per_device_train_batch_size x world_size x "
                        "gradient_accumulation_steps samples, so it is step x a multiple of world_size (",
                        step, " x a multiple of ", world_size, ")"));
}

// The evaluation fields (Hugging Face's trainer_state.json names), each null when there was none.
Status read_evaluation(const JsonFields& f, CheckpointState& state) {
  if (f.has("eval_loss")) {
    GLM_ASSIGN_OR_RETURN(state.eval_loss, f.number("eval_loss"));
  }
  if (!f.has("best_metric")) return Status::ok();
  EvalRecord best;
  GLM_ASSIGN_OR_RETURN(best.loss, f.number("best_metric"));
  GLM_ASSIGN_OR_RETURN(best.step, f.integer("best_global_step", 0, state.step));
  GLM_ASSIGN_OR_RETURN(best.checkpoint, f.string_or("best_model_checkpoint", ""));
  if (best.checkpoint.find('/') != std::string::npos)
    return f.error("best_model_checkpoint",
                   concat("must name a checkpoint directory beside this one, got '", best.checkpoint, "'"));
  state.best = best;
  return Status::ok();
}

// The fields that say where the run stood: steps, samples, seed, world size, ZeRO stage.
Status read_position(const JsonFields& f, const fs::path& dir, CheckpointMeta& meta) {
  CheckpointState& state = meta.state;
  GLM_ASSIGN_OR_RETURN(const int64_t world, f.integer("world_size", 1, kMaxCheckpointWorldSize));
  meta.world_size = static_cast<int>(world);
  // The ranks sharing each row: they read the same samples, so the data-parallel ranks are world / cp.
  GLM_ASSIGN_OR_RETURN(const int64_t cp, f.integer_or("context_parallel_size", 1, 1, world));
  if (world % cp != 0)
    return f.error("context_parallel_size", concat("is ", cp, ", which does not divide world_size ", world));
  meta.context_parallel_size = static_cast<int>(cp);
  GLM_ASSIGN_OR_RETURN(const int64_t stage, f.integer_or("zero_stage", 0, 0, 3));
  meta.zero_stage = static_cast<int>(stage);
  GLM_ASSIGN_OR_RETURN(state.step, f.integer("step", 0));
  // Updates since the optimizer started (--resume_only_model restarts both at 0): never past step.
  GLM_ASSIGN_OR_RETURN(meta.optimizer_steps, f.integer("optimizer_steps", 0, state.step));
  GLM_ASSIGN_OR_RETURN(state.consumed_samples, f.integer("consumed_samples", 0));
  GLM_RETURN_IF_ERROR(check_consumed_samples(f, dir, state.step, state.consumed_samples,
                                             meta.world_size / meta.context_parallel_size));
  GLM_ASSIGN_OR_RETURN(state.seed, f.unsigned_integer("seed"));
  return Status::ok();
}

// What was trained and with what: units, model, train_type, tokenizer, LoRA base.
Status read_contents(const JsonFields& f, CheckpointMeta& meta) {
  CheckpointState& state = meta.state;
  GLM_ASSIGN_OR_RETURN(meta.units, f.integers("units", 0));
  GLM_RETURN_IF_ERROR(f.object("model").status());
  if (f.has("model_config")) GLM_RETURN_IF_ERROR(f.object("model_config").status());
  GLM_ASSIGN_OR_RETURN(const std::string train_type, f.string_or("train_type", "full"));
  const std::optional<TrainType> kind = enum_from_name<TrainType>(train_type);
  if (!kind)
    return f.error("train_type", concat("must be ", enum_choices<TrainType>(), ", got '", train_type,
                                        "' (a damaged or foreign checkpoint)"));
  meta.train_type = *kind;
  GLM_ASSIGN_OR_RETURN(state.model_only, f.boolean_or("model_only", false));
  if (f.has("tokenizer")) {
    GLM_ASSIGN_OR_RETURN(const JsonFields t, f.object("tokenizer"));
    GLM_ASSIGN_OR_RETURN(state.tokenizer, t.string_or("path", ""));
    GLM_ASSIGN_OR_RETURN(state.tokenizer_hash, t.string_or("content_hash", ""));
  }
  if (meta.train_type == TrainType::lora) {
    GLM_RETURN_IF_ERROR(f.object("lora").status());
    GLM_ASSIGN_OR_RETURN(const JsonFields base, f.object("base"));
    GLM_ASSIGN_OR_RETURN(state.base_model, base.string_or("model_id_or_path", ""));
  }
  return read_evaluation(f, state);
}

}  // namespace

Result<CheckpointMeta> read_checkpoint_meta(const fs::path& dir) {
  CheckpointMeta meta;
  meta.path = dir / "meta.json";
  const std::string path = meta.path.string();
  std::ifstream in(meta.path);
  if (!in) return GLM_USER_ERROR("checkpoint '", dir.string(), "' has no readable meta.json");
  meta.json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (meta.json.is_discarded() || !meta.json.is_object()) return GLM_USER_ERROR(path, " is not valid JSON");
  GLM_ASSIGN_OR_RETURN(const JsonFields f, JsonFields::of(meta.json, path));
  if (f.raw("format") != kCheckpointFormat)
    return GLM_USER_ERROR(path, " is not a glm_hpc checkpoint (its format field is not '", kCheckpointFormat, "')");
  auto version = f.integer("version", kOldestReadableCheckpointVersion, kCheckpointVersion);
  if (!version.is_ok())
    return GLM_USER_ERROR(path, ": checkpoint version ", f.has("version") ? json_excerpt(f.raw("version")) : "(none)",
                          " is not one this glm_hpc reads (", kOldestReadableCheckpointVersion, " to ",
                          kCheckpointVersion, ")");
  meta.version = static_cast<int>(version.value());
  GLM_RETURN_IF_ERROR(read_position(f, dir, meta));
  GLM_RETURN_IF_ERROR(read_contents(f, meta));
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

Result<ModelConfig> saved_model_config(const CheckpointMeta& meta, const nlohmann::json& args) {
  const std::string path = meta.path.string();
  GLM_ASSIGN_OR_RETURN(const JsonFields f, JsonFields::of(meta.json, path));
  const bool has_config = f.has("model_config");
  const bool has_options = args.is_object() && args.contains("options") && args["options"].is_object();
  if (!has_config && !has_options)
    return GLM_USER_ERROR(path,
                          " has no model_config (an older glm_hpc wrote it) and no args.json is "
                          "beside the checkpoint to take RoPE and norm settings from");
  // An older checkpoint: meta.json's model, the rest from args.json's options ({"value": ...}).
  nlohmann::json legacy = nlohmann::json::object();
  if (!has_config) {
    for (const auto& [name, option] : args["options"].items())
      if (option.is_object() && option.contains("value")) legacy[name] = option["value"];
    for (const auto& [name, value] : meta.json["model"].items()) legacy[name] = value;
  }
  Result<JsonFields> fields =
      has_config ? f.object("model_config") : JsonFields::of(legacy, path + " (its model, with args.json's options)");
  GLM_RETURN_IF_ERROR(fields.status());
  const JsonFields& c_fields = fields.value();
  ModelConfig c;
  int64_t* integers[] = {
      &c.vocab_size,          &c.hidden_size,         &c.intermediate_size, &c.num_hidden_layers,
      &c.num_attention_heads, &c.num_key_value_heads, &c.head_dim,          &c.max_position_embeddings};
  const char* integer_names[] = {
      "vocab_size",          "hidden_size",         "intermediate_size", "num_hidden_layers",
      "num_attention_heads", "num_key_value_heads", "head_dim",          "max_position_embeddings"};
  for (size_t i = 0; i < std::size(integers); ++i) {
    GLM_ASSIGN_OR_RETURN(*integers[i], c_fields.integer(integer_names[i], 1));
  }
  GLM_ASSIGN_OR_RETURN(c.rope_theta, c_fields.number("rope_theta"));
  GLM_ASSIGN_OR_RETURN(c.partial_rotary_factor, c_fields.number("partial_rotary_factor"));
  GLM_ASSIGN_OR_RETURN(c.rms_norm_eps, c_fields.number("rms_norm_eps"));
  GLM_ASSIGN_OR_RETURN(c.initializer_range, c_fields.number("initializer_range"));
  // Without pad_token_id (an older checkpoint) every row trained.
  GLM_ASSIGN_OR_RETURN(c.pad_token_id, c_fields.integer_or("pad_token_id", -1, -1, c.vocab_size - 1));
  Status valid = c.finalize_and_validate();
  if (!valid.is_ok()) return GLM_USER_ERROR(path, ": invalid model configuration: ", valid.message());
  return c;
}

// meta.json's lora and base objects (written by save_checkpoint: lora_json, base_json).
Result<LoraCheckpointInfo> saved_lora(const CheckpointMeta& meta, const ModelConfig& config) {
  const std::string path = meta.path.string();
  GLM_ASSIGN_OR_RETURN(const JsonFields f, JsonFields::of(meta.json, path));
  GLM_ASSIGN_OR_RETURN(const JsonFields l, f.object("lora"));
  GLM_ASSIGN_OR_RETURN(const JsonFields b, f.object("base"));
  LoraCheckpointInfo out;
  GLM_ASSIGN_OR_RETURN(out.config.rank, l.integer("rank", 1));
  GLM_ASSIGN_OR_RETURN(out.config.alpha, l.number("alpha"));
  if (!(out.config.alpha > 0)) return l.error("alpha", concat("must be positive, got ", out.config.alpha));
  // A meta.json without lora.dropout (an older checkpoint) trained without dropout.
  GLM_ASSIGN_OR_RETURN(out.config.dropout, l.number_or("dropout", 0.0, 0.0, 1.0));
  GLM_ASSIGN_OR_RETURN(const std::vector<std::string> target_names, l.strings("targets"));
  if (target_names.empty()) return l.error("targets", "is an empty list (of module names)");
  std::string names;
  for (const std::string& t : target_names) names += (names.empty() ? "" : ",") + t;
  auto targets = parse_lora_targets(names);
  if (!targets.is_ok()) return GLM_USER_ERROR(path, ": lora.targets: ", targets.status().message());
  out.config.targets = targets.take();
  const int64_t numel = LoraLayout(config, out.config).total_numel();
  if (l.raw("numel") != nlohmann::json(numel))
    return GLM_USER_ERROR(path, ": lora.numel is ", json_excerpt(l.raw("numel")),
                          ", the LoRA layout of its model and configuration has ", numel);
  GLM_ASSIGN_OR_RETURN(out.base_model, b.string_or("model_id_or_path", ""));
  if (out.base_model.empty()) {
    if (!b.has("random_init_seed"))
      return GLM_USER_ERROR(path, ": field 'base' names neither a model_id_or_path nor a random_init_seed");
    GLM_ASSIGN_OR_RETURN(out.random_init_seed, b.unsigned_integer("random_init_seed"));
  }
  GLM_ASSIGN_OR_RETURN(out.base_sum_squares, b.number("sum_squares", 0.0));
  return out;
}

}  // namespace glm
