// One thread per (token, rotated head, pair); angles in fp32 as transformers computes them.
#include "kernels/cuda/rope.cuh"

namespace glm::cuda {
namespace {

__global__ void rope_kernel(bf16* qkv, const int32_t* positions, int64_t n, int64_t rotated_heads, int64_t width,
                            int64_t head_dim, int64_t pairs, int64_t rotary_dim, float base, float direction) {
  const int64_t total = n * rotated_heads * pairs;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t pair = i % pairs, h = (i / pairs) % rotated_heads, t = i / (pairs * rotated_heads);
    const float inv_freq = 1.0f / powf(base, static_cast<float>(2 * pair) / static_cast<float>(rotary_dim));
    const float angle = static_cast<float>(positions[t]) * inv_freq;
    float s, c;
    sincosf(angle, &s, &c);
    s *= direction;
    bf16* x = qkv + t * width + h * head_dim + 2 * pair;
    const float x0 = __bfloat162float(x[0]), x1 = __bfloat162float(x[1]);
    x[0] = __float2bfloat16(x0 * c - x1 * s);
    x[1] = __float2bfloat16(x1 * c + x0 * s);
  }
}

}  // namespace

cudaError_t rope(bf16* qkv, const int32_t* positions, int64_t n, int64_t heads, int64_t kv_heads, int64_t head_dim,
                 int64_t rotary_dim, float base, float direction, cudaStream_t stream) {
  const int64_t pairs = rotary_dim / 2, rotated = heads + kv_heads;
  const int64_t total = n * rotated * pairs;
  if (total == 0) return cudaSuccess;
  rope_kernel<<<grid_for(total, 256), 256, 0, stream>>>(qkv, positions, n, rotated, (heads + 2 * kv_heads) * head_dim,
                                                        head_dim, pairs, rotary_dim, base, direction);
  return cudaGetLastError();
}

}  // namespace glm::cuda
