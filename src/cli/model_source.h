// The one place that opens a model to run it: a Hugging Face model directory (--model_id_or_path,
// either layout, sharded or not), a training checkpoint (--ckpt_dir: a checkpoint-N directory or an
// output directory's latest, saved at any world size and ZeRO stage; a LoRA checkpoint brings the
// base it was trained on), or a base plus LoRA adapters applied without merging (--adapters: a LoRA
// checkpoint or a PEFT adapter directory). glm_hpc eval and infer and glm_dump_logits open models
// through it; glm_hpc export reads checkpoints through the same readers (train/checkpoint.h).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "data/tokenizer.h"
#include "io/hf_import.h"
#include "model/beam_search.h"
#include "model/config.h"
#include "model/lora.h"
#include "train/checkpoint.h"
#include "train/engine.h"
#include "train/lora_base.h"

namespace glm {

struct ModelSpec {
  std::string model_dir;  // --model_id_or_path; with LoRA adapters, their base (one that moved)
  std::string ckpt_dir;   // --ckpt_dir
  std::string adapters;   // --adapters
};

// What generation_config.json says (transformers' GenerationConfig fields glm_hpc uses); absent
// fields stay unset.
struct GenerationDefaults {
  // eos_token_id: unset when the file has no such field; set but empty when it is null or [] (as in
  // transformers, generation then ends only at max_new_tokens).
  std::optional<std::vector<int32_t>> eos_token_ids;
  std::optional<bool> do_sample;
  std::optional<double> temperature, top_p, repetition_penalty, length_penalty;
  std::optional<int64_t> top_k, max_new_tokens, num_beams;
  std::optional<EarlyStopping> early_stopping;
  std::string source;  // the file read; empty: none
};

class ModelSource {
 public:
  // Reads the configurations and checks that the pieces fit together (no weights are read yet).
  static Result<ModelSource> open(const ModelSpec& spec);
  // The checks load() makes of a Hugging Face directory's tensors (names, shapes, dtypes, unused
  // ones) without reading their data, so that every rank can agree on bad input first.
  Status verify() const;

  const ModelConfig& config() const { return config_; }
  // The adapters applied unmerged: create the engine with this configuration (dropout 0).
  const std::optional<LoraConfig>& lora() const { return lora_; }
  // "the Hugging Face model DIR", "checkpoint DIR (step N, full)", "... + LoRA adapters of DIR".
  const std::string& describe() const { return description_; }
  // The directory whose tokenizer files and generation_config.json belong to this model: the
  // Hugging Face directory, a LoRA checkpoint's base, or a checkpoint run's --model_id_or_path.
  // Empty when there is none (a model trained from random initialisation).
  const std::string& files_dir() const { return files_dir_; }
  // What tokenized a checkpoint's training data (meta.json's record: a rank file or "bytes").
  const std::string& recorded_tokenizer() const { return recorded_tokenizer_; }
  const std::optional<HfModel>& hf() const { return hf_; }

  // Writes the weights (and adapters) into an engine created with config() and lora(); the
  // masters rounded to bf16 first when round_to_bf16 (what the export stores). Checks a LoRA
  // base against the fingerprint its checkpoint recorded, and a Hugging Face directory's tensors
  // against the model's layout, before anything is written.
  Status load(TrainingEngine& engine, bool round_to_bf16 = false) const;

  // The model's tokenizer: `option` (--tokenizer: a rank file, a directory or "bytes") when not
  // "auto", else the tokenizer.model (or tokenizer.json) of files_dir(), else the one a checkpoint
  // recorded; a model directory with other Hugging Face tokenizer files only gets none, one with
  // no tokenizer files at all (ours, the test fixtures) the byte tokenizer when its vocabulary
  // holds it. Null when there is none.
  Result<std::unique_ptr<Tokenizer>> tokenizer(const std::string& option) const;

  // generation_config.json of files_dir() (nothing set when there is none).
  Result<GenerationDefaults> generation_defaults() const;

 private:
  ModelConfig config_;
  std::optional<HfModel> hf_;                 // weights from a Hugging Face directory
  std::optional<CheckpointInfo> checkpoint_;  // weights from a full checkpoint's masters
  std::optional<CheckpointInfo> lora_checkpoint_;
  std::optional<LoraBaseSource> lora_base_;
  std::optional<LoraConfig> lora_;
  std::vector<float> peft_values_;  // adapters read from a PEFT directory
  std::string description_, files_dir_, recorded_tokenizer_;
};

// A PEFT adapter directory (adapter_config.json + adapter_model.safetensors) for `config`: its
// LoRA configuration and the adapters laid out as LoraLayout(config, lora) lays them out. Either
// layout's module names (transformers' q_proj/k_proj/v_proj..., THUDM's query_key_value...); in
// transformers' layout q, k and v with different A's become one fused adapter of rank 3r (exact).
struct PeftAdapter {
  LoraConfig lora;   // what the engine applies: rank 3r where q, k and v have their own A's
  int64_t rank = 0;  // adapter_config.json's r
  std::vector<float> values;
  HfLayout layout = HfLayout::glm;
  std::string base_model;  // base_model_name_or_path; empty when null
};
Result<LoraConfig> read_peft_config(const std::string& dir);
Result<PeftAdapter> read_peft_adapter(const std::string& dir, const ModelConfig& config);

}  // namespace glm
