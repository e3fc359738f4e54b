// Command-line and INI options (Boost.Program_options): names follow ms-swift / transformers /
// DeepSpeed; an INI file gives defaults and the command line overrides it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "base/status.h"
#include "model/backend_config.h"
#include "train/train_config.h"

namespace glm {

struct CliOptions {
  std::string command = "train";
  bool help = false;
  std::string config_file;
  std::string device = "auto";
  double collective_timeout = 600.0;
  std::string model_id_or_path;
  int64_t per_device_eval_batch_size = 8;
  std::vector<std::string> val_datasets;  // --val_dataset
  double split_dataset_ratio = 0.0;       // share of --dataset held out for validation
  int64_t plan_world_size = 1;            // glm_hpc plan --world_size
  double gpu_memory_gib = 140.4;          // glm_hpc plan: an H200's 143771 MiB
  int64_t print_example = -1;             // glm_hpc prepare: the sample to print with trained tokens marked
  std::string tokenizer = "auto";         // --tokenizer: auto, bytes, or a rank file / model directory
  bool dataset_cache = true;              // --dataset_cache: reuse tokenized jsonl (data/dataset_cache.h)
  std::string recompute = "none";         // --recompute, parsed into train.recompute
  bool gradient_checkpointing = false;    // transformers' name for --recompute full
  // glm_hpc export: a checkpoint to a Hugging Face model directory (src/cli/export.h).
  std::string ckpt_dir;                // a checkpoint, or an output directory (its latest)
  std::string save_dir;                // where the model directory goes
  std::string export_format = "hf";    // hf (transformers GlmForCausalLM) or chatglm (THUDM layout)
  std::string max_shard_size = "5GB";  // transformers' spellings: 5GB, 500MB, 2GiB, bytes
  std::string tokenizer_dir;           // tokenizer files to copy; empty: the checkpoint's run's
  bool overwrite = false;              // replace a non-empty save_dir
  bool merge_lora = false;             // a LoRA checkpoint: base + adapters merged, not PEFT's adapter files
  // ZeRO communication (DeepSpeed names, element counts such as 5e8), parsed into train.zero_options.
  std::string reduce_bucket_size = "5e8";  // or auto
  std::string allgather_bucket_size = "5e8";
  std::string prefetch_bucket_size = "5e8";
  std::string grad_reduce_dtype = "fp32";
  std::string param_persistence_threshold = "1e5";  // DeepSpeed's default
  std::string model_persistence_threshold = "inf";  // DeepSpeed's default: sys.maxsize
  std::string target_modules = "all-linear";        // --target_modules, parsed into train.lora.targets
  // Kernels and the device backend (BackendConfig), parsed from these strings.
  std::string gemm_autotune = "off";
  std::string attention_kernel = "auto";
  int64_t lm_head_scratch_mb = 2048;
  BackendConfig backend;
  TrainConfig train;
  // Effective options: {"name": {"value": ..., "source": "default" | "config" | "command_line"}}.
  nlohmann::json effective;
};

// Parses and validates; a bad option, key or value is a user error naming --option or file:line.
Result<CliOptions> parse_options(int argc, const char* const* argv);
std::string help_text();

// Writes output_dir/args.json atomically (temporary file, then rename).
Status write_args_json(const CliOptions& options);

}  // namespace glm
