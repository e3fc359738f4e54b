// The one fatal path catches what would otherwise end a rank with a bare abort: an uncaught
// exception prints rank, host, the exception and a backtrace and exits 1; a fatal signal prints
// rank, host and the signal and still ends the process by that signal.
#include <gtest/gtest.h>

#include <csignal>
#include <stdexcept>
#include <thread>

#include "mpi/fatal.h"

namespace glm::test {
namespace {

// A helper thread's exception (the checkpoint writer's, a loader's) is the common uncaught one.
void throw_in_a_thread() {
  install_fatal_handlers();
  std::thread([] { throw std::runtime_error("shard writer failed"); }).join();
}

TEST(FatalPathDeathTest, UncaughtExceptionGoesThroughTheFatalPath) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(throw_in_a_thread(), testing::ExitedWithCode(1),
              "glm_hpc: fatal: rank [?0-9/]+ \\([^)]+\\) at .*: uncaught exception std::runtime_error: shard writer "
              "failed\nglm_hpc: backtrace of rank");
}

TEST(FatalPathDeathTest, TerminateWithoutAnExceptionSaysSo) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        install_fatal_handlers();
        std::terminate();
      },
      testing::ExitedWithCode(1), "glm_hpc: fatal: rank .*: std::terminate called without an active exception");
}

TEST(FatalPathDeathTest, FatalSignalNamesRankHostAndSignal) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        install_fatal_handlers();
        std::raise(SIGSEGV);
      },
      testing::KilledBySignal(SIGSEGV),
      "glm_hpc: fatal: rank [?0-9/]+ \\([^)]+\\) received SIGSEGV \\(invalid memory access\\) at address 0x[0-9a-f]+; "
      "backtrace:");
  EXPECT_EXIT(
      {
        install_fatal_handlers();
        std::abort();
      },
      testing::KilledBySignal(SIGABRT), "glm_hpc: fatal: rank .* received SIGABRT \\(abort\\); backtrace:");
}

}  // namespace
}  // namespace glm::test
