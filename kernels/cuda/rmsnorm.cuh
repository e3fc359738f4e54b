// RMSNorm forward/backward (bf16 data, fp32 statistics and accumulation).
#pragma once

#include "kernels/cuda/common.cuh"

namespace glm::cuda {

// out = w * x * rstd, rstd = 1 / sqrt(mean(x^2) + eps) per row.
cudaError_t rmsnorm_forward(bf16* out, float* rstd, const bf16* in, const bf16* weight, int64_t n, int64_t hidden,
                            float eps, cudaStream_t stream);
// fp32 scratch (in floats) that rmsnorm_backward needs for n rows of hidden on the current device.
cudaError_t rmsnorm_backward_scratch(int64_t n, int64_t hidden, int64_t* floats);
// din += dx; dweight += sum over rows of dout * x * rstd (fp32 per-block partial sums in scratch,
// reduced in a fixed order: the same inputs give the same bits on the same device).
cudaError_t rmsnorm_backward(bf16* din, bf16* dweight, float* scratch, const bf16* dout, const bf16* in,
                             const bf16* weight, const float* rstd, int64_t n, int64_t hidden, cudaStream_t stream);

}  // namespace glm::cuda
