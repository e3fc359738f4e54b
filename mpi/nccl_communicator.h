// Communicator over device buffers with NCCL, created from MPI (rank 0 makes the unique id, MPI
// broadcasts it). Collectives run on a communication stream of their own, ordered against the
// compute stream with events: start_* makes the communication stream wait for the work enqueued
// so far, and CommRequest::wait() makes the compute stream wait for the collective without
// blocking the host. A watchdog thread polls NCCL's asynchronous errors and every collective's
// deadline; on failure it aborts the communicator, so nothing hangs, and the next call on this
// communicator returns an error naming the rank and the operation (the fatal path then ends the
// job with MPI_Abort).
//
// Without CUDA/NCCL in the build, create() returns an error.
#pragma once

#include <mpi.h>

#include <chrono>
#include <memory>

#include "mpi/communicator.h"

namespace glm {

// Collective over all ranks of `comm` (every rank calls it), each on CUDA device `device`;
// compute_stream is the cudaStream_t the collectives are ordered against.
Result<std::unique_ptr<Communicator>> make_nccl_communicator(MPI_Comm comm, int device, void* compute_stream,
                                                             std::chrono::duration<double> timeout);

}  // namespace glm
