// One block per row: max, sum of exponentials, then the gradient in one more pass.
#include "kernels/cuda/cross_entropy.cuh"

namespace glm::cuda {
namespace {

__global__ void cross_entropy_kernel(float* losses, bf16* dlogits, const float* logits, const int32_t* targets,
                                     int64_t vocab, float grad_scale) {
  const int64_t r = blockIdx.x;
  const int32_t target = targets[r];
  const float* z = logits + r * vocab;
  bf16* dz = dlogits != nullptr ? dlogits + r * vocab : nullptr;
  if (target < 0) {
    if (threadIdx.x == 0) losses[r] = 0.0f;
    if (dz != nullptr)
      for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) dz[v] = __float2bfloat16(0.0f);
    return;
  }
  float mx = -INFINITY;
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) mx = fmaxf(mx, z[v]);
  mx = block_max(mx);
  float sum = 0.0f;
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) sum += __expf(z[v] - mx);
  sum = block_sum(sum);
  const float lse = mx + __logf(sum);
  if (threadIdx.x == 0) losses[r] = lse - z[target];
  if (dz != nullptr)
    for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x)
      dz[v] = __float2bfloat16((__expf(z[v] - lse) - (v == target ? 1.0f : 0.0f)) * grad_scale);
}

}  // namespace

cudaError_t cross_entropy(float* losses, bf16* dlogits, const float* logits, const int32_t* targets, int64_t rows,
                          int64_t vocab, float grad_scale, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  cross_entropy_kernel<<<static_cast<unsigned int>(rows), 512, 0, stream>>>(losses, dlogits, logits, targets, vocab,
                                                                            grad_scale);
  return cudaGetLastError();
}

}  // namespace glm::cuda
