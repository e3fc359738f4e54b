// CUDA device discovery: a machine without a driver or GPU reports zero devices, not an error.
#include <cuda_runtime.h>

#include "kernels/cuda_device.h"

namespace glm::cuda {

int cuda_device_count_impl() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}

}  // namespace glm::cuda
