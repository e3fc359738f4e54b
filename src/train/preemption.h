// Preemption: SIGUSR1 (what slurm/*.sh forward when Slurm's --signal=B:USR1@N fires before the
// time limit) and SIGTERM only set a flag; the training loop asks every rank once per step, and
// when any rank got one, all save a checkpoint at the same step and exit with kPreemptedExitCode.
#pragma once

#include <string>

#include "mpi/communicator.h"
#include "base/status.h"

namespace glm {

// EX_TEMPFAIL from sysexits.h ("try again later"): slurm/*.sh requeue the job on exactly this code.
inline constexpr int kPreemptedExitCode = 75;

// Installs the SIGUSR1 and SIGTERM handlers (SA_RESTART, so interrupted file I/O carries on).
// Called once, early, by the train command: a signal that arrives before the first step is kept.
Status install_preemption_handlers();

// The signal this process received since the last clear (0: none). Async-signal-safe flag.
int received_preemption_signal();
void clear_preemption_signal();

// Collective over the host communicator (one int all-reduced with max): the signal number if any
// rank received one, else 0. Every rank gets the same answer, so all stop after the same step.
Result<int> agree_on_preemption(Communicator& comm);

// "SIGUSR1", "SIGTERM", or "signal N".
std::string preemption_signal_name(int signal_number);

}  // namespace glm
