// glm_hpc export: resolve the checkpoint, stream its masters unit by unit into bf16 safetensors of
// the chosen layout in a temporary directory, add the configs and tokenizer files, rename into place.
// A LoRA checkpoint: its adapters in PEFT's format, or with --merge_lora its verified base with the
// adapters merged in, through the same writer as a full checkpoint.
#include "cli/export.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>

#include "base/json_text.h"
#include "base/temp_names.h"
#include "data/tokenizer.h"
#include "io/durable_file.h"
#include "io/hf_export.h"
#include "io/peft_adapter.h"
#include "train/checkpoint.h"
#include "train/lora_base.h"

namespace glm {

namespace fs = std::filesystem;

Result<std::string> resolve_export_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return GLM_USER_ERROR("--ckpt_dir '", dir, "' is not a directory");
  if (fs::exists(fs::path(dir) / "meta.json") || fs::exists(fs::path(dir) / "COMPLETE"))
    return resolve_checkpoint(dir, "", "--ckpt_dir");
  bool holds_checkpoints = fs::exists(fs::path(dir) / "latest");
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.is_directory() && entry.path().filename().string().rfind("checkpoint-", 0) == 0) holds_checkpoints = true;
  if (!holds_checkpoints)
    return GLM_USER_ERROR(
        "--ckpt_dir '", dir,
        "' holds neither a checkpoint (meta.json) nor the checkpoints of a run (latest, checkpoint-N)");
  return resolve_checkpoint("latest", dir, "--ckpt_dir");
}

namespace {

// Where the tokenizer files come from and which ids the configs carry.
struct TokenizerSource {
  std::vector<std::pair<fs::path, std::string>> files;  // source -> name inside the export
  std::string origin;                                   // for the report; empty: none
  std::unique_ptr<Tokenizer> tokenizer;                 // when a rank file (or bytes) says the ids
  std::vector<std::string> notes;
};

std::vector<std::pair<fs::path, std::string>> tokenizer_files_in(const fs::path& dir, HfLayout format) {
  std::vector<std::pair<fs::path, std::string>> found;
  std::error_code ec;
  for (const char* name : kTokenizerFiles)
    if (fs::is_regular_file(dir / name, ec)) found.emplace_back(dir / name, name);
  if (format == HfLayout::chatglm)
    for (const char* name : kChatglmCodeFiles)
      if (fs::is_regular_file(dir / name, ec)) found.emplace_back(dir / name, name);
  return found;
}

bool has_tokenizer_files(const fs::path& dir) {
  std::error_code ec;
  for (const char* name : kTokenizerFiles)
    if (fs::is_regular_file(dir / name, ec)) return true;
  return false;
}

// A directory's files, or a rank file copied as tokenizer.model; the rank file also gives the ids.
Status take_tokenizer(const fs::path& path, HfLayout format, const std::string& origin, TokenizerSource& out) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    out.files = {{path, "tokenizer.model"}};
  } else {
    out.files = tokenizer_files_in(path, format);
  }
  out.origin = origin;
  fs::path rank_file;
  for (const auto& [source, name] : out.files)
    if (name == "tokenizer.model") rank_file = source;
  if (!rank_file.empty()) {
    auto loaded = load_tokenizer(rank_file.string());
    if (!loaded.is_ok()) return loaded.status().with_context(concat("tokenizer of the export (", origin, ")"));
    out.tokenizer = loaded.take();
  }
  return Status::ok();
}

Result<TokenizerSource> choose_tokenizer_source(const CliOptions& o, const CheckpointInfo& info, HfLayout format) {
  TokenizerSource src;
  std::error_code ec;
  if (!o.tokenizer_dir.empty()) {
    const fs::path p(o.tokenizer_dir);
    if (!fs::exists(p, ec)) return GLM_USER_ERROR("--tokenizer_dir '", o.tokenizer_dir, "' does not exist");
    if (fs::is_directory(p, ec) && !has_tokenizer_files(p))
      return GLM_USER_ERROR("--tokenizer_dir '", o.tokenizer_dir,
                            "' holds none of tokenizer.model, tokenizer.json, tokenizer_config.json, "
                            "special_tokens_map.json, added_tokens.json, tokenization_chatglm.py");
    GLM_RETURN_IF_ERROR(take_tokenizer(p, format, "--tokenizer_dir " + o.tokenizer_dir, src));
    return src;
  }
  // The training run's model directory, when it has tokenizer files.
  const nlohmann::json* options =
      info.args.is_object() && info.args.contains("options") ? &info.args["options"] : nullptr;
  auto option = [&](const char* name) -> std::string {
    if (options == nullptr || !options->contains(name)) return "";
    const nlohmann::json& v = (*options)[name].contains("value") ? (*options)[name]["value"] : (*options)[name];
    return v.is_string() ? v.get<std::string>() : "";
  };
  // A LoRA checkpoint's base given on the command line (it moved) stands for the run's.
  const std::string model_dir = o.model_id_or_path.empty() ? option("model_id_or_path") : o.model_id_or_path;
  if (!model_dir.empty() && fs::is_directory(model_dir, ec) && has_tokenizer_files(model_dir)) {
    GLM_RETURN_IF_ERROR(take_tokenizer(model_dir, format, "the run's --model_id_or_path " + model_dir, src));
    return src;
  }
  // Else what tokenized the training data: meta.json's record, else args.json's.
  std::string used = info.tokenizer.empty() ? option("tokenizer") : info.tokenizer;
  if (used == "bytes") {
    src.tokenizer = std::make_unique<ByteTokenizer>();
    src.origin = "the run's byte-level tokenizer (no files)";
    return src;
  }
  if (used.empty() || used == "auto") {
    src.notes.push_back("no tokenizer recorded with the checkpoint: no tokenizer files copied (give --tokenizer_dir)");
    return src;
  }
  for (const fs::path& p : {fs::path(used), fs::path(GLM_SOURCE_DIR) / used}) {
    if (fs::exists(p, ec)) {
      GLM_RETURN_IF_ERROR(take_tokenizer(p, format, "the run's tokenizer " + p.string(), src));
      return src;
    }
  }
  src.notes.push_back("the run's tokenizer '" + used + "' no longer exists: no tokenizer files copied");
  return src;
}

// pad_token_id and eos_token_id: GLM-4's end tokens (data/tokenizer.h glm4_end_ids).
Result<HfTokenIds> token_ids(const TokenizerSource& src, const ModelConfig& c, std::vector<std::string>& notes) {
  HfTokenIds ids;
  if (src.tokenizer != nullptr && src.tokenizer->vocab_size() > c.vocab_size)
    return GLM_USER_ERROR("the tokenizer (", src.origin, ") has ", src.tokenizer->vocab_size(),
                          " ids but the checkpoint's model has vocab_size ", c.vocab_size,
                          ": it is not this model's tokenizer (give --tokenizer_dir)");
  const std::vector<int32_t> ends = glm4_end_ids(src.tokenizer.get(), c.vocab_size);
  if (ends.empty()) {
    notes.push_back(concat("no tokenizer.model to take token ids from and vocab_size ", c.vocab_size,
                           " is smaller than GLM-4's: pad_token_id and eos_token_id are left null"));
    return ids;
  }
  ids.pad = ends.front();
  ids.eos.assign(ends.begin(), ends.end());
  return ids;
}

Status write_json(const fs::path& path, const nlohmann::ordered_json& j) {
  return write_file_durably(path, json_text(j, 2) + "\n");
}

// Removes the temporary directory unless the export was published.
class TemporaryDirectory {
 public:
  explicit TemporaryDirectory(fs::path p) : path_(std::move(p)) {}
  ~TemporaryDirectory() {
    std::error_code ec;
    if (!published_) fs::remove_all(path_, ec);
  }
  TemporaryDirectory(const TemporaryDirectory&) = delete;
  TemporaryDirectory& operator=(const TemporaryDirectory&) = delete;
  const fs::path& path() const { return path_; }
  void published() { published_ = true; }

 private:
  fs::path path_;
  bool published_ = false;
};

bool is_inside(const fs::path& inner, const fs::path& outer) {
  std::error_code ec;
  const fs::path a = fs::weakly_canonical(inner, ec), b = fs::weakly_canonical(outer, ec);
  auto ai = a.begin(), bi = b.begin();
  for (; bi != b.end() && !bi->empty(); ++ai, ++bi)
    if (ai == a.end() || *ai != *bi) return false;
  return true;
}

// tmp becomes save (an existing save, when allowed, is moved aside first and removed after).
Status publish(const fs::path& tmp, const fs::path& save, bool replace) {
  std::error_code ec;
  if (fs::exists(save)) {
    if (!replace) {
      fs::remove(save, ec);  // an empty directory
      if (ec) return GLM_ERROR(ErrorKind::io, "cannot remove the empty '", save.string(), "': ", ec.message());
    } else {
      const fs::path old = aside_path_for(save);
      fs::rename(save, old, ec);
      if (ec) return GLM_ERROR(ErrorKind::io, "cannot move the old '", save.string(), "' aside: ", ec.message());
      fs::rename(tmp, save, ec);
      if (ec) {
        std::error_code back;
        fs::rename(old, save, back);
        return GLM_ERROR(ErrorKind::io, "cannot rename '", tmp.string(), "' to '", save.string(), "': ", ec.message());
      }
      fs::remove_all(old, ec);
      return Status::ok();
    }
  }
  fs::rename(tmp, save, ec);
  if (ec)
    return GLM_ERROR(ErrorKind::io, "cannot rename '", tmp.string(), "' to '", save.string(), "': ", ec.message());
  return Status::ok();
}

// The files written into the temporary directory, one line each, and their total size.
Result<std::string> list_files(const fs::path& dir, const std::vector<std::string>& names, uint64_t& total) {
  std::error_code ec;
  std::ostringstream files;
  total = 0;
  for (const auto& name : names) {
    const uint64_t bytes = fs::file_size(dir / name, ec);
    if (ec) return GLM_ERROR(ErrorKind::io, "cannot stat '", (dir / name).string(), "': ", ec.message());
    total += bytes;
    files << "  " << name << "  " << bytes << " bytes\n";
  }
  return files.str();
}

Status copy_files(const std::vector<std::pair<fs::path, std::string>>& files, const fs::path& dir,
                  std::vector<std::string>& written) {
  std::error_code ec;
  for (const auto& [source, name] : files) {
    fs::copy_file(source, dir / name, fs::copy_options::overwrite_existing, ec);
    if (ec) return GLM_FILE_ERROR(concat("cannot copy '", source.string(), "' to"), dir / name, ec.value());
    written.push_back(name);
  }
  return Status::ok();
}

std::string describe_lora(const LoraConfig& l) {
  return concat("rank ", l.rank, ", alpha ", l.alpha, " on ", lora_targets_text(l.targets));
}

// A LoRA checkpoint's adapters as PEFT saves them: adapter_config.json and adapter_model.safetensors
// (fp32, as PEFT keeps adapters, so the export is exact); tokenizer files only when --tokenizer_dir says.
Result<std::string> write_peft_adapter(const CliOptions& o, const CheckpointInfo& info, HfLayout format,
                                       const fs::path& tmp, std::vector<std::string>& written,
                                       std::vector<std::string>& notes) {
  const LoraCheckpointInfo& lora = *info.lora;
  const LoraLayout layout(info.config, lora.config);
  GLM_ASSIGN_OR_RETURN(const std::vector<float> adapters, read_checkpoint_adapters(info));
  const std::string base = o.model_id_or_path.empty() ? lora.base_model : o.model_id_or_path;
  GLM_RETURN_IF_ERROR(write_json(tmp / kPeftConfigFile, peft_adapter_config(lora.config, format, base)));
  GLM_RETURN_IF_ERROR(write_peft_safetensors((tmp / kPeftWeightsFile).string(), layout, info.config, format, adapters));
  written = {kPeftConfigFile, kPeftWeightsFile};
  if (!o.tokenizer_dir.empty()) {
    GLM_ASSIGN_OR_RETURN(TokenizerSource tokenizer, choose_tokenizer_source(o, info, format));
    GLM_RETURN_IF_ERROR(copy_files(tokenizer.files, tmp, written));
  }
  if (base.empty())
    notes.push_back(concat("the base is a random initialisation (seed ", lora.random_init_seed,
                           "): base_model_name_or_path is null; PeftModel.from_pretrained needs that base as a model "
                           "directory, or use --merge_lora true for base and adapters in one model"));
  const size_t tensors = peft_tensors(layout, info.config, format).size();
  std::ostringstream r;
  r << tensors << " F32 adapter tensors (LoRA " << describe_lora(lora.config) << ", " << layout.parameter_count()
    << " parameters" << (format == HfLayout::glm ? "; query_key_value as q_proj, k_proj, v_proj sharing lora_A" : "")
    << "); base_model_name_or_path " << (base.empty() ? "null" : base) << "\n";
  return r.str();
}

// Each unit of the base, the adapters of its layer merged in: W += (alpha / r) B A.
Status read_merged_units(const CheckpointInfo& info, const LoraBaseSource& base, const std::vector<float>& adapters,
                         const std::function<Status(int unit, std::span<const float> values)>& sink) {
  const LoraLayout lora(info.config, info.lora->config);
  const ParamLayout layout(info.config, 1);
  return read_lora_base(info, base, [&](int unit, std::span<float> values) -> Status {
    const ParamUnit& u = layout.units()[static_cast<size_t>(unit)];
    for (const LoraEntry& e : lora.entries()) {
      if (layout.layer_unit(e.layer) != unit) continue;
      const LayerEntries& le = layout.layer(e.layer);
      const int entry = e.target == LoraTarget::query_key_value ? le.qkv_weight
                        : e.target == LoraTarget::dense         ? le.dense
                        : e.target == LoraTarget::dense_h_to_4h ? le.h_to_4h
                                                                : le.four_h_to_h;
      const ParamEntry& p = layout.entry(entry);
      merge_lora_entry(lora, e, adapters,
                       values.subspan(static_cast<size_t>(p.offset - u.offset), static_cast<size_t>(p.numel)));
    }
    return sink(unit, values);
  });
}

}  // namespace

Result<std::string> run_export(const CliOptions& o) {
  const HfLayout format = o.export_format;
  GLM_ASSIGN_OR_RETURN(const uint64_t max_shard_bytes, parse_byte_size(o.max_shard_size));
  GLM_ASSIGN_OR_RETURN(const std::string ckpt, resolve_export_checkpoint(o.ckpt_dir));
  GLM_ASSIGN_OR_RETURN(const CheckpointInfo info, read_checkpoint_info(ckpt));
  const ModelConfig& config = info.config;
  if (!info.lora && o.merge_lora)
    return GLM_USER_ERROR("--merge_lora true: '", ckpt,
                          "' is a full-training checkpoint (train_type full): it holds the whole model and no LoRA "
                          "adapters to merge; export it without --merge_lora");
  if (!info.lora && !o.model_id_or_path.empty())
    return GLM_USER_ERROR("--model_id_or_path '", o.model_id_or_path,
                          "': only the export of a LoRA checkpoint takes a base model, and '", ckpt,
                          "' is a full-training checkpoint");

  fs::path save = fs::path(o.save_dir).lexically_normal();
  if (save.filename().empty()) save = save.parent_path();  // a trailing slash
  std::error_code ec;
  bool replace = false;
  if (fs::exists(save, ec)) {
    if (!fs::is_directory(save, ec))
      return GLM_USER_ERROR("--save_dir '", o.save_dir, "' exists and is not a directory");
    replace = !fs::is_empty(save, ec);
    if (replace && !o.overwrite)
      return GLM_USER_ERROR("--save_dir '", o.save_dir, "' is not empty; give --overwrite true to replace it");
    if (replace && is_inside(ckpt, save))
      return GLM_USER_ERROR("--save_dir '", o.save_dir, "' holds the checkpoint being exported; choose another");
  }
  // A merge reads the base first: one that is not the adapters' base is refused before anything is written.
  std::optional<LoraBaseSource> base;
  std::vector<float> adapters;
  if (info.lora && o.merge_lora) {
    GLM_ASSIGN_OR_RETURN(base, lora_base_source(info, o.model_id_or_path));
    GLM_RETURN_IF_ERROR(verify_lora_base(info, *base));
    GLM_ASSIGN_OR_RETURN(adapters, read_checkpoint_adapters(info));
  }
  TokenizerSource tokenizer;
  std::vector<std::string> notes;
  HfTokenIds ids;
  nlohmann::ordered_json config_json;
  if (!info.lora || o.merge_lora) {
    GLM_ASSIGN_OR_RETURN(tokenizer, choose_tokenizer_source(o, info, format));
    notes = tokenizer.notes;
    GLM_ASSIGN_OR_RETURN(ids, token_ids(tokenizer, config, notes));
    GLM_ASSIGN_OR_RETURN(config_json, hf_export_config(config, format, ids));
  }

  const fs::path parent = save.has_parent_path() ? save.parent_path() : fs::path(".");
  fs::create_directories(parent, ec);
  if (ec) return GLM_USER_ERROR("cannot create '", parent.string(), "' for --save_dir: ", ec.message());
  TemporaryDirectory tmp(temp_path_for(save));
  fs::create_directory(tmp.path(), ec);
  if (ec) return GLM_FILE_ERROR("cannot create", tmp.path(), ec.value());

  const std::string origin = concat(ckpt, " (step ", info.step, ", saved by ", info.world_size,
                                    info.world_size == 1 ? " rank" : " ranks", " at ZeRO stage ", info.zero_stage, ")");
  std::vector<std::string> written;
  if (info.lora && !o.merge_lora) {
    GLM_ASSIGN_OR_RETURN(const std::string summary, write_peft_adapter(o, info, format, tmp.path(), written, notes));
    uint64_t total = 0;
    GLM_ASSIGN_OR_RETURN(const std::string files, list_files(tmp.path(), written, total));
    GLM_RETURN_IF_ERROR(publish(tmp.path(), save, replace));
    tmp.published();
    std::ostringstream r;
    r << "glm_hpc: exported the LoRA adapters of " << origin << " to " << save.string() << " in PEFT's format"
      << (format == HfLayout::glm ? " for transformers' GlmForCausalLM (PeftModel.from_pretrained)\n"
                                  : " for THUDM's ChatGLM layout (ms-swift's names)\n")
      << files << "  " << summary << "  " << written.size() << " files, " << total << " bytes in all\n";
    for (const auto& note : notes) r << "  note: " << note << "\n";
    return r.str();
  }

  GLM_ASSIGN_OR_RETURN(HfWeightWriter weights,
                       HfWeightWriter::create(tmp.path().string(), config, format, max_shard_bytes));
  const auto add_unit = [&](int unit, std::span<const float> values) { return weights.add_unit(unit, values); };
  GLM_RETURN_IF_ERROR(base ? read_merged_units(info, *base, adapters, add_unit)
                           : read_checkpoint_masters(info, add_unit));
  GLM_RETURN_IF_ERROR(weights.finish());
  GLM_RETURN_IF_ERROR(write_json(tmp.path() / "config.json", config_json));
  GLM_RETURN_IF_ERROR(write_json(tmp.path() / "generation_config.json", hf_generation_config(ids)));
  written = weights.files();
  written.push_back("config.json");
  written.push_back("generation_config.json");
  GLM_RETURN_IF_ERROR(copy_files(tokenizer.files, tmp.path(), written));
  if (format == HfLayout::chatglm && !fs::exists(tmp.path() / "modeling_chatglm.py"))
    notes.push_back(
        "transformers loads the chatglm layout only with trust_remote_code and THUDM's configuration_chatglm.py and "
        "modeling_chatglm.py beside it (--tokenizer_dir of a glm-4-9b-chat download copies them)");
  uint64_t total = 0;
  GLM_ASSIGN_OR_RETURN(const std::string files, list_files(tmp.path(), written, total));
  GLM_RETURN_IF_ERROR(publish(tmp.path(), save, replace));
  tmp.published();

  std::ostringstream r;
  r << "glm_hpc: exported " << origin << " to " << save.string()
    << (format == HfLayout::glm ? " in the hf layout (GlmForCausalLM)\n"
                                : " in the chatglm layout (THUDM ChatGLMModel)\n");
  if (base)
    r << "  merged: " << base->describe()
      << (base->bf16 ? " (its weights rounded to bf16, as the CUDA run held them)" : "") << " + the LoRA adapters ("
      << describe_lora(info.lora->config) << "), W += (alpha / r) B A in fp32\n";
  r << files << "  " << ParamLayout(config, 1).parameter_count() << " parameters in " << weights.tensor_count()
    << " bf16 tensors (" << weights.total_bytes() << " bytes); " << written.size() << " files, " << total
    << " bytes in all\n"
    << "  tokenizer: " << (tokenizer.origin.empty() ? "none" : tokenizer.origin) << "; eos_token_id "
    << hf_generation_config(ids).value("eos_token_id", nlohmann::ordered_json()).dump() << ", pad_token_id "
    << (ids.pad ? std::to_string(*ids.pad) : "null") << "\n";
  for (const auto& note : notes) r << "  note: " << note << "\n";
  return r.str();
}

}  // namespace glm
