// RMSNorm forward/backward (bf16 data, fp32 statistics and accumulation).
#pragma once

#include "kernels/cuda/common.cuh"

namespace glm::cuda {

// out = w * x * rstd, rstd = 1 / sqrt(mean(x^2) + eps) per row.
cudaError_t rmsnorm_forward(bf16* out, float* rstd, const bf16* in, const bf16* weight, int64_t n, int64_t hidden,
                            float eps, cudaStream_t stream);
// din += dx; dweight_acc (fp32, device, zeroed by the caller) += sum over rows of dout * x * rstd.
cudaError_t rmsnorm_backward(bf16* din, float* dweight_acc, const bf16* dout, const bf16* in, const bf16* weight,
                             const float* rstd, int64_t n, int64_t hidden, cudaStream_t stream);

}  // namespace glm::cuda
