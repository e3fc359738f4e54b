// glm_hpc infer (ms-swift's `swift infer`): generation from a model opened by cli/model_source.h.
// Batch mode (--val_dataset FILE...): the prompts are split over the ranks, each rank generating
// with its own copy of the model, and rank 0 writes one jsonl file in input order
// (--result_path, else infer_result/<time>.jsonl beside the checkpoint or in the working
// directory): each prompt's messages, response, reference (labels), token counts, finish reason
// and timings. Without --val_dataset: an interactive chat on one process, replies streamed.
//
// The phases are separate so that every rank can agree on each one's outcome before the next
// (main.cpp settles them): prepare, generate this rank's share, gather and write.
#pragma once

#include <mpi.h>

#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "cli/model_source.h"
#include "cli/options.h"
#include "data/infer_prompts.h"
#include "model/backend.h"
#include "mpi/local_communicator.h"
#include "mpi/runtime.h"
#include "train/cached_generator.h"
#include "train/generate.h"

namespace glm {

// Batch mode's results on rank 0: one jsonl line per prompt in input order, the run's summary and
// the model that answered.
struct InferResults {
  std::vector<std::string> lines;
  std::string summary, model;
};

// The options of --compare_with's model: the same prompts, sampling and result file, that model.
Result<CliOptions> comparison_options(const CliOptions& options);
// --result_path, else infer_result/<time>.jsonl in the --ckpt_dir checkpoint or the working directory.
Result<std::string> result_path_of(const CliOptions& options);

// The new tokens one forward takes (the engine's max_tokens): at least 8192 (or the whole cache),
// and the longest prompt whole, so that its attention is one causal pass and its GEMMs the largest;
// halved down to 512 while the activations (Glm4Model::planned_activation_bytes, forward only, of
// act and stats bytes an element) do not fit in `free` bytes of device memory (-1: no bound) beside
// the weights, the KV cache of `batch` sequences of `per_sequence` tokens, a decode step's f32
// logits and kForwardReserve; never
// fewer than `batch` (a decode step of every sequence). A user error, with the sizes, where the
// weights, those activations and one sequence's cache exceed `free`.
inline constexpr int64_t kForwardReserve = int64_t{1} << 30;  // cuBLASLt's workspace, CUDA graphs
Result<int64_t> forward_tokens(const ModelConfig& config, int64_t free, int64_t act, int64_t stats, int64_t longest,
                               int64_t per_sequence, int64_t batch, int64_t beams = 1);

class InferJob {
 public:
  // Opens the model and tokenizer, reads the prompts (all of them, on every rank: the same
  // messages everywhere), creates this rank's engine and loads the weights.
  static Result<std::unique_ptr<InferJob>> prepare(const CliOptions& options, const ProcessInfo& proc,
                                                   Backend& backend);
  ~InferJob();

  bool interactive() const { return options_.val_datasets.empty(); }
  // What rank 0 prints before generating: the model, the sampling, the prompts and their split.
  std::string describe() const;
  // Batch mode: this rank's prompts (every world_size-th from its rank), --max_batch_size at once.
  Status generate_share();
  // Batch mode, collective: the results to rank 0 (empty elsewhere).
  Result<InferResults> gather(MPI_Comm comm);
  // Rank 0: the result file (--result_path, else infer_result/<time>.jsonl); says where.
  Result<std::string> write(const std::vector<std::string>& lines) const;
  // Rank 0, --compare_with: the blinded side-by-side file (each line's response_a and response_b
  // in a seeded random order), its Markdown table for scoring, the key apart (<stem>.key.json) and
  // each model's own results (<stem>.model.jsonl, <stem>.compare_with.jsonl).
  Result<std::string> write_comparison(const InferResults& model, const InferResults& compared) const;
  // Interactive: lines from `in` are user turns of one conversation until "exit", "quit" or the
  // end of input; "clear" starts a new conversation. Replies are written to `out` as they grow.
  Status chat(std::istream& in, std::ostream& out);

 private:
  InferJob(const CliOptions& options, const ProcessInfo& proc) : options_(options), proc_(proc) {}
  Result<std::string> result_path() const;
  // The engine (forward only, of up to forward_tokens() new tokens) and the generator over a KV
  // cache for `batch` sequences of up to `per_sequence` rows (beams together), as large as the device's free memory
  // allows; `longest`: the longest prompt (0 in a chat).
  Status create_generator(Backend& backend, int64_t longest, int64_t per_sequence, int64_t batch);
  std::string result_line(size_t index, const Generation& g) const;

  CliOptions options_;
  ProcessInfo proc_;
  std::optional<ModelSource> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  GenerationOptions generation_;
  std::string sampling_source_;  // where the sampling settings came from, for describe()
  std::vector<InferPrompt> prompts_;
  LocalCommunicator comm_;  // each rank runs a whole model of its own
  std::unique_ptr<TrainingEngine> engine_;
  std::unique_ptr<CachedGenerator> generator_;
  std::vector<std::pair<size_t, std::string>> lines_;  // this rank's results: prompt index, jsonl line
  double generate_seconds_ = 0;
};

}  // namespace glm
