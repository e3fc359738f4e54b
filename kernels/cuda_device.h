// CUDA device discovery (compiled only when the CUDA toolkit is present).
#pragma once

namespace glm::cuda {

// Number of usable CUDA devices; 0 when no driver or GPU is present.
int cuda_device_count_impl();

// Whether this build holds code the current device runs (its architecture's, or PTX it compiles).
bool device_has_kernel_image();
// The CUDA architectures this build was compiled for, as CMake named them ("80-real, 86-real, ...").
const char* built_architectures();

}  // namespace glm::cuda
