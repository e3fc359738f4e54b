// Builds without CUDA or NCCL: multi-GPU communication is unavailable, said in one message.
#include "mpi/nccl_communicator.h"

namespace glm {

Result<std::unique_ptr<Communicator>> make_nccl_communicator(MPI_Comm, int, void*, std::chrono::duration<double>) {
  return GLM_USER_ERROR("this glm_hpc was built without CUDA and NCCL: several GPU ranks need both (rebuild where "
                        "nvcc and nccl.h are found, or use --device cpu)");
}

}  // namespace glm
