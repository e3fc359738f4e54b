// The data-parallel training loop: accumulation, global loss normalisation, gradient all-reduce
// through the Communicator, clipping, AdamW, LR schedule, metrics.
#pragma once

#include <functional>
#include <vector>

#include "data/dataset.h"
#include "model/backend.h"
#include "model/param_init.h"
#include "model/param_layout.h"
#include "mpi/communicator.h"
#include "train/train_config.h"

namespace glm {

struct TrainSummary {
  std::vector<double> losses;      // global mean target-token loss per optimizer step
  std::vector<double> grad_norms;  // before clipping
  int64_t steps = 0;
  double parameter_checksum = 0;                        // sum of squares of the final parameters (equal on every rank)
  std::vector<std::pair<int64_t, double>> eval_losses;  // (step, mean validation loss)
  std::vector<std::pair<int64_t, int64_t>> eval_correct;  // (step, target tokens whose argmax is the label)
  std::vector<int64_t> skipped_steps;  // steps whose update was skipped (train/bad_steps.h)
  int preempted_by = 0;  // the signal that stopped the run after `steps` steps (0: it ran to the end)
};

// Number of optimizer steps the run makes (max_steps or epochs x epoch_size / global batch), where
// epoch_size counts the loader's units: samples, or packed rows with --packing. More samples in all
// than the loader's int64 stream numbers is a user error naming --max_steps or --num_train_epochs.
Result<int64_t> total_training_steps(const TrainConfig& config, int64_t epoch_size, int world_size);

class TrainingEngine;
struct EvalResult;
// Writes the starting weights into the engine (HF import); empty = random initialisation.
using WeightLoader = std::function<Status(TrainingEngine&)>;

// validation (optional) is evaluated every config.eval_steps steps and after the last one.
// data_comm (optional) moves parameters and gradients (NCCL between GPUs); comm does the rest.
Result<TrainSummary> train(const TrainConfig& config, const Dataset& dataset, Communicator& comm, Backend& backend,
                           const WeightLoader& load_weights = {}, const Dataset* validation = nullptr,
                           Communicator* data_comm = nullptr);

// The run's ZeRO options with --reduce_bucket_size auto resolved (zero/bucket_autotune.h): from
// --comm_profile, or measured on `data` now (every rank calls it); printed on rank 0.
Result<ZeroOptions> resolve_zero_options(const TrainConfig& config, Communicator& comm, Communicator& data,
                                         Backend& backend);

// Mean loss of every sample of `data`, spread over the ranks of comm in batches of per_device
// samples. The ranks agree on the stop flag before each batch: a stop by signal is an
// ErrorKind::stopped status on every rank alike.
Result<EvalResult> evaluate_dataset(TrainingEngine& engine, const Dataset& data, int64_t per_device,
                                    Communicator& comm);

}  // namespace glm
