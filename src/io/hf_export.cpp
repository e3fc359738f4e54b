// config.json / generation_config.json of both GLM-4 layouts and the weights as bf16 safetensors.
#include "io/hf_export.h"

#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>

namespace glm {
namespace {

nlohmann::json optional_id(const std::optional<int64_t>& id) { return id ? nlohmann::json(*id) : nlohmann::json(); }

nlohmann::json eos_ids(const HfTokenIds& ids) { return ids.eos.empty() ? nlohmann::json() : nlohmann::json(ids.eos); }

Status check_chatglm_rotary(const ModelConfig& c) {
  // THUDM's remote code builds its rotary embedding over kv_channels / 2 dims, whatever the config says.
  if (c.partial_rotary_factor != 0.5)
    return GLM_USER_ERROR(
        "--export_format chatglm: the THUDM layout rotates half of every head, but this model's "
        "partial_rotary_factor is ",
        c.partial_rotary_factor, "; export it with --export_format hf");
  return Status::ok();
}

}  // namespace

Result<nlohmann::ordered_json> hf_export_config(const ModelConfig& c, HfLayout format, const HfTokenIds& ids) {
  if (format == HfLayout::glm) {
    // The field set transformers 5 writes for GlmConfig (tests/data/glm_a/config.json), plus the
    // top-level rope_theta and torch_dtype that transformers 4 reads.
    nlohmann::ordered_json rope = {
        {"partial_rotary_factor", c.partial_rotary_factor}, {"rope_theta", c.rope_theta}, {"rope_type", "default"}};
    return nlohmann::ordered_json{
        {"architectures", {"GlmForCausalLM"}},
        {"attention_bias", true},
        {"attention_dropout", 0.0},
        {"bos_token_id", optional_id(ids.bos)},
        {"dtype", "bfloat16"},
        {"eos_token_id", eos_ids(ids)},
        {"head_dim", c.head_dim},
        {"hidden_act", "silu"},
        {"hidden_size", c.hidden_size},
        {"initializer_range", c.initializer_range},
        {"intermediate_size", c.intermediate_size},
        {"max_position_embeddings", c.max_position_embeddings},
        {"model_type", "glm"},
        {"num_attention_heads", c.num_attention_heads},
        {"num_hidden_layers", c.num_hidden_layers},
        {"num_key_value_heads", c.num_key_value_heads},
        {"pad_token_id", c.pad_token_id >= 0 ? nlohmann::json(c.pad_token_id) : optional_id(ids.pad)},
        {"partial_rotary_factor", c.partial_rotary_factor},
        {"rms_norm_eps", c.rms_norm_eps},
        {"rope_parameters", rope},
        {"rope_theta", c.rope_theta},
        {"tie_word_embeddings", false},
        {"torch_dtype", "bfloat16"},
        {"use_cache", true},
        {"vocab_size", c.vocab_size}};
  }
  GLM_RETURN_IF_ERROR(check_chatglm_rotary(c));
  // glm-4-9b-chat's config.json (GLM4_SPEC.md 1.1): the remote code reads these names.
  const nlohmann::ordered_json auto_map = {
      {"AutoConfig", "configuration_chatglm.ChatGLMConfig"},
      {"AutoModel", "modeling_chatglm.ChatGLMForConditionalGeneration"},
      {"AutoModelForCausalLM", "modeling_chatglm.ChatGLMForConditionalGeneration"},
      {"AutoModelForSeq2SeqLM", "modeling_chatglm.ChatGLMForConditionalGeneration"},
      {"AutoModelForSequenceClassification", "modeling_chatglm.ChatGLMForSequenceClassification"}};
  return nlohmann::ordered_json{{"architectures", {"ChatGLMModel"}},
                                {"auto_map", auto_map},
                                {"model_type", "chatglm"},
                                {"add_bias_linear", false},
                                {"add_qkv_bias", true},
                                {"apply_query_key_layer_scaling", true},
                                {"apply_residual_connection_post_layernorm", false},
                                {"attention_dropout", 0.0},
                                {"attention_softmax_in_fp32", true},
                                {"bias_dropout_fusion", true},
                                {"classifier_dropout", nullptr},
                                {"ffn_hidden_size", c.intermediate_size},
                                {"fp32_residual_connection", false},
                                {"hidden_dropout", 0.0},
                                {"hidden_size", c.hidden_size},
                                {"kv_channels", c.head_dim},
                                {"layernorm_epsilon", c.rms_norm_eps},
                                {"multi_query_attention", true},
                                {"multi_query_group_num", c.num_key_value_heads},
                                {"num_attention_heads", c.num_attention_heads},
                                {"num_hidden_layers", c.num_hidden_layers},
                                {"num_layers", c.num_hidden_layers},
                                {"original_rope", true},
                                {"padded_vocab_size", c.vocab_size},
                                {"post_layer_norm", true},
                                {"rmsnorm", true},
                                {"rope_ratio", c.rope_theta / 10000.0},
                                {"seq_length", c.max_position_embeddings},
                                {"tie_word_embeddings", false},
                                {"torch_dtype", "bfloat16"},
                                {"use_cache", true},
                                {"eos_token_id", eos_ids(ids)},
                                {"pad_token_id", optional_id(ids.pad)}};
}

nlohmann::ordered_json hf_generation_config(const HfTokenIds& ids) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (ids.bos) j["bos_token_id"] = *ids.bos;
  if (!ids.eos.empty()) j["eos_token_id"] = ids.eos;
  if (ids.pad) j["pad_token_id"] = *ids.pad;
  return j;
}

Result<uint64_t> parse_byte_size(const std::string& text) {
  auto bad = [&] {
    return GLM_USER_ERROR("'", text,
                          "' is not a size: an integer, optionally followed by KB, MB, GB (powers of 1000) or KiB, "
                          "MiB, GiB (powers of 1024), e.g. 5GB");
  };
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0 || digits > 18) return bad();
  const uint64_t number = std::stoull(text.substr(0, digits));
  std::string unit = text.substr(digits);
  const bool bits = unit.size() == 2 && unit[1] == 'b';  // transformers: "5Gb" is gigabits
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  uint64_t scale = 0;
  if (unit.empty()) scale = 1;
  if (unit == "KB") scale = 1000;
  if (unit == "MB") scale = 1000 * 1000;
  if (unit == "GB") scale = 1000 * 1000 * 1000;
  if (unit == "KIB") scale = uint64_t{1} << 10;
  if (unit == "MIB") scale = uint64_t{1} << 20;
  if (unit == "GIB") scale = uint64_t{1} << 30;
  if (scale == 0) return bad();
  if (number > std::numeric_limits<uint64_t>::max() / scale) return bad();
  const uint64_t bytes = bits ? number * scale / 8 : number * scale;
  if (bytes == 0) return GLM_USER_ERROR("'", text, "' must be at least one byte");
  return bytes;
}

std::vector<float> chatglm_inv_freq(const ModelConfig& c) {
  const int64_t dim = c.head_dim / 2;
  std::vector<float> v;
  for (int64_t i = 0; i < dim; i += 2)
    v.push_back(static_cast<float>(1.0 / std::pow(10000.0, static_cast<double>(i) / static_cast<double>(dim))));
  return v;
}

namespace {
constexpr const char* kInvFreq = "transformer.rotary_pos_emb.inv_freq";
}

Result<HfWeightWriter> HfWeightWriter::create(const std::string& dir, const ModelConfig& config, HfLayout format,
                                              uint64_t max_shard_bytes) {
  if (format == HfLayout::chatglm) GLM_RETURN_IF_ERROR(check_chatglm_rotary(config));
  ParamLayout layout(config, 1);
  HfModel model;
  model.layout = format;
  model.config = config;
  model.tie_word_embeddings = false;
  model.attention_bias = true;
  std::vector<StTensorSpec> specs;
  for (const ParamUnit& unit : layout.units())
    for (int entry : unit.entries)
      for (const HfPiece& piece : hf_pieces(model, layout, entry))
        specs.push_back({piece.name, StDType::BF16, piece.shape});
  if (format == HfLayout::chatglm)
    specs.push_back({kInvFreq, StDType::BF16, {static_cast<int64_t>(chatglm_inv_freq(config).size())}});
  GLM_ASSIGN_OR_RETURN(SafetensorsShardWriter writer, SafetensorsShardWriter::create(dir, specs, max_shard_bytes));
  return HfWeightWriter(std::move(layout), std::move(model), std::move(writer));
}

Status HfWeightWriter::add_unit(int unit, std::span<const float> values) {
  if (unit != next_unit_ || unit >= static_cast<int>(layout_.units().size()))
    return GLM_INTERNAL_ERROR("HfWeightWriter: unit ", unit, " arrived, expected ", next_unit_);
  const ParamUnit& u = layout_.units()[static_cast<size_t>(unit)];
  if (static_cast<int64_t>(values.size()) != u.numel)
    return GLM_INTERNAL_ERROR("HfWeightWriter: unit ", unit, " has ", values.size(), " values, the layout ", u.numel);
  for (int entry : u.entries) {
    const int64_t base = layout_.entry(entry).offset - u.offset;
    for (const HfPiece& piece : hf_pieces(model_, layout_, entry)) {
      int64_t n = 1;
      for (int64_t s : piece.shape) n *= s;
      bf16_.resize(static_cast<size_t>(n));
      const float* src = values.data() + base + piece.offset;
      for (int64_t i = 0; i < n; ++i) bf16_[static_cast<size_t>(i)] = float_to_bf16_bits(src[i]);
      GLM_RETURN_IF_ERROR(writer_.write(piece.name, bf16_.data()));
      ++tensor_count_;
    }
  }
  ++next_unit_;
  return Status::ok();
}

Status HfWeightWriter::finish() {
  if (next_unit_ != static_cast<int>(layout_.units().size()))
    return GLM_INTERNAL_ERROR("HfWeightWriter: ", layout_.units().size() - static_cast<size_t>(next_unit_),
                              " units never arrived");
  if (model_.layout == HfLayout::chatglm) {
    const std::vector<float> inv = chatglm_inv_freq(model_.config);
    bf16_.resize(inv.size());
    for (size_t i = 0; i < inv.size(); ++i) bf16_[i] = float_to_bf16_bits(inv[i]);
    GLM_RETURN_IF_ERROR(writer_.write(kInvFreq, bf16_.data()));
    ++tensor_count_;
  }
  return writer_.finish();
}

}  // namespace glm
