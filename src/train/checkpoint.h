// Sharded checkpoints: <output_dir>/checkpoint-<step>/ holds one HDF5 file per rank with that
// rank's slices of the fp32 master weights and Adam moments, unit by unit, each slice located by
// its offset from the unit's start (offsets inside a unit do not depend on the world size, so a
// checkpoint resumes at any world size and ZeRO stage). Units and offsets are those of the layout
// without persistent tensors: under ZeRO-3 with --param_persistence_threshold a rank's part of a
// unit is several runs (version 3, attribute `ranges`), so the threshold may change on resume too.
// Plus meta.json and a COMPLETE marker written last. The directory is assembled under a temporary
// name and renamed into place once every rank finished; <output_dir>/latest names the newest
// complete checkpoint.
//
// Rank files are written by io/checkpoint_file.h (contiguous datasets, O_DIRECT from a writer
// thread overlapping the GPU->host copies, CRC32C per 8 MiB block verified on every read, one
// fdatasync); version-1 checkpoints (chunked with Fletcher-32) still load.
//
// meta.json also records the evaluation: the eval loss at the checkpoint's step (if evaluated) and
// the best eval loss of the run so far with its step and checkpoint; pruning keeps that checkpoint.
// It records the tokenizer (path and content hash) too: resuming with another one is refused.
// With --save_only_model the files hold the master weights alone (meta.json: "model_only": true):
// export and a weights-only resume read them; a full resume is refused.
//
// LoRA checkpoints (train_type "lora" in meta.json) hold only what is trained: the adapters' fp32
// master weights and Adam moments in one file, adapters.h5, that rank 0 writes (the adapters and
// their optimizer are replicated, bit-identical on every rank; every rank reads the whole file on
// resume, at any world size and ZeRO stage). meta.json names the LoRA configuration (rank, alpha,
// dropout, targets) and the base: --model_id_or_path or random init with its seed, its configuration, and the
// sum of squares of its weights as a fingerprint. Resuming with another base or LoRA configuration
// (rank, alpha, targets), or a LoRA checkpoint in full training (and the reverse), is refused naming
// the field; another --lora_dropout is allowed, as in HF/ms-swift (it changes no adapter shape).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>

#include "mpi/communicator.h"
#include "train/engine.h"

namespace glm {

// One evaluation of the validation set; checkpoint names the directory saved at that step
// ("checkpoint-<step>"), empty when none was.
struct EvalRecord {
  int64_t step = 0;
  double loss = 0;
  std::string checkpoint;
};

struct CheckpointState {
  int64_t step = 0;              // optimizer steps taken
  int64_t consumed_samples = 0;  // loader position: samples (or packed rows) consumed
  uint64_t seed = 0;
  std::string tokenizer;       // what tokenized the data (its path) and its content hash; empty: none
  std::string tokenizer_hash;
  std::optional<double> eval_loss;  // at this step, when the validation set was evaluated at it
  std::optional<EvalRecord> best;   // the lowest eval loss so far; its checkpoint is never pruned
  std::string base_model;           // LoRA: the base's --model_id_or_path; empty: random init with `seed`
  bool model_only = false;          // --save_only_model: the weights without the Adam moments
};

struct SaveReport {
  std::string dir;     // the published checkpoint directory
  int64_t bytes = 0;   // all ranks' files together
  double seconds = 0;  // wall time of the collective save, publication included
};

// Collective: every rank writes its file; rank 0 writes meta.json, the marker, renames the
// directory, points latest at it and prunes to save_total_limit (<= 0 keeps all; never the
// newest, nor state.best's checkpoint, as Hugging Face's Trainer keeps its best model).
Result<SaveReport> save_checkpoint(TrainingEngine& engine, Communicator& comm, const std::string& output_dir,
                                   const CheckpointState& state, int64_t save_total_limit);

// "latest" (inside output_dir) or a checkpoint directory -> the directory, checked complete.
// `option` names the option in messages.
Result<std::string> resolve_checkpoint(const std::string& spec, const std::string& output_dir,
                                       const std::string& option = "--resume_from_checkpoint");

// What a resuming run expects of a checkpoint beyond its model's shape.
struct ResumeExpectation {
  std::string tokenizer;       // this run's tokenizer (its path) and content hash: a checkpoint that
  std::string tokenizer_hash;  // records another hash is refused; empty: not checked
  bool weights_only = false;   // --resume_only_model: moments stay zero, the optimizer at step 0
  // LoRA: this run's base (--model_id_or_path, empty: random init with base_seed). A pretrained base is
  // matched by its weights' fingerprint (the path may move), a random one by its seed as well.
  std::string base_model;
  uint64_t base_seed = 0;
};

// Collective: validates meta.json against the engine's model (and the tokenizer), reads the slices
// this rank owns from whichever rank files hold them, restores the optimizer (weights_only: only the
// master weights) and the parameters. Returns the saved state.
Result<CheckpointState> load_checkpoint(TrainingEngine& engine, Communicator& comm, const std::string& dir,
                                        const ResumeExpectation& expect = {});

// Relative tolerance of the base fingerprint (meta.json's base.sum_squares): the sum is taken in
// another order at another world size or ZeRO stage, and on GPUs per thread in fp32.
inline constexpr double kLoraBaseFingerprintTolerance = 1e-5;
bool lora_base_fingerprint_matches(double recorded, double computed);

// What a LoRA checkpoint's meta.json says of its adapters and of the base they were trained on.
struct LoraCheckpointInfo {
  LoraConfig config;
  std::string base_model;  // base.model_id_or_path; empty: random init with random_init_seed
  uint64_t random_init_seed = 0;
  double base_sum_squares = 0;  // the base weights' fingerprint
};

// A checkpoint as one process reads it without an engine or communicator (glm_hpc export).
struct CheckpointInfo {
  std::string dir;
  ModelConfig config;  // the whole model configuration, validated against the saved layout
  int world_size = 0;
  int zero_stage = 0;
  int64_t step = 0;
  std::string tokenizer;  // what tokenized the training data (meta.json's path, "bytes"); empty: unknown
  nlohmann::json args;    // the run's args.json ({"command", "options"}); null when there is none
  std::optional<LoraCheckpointInfo> lora;  // train_type lora: adapters only, no rank files
};
// Reads meta.json (and args.json: the checkpoint's own, else its output directory's).
Result<CheckpointInfo> read_checkpoint_info(const std::string& dir);
// Reassembles the fp32 master weights from every rank file (any world size and ZeRO stage), one
// unit at a time in layout order: sink gets each unit's elements laid out as ParamLayout(config, 1)
// lays them out, relative to the unit's offset. Missing, overlapping or unreadable slices are user
// errors naming the file. A LoRA checkpoint holds no base weights: a user error.
Status read_checkpoint_masters(const CheckpointInfo& info,
                               const std::function<Status(int unit, std::span<const float> values)>& sink);
// A LoRA checkpoint's fp32 adapter master weights (adapters.h5), laid out as
// LoraLayout(info.config, info.lora->config).
Result<std::vector<float>> read_checkpoint_adapters(const CheckpointInfo& info);

}  // namespace glm
