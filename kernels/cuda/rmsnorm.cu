// One block per row; the weight gradient is reduced with fp32 atomics into a scratch vector.
#include "kernels/cuda/rmsnorm.cuh"

namespace glm::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void rmsnorm_forward_kernel(bf16* out, float* rstd, const bf16* in, const bf16* weight, int64_t hidden,
                                       float eps) {
  const int64_t row = blockIdx.x;
  const bf16* x = in + row * hidden;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    const float v = __bfloat162float(x[j]);
    ss += v * v;
  }
  ss = block_sum(ss);
  const float r = rsqrtf(ss / static_cast<float>(hidden) + eps);
  if (threadIdx.x == 0) rstd[row] = r;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x)
    out[row * hidden + j] = __float2bfloat16(__bfloat162float(weight[j]) * (__bfloat162float(x[j]) * r));
}

__global__ void rmsnorm_backward_kernel(bf16* din, float* dweight, const bf16* dout, const bf16* in, const bf16* weight,
                                        const float* rstd, int64_t hidden) {
  const int64_t row = blockIdx.x;
  const bf16* x = in + row * hidden;
  const bf16* g = dout + row * hidden;
  const float r = rstd[row];
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x)
    dot += __bfloat162float(g[j]) * __bfloat162float(weight[j]) * __bfloat162float(x[j]);
  dot = block_sum(dot);
  const float c = dot / static_cast<float>(hidden) * r * r * r;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    const float xv = __bfloat162float(x[j]), gv = __bfloat162float(g[j]);
    const float dx = r * gv * __bfloat162float(weight[j]) - xv * c;
    din[row * hidden + j] = __float2bfloat16(__bfloat162float(din[row * hidden + j]) + dx);
    atomicAdd(dweight + j, gv * xv * r);
  }
}

}  // namespace

cudaError_t rmsnorm_forward(bf16* out, float* rstd, const bf16* in, const bf16* weight, int64_t n, int64_t hidden,
                            float eps, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  rmsnorm_forward_kernel<<<static_cast<unsigned int>(n), kThreads, 0, stream>>>(out, rstd, in, weight, hidden, eps);
  return cudaGetLastError();
}

cudaError_t rmsnorm_backward(bf16* din, float* dweight_acc, const bf16* dout, const bf16* in, const bf16* weight,
                             const float* rstd, int64_t n, int64_t hidden, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  rmsnorm_backward_kernel<<<static_cast<unsigned int>(n), kThreads, 0, stream>>>(din, dweight_acc, dout, in, weight,
                                                                                 rstd, hidden);
  return cudaGetLastError();
}

}  // namespace glm::cuda
