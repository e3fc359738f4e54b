// MPI bootstrap and the all-ranks agreement used before exiting on bad input.
#include "mpi/runtime.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>

#include "mpi/fatal.h"

namespace glm {

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
    std::fprintf(stderr, "glm_hpc: fatal: MPI_Init_thread failed\n");
    std::_Exit(1);
  }
  // Errors come back as return codes so that we can report them with context.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  // After MPI_Init, whose own handlers of these signals they replace.
  install_fatal_handlers();
  auto info = discover_process_info(MPI_COMM_WORLD);
  if (!info.is_ok()) GLM_FATAL(info.status().message());
  info_ = info.take();
}

Result<ProcessInfo> discover_process_info(MPI_Comm comm) {
  ProcessInfo info;
  GLM_MPI_RETURN_IF_ERROR(MPI_Comm_rank(comm, &info.rank));
  GLM_MPI_RETURN_IF_ERROR(MPI_Comm_size(comm, &info.world_size));
  // Ranks that share memory share a node; ordered by rank, so local rank = position among them.
  MPI_Comm local = MPI_COMM_NULL;
  GLM_MPI_RETURN_IF_ERROR(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, info.rank, MPI_INFO_NULL, &local));
  const int rank_rc = MPI_Comm_rank(local, &info.local_rank);
  const int size_rc = MPI_Comm_size(local, &info.local_size);
  MPI_Comm_free(&local);
  GLM_MPI_RETURN_IF_ERROR(rank_rc);
  GLM_MPI_RETURN_IF_ERROR(size_rc);
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) return GLM_INTERNAL_ERROR("gethostname failed");
  info.host = host;
  return info;
}

Status check_one_rank_per_gpu(const ProcessInfo& info, int visible_gpus) {
  if (visible_gpus > 0 && info.local_size > visible_gpus)
    return GLM_USER_ERROR(info.local_size, " ranks on host ", info.host, " but ", visible_gpus,
                          " visible GPU(s): start at most one rank per GPU (or --device cpu)");
  return Status::ok();
}

MpiRuntime::~MpiRuntime() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

AgreedStatus agree_on_status(const Status& local, MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  // Lowest failing rank and worst outcome, so every rank returns the same code. Worst first: bad
  // input (2), another failure (1), a stop by signal (75: only when that is all that happened), ok.
  auto severity = [](const Status& s) {
    if (s.is_ok()) return 0;
    if (s.kind() == ErrorKind::stopped) return 1;
    return s.exit_code() == 2 ? 3 : 2;
  };
  int mine[2] = {severity(local), local.is_ok() ? INT32_MAX : rank};
  int worst = 0, first_rank = INT32_MAX;
  if (MPI_Allreduce(&mine[0], &worst, 1, MPI_INT, MPI_MAX, comm) != MPI_SUCCESS ||
      MPI_Allreduce(&mine[1], &first_rank, 1, MPI_INT, MPI_MIN, comm) != MPI_SUCCESS)
    GLM_FATAL("MPI_Allreduce failed while agreeing on a status");
  if (worst == 0) return {};
  AgreedStatus agreed;
  agreed.report_here = first_rank == rank;
  const ErrorKind kind = worst == 3 ? ErrorKind::user_input : worst == 2 ? ErrorKind::internal : ErrorKind::stopped;
  // Every rank exits with the worst code, whatever its own failure was.
  agreed.status = Status::error(kind, local.is_ok() ? concat("rank ", first_rank, " failed") : local.message());
  return agreed;
}

}  // namespace glm
