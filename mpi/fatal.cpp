// The fatal path shared by every rank; see DESIGN.md decision 5.
#include "mpi/fatal.h"

#include <cxxabi.h>
#include <execinfo.h>
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <typeinfo>
#include <vector>

namespace glm {
namespace {
std::mutex& hooks_mutex() {
  static std::mutex m;
  return m;
}
std::vector<std::function<void()>>& hooks() {
  static std::vector<std::function<void()>> h;
  return h;
}

// Set once the fatal path runs: an abort raised inside MPI_Abort is no new failure to report.
std::atomic<bool> g_dying{false};
static_assert(std::atomic<bool>::is_always_lock_free);

constexpr int kMaxFrames = 64;

std::string demangle(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return status == 0 && name != nullptr ? std::string(name.get()) : std::string(mangled);
}

// The function of a backtrace_symbols line "binary(mangled+0x1c) [0x...]", demangled; empty when
// the binary does not export its name.
std::string frame_function(const char* line) {
  const char* open = std::strchr(line, '(');
  const char* plus = open != nullptr ? std::strchr(open, '+') : nullptr;
  if (plus == nullptr || plus == open + 1) return "";
  return demangle(std::string(open + 1, plus).c_str());
}

struct Backtrace {
  std::vector<std::string> lines;  // "#4 glm::f(int)", or "#4 glm_hpc(+0x1c2f)" where unnamed
  // Where the exception was thrown: past the C++ runtime's throw and terminate frames, the first of
  // glm_hpc's own functions (without its parameters), else the first frame at all ("binary(+offset)"
  // when unnamed, for addr2line).
  std::string thrower;
};

bool in_cxx_runtime(const std::string& line) {
  return line.find("libstdc++") != std::string::npos || line.find("libgcc_s") != std::string::npos;
}

std::string without_parameters(const std::string& function) {
  const size_t open = function.find('(');
  return open == std::string::npos || open == 0 ? function : function.substr(0, open);
}

Backtrace backtrace_here() {
  void* frames[kMaxFrames];
  const int n = backtrace(frames, kMaxFrames);
  std::unique_ptr<char*, void (*)(void*)> symbols(backtrace_symbols(frames, n), std::free);
  Backtrace bt;
  if (symbols == nullptr) return bt;
  bool past_runtime = false;
  std::string first_past_runtime;
  for (int i = 0; i < n; ++i) {
    const std::string line = symbols.get()[i];
    const std::string function = frame_function(line.c_str());
    // A named frame shows its (shortened) name; an unnamed one binary(+offset) for addr2line.
    constexpr size_t kMaxName = 160;
    const std::string shown = function.empty()             ? line.substr(0, line.find(" ["))
                              : function.size() > kMaxName ? function.substr(0, kMaxName) + "..."
                                                           : function;
    bt.lines.push_back(concat("#", i, " ", shown));
    if (in_cxx_runtime(line)) {
      past_runtime = true;
    } else if (past_runtime) {
      if (first_past_runtime.empty()) first_past_runtime = shown;
      if (bt.thrower.empty() && function.rfind("glm::", 0) == 0) bt.thrower = without_parameters(function);
    }
  }
  if (bt.thrower.empty()) bt.thrower = first_past_runtime;
  return bt;
}

[[noreturn]] void die(const std::string& where, const std::string& reason, int exit_code,
                      const Backtrace* bt = nullptr) {
  g_dying.store(true);
  const std::string who = rank_prefix();
  std::fprintf(stderr, "glm_hpc: fatal: %s at %s: %s\n", who.c_str(), where.c_str(), reason.c_str());
  if (bt != nullptr && !bt->lines.empty()) {
    std::fprintf(stderr, "glm_hpc: backtrace of %s (name a frame: addr2line -C -f -e BINARY +OFFSET):\n", who.c_str());
    for (const std::string& line : bt->lines) std::fprintf(stderr, "  %s\n", line.c_str());
  }
  std::fflush(stderr);
  std::vector<std::function<void()>> to_run;
  {
    std::lock_guard<std::mutex> lock(hooks_mutex());
    to_run.swap(hooks());
  }
  for (auto& hook : to_run) hook();
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

// std::terminate's handler: an exception nobody caught, or a noexcept function that threw.
[[noreturn]] void on_terminate() {
  static std::atomic<bool> entered{false};
  if (entered.exchange(true)) std::_Exit(1);  // the fatal path itself failed: nothing more to say
  std::string reason = "std::terminate called without an active exception";
  if (const std::exception_ptr current = std::current_exception()) {
    const std::type_info* type = abi::__cxa_current_exception_type();
    const std::string type_name = type != nullptr ? demangle(type->name()) : std::string("?");
    try {
      std::rethrow_exception(current);
    } catch (const std::exception& e) {
      reason = concat("uncaught exception ", type_name, ": ", e.what());
    } catch (...) {
      reason = concat("uncaught exception of type ", type_name);
    }
  }
  const Backtrace bt = backtrace_here();
  die(bt.thrower.empty() ? std::string("?") : bt.thrower, reason, 1, &bt);
}

// What the signal handler writes, prepared at installation: it may call only async-signal-safe
// functions (write, backtrace_symbols_fd), so no formatting, MPI or allocation happens there.
char g_signal_prefix[512];
alignas(16) char g_alternate_stack[64 * 1024];  // a stack overflow's SIGSEGV still gets its message

void write_text(const char* text) {
  size_t left = std::strlen(text);
  while (left > 0) {
    const ssize_t wrote = write(STDERR_FILENO, text, left);
    if (wrote <= 0) return;
    text += wrote;
    left -= static_cast<size_t>(wrote);
  }
}

void write_hex(uintptr_t value) {
  char text[2 + 2 * sizeof(value) + 1];
  char* end = text + sizeof(text) - 1;
  *end = '\0';
  char* p = end;
  do {
    *--p = "0123456789abcdef"[value & 0xf];
    value >>= 4;
  } while (value != 0);
  *--p = 'x';
  *--p = '0';
  write_text(p);
}

const char* signal_text(int signal_number) {
  switch (signal_number) {
    case SIGSEGV:
      return "SIGSEGV (invalid memory access)";
    case SIGBUS:
      return "SIGBUS (bus error)";
    case SIGFPE:
      return "SIGFPE (arithmetic fault)";
    case SIGABRT:
      return "SIGABRT (abort)";
    default:
      return "a fatal signal";
  }
}

extern "C" void on_fatal_signal(int signal_number, siginfo_t* info, void*) {
  if (!(signal_number == SIGABRT && g_dying.load())) {
    write_text(g_signal_prefix);
    write_text(" received ");
    write_text(signal_text(signal_number));
    if (signal_number != SIGABRT && info != nullptr) {
      write_text(" at address ");
      write_hex(reinterpret_cast<uintptr_t>(info->si_addr));
    }
    write_text("; backtrace:\n");
    void* frames[kMaxFrames];
    backtrace_symbols_fd(frames, backtrace(frames, kMaxFrames), STDERR_FILENO);
  }
  // SA_RESETHAND restored the default action: the process ends by this signal, which the launcher sees.
  raise(signal_number);
}

}  // namespace

void register_abort_hook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(hooks_mutex());
  hooks().push_back(std::move(hook));
}

std::string rank_prefix() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) {
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    return concat("rank ", rank, "/", size, " (", host, ")");
  }
  return concat("rank ? (", host, ")");
}

void fatal(const char* file, int line, const std::string& reason, int exit_code) {
  const char* base = std::strrchr(file, '/');
  die(concat(base != nullptr ? base + 1 : file, ":", line), reason, exit_code);
}

void fatal_status(const Status& status) {
  std::string where = status.location().empty() ? std::string("?") : status.location();
  auto colon = where.rfind(':');
  std::string file = colon == std::string::npos ? where : where.substr(0, colon);
  int line = colon == std::string::npos ? 0 : std::atoi(where.c_str() + colon + 1);
  fatal(file.c_str(), line, status.message(), status.exit_code());
}

void install_fatal_handlers() {
  std::set_terminate(on_terminate);
  std::snprintf(g_signal_prefix, sizeof(g_signal_prefix), "glm_hpc: fatal: %s", rank_prefix().c_str());
  // The first backtrace() loads the unwinder (it allocates): done here, not in a signal handler.
  void* warm[1];
  backtrace(warm, 1);
  stack_t stack{};
  stack.ss_sp = g_alternate_stack;
  stack.ss_size = sizeof(g_alternate_stack);
  sigaltstack(&stack, nullptr);
  struct sigaction action {};
  action.sa_sigaction = on_fatal_signal;
  action.sa_flags = SA_SIGINFO | SA_RESETHAND | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  // sigaction fails only for invalid signal numbers; these four are valid everywhere.
  for (int signal_number : {SIGSEGV, SIGBUS, SIGFPE, SIGABRT}) sigaction(signal_number, &action, nullptr);
}

}  // namespace glm
