// Command-line and INI options (Boost.Program_options): names follow ms-swift / transformers /
// DeepSpeed; an INI file gives defaults and the command line overrides it.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "base/enum_names.h"
#include "base/status.h"
#include "io/hf_import.h"
#include "model/backend_config.h"
#include "model/beam_search.h"
#include "train/train_config.h"

namespace glm {

// --device: cuda when a GPU and the CUDA backend exist (auto), or the one named.
enum class Device { auto_select, cpu, cuda };

template <>
struct EnumNames<Device> {
  static constexpr std::pair<Device, std::string_view> table[] = {
      {Device::auto_select, "auto"}, {Device::cpu, "cpu"}, {Device::cuda, "cuda"}};
};

// --torch_dtype (transformers' and ms-swift's): the dtype the model computes in. glm_hpc's is fixed
// by the backend (bf16 on GPUs with fp32 masters, fp32 on the CPU), so only the names that say that
// are accepted.
enum class TorchDtype { auto_select, bfloat16, float16, float32 };
template <>
struct EnumNames<TorchDtype> {
  static constexpr std::pair<TorchDtype, std::string_view> table[] = {{TorchDtype::auto_select, "auto"},
                                                                      {TorchDtype::bfloat16, "bfloat16"},
                                                                      {TorchDtype::float16, "float16"},
                                                                      {TorchDtype::float32, "float32"},
                                                                      {TorchDtype::bfloat16, "bf16"},
                                                                      {TorchDtype::float16, "fp16"},
                                                                      {TorchDtype::float32, "fp32"}};
};

// --eval_strategy (transformers' and ms-swift's): steps evaluates every --eval_steps; no never.
enum class EvalStrategy { steps, no };
template <>
struct EnumNames<EvalStrategy> {
  static constexpr std::pair<EvalStrategy, std::string_view> table[] = {{EvalStrategy::steps, "steps"},
                                                                        {EvalStrategy::no, "no"}};
};

// --plot_format: the charts of glm_hpc plot and of the end of training (io/run_plots.h): png through
// gnuplot (SVG where gnuplot is missing), svg, or none (training draws nothing).
enum class PlotFormat { png, svg, none };
template <>
struct EnumNames<PlotFormat> {
  static constexpr std::pair<PlotFormat, std::string_view> table[] = {
      {PlotFormat::png, "png"}, {PlotFormat::svg, "svg"}, {PlotFormat::none, "none"}};
};

struct CliOptions {
  std::string command = "train";
  bool help = false;
  std::string config_file;
  Device device = Device::auto_select;
  double collective_timeout = 600.0;
  std::string model_id_or_path;
  int64_t per_device_eval_batch_size = 8;
  std::vector<std::string> val_datasets;  // --val_dataset
  double split_dataset_ratio = 0.0;       // share of --dataset held out for validation
  int64_t plan_world_size = 1;            // glm_hpc plan --world_size
  int64_t plan_gpus_per_node = 8;         // glm_hpc plan --gpus_per_node (host memory per node)
  double gpu_memory_gib = 140.4;          // glm_hpc plan: an H200's 143771 MiB
  int64_t print_example = -1;             // glm_hpc prepare: the sample to print with trained tokens marked
  std::string tokenizer = "auto";         // --tokenizer: auto, bytes, or a rank file / model directory
  bool dataset_cache = true;              // --dataset_cache: reuse tokenized jsonl (data/dataset_cache.h)
  bool gradient_checkpointing = false;    // transformers' name for --recompute full
  int sequence_parallel_size = 0;         // ms-swift's name for --context_parallel_size (0: not given)
  // Names users type first (transformers, ms-swift), checked against what glm_hpc does.
  std::string model;                        // --model: ms-swift's name for --model_id_or_path
  bool bf16 = true;                         // --bf16: GPUs compute in bf16; false is refused
  bool fp16 = false;                        // --fp16: true is refused (no fp16 path)
  std::string deepspeed;                    // --deepspeed FILE|zero1|zero2|zero3 (cli/deepspeed_config.h)
  bool overwrite_output_dir = false;        // train: replace an earlier run's log and checkpoints there
  std::string report_to = "tensorboard";    // --report_to: tensorboard, all or none; other trackers are refused
  std::string deepspeed_account;            // what each of its keys did, printed once by rank 0
  TorchDtype torch_dtype = TorchDtype::auto_select;
  EvalStrategy eval_strategy = EvalStrategy::steps;
  // glm_hpc export: a checkpoint to a Hugging Face model directory (src/cli/export.h).
  std::string ckpt_dir;                       // a checkpoint, or an output directory (its latest)
  std::string save_dir;                       // where the model directory goes
  HfLayout export_format = HfLayout::glm;     // hf (transformers GlmForCausalLM) or chatglm (THUDM layout)
  std::string max_shard_size = "5GB";         // transformers' spellings: 5GB, 500MB, 2GiB, bytes
  std::string tokenizer_dir;                  // tokenizer files to copy; empty: the checkpoint's run's
  bool overwrite = false;                     // replace a non-empty save_dir
  bool merge_lora = false;                    // a LoRA checkpoint: base + adapters merged, not PEFT's adapter files
  std::string target_modules = "all-linear";  // --target_modules, parsed into train.lora.targets
  // glm_hpc infer (src/cli/infer.h); unset sampling values come from the model's generation_config.json.
  std::string adapters;       // LoRA adapters applied unmerged: our LoRA checkpoint or a PEFT directory
  std::string result_path;    // batch mode's jsonl; empty: infer_result/<time>.jsonl
  std::string compare_with;   // a second model answering the same prompts, for blinded scoring
  int64_t max_new_tokens = 512;
  int64_t max_batch_size = 32;  // sequences a rank generates together
  std::optional<double> temperature, top_p, repetition_penalty;
  std::optional<int64_t> top_k, num_beams;
  std::optional<double> length_penalty;
  std::optional<EarlyStopping> early_stopping;
  bool stream = true;  // the chat shows replies as they are generated
  // glm_hpc plot DIR... (io/run_plots.h); its images go to --save_dir when given.
  std::vector<std::string> plot_runs;
  double plot_smoothing = 0.9;
  PlotFormat plot_format = PlotFormat::png;
  int64_t lm_head_scratch_mb =
      BackendConfig{}.lm_head_scratch_bytes >> 20;  // --lm_head_scratch_mb, into backend.lm_head_scratch_bytes
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
