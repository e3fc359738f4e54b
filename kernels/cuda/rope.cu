// Partial interleaved RoPE in place, touching only the rotated part of the q and k heads; angles in
// fp32 as transformers computes them. Vectorised path (head_dim and rotary_dim multiples of 8, an
// aligned buffer): a thread owns one 16-byte vector (4 pairs) of the rotated part at one token and
// a strided group of heads, computes its 4 cos/sin once and applies them to every head it owns,
// with all of that thread's loads issued before the math. Elsewhere one thread per pair.
#include <algorithm>

#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/rope_math.cuh"
#include "kernels/cuda/vec.cuh"

namespace glm::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxHeadsPerThread = 8;

__global__ void rope_scalar_kernel(bf16* qkv, const int32_t* positions, int64_t n, int64_t rotated_heads,
                                   int64_t width, int64_t head_dim, int64_t pairs, int64_t rotary_dim, float base,
                                   float direction) {
  const int64_t total = n * rotated_heads * pairs;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t pair = i % pairs, h = (i / pairs) % rotated_heads, t = i / (pairs * rotated_heads);
    float s, c;
    rope_sincos(static_cast<float>(positions[t]),
                rope_inv_freq(static_cast<int>(pair), static_cast<int>(rotary_dim), base), s, c);
    s *= direction;
    bf16* x = qkv + t * width + h * head_dim + 2 * pair;
    const float x0 = __bfloat162float(x[0]), x1 = __bfloat162float(x[1]);
    x[0] = __float2bfloat16(rotated_first(x0, x1, c, s));
    x[1] = __float2bfloat16(rotated_second(x0, x1, c, s));
  }
}

// The angles of a 16-byte vector's four pairs (table entries freq[0..3]) at position pos, their
// sines times direction (-1: the backward's rotation).
__device__ __forceinline__ void vector_angles(float pos, const float* freq, float direction, float (&c)[4],
                                              float (&s)[4]) {
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    rope_sincos(pos, freq[p], s[p], c[p]);
    s[p] *= direction;
  }
}
// A 16-byte vector of bf16 pairs rotated by those angles.
__device__ __forceinline__ uint4 rotate_vector(uint4 x, const float (&c)[4], const float (&s)[4]) {
  float f[8];
  unpack_bf16x8(x, f);
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const float x0 = f[2 * p], x1 = f[2 * p + 1];
    f[2 * p] = rotated_first(x0, x1, c[p], s[p]);
    f[2 * p + 1] = rotated_second(x0, x1, c[p], s[p]);
  }
  return pack_bf16x8(f);
}

// Thread i: token t = i / (slots * groups), then head group g, then vector slot v (fastest, so a
// warp reads whole 16-byte runs of one head); heads g, g + groups, ... (at most kMaxHeadsPerThread).
// All offsets in vectors: width_v = width / 8, head_v = head_dim / 8.
__global__ void __launch_bounds__(kThreads, 3) rope_vec_kernel(uint4* qkv, const int32_t* positions, int64_t n,
                                                            int rotated_heads, int groups, int slots,
                                                            int64_t width_v, int head_v, int rotary_dim, float base,
                                                            float direction) {
  extern __shared__ float inv_freq[];  // rotary_dim / 2 entries, the same powf as the scalar path
  for (int pair = threadIdx.x; pair < rotary_dim / 2; pair += blockDim.x)
    inv_freq[pair] = rope_inv_freq(pair, rotary_dim, base);
  __syncthreads();
  const int64_t per_token = static_cast<int64_t>(slots) * groups;
  const int64_t total = n * per_token;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / per_token;
    const int rem = static_cast<int>(i - t * per_token);
    const int g = rem / slots, v = rem - g * slots;
    uint4* row = qkv + t * width_v + v;
    uint4 x[kMaxHeadsPerThread];
#pragma unroll
    for (int k = 0; k < kMaxHeadsPerThread; ++k) {
      const int h = g + k * groups;
      if (h < rotated_heads) x[k] = row[h * head_v];
    }
    const float pos = static_cast<float>(positions[t]);
    float c[4], s[4];
    vector_angles(pos, inv_freq + 4 * v, direction, c, s);
#pragma unroll
    for (int k = 0; k < kMaxHeadsPerThread; ++k) {
      const int h = g + k * groups;
      if (h < rotated_heads) row[h * head_v] = rotate_vector(x[k], c, s);
    }
  }
}

// Generation's RoPE and KV-cache store in one pass: thread i owns one 16-byte vector of a token's
// row, either in a q head's rotary part (rotated in place) or among its k | v columns (rotated
// first where it is in a k head's rotary part, written back, and copied to the token's cache row).
// The angles and rotation of rope_vec_kernel: the same bits.
__global__ void __launch_bounds__(kThreads) rope_store_kernel(uint4* qkv, uint4* cache, const int32_t* positions,
                                                              const int32_t* cache_rows, int64_t n, int heads,
                                                              int kv_heads, int head_v, int rot_v, int rotary_dim,
                                                              float base) {
  extern __shared__ float inv_freq[];
  for (int pair = threadIdx.x; pair < rotary_dim / 2; pair += blockDim.x)
    inv_freq[pair] = rope_inv_freq(pair, rotary_dim, base);
  __syncthreads();
  const int q_items = heads * rot_v, kv_v = 2 * kv_heads * head_v, per_token = q_items + kv_v;
  const int64_t width_v = static_cast<int64_t>(heads) * head_v + kv_v;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n * per_token;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / per_token;
    const int j = static_cast<int>(i - t * per_token);
    uint4* row = qkv + t * width_v;
    int slot, c = -1;
    uint4* at;
    if (j < q_items) {
      const int h = j / rot_v;
      slot = j - h * rot_v;
      at = row + h * head_v + slot;
    } else {
      c = j - q_items;
      slot = c % head_v;
      at = row + static_cast<int64_t>(heads) * head_v + c;
    }
    uint4 x = *at;
    if (slot < rot_v && c < kv_heads * head_v) {  // a q vector, or one in a k head's rotary part
      float c[4], s[4];
      vector_angles(static_cast<float>(positions[t]), inv_freq + 4 * slot, 1.0f, c, s);
      x = rotate_vector(x, c, s);
      *at = x;
    }
    if (c >= 0) cache[static_cast<int64_t>(cache_rows[t]) * kv_v + c] = x;
  }
}

// The store alone, an element a thread (rope_store's shapes that the vector kernel does not take).
__global__ void store_kv_scalar_kernel(bf16* cache, const bf16* qkv, const int32_t* cache_rows, int64_t n,
                                       int64_t q_width, int64_t kv_width) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n * kv_width;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / kv_width, c = i - t * kv_width;
    cache[static_cast<int64_t>(cache_rows[t]) * kv_width + c] = qkv[t * (q_width + kv_width) + q_width + c];
  }
}

}  // namespace

cudaError_t rope(bf16* qkv, const int32_t* positions, int64_t n, int64_t heads, int64_t kv_heads, int64_t head_dim,
                 int64_t rotary_dim, float base, float direction, cudaStream_t stream) {
  const int64_t pairs = rotary_dim / 2, rotated = heads + kv_heads, width = (heads + 2 * kv_heads) * head_dim;
  if (n * rotated * pairs == 0) return cudaSuccess;
  if (head_dim % kBf16PerVec == 0 && rotary_dim % kBf16PerVec == 0 && aligned16(qkv)) {
    const int slots = static_cast<int>(rotary_dim / kBf16PerVec);
    // Fewest groups that keep each thread at or under kMaxHeadsPerThread heads: cos/sin are
    // computed once per (token, slot, group), the loads per thread stay at most 8 x 16 bytes.
    const int groups = static_cast<int>((rotated + kMaxHeadsPerThread - 1) / kMaxHeadsPerThread);
    const int64_t total = n * slots * groups;
    const size_t table_bytes = sizeof(float) * static_cast<size_t>(pairs);
    if (table_bytes > 48 * 1024) return cudaErrorInvalidValue;  // rotary_dim > 24576: no such model
    rope_vec_kernel<<<grid_for(total, kThreads), kThreads, table_bytes, stream>>>(
        reinterpret_cast<uint4*>(qkv), positions, n, static_cast<int>(rotated), groups, slots, width / kBf16PerVec,
        static_cast<int>(head_dim / kBf16PerVec), static_cast<int>(rotary_dim), base, direction);
    return cudaGetLastError();
  }
  const int64_t total = n * rotated * pairs;
  rope_scalar_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(qkv, positions, n, rotated, width, head_dim,
                                                                         pairs, rotary_dim, base, direction);
  return cudaGetLastError();
}

cudaError_t rope_store(bf16* qkv, bf16* cache, const int32_t* positions, const int32_t* cache_rows, int64_t n,
                       int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t rotary_dim, float base,
                       cudaStream_t stream) {
  const int64_t q_width = heads * head_dim, kv_width = 2 * kv_heads * head_dim;
  if (n == 0) return cudaSuccess;
  if (head_dim % kBf16PerVec == 0 && rotary_dim % kBf16PerVec == 0 && rotary_dim > 0 && aligned16(qkv) &&
      aligned16(cache)) {
    const int head_v = static_cast<int>(head_dim / kBf16PerVec), rot_v = static_cast<int>(rotary_dim / kBf16PerVec);
    const int64_t total = n * (heads * rot_v + kv_width / kBf16PerVec);
    const size_t table_bytes = sizeof(float) * static_cast<size_t>(rotary_dim / 2);
    if (table_bytes > 48 * 1024) return cudaErrorInvalidValue;
    rope_store_kernel<<<grid_for(total, kThreads), kThreads, table_bytes, stream>>>(
        reinterpret_cast<uint4*>(qkv), reinterpret_cast<uint4*>(cache), positions, cache_rows, n,
        static_cast<int>(heads), static_cast<int>(kv_heads), head_v, rot_v, static_cast<int>(rotary_dim), base);
    return cudaGetLastError();
  }
  const cudaError_t e = rope(qkv, positions, n, heads, kv_heads, head_dim, rotary_dim, base, 1.0f, stream);
  if (e != cudaSuccess) return e;
  store_kv_scalar_kernel<<<grid_for(n * kv_width, kThreads), kThreads, 0, stream>>>(cache, qkv, cache_rows, n, q_width,
                                                                                    kv_width);
  return cudaGetLastError();
}

}  // namespace glm::cuda
