// Preemption: SIGUSR1 (what slurm/*.sh forward when Slurm's --signal=B:USR1@N fires before the
// time limit), SIGTERM and SIGINT only set the stop flag (base/stop_signal.h); the training loop
// asks every rank once per step, and when any rank got one, all save a checkpoint at the same step
// and exit with kPreemptedExitCode.
#pragma once

#include "base/status.h"
#include "base/stop_signal.h"
#include "mpi/communicator.h"

namespace glm {

// The code of every stop by signal (base/status.h): slurm/*.sh requeue the job on exactly this code.
inline constexpr int kPreemptedExitCode = kStoppedExitCode;

// Collective over the host communicator (one int all-reduced with max): the signal number if any
// rank received one, else 0. Every rank gets the same answer, so all stop after the same step.
Result<int> agree_on_preemption(Communicator& comm);

}  // namespace glm
