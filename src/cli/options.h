// Command-line and INI options (Boost.Program_options): names follow ms-swift / transformers /
// DeepSpeed; an INI file gives defaults and the command line overrides it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "mpi/status.h"
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
