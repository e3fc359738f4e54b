// Our logits for a fixed batch, for comparisons with transformers and PEFT (benchmarks/checks/export_check.sh,
// benchmarks/checks/lora_peft_check.sh): the model comes from a glm_hpc checkpoint (its fp32 masters,
// rounded to bf16 by default as the export stores them), a LoRA checkpoint (its base, checked against
// the recorded fingerprint, plus its fp32 adapters: what the PEFT export holds) or a Hugging Face
// directory; fp32 on the CPU backend, one process.
//
// usage: glm_dump_logits (--ckpt_dir DIR | --model_dir DIR) --input_ids FILE --out FILE [--bf16_weights true|false]
//                        [--model_id_or_path DIR] [--grads_out FILE]
//   --ckpt_dir as glm_hpc export takes it (a checkpoint, or an output directory: its latest).
//   FILE of --input_ids: a JSON list of equally long rows of token ids, each its own sequence.
//   --out: a safetensors file holding "logits" F32 [rows, length, vocab_size].
//   --bf16_weights: full checkpoints only (a LoRA checkpoint's base is used as it was trained).
//   --model_id_or_path: a LoRA checkpoint's base when it moved from where meta.json says.
//   --grads_out (LoRA checkpoints): the loss and the adapter gradients of one batch (no dropout), every row's
//     tokens its labels (transformers' labels = input_ids: each position predicts the next token,
//     the mean over all predicted tokens of all rows). A safetensors file with "loss" F64 [1] and
//     F32 gradients under PEFT's names for GlmForCausalLM (without the adapter name "default"):
//     ...lora_B.weight of every adapter (q_proj, k_proj and v_proj: the row blocks of our fused
//     query_key_value B) and ...lora_A.weight of o_proj, gate_up_proj and down_proj. Our fused
//     query_key_value adapter has one A where PEFT has three equal copies; the sum of PEFT's three
//     A gradients equals its gradient, stored as
//     base_model.model.model.layers.N.self_attn.q_proj+k_proj+v_proj.lora_A.weight.
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cli/model_source.h"
#include "io/peft_adapter.h"
#include "io/safetensors.h"
#include "mpi/local_communicator.h"
#include "train/engine.h"

namespace {

constexpr const char* kUsage =
    "usage: glm_dump_logits (--ckpt_dir DIR | --model_dir DIR) --input_ids FILE --out FILE "
    "[--bf16_weights true|false]\n"
    "                       [--model_id_or_path DIR] [--grads_out FILE]   (LoRA checkpoints)\n";

glm::Result<std::vector<std::vector<int32_t>>> read_rows(const std::string& path) {
  std::ifstream in(path);
  if (!in) return GLM_USER_ERROR("cannot open --input_ids '", path, "'");
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_array() || j.empty())
    return GLM_USER_ERROR("--input_ids '", path, "' is not a non-empty JSON list of rows");
  std::vector<std::vector<int32_t>> rows;
  for (const auto& row : j) {
    if (!row.is_array() || row.empty() || (!rows.empty() && row.size() != rows.front().size()))
      return GLM_USER_ERROR("--input_ids '", path, "': rows must be non-empty lists of equal length");
    std::vector<int32_t> ids;
    for (const auto& id : row) {
      if (!id.is_number_integer()) return GLM_USER_ERROR("--input_ids '", path, "': ids must be integers");
      ids.push_back(id.get<int32_t>());
    }
    rows.push_back(std::move(ids));
  }
  return rows;
}

glm::Status run(const std::map<std::string, std::string>& args) {
  auto arg = [&](const char* name) {
    auto it = args.find(name);
    return it == args.end() ? std::string() : it->second;
  };
  const std::set<std::string> known = {"ckpt_dir",     "model_dir",        "input_ids", "out",
                                       "bf16_weights", "model_id_or_path", "grads_out"};
  for (const auto& [name, value] : args)
    if (!known.count(name)) return GLM_USER_ERROR("unknown option --", name);
  const std::string ckpt = arg("ckpt_dir"), model_dir = arg("model_dir");
  if (ckpt.empty() == model_dir.empty()) return GLM_USER_ERROR("give exactly one of --ckpt_dir and --model_dir");
  if (arg("input_ids").empty() || arg("out").empty()) return GLM_USER_ERROR("--input_ids and --out are required");
  const std::string bf16_arg = args.count("bf16_weights") ? arg("bf16_weights") : "true";
  if (bf16_arg != "true" && bf16_arg != "false") return GLM_USER_ERROR("--bf16_weights must be true or false");
  const bool bf16 = bf16_arg == "true";
  GLM_ASSIGN_OR_RETURN(const auto rows, read_rows(arg("input_ids")));

  GLM_ASSIGN_OR_RETURN(const glm::ModelSource source,
                       glm::ModelSource::open({ckpt.empty() ? model_dir : arg("model_id_or_path"), ckpt, ""}));
  const glm::ModelConfig& config = source.config();
  const bool lora = source.lora().has_value();
  if (lora && args.count("bf16_weights"))
    return GLM_USER_ERROR("--bf16_weights: '", ckpt,
                          "' is a LoRA checkpoint, whose base is used as it was trained and whose adapters stay fp32 "
                          "(as the PEFT export holds them)");
  if (!lora && args.count("model_id_or_path"))
    return GLM_USER_ERROR("--model_id_or_path names the base of a LoRA checkpoint; give --ckpt_dir one");
  if (!lora && args.count("grads_out"))
    return GLM_USER_ERROR("--grads_out writes adapter gradients: give --ckpt_dir a LoRA checkpoint");
  glm::HostMicroBatch batch;
  for (const auto& row : rows) {
    glm::TokenizedSample s;
    for (int32_t id : row) {
      if (id < 0 || id >= config.vocab_size)
        return GLM_USER_ERROR("--input_ids: id ", id, " is outside the model's vocabulary of ", config.vocab_size);
      s.tokens.push_back(id);
      s.labels.push_back(id);  // transformers' labels = input_ids; only --grads_out uses them
    }
    glm::append_document(batch, s);  // each row its own causal sequence
  }
  auto backend = glm::make_cpu_backend(glm::DType::f32);
  glm::LocalCommunicator comm;
  glm::EngineConfig engine_config{.model = config, .max_tokens = batch.size(), .max_grad_norm = 0.0};
  if (lora) {
    engine_config.adam = glm::AdamWOptions{};
    // The gradients of the function PEFT evaluates in eval mode: no dropout (ModelSource's adapters have none).
    engine_config.lora = source.lora();
  }
  GLM_ASSIGN_OR_RETURN(auto engine, glm::TrainingEngine::create(engine_config, *backend, comm));
  // A full checkpoint's masters rounded to bf16 as the export stores them, unless asked otherwise.
  GLM_RETURN_IF_ERROR(source.load(*engine, !ckpt.empty() && !lora && bf16));
  const std::string weights =
      source.describe() + (!ckpt.empty() && !lora ? (bf16 ? ", bf16-rounded weights" : ", weights as stored") : "");
  std::vector<float> logits;
  GLM_RETURN_IF_ERROR(engine->logits(batch, logits));
  const std::vector<int64_t> shape = {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows.front().size()),
                                      config.vocab_size};
  if (static_cast<int64_t>(logits.size()) != shape[0] * shape[1] * shape[2])
    return GLM_INTERNAL_ERROR("logits hold ", logits.size(), " values, expected ", shape[0] * shape[1] * shape[2]);
  GLM_RETURN_IF_ERROR(glm::write_safetensors(arg("out"), {{"logits", glm::StDType::F32, shape, logits.data()}}));
  std::printf("glm_dump_logits: logits [%lld, %lld, %lld] of %s (%s) to %s\n", static_cast<long long>(shape[0]),
              static_cast<long long>(shape[1]), static_cast<long long>(shape[2]),
              ckpt.empty() ? model_dir.c_str() : ckpt.c_str(), weights.c_str(), arg("out").c_str());
  if (!args.count("grads_out")) return glm::Status::ok();

  // One step at learning rate 0: the loss and the all-reduced adapter gradients before clipping.
  const std::vector<glm::HostMicroBatch> micro = {batch};
  GLM_ASSIGN_OR_RETURN(const glm::StepResult step, engine->step(micro, 0.0));
  GLM_ASSIGN_OR_RETURN(const std::vector<float> grads, engine->lora_gradients());
  const double loss = step.loss;
  GLM_RETURN_IF_ERROR(glm::write_peft_safetensors(arg("grads_out"), *engine->lora_layout(), config, glm::HfLayout::glm,
                                                  grads, /*fused_qkv_a=*/true,
                                                  {{"loss", glm::StDType::F64, {1}, &loss}}));
  std::printf("glm_dump_logits: loss %.8f over %lld predicted tokens and the adapter gradients to %s\n", loss,
              static_cast<long long>(batch.target_count), arg("grads_out").c_str());
  return glm::Status::ok();
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
    if (a.rfind("--", 0) != 0 || i + 1 >= argc) {
      std::fprintf(stderr, "glm_dump_logits: error: unexpected argument '%s'\n%s", a.c_str(), kUsage);
      return 2;
    }
    args[a.substr(2)] = argv[++i];
  }
  const glm::Status s = run(args);
  if (!s.is_ok()) {
    std::fprintf(stderr, "glm_dump_logits: error: %s\n", s.message().c_str());
    return s.exit_code();
  }
  return 0;
}
