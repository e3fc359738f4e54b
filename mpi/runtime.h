// MPI bootstrap: initialises MPI once per process and knows rank, world size, local rank and host.
#pragma once

#include <mpi.h>

#include <string>

#include "base/status.h"

namespace glm {

struct ProcessInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // rank among the processes sharing this node's memory
  int local_size = 1;
  std::string host;
};

// RAII owner of MPI_Init/MPI_Finalize. Exactly one lives in main().
class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  const ProcessInfo& info() const { return info_; }

 private:
  ProcessInfo info_;
};

// Rank, size, host, and the local rank and size among the ranks of comm that share this node's
// memory (MPI_Comm_split_type), whatever launched them (mpirun, srun): no launcher variables.
Result<ProcessInfo> discover_process_info(MPI_Comm comm);

// One rank per GPU: more ranks on a host than visible GPUs is a user error naming the host.
Status check_one_rank_per_gpu(const ProcessInfo& info, int visible_gpus);

// Every rank holds a local status; all agree on the worst one so that all exit together with the
// same code. status is the local one if it failed, else one naming the failing rank; report_here
// is true on exactly one failing rank (the lowest), which prints the message.
struct AgreedStatus {
  Status status;
  bool report_here = false;
};
AgreedStatus agree_on_status(const Status& local, MPI_Comm comm);

}  // namespace glm

// Checks an MPI call and turns failure into a Status carrying the MPI error string.
#define GLM_MPI_RETURN_IF_ERROR(call)                                            \
  do {                                                                           \
    int glm_mpi_rc_ = (call);                                                    \
    if (glm_mpi_rc_ != MPI_SUCCESS) {                                            \
      char glm_mpi_msg_[MPI_MAX_ERROR_STRING] = {0};                             \
      int glm_mpi_len_ = 0;                                                      \
      MPI_Error_string(glm_mpi_rc_, glm_mpi_msg_, &glm_mpi_len_);                \
      return GLM_ERROR(::glm::ErrorKind::comm, #call " failed: ", glm_mpi_msg_); \
    }                                                                            \
  } while (0)
