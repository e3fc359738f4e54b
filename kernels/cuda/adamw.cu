// Grid-stride update, torch.optim.AdamW arithmetic in fp32.
#include "kernels/cuda/adamw.cuh"

namespace glm::cuda {
namespace {

__global__ void adamw_kernel(bf16* param, float* master, const bf16* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                             AdamWArgs a) {
  const float step_size = a.lr / a.bias_correction1, decay = 1.0f - a.lr * a.weight_decay;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = __bfloat162float(grad[i]) * a.grad_scale;
    const float m = a.beta1 * exp_avg[i] + (1.0f - a.beta1) * g;
    const float v = a.beta2 * exp_avg_sq[i] + (1.0f - a.beta2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float p = master[i] * decay - step_size * m / (sqrtf(v) / a.bias_correction2_sqrt + a.eps);
    master[i] = p;
    if (param != nullptr) param[i] = __float2bfloat16(p);
  }
}

}  // namespace

cudaError_t adamw(bf16* param, float* master, const bf16* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                  const AdamWArgs& args, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  adamw_kernel<<<grid_for(n, 256), 256, 0, stream>>>(param, master, grad, exp_avg, exp_avg_sq, n, args);
  return cudaGetLastError();
}

}  // namespace glm::cuda
