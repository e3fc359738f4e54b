// The stop flag and its signal handlers.
#include "base/stop_signal.h"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>

namespace glm {
namespace {

// Lock-free, hence safe to store from a signal handler.
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_stop_signal(int signal_number) { g_stop_signal.store(signal_number, std::memory_order_relaxed); }

}  // namespace

Status install_stop_handlers() {
  for (int signal_number : {SIGUSR1, SIGTERM, SIGINT}) {
    struct sigaction action;
    std::memset(&action, 0, sizeof(action));
    action.sa_handler = on_stop_signal;
    // A second Ctrl-C is the user insisting: the default action, at once.
    action.sa_flags = SA_RESTART | (signal_number == SIGINT ? SA_RESETHAND : 0);
    if (sigemptyset(&action.sa_mask) != 0) return GLM_INTERNAL_ERROR("sigemptyset failed: ", std::strerror(errno));
    if (sigaction(signal_number, &action, nullptr) != 0)
      return GLM_INTERNAL_ERROR("sigaction(", signal_name(signal_number), ") failed: ", std::strerror(errno));
  }
  return Status::ok();
}

int stop_signal() { return g_stop_signal.load(std::memory_order_relaxed); }

void request_stop(int signal_number) { on_stop_signal(signal_number); }

void clear_stop_signal() { g_stop_signal.store(0, std::memory_order_relaxed); }

std::string signal_name(int signal_number) {
  if (signal_number == SIGUSR1) return "SIGUSR1";
  if (signal_number == SIGTERM) return "SIGTERM";
  if (signal_number == SIGINT) return "SIGINT";
  return concat("signal ", signal_number);
}

Status stopped_status(std::string_view doing, int signal_number) {
  return Status::error(ErrorKind::stopped, concat("stopped by ", signal_name(signal_number), " ", doing));
}

}  // namespace glm
