// One block per row: max, sum of exponentials (and the argmax), then the gradient in one more pass.
#include <climits>

#include "kernels/cuda/cross_entropy.cuh"

namespace glm::cuda {
namespace {

// Minimum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ int block_min_int(int v) {
  __shared__ int partial[32];
  __shared__ int total;
  for (int offset = 16; offset > 0; offset >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, offset));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int w = lane < static_cast<int>(blockDim.x >> 5) ? partial[lane] : INT_MAX;
    for (int offset = 16; offset > 0; offset >>= 1) w = min(w, __shfl_xor_sync(0xffffffffu, w, offset));
    if (lane == 0) total = w;
  }
  __syncthreads();
  const int result = total;
  __syncthreads();
  return result;
}

__global__ void cross_entropy_kernel(float* losses, int32_t* correct, bf16* dlogits, const float* logits,
                                     const int32_t* targets, int64_t vocab, float grad_scale) {
  const int64_t r = blockIdx.x;
  const int32_t target = targets[r];
  const float* z = logits + r * vocab;
  bf16* dz = dlogits != nullptr ? dlogits + r * vocab : nullptr;
  if (target < 0) {
    if (threadIdx.x == 0) {
      losses[r] = 0.0f;
      if (correct != nullptr) correct[r] = 0;
    }
    if (dz != nullptr)
      for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) dz[v] = __float2bfloat16(0.0f);
    return;
  }
  float mx = -INFINITY;
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) mx = fmaxf(mx, z[v]);
  mx = block_max(mx);
  float sum = 0.0f;
  int first_max = INT_MAX;  // vocab < 2^31: the lowest index holding the maximum
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) {
    const float x = z[v];
    sum += __expf(x - mx);
    if (x == mx && v < first_max) first_max = static_cast<int>(v);
  }
  sum = block_sum(sum);
  if (correct != nullptr) {  // uniform across the block: every thread joins the reduction
    first_max = block_min_int(first_max);
    if (threadIdx.x == 0) correct[r] = first_max == target ? 1 : 0;
  }
  const float lse = mx + __logf(sum);
  if (threadIdx.x == 0) losses[r] = lse - z[target];
  if (dz != nullptr)
    for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x)
      dz[v] = __float2bfloat16((__expf(z[v] - lse) - (v == target ? 1.0f : 0.0f)) * grad_scale);
}

}  // namespace

cudaError_t cross_entropy(float* losses, int32_t* correct, bf16* dlogits, const float* logits, const int32_t* targets,
                          int64_t rows, int64_t vocab, float grad_scale, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  cross_entropy_kernel<<<static_cast<unsigned int>(rows), 512, 0, stream>>>(losses, correct, dlogits, logits, targets,
                                                                            vocab, grad_scale);
  return cudaGetLastError();
}

}  // namespace glm::cuda
