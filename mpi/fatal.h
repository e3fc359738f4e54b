// The one fatal path: print rank, host, file:line and reason, run abort hooks, MPI_Abort.
#pragma once

#include <functional>
#include <string>

#include "base/status.h"

namespace glm {

// Called before MPI_Abort so that NCCL communicators can be aborted (registered by their owners).
void register_abort_hook(std::function<void()> hook);

[[noreturn]] void fatal(const char* file, int line, const std::string& reason, int exit_code = 1);

// Ends the job from a Status that nobody above can handle.
[[noreturn]] void fatal_status(const Status& status);

// Rank/host prefix used in every message that may come from any rank: "rank 1/4 (host)".
std::string rank_prefix();

// Routes what would otherwise end a rank with a bare abort through the fatal path: an uncaught
// exception (std::terminate) prints rank, host, where it was thrown, the exception and a backtrace,
// then ends the job as fatal() does; SIGSEGV, SIGBUS, SIGFPE and SIGABRT print rank, host, the
// signal and a backtrace, then end the process by that signal (the launcher then ends the job).
// Called once per process by MpiRuntime, after MPI_Init (which installs handlers of its own).
void install_fatal_handlers();

}  // namespace glm

#define GLM_FATAL(...) ::glm::fatal(__FILE__, __LINE__, ::glm::concat(__VA_ARGS__))

#define GLM_CHECK(cond, ...)                                                                               \
  do {                                                                                                     \
    if (!(cond)) ::glm::fatal(__FILE__, __LINE__, ::glm::concat("check failed: " #cond " ", __VA_ARGS__)); \
  } while (0)

#define GLM_CHECK_OK(expr)                                      \
  do {                                                          \
    ::glm::Status glm_status_ = (expr);                         \
    if (!glm_status_.is_ok()) ::glm::fatal_status(glm_status_); \
  } while (0)
