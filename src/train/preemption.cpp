// Signal flag for preemption and the per-step agreement on it.
#include "train/preemption.h"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstring>

namespace glm {
namespace {

// Lock-free, hence safe to store from a signal handler.
std::atomic<int> g_received_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_preemption_signal(int signal_number) {
  g_received_signal.store(signal_number, std::memory_order_relaxed);
}

}  // namespace

Status install_preemption_handlers() {
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = on_preemption_signal;
  action.sa_flags = SA_RESTART;
  if (sigemptyset(&action.sa_mask) != 0) return GLM_INTERNAL_ERROR("sigemptyset failed: ", std::strerror(errno));
  for (int signal_number : {SIGUSR1, SIGTERM}) {
    if (sigaction(signal_number, &action, nullptr) != 0)
      return GLM_INTERNAL_ERROR("sigaction(", preemption_signal_name(signal_number),
                                ") failed: ", std::strerror(errno));
  }
  return Status::ok();
}

int received_preemption_signal() { return g_received_signal.load(std::memory_order_relaxed); }

void clear_preemption_signal() { g_received_signal.store(0, std::memory_order_relaxed); }

Result<int> agree_on_preemption(Communicator& comm) {
  const int32_t mine = received_preemption_signal();
  int32_t agreed = 0;
  GLM_RETURN_IF_ERROR(comm.all_reduce(&mine, &agreed, 1, CommType::i32, ReduceOp::max));
  return static_cast<int>(agreed);
}

std::string preemption_signal_name(int signal_number) {
  if (signal_number == SIGUSR1) return "SIGUSR1";
  if (signal_number == SIGTERM) return "SIGTERM";
  return concat("signal ", signal_number);
}

}  // namespace glm
