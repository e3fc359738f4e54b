// Builds without the CUDA toolkit (-DGLM_CUDA=OFF): the CUDA backend is absent and says so.
#include "model/backend.h"

namespace glm {

Result<std::unique_ptr<Backend>> make_cuda_backend(int, const BackendConfig&) {
  return GLM_USER_ERROR("--device cuda: this glm_hpc was built without CUDA (-DGLM_CUDA=OFF or no nvcc)");
}

int cuda_device_count() { return 0; }

}  // namespace glm
