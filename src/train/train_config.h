// Everything a training run needs, filled from the options (cli) or directly by tests.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/enum_names.h"
#include "data/dataset.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/recompute.h"
#include "train/bad_steps.h"
#include "train/lr_schedule.h"
#include "zero/zero_options.h"

namespace glm {

// --train_type: every parameter trained, or the base frozen and LoRA adapters trained (model/lora.h).
enum class TrainType { full, lora };
// --save_strategy: a checkpoint every save_steps and at the end, or none.
enum class SaveStrategy { steps, no };
// --offload_optimizer (DeepSpeed's zero_optimization.offload_optimizer.device): where the optimizer
// state lives (train/optimizer_offload.h).
enum class OffloadDevice { none, cpu };

template <>
struct EnumNames<OffloadDevice> {
  static constexpr std::pair<OffloadDevice, std::string_view> table[] = {{OffloadDevice::none, "none"},
                                                                         {OffloadDevice::cpu, "cpu"}};
};

template <>
struct EnumNames<TrainType> {
  static constexpr std::pair<TrainType, std::string_view> table[] = {{TrainType::full, "full"},
                                                                     {TrainType::lora, "lora"}};
};
template <>
struct EnumNames<SaveStrategy> {
  static constexpr std::pair<SaveStrategy, std::string_view> table[] = {{SaveStrategy::steps, "steps"},
                                                                        {SaveStrategy::no, "no"}};
};

struct TrainConfig {
  ModelConfig model;
  TrainType train_type = TrainType::full;
  LoraConfig lora;         // used when train_type is lora
  std::string base_model;  // --model_id_or_path (LoRA checkpoints name their base); empty: random init
  std::vector<std::string> datasets;
  int64_t max_length = 512;
  Truncation truncation_strategy = Truncation::remove;  // samples over max_length
  OnBadSample on_bad_sample = OnBadSample::error;
  LossScale loss_scale = LossScale::assistant;
  std::string system;  // default system prompt for conversations without one
  // Bin-pack samples into rows of max_length (src/data/packing.h); a row then counts as a sample.
  bool packing = false;
  int64_t per_device_train_batch_size = 1;
  int64_t gradient_accumulation_steps = 1;
  int64_t max_steps = -1;  // > 0 overrides num_train_epochs
  double num_train_epochs = 1.0;
  double learning_rate = 1e-4;
  double weight_decay = 0.0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_epsilon = 1e-8;
  double max_grad_norm = 1.0;  // <= 0 disables clipping
  BadStepOptions bad_steps{};   // --skip_nonfinite_steps, --skip_*_zscore, --max_skipped_steps
  GradientFault gradient_fault{};  // a test hook: no option sets it
  // A test hook (no option sets it): rank slow_rank sleeps slow_rank_seconds in each of its steps,
  // a straggler for train/run_health.h to name.
  int slow_rank = -1;
  double slow_rank_seconds = 0;
  bool report_tensorboard = false;  // --report_to tensorboard: event files in output_dir/runs (rank 0)
  bool log_gpu_health = true;       // NVML's utilisation, power, temperature and clocks in each log line
  double warmup_ratio = 0.0;
  int64_t warmup_steps = 0;
  LrSchedulerType lr_scheduler_type = LrSchedulerType::cosine;
  uint64_t seed = 42;
  int64_t logging_steps = 1;
  int64_t eval_steps = 0;  // evaluate the validation set every N steps (and at the end); 0 = never
  int64_t per_device_eval_batch_size = 8;
  int zero_stage = 0;                     // DeepSpeed's ZeRO stages 0-3 (src/zero/zero_engine.h)
  int context_parallel_size = 1;          // ranks sharing each row (src/data/context_split.h)
  Recompute recompute = Recompute::none;  // activation recomputation (src/model/recompute.h)
  bool offload_activations = false;        // layer inputs in pinned host memory (src/model/residual_stash.h)
  ZeroOptions zero_options;               // buckets, overlap, reduce dtype (src/zero/zero_options.h)
  std::string comm_profile;               // bench_comm JSON for --reduce_bucket_size auto; empty: measure at start
  std::string output_dir;                 // empty: no files (tests)
  SaveStrategy save_strategy = SaveStrategy::steps;
  int64_t save_steps = 500;
  bool save_only_model = false;        // checkpoints hold the weights only (no Adam moments): no full resume
  int64_t save_total_limit = -1;       // keep at most this many checkpoints (<= 0: all)
  std::string resume_from_checkpoint;  // a checkpoint directory or "latest" (in output_dir)
  bool resume_only_model = false;      // from that checkpoint the weights only: fresh optimizer, step 0, data start
  std::string tokenizer;               // the tokenizer's path and content hash, recorded in checkpoints
  std::string tokenizer_hash;          // (empty: none; resuming with a different hash is refused)
  bool log_to_console = true;
  // Optimizer placement and state (--optimizer_in_backward, --split_master_weights,
  // --defer_embedding_rows): the same arithmetic either way, different speed and memory.
  bool optimizer_in_backward = true;
  bool split_master_weights = true;
  int defer_embedding_rows = 64;  // most optimizer steps an unread embedding row's update may lag; 0: none
  OffloadDevice offload_optimizer = OffloadDevice::none;
  OffloadDevice offload_param = OffloadDevice::none;  // --offload_param (ZeRO-3's parameter shards)
  bool offload_pin_memory = true;
  bool offload_delayed_update = false;  // --offload_delayed_update (OffloadConfig::delayed_update)
  int64_t offload_delayed_update_after = 40;  // --offload_delayed_update_after
  bool offload_gradients = true;              // --offload_gradients (ZeroOptions::offload_grads where it applies)
  int offload_threads = 0;  // host threads of this rank's offloaded updates; 0: 1 (the CLI resolves its auto)
};

}  // namespace glm
