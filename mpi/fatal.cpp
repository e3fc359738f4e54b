// The fatal path shared by every rank; see DESIGN.md decision 5.
#include "mpi/fatal.h"

#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
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
  std::fprintf(stderr, "glm_hpc: fatal: %s at %s:%d: %s\n", rank_prefix().c_str(), base != nullptr ? base + 1 : file,
               line, reason.c_str());
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

void fatal_status(const Status& status) {
  std::string where = status.location().empty() ? std::string("?") : status.location();
  auto colon = where.rfind(':');
  std::string file = colon == std::string::npos ? where : where.substr(0, colon);
  int line = colon == std::string::npos ? 0 : std::atoi(where.c_str() + colon + 1);
  fatal(file.c_str(), line, status.message(), status.exit_code());
}

}  // namespace glm
