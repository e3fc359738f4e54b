// Sharded checkpoints: <output_dir>/checkpoint-<step>/ holds one HDF5 file per rank with that
// rank's slices of the fp32 master weights and Adam moments, unit by unit, each slice located by
// its offset from the unit's start (offsets inside a unit do not depend on the world size, so a
// checkpoint resumes at any world size and ZeRO stage), plus meta.json and a COMPLETE marker
// written last. The directory is assembled under a temporary name and renamed into place once
// every rank finished; <output_dir>/latest names the newest complete checkpoint.
//
// Datasets are chunked with HDF5's Fletcher-32 checksum, so a damaged file fails to read.
#pragma once

#include <cstdint>
#include <string>

#include "mpi/communicator.h"
#include "train/engine.h"

namespace glm {

struct CheckpointState {
  int64_t step = 0;              // optimizer steps taken
  int64_t consumed_samples = 0;  // loader position: samples (or packed rows) consumed
  uint64_t seed = 0;
};

// Collective: every rank writes its file; rank 0 writes meta.json, the marker, renames the
// directory, points latest at it and prunes to save_total_limit (<= 0 keeps all; never the
// newest). Returns the checkpoint directory.
Result<std::string> save_checkpoint(TrainingEngine& engine, Communicator& comm, const std::string& output_dir,
                                    const CheckpointState& state, int64_t save_total_limit);

// "latest" (inside output_dir) or a checkpoint directory -> the directory, checked complete.
Result<std::string> resolve_checkpoint(const std::string& spec, const std::string& output_dir);

// Collective: validates meta.json against the engine's model, reads the slices this rank owns from
// whichever rank files hold them, restores the optimizer and parameters. Returns the saved state.
Result<CheckpointState> load_checkpoint(TrainingEngine& engine, Communicator& comm, const std::string& dir);

}  // namespace glm
