// Stops asked for by a signal: SIGTERM (Slurm's scancel and time limit, `timeout`), SIGUSR1 (what
// slurm/*.sh forward before the time limit) and SIGINT (Ctrl-C) only set a flag. The long loops
// (reading and tokenizing datasets, hashing them, writing shards, evaluation, the training steps)
// poll it and return a Status of ErrorKind::stopped, removing their temporary files on the way out;
// training first saves a checkpoint (train/preemption.h). A second SIGINT ends the process at once.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"

namespace glm {

// Installs the handlers (SA_RESTART, so interrupted file I/O carries on). Called once, early, by the
// commands that poll the flag (train, eval, prepare); the others keep the default actions.
Status install_stop_handlers();

// The signal received since the last clear (0: none). A lock-free load: cheap enough per sample.
int stop_signal();
// What a handler does (async-signal-safe); tests call it to stop a loop.
void request_stop(int signal_number);
void clear_stop_signal();

// "SIGTERM", "SIGUSR1", "SIGINT", or "signal N".
std::string signal_name(int signal_number);

// ErrorKind::stopped with "stopped by SIGTERM <doing>", e.g. doing = "while tokenizing 'a.jsonl'";
// the signal is this process's, or the one the ranks agreed on.
Status stopped_status(std::string_view doing, int signal_number = stop_signal());

}  // namespace glm
