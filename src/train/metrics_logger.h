// Rank 0's training log: one console line per logging step and the same record in logging.jsonl.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "base/progress.h"
#include "base/status.h"
#include "io/tensorboard.h"
#include "train/run_health.h"

namespace glm {

struct StepMetrics {
  int64_t step = 0;  // 1-based, after the update
  int64_t max_steps = 0;
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double tokens_per_second = 0;
  double elapsed_seconds = 0;
  double eta_seconds = 0;
  int64_t tokens = 0;               // global tokens of this step
  double step_seconds = 0;          // rank 0's wall time of this step
  double exposed_comm_seconds = 0;  // of which waiting on collectives
  int64_t device_memory_bytes = -1;  // rank 0's device memory in use; -1 on CPU
  int64_t host_memory_bytes = -1;    // rank 0's resident host memory; -1 where unknown
  double model_tflops = 0;           // model FLOPs a second per GPU (train/model_flops.h) over the interval
  double mfu = -1;                   // of the GPU's dense bf16 peak (Backend::bf16_peak); -1: no peak known
  RanksReport ranks;                 // every rank's busy time and GPU health (train/run_health.h)
};

class MetricsLogger {
 public:
  // Inactive (prints and writes nothing) unless enabled; output_dir empty = console only.
  // tensorboard: every record's numbers also go to TensorBoard event files in output_dir/runs
  // (io/tensorboard.h; the tag train/<key>, or eval/<key> for eval_<key>), and args.json as text.
  static Result<MetricsLogger> open(const std::string& output_dir, bool enabled, bool tensorboard = false);
  // Opens logging.jsonl before the first record: a fresh run (resumed_step 0) starts it empty; a run
  // resumed after step N keeps the earlier records of steps <= N (those past N are redone) and
  // appends, as Hugging Face's Trainer keeps its log history through a resume.
  Status begin(int64_t resumed_step);
  Status log(const StepMetrics& m);
  // Validation loss, perplexity (exp of the loss) and token accuracy (argmax of the logits equal to
  // the label, over the eval_tokens target tokens) after `step`: one console line, one jsonl record.
  Status log_eval(int64_t step, int64_t max_steps, double eval_loss, double token_accuracy, int64_t eval_tokens);
  // A checkpoint saved after `step`: "glm_hpc: saved DIR (bytes, seconds, GB/s)" and a jsonl record
  // (save_bytes, save_seconds, save_gb_per_s; GB = 1e9 bytes, as dd counts).
  Status log_save(int64_t step, const std::string& dir, int64_t bytes, double seconds);
  // A step whose update was skipped (train/bad_steps.h): the reason, its batch (the loader's
  // samples [first_sample, end_sample)) and how many in a row; a console line and a jsonl record.
  Status log_skip(int64_t step, int64_t max_steps, const std::string& reason, int64_t first_sample, int64_t end_sample,
                  int64_t consecutive);
  void print(const std::string& line) const;

 private:
  Status write_record(const nlohmann::json& record);
  // A per-rank array's TensorBoard scalars (kTensorBoardRankTags).
  Status rank_scalars(const std::string& tag, int64_t step, const nlohmann::json& by_rank);
  Status begin_jsonl(int64_t resumed_step);
  bool enabled_ = false;
  std::ofstream jsonl_;
  std::string path_;
  std::string args_path_, tensorboard_dir_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
};

// The TensorBoard tag of a logging.jsonl key: eval/<rest> for eval_<rest>, else train/<key>.
std::string tensorboard_tag(const std::string& key);

// logging.jsonl's per-rank keys (gpu_*) hold an array by rank; TensorBoard gets <tag>/rank<r> for
// each rank up to this many ranks, <tag>/min and <tag>/max beyond.
inline constexpr size_t kTensorBoardRankTags = 16;

}  // namespace glm
