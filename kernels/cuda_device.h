// CUDA device discovery (compiled only when the CUDA toolkit is present).
#pragma once

namespace glm::cuda {

// Number of usable CUDA devices; 0 when no driver or GPU is present.
int cuda_device_count_impl();

}  // namespace glm::cuda
