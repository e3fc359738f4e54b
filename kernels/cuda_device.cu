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

namespace {
__global__ void probe_kernel() {}
}  // namespace

bool device_has_kernel_image() {
  cudaFuncAttributes attributes{};
  if (cudaFuncGetAttributes(&attributes, probe_kernel) == cudaSuccess) return true;
  cudaGetLastError();  // not sticky, but cleared so that later checks see their own errors
  return false;
}

const char* built_architectures() { return GLM_CUDA_ARCHITECTURES; }

}  // namespace glm::cuda
