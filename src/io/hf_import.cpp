// config.json parsing for both GLM-4 layouts and the weight-name mapping onto the flat layout.
#include "io/hf_import.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "base/input_path.h"
#include "base/json_fields.h"
#include "base/progress.h"
#include "io/safetensors.h"

namespace glm {
namespace {

// config.json's fields, typed and range-checked (base/json_fields.h), "<path>: field 'x' ..." in messages.
class ConfigReader {
 public:
  explicit ConfigReader(JsonFields fields) : f_(std::move(fields)) {}
  Status error(const std::string& field, const std::string& what) const { return f_.error(field, what); }
  bool has(const std::string& key) const { return f_.has(key); }
  Result<int64_t> integer(const std::string& key) const { return f_.integer(key, 0); }
  Result<int64_t> integer_or(const std::string& key, int64_t fallback) const { return f_.integer_or(key, fallback, 0); }
  Result<double> number_or(const std::string& key, double fallback) const { return f_.number_or(key, fallback); }
  Result<bool> boolean_or(const std::string& key, bool fallback) const { return f_.boolean_or(key, fallback); }
  Result<ConfigReader> object(const std::string& key) const {
    GLM_ASSIGN_OR_RETURN(JsonFields nested, f_.object(key));
    return ConfigReader(std::move(nested));
  }
  Status require(const std::string& key, bool expected, bool fallback) const {
    GLM_ASSIGN_OR_RETURN(bool v, boolean_or(key, fallback));
    if (v != expected)
      return error(key, concat("= ", v ? "true" : "false", " is not supported by the GLM-4 architecture"));
    return Status::ok();
  }

 private:
  JsonFields f_;
};

constexpr int64_t kGlmConfigPadTokenId = 151329;

Status read_glm(const ConfigReader& r, const nlohmann::json& j, HfModel& m) {
  ModelConfig& c = m.config;
  GLM_ASSIGN_OR_RETURN(c.vocab_size, r.integer("vocab_size"));
  GLM_ASSIGN_OR_RETURN(c.hidden_size, r.integer("hidden_size"));
  GLM_ASSIGN_OR_RETURN(c.intermediate_size, r.integer("intermediate_size"));
  GLM_ASSIGN_OR_RETURN(c.num_hidden_layers, r.integer("num_hidden_layers"));
  GLM_ASSIGN_OR_RETURN(c.num_attention_heads, r.integer("num_attention_heads"));
  GLM_ASSIGN_OR_RETURN(c.num_key_value_heads, r.integer_or("num_key_value_heads", c.num_attention_heads));
  GLM_ASSIGN_OR_RETURN(c.head_dim, r.integer_or("head_dim", 0));
  GLM_ASSIGN_OR_RETURN(c.max_position_embeddings, r.integer_or("max_position_embeddings", 131072));
  GLM_ASSIGN_OR_RETURN(c.rms_norm_eps, r.number_or("rms_norm_eps", 1.5625e-07));
  GLM_ASSIGN_OR_RETURN(c.initializer_range, r.number_or("initializer_range", 0.02));
  // GlmModel's embedding padding_idx: pad_token_id, whose default in GlmConfig is 151329; null is none.
  if (!j.contains("pad_token_id")) {
    c.pad_token_id = kGlmConfigPadTokenId < c.vocab_size ? kGlmConfigPadTokenId : -1;
  } else if (!j["pad_token_id"].is_null()) {
    GLM_ASSIGN_OR_RETURN(c.pad_token_id, r.integer("pad_token_id"));
  }
  if (r.has("hidden_act") && j["hidden_act"] != "silu")
    return r.error("hidden_act", "must be \"silu\" (GLM-4's SwiGLU)");
  // transformers 5 keeps RoPE settings in rope_parameters; older configs have them at the top.
  // Without either, transformers uses rope_theta 10000 and partial_rotary_factor 0.5 for GLM.
  GLM_ASSIGN_OR_RETURN(c.rope_theta, r.number_or("rope_theta", 10000.0));
  GLM_ASSIGN_OR_RETURN(c.partial_rotary_factor, r.number_or("partial_rotary_factor", 0.5));
  if (r.has("rope_parameters")) {
    const auto& rp = j["rope_parameters"];
    GLM_ASSIGN_OR_RETURN(const ConfigReader rr, r.object("rope_parameters"));
    GLM_ASSIGN_OR_RETURN(c.rope_theta, rr.number_or("rope_theta", c.rope_theta));
    GLM_ASSIGN_OR_RETURN(c.partial_rotary_factor, rr.number_or("partial_rotary_factor", c.partial_rotary_factor));
    if (rp.contains("rope_type") && rp["rope_type"] != "default")
      return r.error("rope_parameters", concat("has rope_type ", rp["rope_type"].dump(),
                                               "; only \"default\" (no RoPE scaling) is supported"));
  }
  if (r.has("rope_scaling") && !j["rope_scaling"].is_null())
    return r.error("rope_scaling", "is set; RoPE scaling is not supported");
  GLM_ASSIGN_OR_RETURN(m.attention_bias, r.boolean_or("attention_bias", true));
  GLM_ASSIGN_OR_RETURN(m.tie_word_embeddings, r.boolean_or("tie_word_embeddings", false));
  return Status::ok();
}

Status read_chatglm(const ConfigReader& r, HfModel& m) {
  ModelConfig& c = m.config;
  GLM_ASSIGN_OR_RETURN(c.num_hidden_layers, r.integer("num_layers"));
  GLM_ASSIGN_OR_RETURN(c.hidden_size, r.integer("hidden_size"));
  GLM_ASSIGN_OR_RETURN(c.intermediate_size, r.integer("ffn_hidden_size"));
  GLM_ASSIGN_OR_RETURN(c.num_attention_heads, r.integer("num_attention_heads"));
  GLM_ASSIGN_OR_RETURN(c.head_dim, r.integer_or("kv_channels", 0));
  GLM_ASSIGN_OR_RETURN(c.vocab_size, r.integer("padded_vocab_size"));
  GLM_ASSIGN_OR_RETURN(c.max_position_embeddings, r.integer_or("seq_length", 131072));
  GLM_ASSIGN_OR_RETURN(c.rms_norm_eps, r.number_or("layernorm_epsilon", 1e-5));
  GLM_ASSIGN_OR_RETURN(bool mqa, r.boolean_or("multi_query_attention", false));
  if (mqa) {
    GLM_ASSIGN_OR_RETURN(c.num_key_value_heads, r.integer("multi_query_group_num"));
  } else {
    c.num_key_value_heads = c.num_attention_heads;
  }
  GLM_ASSIGN_OR_RETURN(double rope_ratio, r.number_or("rope_ratio", 1.0));
  c.rope_theta = 10000.0 * rope_ratio;
  c.partial_rotary_factor = 0.5;  // the remote code rotates half of every head
  GLM_ASSIGN_OR_RETURN(m.attention_bias, r.boolean_or("add_qkv_bias", false));
  GLM_ASSIGN_OR_RETURN(m.tie_word_embeddings, r.boolean_or("tie_word_embeddings", false));
  GLM_RETURN_IF_ERROR(r.require("add_bias_linear", false, false));
  GLM_RETURN_IF_ERROR(r.require("rmsnorm", true, true));
  GLM_RETURN_IF_ERROR(r.require("post_layer_norm", true, true));
  GLM_RETURN_IF_ERROR(r.require("apply_residual_connection_post_layernorm", false, false));
  GLM_RETURN_IF_ERROR(r.require("original_rope", true, true));
  return Status::ok();
}

}  // namespace

Result<HfModel> read_hf_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  if (!std::filesystem::is_directory(dir)) return GLM_USER_ERROR("--model_id_or_path '", dir, "' is not a directory");
  GLM_RETURN_IF_ERROR(check_input_path(path).with_context("--model_id_or_path"));
  std::ifstream in(path);
  if (!in) return GLM_USER_ERROR("cannot open '", path, "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    return GLM_USER_ERROR("'", path, "' is not valid JSON (", e.what(), ")");
  }
  if (!j.is_object()) return GLM_USER_ERROR("'", path, "' is not a JSON object");
  HfModel m;
  m.dir = dir;
  GLM_ASSIGN_OR_RETURN(const JsonFields fields, JsonFields::of(j, path));
  const ConfigReader r(fields);
  GLM_ASSIGN_OR_RETURN(const std::string type, fields.string_or("model_type", ""));
  if (type == "glm") {
    m.layout = HfLayout::glm;
    GLM_RETURN_IF_ERROR(read_glm(r, j, m));
  } else if (type == "chatglm") {
    m.layout = HfLayout::chatglm;
    GLM_RETURN_IF_ERROR(read_chatglm(r, m));
  } else if (type == "glm4") {
    return GLM_USER_ERROR(path,
                          ": model_type \"glm4\" is GLM-4-0414 (four norms per layer), a different "
                          "architecture; supported: \"glm\" (GlmForCausalLM) and \"chatglm\" (THUDM GLM-4)");
  } else {
    return GLM_USER_ERROR(path, ": unsupported model_type \"", type,
                          "\"; supported: \"glm\" (GlmForCausalLM) and \"chatglm\" (THUDM GLM-4)");
  }
  Status s = m.config.finalize_and_validate();
  if (!s.is_ok()) return GLM_USER_ERROR(path, ": ", s.message());
  return m;
}

std::vector<HfPiece> hf_pieces(const HfModel& m, const ParamLayout& layout, int entry) {
  const ParamEntry& e = layout.entry(entry);
  if (m.layout == HfLayout::chatglm) return {{e.name, e.shape, 0}};
  const ModelConfig& c = m.config;
  if (entry == layout.embedding()) return {{"model.embed_tokens.weight", e.shape, 0}};
  if (entry == layout.final_norm()) return {{"model.norm.weight", e.shape, 0}};
  if (entry == layout.output())
    return {{m.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight", e.shape, 0}};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerEntries& le = layout.layer(l);
    const std::string p = "model.layers." + std::to_string(l) + ".";
    if (entry == le.input_norm) return {{p + "input_layernorm.weight", e.shape, 0}};
    if (entry == le.post_norm) return {{p + "post_attention_layernorm.weight", e.shape, 0}};
    if (entry == le.dense) return {{p + "self_attn.o_proj.weight", e.shape, 0}};
    if (entry == le.h_to_4h) return {{p + "mlp.gate_up_proj.weight", e.shape, 0}};
    if (entry == le.four_h_to_h) return {{p + "mlp.down_proj.weight", e.shape, 0}};
    if (entry == le.qkv_weight || entry == le.qkv_bias) {
      // Rows q | k | v of the fused tensor (GLM4_SPEC.md 4.3); a bias is one "row" wide per output.
      const bool bias = entry == le.qkv_bias;
      const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
      const int64_t row = bias ? 1 : c.hidden_size;
      const std::string kind = bias ? "bias" : "weight";
      auto shape = [&](int64_t rows) { return bias ? std::vector<int64_t>{rows} : std::vector<int64_t>{rows, row}; };
      return {{p + "self_attn.q_proj." + kind, shape(q), 0},
              {p + "self_attn.k_proj." + kind, shape(kv), q * row},
              {p + "self_attn.v_proj." + kind, shape(kv), (q + kv) * row}};
    }
  }
  return {};
}

namespace {

// A NaN or infinity in a weight makes every loss NaN: said here, where the tensor has a name.
Status check_finite(std::span<const float> values, const std::string& tensor, const std::string& file) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i]))
      return GLM_USER_ERROR("tensor '", tensor, "' in '", file, "' holds ", values[i], " at element ", i, " of ",
                            values.size(), " (as f32): the weights are damaged (a diverged or corrupt checkpoint)");
  }
  return Status::ok();
}

Status visit_hf_weights(const HfModel& m, const ParamLayout& layout,
                        const std::function<Status(int entry, std::span<const float> values)>* sink) {
  GLM_ASSIGN_OR_RETURN(SafetensorsCheckpoint ckpt, SafetensorsCheckpoint::open(m.dir));
  std::set<std::string> used;
  std::vector<float> values;
  int64_t total = 0, loaded = 0;
  for (const ParamEntry& e : layout.entries()) total += e.numel;
  // Reading (not the verification of names and shapes alone) says how far it is.
  std::optional<Progress> progress;
  if (sink != nullptr) progress.emplace("loading the weights of " + m.dir, total, Progress::Unit::items, "parameters");
  for (int i = 0; i < static_cast<int>(layout.entries().size()); ++i) {
    const ParamEntry& e = layout.entry(i);

    if (sink != nullptr) values.assign(static_cast<size_t>(e.numel), 0.0f);
    const bool is_qkv_bias = e.kind == ParamKind::bias;
    for (const HfPiece& piece : hf_pieces(m, layout, i)) {
      auto found = ckpt.find(piece.name);
      if (found.file == nullptr) {
        if (is_qkv_bias && !m.attention_bias) continue;  // no bias in the checkpoint: it starts at zero
        return GLM_USER_ERROR("checkpoint '", m.dir, "' has no tensor '", piece.name, "' (config.json describes ",
                              m.config.num_hidden_layers, " layers; is it the matching checkpoint?)");
      }
      if (found.info->shape != piece.shape) {
        return GLM_USER_ERROR("tensor '", piece.name, "' in '", found.file->path(), "' has shape ",
                              nlohmann::json(found.info->shape).dump(), " but config.json implies ",
                              nlohmann::json(piece.shape).dump());
      }
      used.insert(piece.name);
      const StDType dt = found.info->dtype;
      if (dt != StDType::F32 && dt != StDType::BF16 && dt != StDType::F16 && dt != StDType::F64)
        return GLM_USER_ERROR("tensor '", piece.name, "' in '", found.file->path(), "' has dtype ", st_dtype_name(dt),
                              "; expected F32, BF16, F16 or F64");
      if (sink == nullptr) continue;
      std::span<float> out(values.data() + piece.offset, static_cast<size_t>(found.info->numel()));
      GLM_RETURN_IF_ERROR(read_as_f32(*found.file, *found.info, out));
      GLM_RETURN_IF_ERROR(check_finite(out, piece.name, found.file->path()));
    }
    if (sink != nullptr) GLM_RETURN_IF_ERROR((*sink)(i, values));
    loaded += e.numel;
    if (progress) progress->update(loaded);
  }
  if (progress) progress->finish();
  for (const auto& name : ckpt.names()) {
    // The THUDM checkpoint carries an unused rotary buffer (GLM4_SPEC.md 4.1).
    if (used.count(name) || name.ends_with("rotary_pos_emb.inv_freq") || name.ends_with("rotary_emb.inv_freq"))
      continue;
    return GLM_USER_ERROR("checkpoint '", m.dir, "' holds tensor '", name,
                          "' that the model described by config.json does not use");
  }
  return Status::ok();
}

}  // namespace

Status load_hf_weights(const HfModel& m, const ParamLayout& layout,
                       const std::function<Status(int entry, std::span<const float> values)>& sink) {
  return visit_hf_weights(m, layout, &sink);
}

Status verify_hf_weights(const HfModel& m, const ParamLayout& layout) { return visit_hf_weights(m, layout, nullptr); }

}  // namespace glm
