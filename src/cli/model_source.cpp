// Opening a model to run (see model_source.h).
#include "cli/model_source.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "base/bf16.h"
#include "base/json_fields.h"
#include "cli/export.h"
#include "io/peft_adapter.h"
#include "io/safetensors.h"

namespace glm {

namespace fs = std::filesystem;

namespace {

// An option of the run that saved a checkpoint (args.json), or "" when it is not recorded.
std::string recorded_option(const CheckpointInfo& info, const char* name) {
  if (!info.args.is_object() || !info.args.contains("options")) return "";
  const nlohmann::json& options = info.args["options"];
  if (!options.contains(name)) return "";
  const nlohmann::json& v = options[name].contains("value") ? options[name]["value"] : options[name];
  return v.is_string() ? v.get<std::string>() : "";
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

bool is_dir(const std::string& path) {
  std::error_code ec;
  return !path.empty() && fs::is_directory(path, ec);
}

// Our LoRA checkpoint (meta.json says train_type lora), or a run's output directory holding them.
Result<CheckpointInfo> read_lora_checkpoint(const std::string& dir, const char* option) {
  GLM_ASSIGN_OR_RETURN(const std::string resolved, resolve_export_checkpoint(dir));
  GLM_ASSIGN_OR_RETURN(CheckpointInfo info, read_checkpoint_info(resolved));
  if (!info.lora)
    return GLM_USER_ERROR(option, " '", dir, "' is a full-training checkpoint, not LoRA adapters (give it as ",
                          "--ckpt_dir)");
  return info;
}

}  // namespace

Result<ModelSource> ModelSource::open(const ModelSpec& spec) {
  ModelSource m;
  if (spec.model_dir.empty() && spec.ckpt_dir.empty() && spec.adapters.empty())
    return GLM_USER_ERROR("no model: give --model_id_or_path DIR (a Hugging Face model), --ckpt_dir DIR (a "
                          "glm_hpc checkpoint or output directory) or --adapters DIR");
  if (!spec.ckpt_dir.empty() && !spec.adapters.empty())
    return GLM_USER_ERROR("--ckpt_dir and --adapters both name the weights to run: give one (--adapters goes with "
                          "the base's --model_id_or_path)");
  std::optional<CheckpointInfo> info;
  if (!spec.ckpt_dir.empty()) {
    GLM_ASSIGN_OR_RETURN(const std::string dir, resolve_export_checkpoint(spec.ckpt_dir));
    GLM_ASSIGN_OR_RETURN(info, read_checkpoint_info(dir));
    m.recorded_tokenizer_ = info->tokenizer;
    if (!info->lora) {
      if (!spec.model_dir.empty())
        return GLM_USER_ERROR("--model_id_or_path '", spec.model_dir, "' and --ckpt_dir '", spec.ckpt_dir,
                              "' (a full checkpoint) both name the weights to run: give one");
      m.config_ = info->config;
      m.description_ = concat("checkpoint ", info->dir, " (step ", info->step, ")");
      const std::string run_model = recorded_option(*info, "model_id_or_path");
      if (is_dir(run_model)) m.files_dir_ = run_model;
      m.checkpoint_ = std::move(info);
      return m;
    }
  } else if (!spec.adapters.empty() && !is_peft_adapter_dir(spec.adapters)) {
    GLM_ASSIGN_OR_RETURN(info, read_lora_checkpoint(spec.adapters, "--adapters"));
    m.recorded_tokenizer_ = info->tokenizer;
  }
  if (info) {  // our LoRA checkpoint: its base (moved: --model_id_or_path), then its adapters
    GLM_ASSIGN_OR_RETURN(LoraBaseSource base, lora_base_source(*info, spec.model_dir));
    m.config_ = info->config;
    m.lora_ = info->lora->config;
    m.lora_->dropout = 0;
    m.files_dir_ = base.model_dir;
    if (!base.model_dir.empty()) {
      GLM_ASSIGN_OR_RETURN(HfModel hf, read_hf_config(base.model_dir));
      m.hf_ = std::move(hf);
    }
    m.description_ = concat(base.describe(), " + LoRA adapters of ", info->dir, " (step ", info->step,
                            ", rank ", m.lora_->rank, "), unmerged");
    m.lora_base_ = std::move(base);
    m.lora_checkpoint_ = std::move(info);
    return m;
  }
  if (spec.model_dir.empty())
    return GLM_USER_ERROR("--adapters '", spec.adapters, "' holds PEFT adapters: give their base model as "
                          "--model_id_or_path DIR");
  GLM_ASSIGN_OR_RETURN(HfModel hf, read_hf_config(spec.model_dir));
  m.config_ = hf.config;
  m.files_dir_ = hf.dir;
  m.description_ = concat("the Hugging Face model ", hf.dir);
  m.hf_ = std::move(hf);
  if (!spec.adapters.empty()) {
    GLM_ASSIGN_OR_RETURN(PeftAdapter adapter, read_peft_adapter(spec.adapters, m.config_));
    m.lora_ = adapter.lora;
    m.peft_values_ = std::move(adapter.values);
    m.description_ += concat(" + PEFT LoRA adapters of ", spec.adapters, " (rank ", adapter.rank, "), unmerged");
    if (adapter.lora.rank != adapter.rank)
      m.description_ += concat(" (q_proj, k_proj and v_proj have their own lora_A: applied as rank ",
                               adapter.lora.rank, " on the fused query_key_value, exactly)");
  }
  return m;
}

Status ModelSource::verify() const {
  if (!hf_ || lora_checkpoint_) return Status::ok();  // a LoRA checkpoint's base is checked by its fingerprint
  return verify_hf_weights(*hf_, ParamLayout(config_, 1));
}

Status ModelSource::load(TrainingEngine& engine, bool round_to_bf16) const {
  const ParamLayout unpadded(config_, 1);
  std::vector<float> values;
  // One unit of the unpadded layout (as the checkpoint readers deliver it) into the engine.
  const auto set_unit = [&](int unit, std::span<const float> v, bool round) -> Status {
    const ParamUnit& u = unpadded.units()[static_cast<size_t>(unit)];
    for (int entry : u.entries) {
      const ParamEntry& e = unpadded.entry(entry);
      values.assign(v.begin() + (e.offset - u.offset), v.begin() + (e.offset - u.offset) + e.numel);
      if (round) {
        for (float& x : values) {
          const uint32_t bits = static_cast<uint32_t>(float_to_bf16_bits(x)) << 16;
          std::memcpy(&x, &bits, 4);
        }
      }
      GLM_RETURN_IF_ERROR(engine.set_parameter(entry, values));
    }
    return Status::ok();
  };
  if (checkpoint_) {
    GLM_RETURN_IF_ERROR(read_checkpoint_masters(
        *checkpoint_, [&](int unit, std::span<const float> v) { return set_unit(unit, v, round_to_bf16); }));
  } else if (lora_checkpoint_) {
    LoraBaseSource base = *lora_base_;
    GLM_RETURN_IF_ERROR(verify_lora_base(*lora_checkpoint_, base));
    GLM_RETURN_IF_ERROR(read_lora_base(*lora_checkpoint_, base,
                                       [&](int unit, std::span<float> v) { return set_unit(unit, v, false); }));
    GLM_ASSIGN_OR_RETURN(const std::vector<float> adapters, read_checkpoint_adapters(*lora_checkpoint_));
    GLM_RETURN_IF_ERROR(engine.set_lora_adapters(adapters));
  } else {
    GLM_RETURN_IF_ERROR(load_hf_weights(
        *hf_, engine.layout(), [&](int entry, std::span<const float> v) { return engine.set_parameter(entry, v); }));
    if (!peft_values_.empty()) GLM_RETURN_IF_ERROR(engine.set_lora_adapters(peft_values_));
  }
  return engine.parameters_updated();
}

Result<std::unique_ptr<Tokenizer>> ModelSource::tokenizer(const std::string& option) const {
  std::string path = option;
  if (path == "auto") {
    std::error_code ec;
    const fs::path dir(files_dir_);
    const bool hf_files = !files_dir_.empty() && (fs::exists(dir / "tokenizer.json", ec) ||
                                                  fs::exists(dir / "tokenizer_config.json", ec));
    if (!files_dir_.empty() && (fs::exists(dir / "tokenizer.model", ec) || fs::exists(dir / "tokenizer.json", ec))) {
      path = files_dir_;  // tokenizer.model, else Hugging Face's tokenizer.json: the same ids
    } else if (!recorded_tokenizer_.empty()) {
      path = recorded_tokenizer_;
      if (path != "bytes" && !fs::exists(path, ec) && fs::exists(fs::path(GLM_SOURCE_DIR) / path, ec))
        path = (fs::path(GLM_SOURCE_DIR) / path).string();
    } else if (!hf_files && !files_dir_.empty() && config_.vocab_size >= ByteTokenizer().vocab_size()) {
      path = "bytes";
    } else {
      return std::unique_ptr<Tokenizer>();
    }
  }
  if (path == "bytes") return std::unique_ptr<Tokenizer>(std::make_unique<ByteTokenizer>());
  auto loaded = load_tokenizer(path);
  if (!loaded.is_ok()) return loaded.status().with_context(concat("tokenizer ", path));
  if (loaded.value()->vocab_size() > config_.vocab_size)
    return GLM_USER_ERROR("the tokenizer ", path, " has ", loaded.value()->vocab_size(), " ids but the model's ",
                          "vocab_size is ", config_.vocab_size, ": it is not this model's tokenizer (give --tokenizer)");
  return loaded.take();
}

Result<GenerationDefaults> ModelSource::generation_defaults() const {
  GenerationDefaults d;
  std::error_code ec;
  const fs::path path = fs::path(files_dir_) / "generation_config.json";
  if (files_dir_.empty() || !fs::exists(path, ec)) return d;
  GLM_ASSIGN_OR_RETURN(const nlohmann::json j, read_json_object(path.string()));
  d.source = path.string();
  auto bad = [&](const char* field) {
    return GLM_USER_ERROR(path.string(), ": \"", field, "\" is ", j[field].dump(), ", not what transformers reads");
  };
  if (j.contains("eos_token_id")) {
    const nlohmann::json& e = j["eos_token_id"].is_null() ? nlohmann::json::array() : j["eos_token_id"];
    d.eos_token_ids.emplace();
    for (const nlohmann::json& id : e.is_array() ? e : nlohmann::json::array({e})) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= config_.vocab_size)
        return bad("eos_token_id");
      d.eos_token_ids->push_back(id.get<int32_t>());
    }
  }
  const std::pair<const char*, std::optional<double>*> numbers[] = {{"temperature", &d.temperature},
                                                                    {"top_p", &d.top_p},
                                                                    {"repetition_penalty", &d.repetition_penalty},
                                                                    {"length_penalty", &d.length_penalty}};
  for (const auto& [field, target] : numbers) {
    if (!j.contains(field) || j[field].is_null()) continue;
    if (!j[field].is_number()) return bad(field);
    *target = j[field].get<double>();
  }
  const std::pair<const char*, std::optional<int64_t>*> integers[] = {
      {"top_k", &d.top_k}, {"max_new_tokens", &d.max_new_tokens}, {"num_beams", &d.num_beams}};
  for (const auto& [field, target] : integers) {
    if (!j.contains(field) || j[field].is_null()) continue;
    if (!j[field].is_number_integer()) return bad(field);
    *target = j[field].get<int64_t>();
  }
  if (j.contains("early_stopping") && !j["early_stopping"].is_null()) {
    const nlohmann::json& e = j["early_stopping"];
    if (e.is_boolean()) {
      d.early_stopping = e.get<bool>() ? EarlyStopping::when_full : EarlyStopping::heuristic;
    } else if (e == "never") {
      d.early_stopping = EarlyStopping::never;
    } else {
      return bad("early_stopping");
    }
  }
  if (j.contains("do_sample") && !j["do_sample"].is_null()) {
    if (!j["do_sample"].is_boolean()) return bad("do_sample");
    d.do_sample = j["do_sample"].get<bool>();
  }
  return d;
}

Result<LoraConfig> read_peft_config(const std::string& dir) {
  const fs::path path = fs::path(dir) / kPeftConfigFile;
  GLM_ASSIGN_OR_RETURN(const nlohmann::json j, read_json_object(path.string()));
  const std::string where = path.string();
  auto refuse = [&](const char* field, const char* why) {
    return GLM_USER_ERROR(where, ": \"", field, "\" is ", j[field].dump(), ": ", why);
  };
  if (j.value("peft_type", "") != "LORA") return GLM_USER_ERROR(where, ": peft_type is not LORA");
  for (const char* field : {"rank_pattern", "alpha_pattern"})
    if (j.contains(field) && !j[field].is_null() && !j[field].empty())
      return refuse(field, "per-module ranks or alphas are not supported");
  for (const char* field : {"use_dora", "fan_in_fan_out"})
    if (j.contains(field) && j[field].is_boolean() && j[field].get<bool>()) return refuse(field, "not supported");
  for (const char* field : {"modules_to_save", "layers_to_transform", "layer_replication"})
    if (j.contains(field) && !j[field].is_null()) return refuse(field, "not supported (whole layers of LoRA only)");
  if (j.contains("bias") && j["bias"] != "none") return refuse("bias", "adapter biases are not supported");
  if (!j.contains("r") || !j["r"].is_number_integer() || j["r"].get<int64_t>() < 1)
    return GLM_USER_ERROR(where, ": \"r\" must be a positive integer");
  LoraConfig lora;
  lora.rank = j["r"].get<int64_t>();
  lora.alpha = j.contains("lora_alpha") && j["lora_alpha"].is_number() ? j["lora_alpha"].get<double>() : 8.0;
  // rsLoRA scales by alpha / sqrt(r): the same scale as alpha * sqrt(r) / r.
  if (j.value("use_rslora", false)) lora.alpha *= std::sqrt(static_cast<double>(lora.rank));
  lora.dropout = 0;
  // Targets by module name, either layout; "all-linear" is every one.
  const nlohmann::json& t = j.contains("target_modules") ? j["target_modules"] : nlohmann::json();
  std::vector<std::string> modules;
  if (t.is_string()) {
    if (t.get<std::string>() != "all-linear") return refuse("target_modules", "a regular expression is not supported");
  } else if (t.is_array()) {
    for (const auto& name : t) modules.push_back(name.is_string() ? name.get<std::string>() : "");
  } else {
    return GLM_USER_ERROR(where, ": \"target_modules\" is missing");
  }
  if (!modules.empty()) {
    const std::map<std::string, LoraTarget> names = {
        {"q_proj", LoraTarget::query_key_value},    {"k_proj", LoraTarget::query_key_value},
        {"v_proj", LoraTarget::query_key_value},    {"query_key_value", LoraTarget::query_key_value},
        {"o_proj", LoraTarget::dense},              {"dense", LoraTarget::dense},
        {"gate_up_proj", LoraTarget::dense_h_to_4h}, {"dense_h_to_4h", LoraTarget::dense_h_to_4h},
        {"down_proj", LoraTarget::dense_4h_to_h},   {"dense_4h_to_h", LoraTarget::dense_4h_to_h}};
    std::set<LoraTarget> targets;
    std::set<std::string> qkv;
    for (const std::string& name : modules) {
      const auto it = names.find(name);
      if (it == names.end())
        return GLM_USER_ERROR(where, ": target module '", name, "' is not a linear of GLM-4's layers");
      targets.insert(it->second);
      if (name == "q_proj" || name == "k_proj" || name == "v_proj") qkv.insert(name);
    }
    if (!qkv.empty() && qkv.size() != 3)
      return GLM_USER_ERROR(where, ": target_modules adapt some of q_proj, k_proj, v_proj but not all three; ",
                            "glm_hpc adapts the fused query_key_value linear as one");
    lora.targets.assign(targets.begin(), targets.end());
  }
  GLM_RETURN_IF_ERROR(lora.validate().with_context(where));
  return lora;
}

Result<PeftAdapter> read_peft_adapter(const std::string& dir, const ModelConfig& config) {
  PeftAdapter out;
  GLM_ASSIGN_OR_RETURN(out.lora, read_peft_config(dir));
  out.rank = out.lora.rank;
  const fs::path weights = fs::path(dir) / kPeftWeightsFile;
  std::error_code ec;
  if (!fs::exists(weights, ec))
    return GLM_USER_ERROR("--adapters '", dir, "' has no ", kPeftWeightsFile,
                          " (adapters saved as pickled adapter_model.bin are not read: save with safe_serialization)");
  GLM_ASSIGN_OR_RETURN(const SafetensorsFile file, SafetensorsFile::open(weights.string()));
  // PEFT keeps the adapter's name out of saved keys; some tools leave ".default" in: accept both.
  auto find = [&](const std::string& name) -> const StTensorInfo* {
    if (const StTensorInfo* t = file.find(name)) return t;
    const size_t dot = name.rfind(".weight");
    return file.find(name.substr(0, dot) + ".default.weight");
  };
  bool chatglm = false;
  for (const StTensorInfo& t : file.tensors()) chatglm = chatglm || t.name.find("transformer.encoder.") != std::string::npos;
  out.layout = chatglm ? HfLayout::chatglm : HfLayout::glm;
  const LoraLayout layout(config, out.lora);
  const std::vector<PeftTensor> tensors = peft_tensors(layout, config, out.layout);
  // Every tensor's values, checked against its expected shape.
  std::vector<std::vector<float>> values(tensors.size());
  std::set<std::string> used;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const PeftTensor& t = tensors[i];
    const StTensorInfo* info = find(t.name);
    if (info == nullptr) return GLM_USER_ERROR(weights.string(), " misses ", t.name);
    if (info->shape != t.shape)
      return GLM_USER_ERROR(weights.string(), ": ", t.name, " has shape ", shape_text(info->shape), ", expected ",
                            shape_text(t.shape), " for this base model and r ", out.lora.rank);
    used.insert(info->name);
    values[i].resize(static_cast<size_t>(t.shape[0] * t.shape[1]));
    GLM_RETURN_IF_ERROR(read_as_f32(file, *info, values[i]));
    for (const float v : values[i])
      if (!std::isfinite(v)) return GLM_USER_ERROR(weights.string(), ": ", t.name, " holds a NaN or an infinity");
  }
  for (const StTensorInfo& t : file.tensors())
    if (!used.count(t.name))
      return GLM_USER_ERROR(weights.string(), " holds ", t.name, ", which adapts no linear that adapter_config.json's ",
                            "target_modules name in GLM-4's layers");
  // transformers' layout adapts q_proj, k_proj and v_proj separately: where their A's differ, the
  // fused query_key_value takes all three as one adapter of rank 3r (A stacked, each B in its row
  // block and rank block), and every other adapter is padded to 3r with zeros; alpha 3 x alpha keeps
  // the scale alpha / r. The same function, exactly.
  bool shared_a = true;
  std::vector<int> a_of(layout.entries().size(), -1);  // the first A tensor of each entry
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].is_b) continue;
    int& first = a_of[static_cast<size_t>(tensors[i].entry)];
    if (first < 0)
      first = static_cast<int>(i);
    else
      shared_a = shared_a && values[i] == values[static_cast<size_t>(first)];
  }
  const int64_t r = out.rank, parts = shared_a ? 1 : 3;
  if (!shared_a) {
    out.lora.rank = 3 * r;
    out.lora.alpha *= 3;
  }
  const LoraLayout target(config, out.lora);
  out.values.assign(static_cast<size_t>(target.total_numel()), 0.0f);
  std::vector<int> part_of(layout.entries().size(), 0);  // the next A (or B) block of each entry
  std::vector<int> b_part(layout.entries().size(), 0);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const PeftTensor& t = tensors[i];
    const LoraEntry& e = target.entries()[static_cast<size_t>(t.entry)];
    const bool fused_qkv = e.target == LoraTarget::query_key_value && out.layout == HfLayout::glm;
    const int64_t block = parts == 3 && fused_qkv ? (t.is_b ? b_part : part_of)[static_cast<size_t>(t.entry)]++ : 0;
    if (!t.is_b) {
      if (parts == 1 && block > 0) continue;  // the shared A, once
      std::copy(values[i].begin(), values[i].end(), out.values.begin() + e.a_offset + block * r * e.in_features);
      continue;
    }
    float* bt = out.values.data() + e.b_offset;  // Bt [rank, out]: PEFT's B [rows, r] into its rank block's rows
    for (int64_t o = 0; o < t.shape[0]; ++o)
      for (int64_t k = 0; k < r; ++k)
        bt[(block * r + k) * e.out_features + t.first_row + o] = values[i][static_cast<size_t>(o * r + k)];
  }
  return out;
}

}  // namespace glm
