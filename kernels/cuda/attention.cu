// Warp-per-row attention: each lane owns head_dim / 32 (rounded up) dimensions of q, o and dq.
#include "kernels/cuda/attention.cuh"

namespace glm::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kPerLane = kAttentionMaxHeadDim / 32;

__global__ void attention_forward_kernel(bf16* out, float* lse, const bf16* qkv, const int32_t* doc_start, int64_t n,
                                         int64_t heads, int64_t kv_heads, int64_t d, float scale) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= n * heads) return;
  const int64_t t = row / heads, h = row % heads, g = h / (heads / kv_heads);
  const int64_t width = (heads + 2 * kv_heads) * d;
  const bf16* q = qkv + t * width + h * d;
  float qr[kPerLane], acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t j = lane + 32 * i;
    qr[i] = j < d ? __bfloat162float(q[j]) * scale : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t s = doc_start[t]; s <= t; ++s) {
    const bf16* k = qkv + s * width + (heads + g) * d;
    const bf16* v = qkv + s * width + (heads + kv_heads + g) * d;
    float partial = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t j = lane + 32 * i;
      if (j < d) partial += qr[i] * __bfloat162float(k[j]);
    }
    const float score = warp_sum(partial);
    const float m_new = fmaxf(m, score);
    const float correction = __expf(m - m_new), p = __expf(score - m_new);
    l = l * correction + p;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t j = lane + 32 * i;
      if (j < d) acc[i] = acc[i] * correction + p * __bfloat162float(v[j]);
    }
    m = m_new;
  }
  bf16* o = out + t * heads * d + h * d;
  const float inv = 1.0f / l;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t j = lane + 32 * i;
    if (j < d) o[j] = __float2bfloat16(acc[i] * inv);
  }
  if (lane == 0) lse[t * heads + h] = m + __logf(l);
}

// dQ and the row statistic delta = dout . out, one warp per (query, head).
__global__ void attention_backward_dq_kernel(bf16* dqkv, float* delta_out, const bf16* dout, const bf16* out,
                                             const float* lse, const bf16* qkv, const int32_t* doc_start, int64_t n,
                                             int64_t heads, int64_t kv_heads, int64_t d, float scale) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= n * heads) return;
  const int64_t t = row / heads, h = row % heads, g = h / (heads / kv_heads);
  const int64_t width = (heads + 2 * kv_heads) * d;
  const bf16* q = qkv + t * width + h * d;
  const bf16* go = dout + t * heads * d + h * d;
  const bf16* o = out + t * heads * d + h * d;
  float qr[kPerLane], gr[kPerLane], dq[kPerLane];
  float delta = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t j = lane + 32 * i;
    qr[i] = j < d ? __bfloat162float(q[j]) : 0.0f;
    gr[i] = j < d ? __bfloat162float(go[j]) : 0.0f;
    dq[i] = 0.0f;
    if (j < d) delta += gr[i] * __bfloat162float(o[j]);
  }
  delta = warp_sum(delta);
  if (lane == 0) delta_out[t * heads + h] = delta;
  const float row_lse = lse[t * heads + h];
  for (int64_t s = doc_start[t]; s <= t; ++s) {
    const bf16* k = qkv + s * width + (heads + g) * d;
    const bf16* v = qkv + s * width + (heads + kv_heads + g) * d;
    float dot = 0.0f, dp = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t j = lane + 32 * i;
      if (j < d) {
        dot += qr[i] * __bfloat162float(k[j]);
        dp += gr[i] * __bfloat162float(v[j]);
      }
    }
    dot = warp_sum(dot);
    dp = warp_sum(dp);
    const float ds = __expf(dot * scale - row_lse) * (dp - delta) * scale;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t j = lane + 32 * i;
      if (j < d) dq[i] += ds * __bfloat162float(k[j]);
    }
  }
  bf16* dqr = dqkv + t * width + h * d;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t j = lane + 32 * i;
    if (j < d) dqr[j] = __float2bfloat16(dq[i]);
  }
}

// dK and dV, one warp per (key, KV group): sums over the group's query heads and over the
// queries of the same document at or after the key. No atomics.
__global__ void attention_backward_dkv_kernel(bf16* dqkv, const float* delta, const bf16* dout, const float* lse,
                                              const bf16* qkv, const int32_t* doc_start, int64_t n, int64_t heads,
                                              int64_t kv_heads, int64_t d, float scale) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= n * kv_heads) return;
  const int64_t s = row / kv_heads, g = row % kv_heads, group = heads / kv_heads;
  const int64_t width = (heads + 2 * kv_heads) * d;
  const bf16* k = qkv + s * width + (heads + g) * d;
  const bf16* v = qkv + s * width + (heads + kv_heads + g) * d;
  float kr[kPerLane], vr[kPerLane], dk[kPerLane], dv[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t j = lane + 32 * i;
    kr[i] = j < d ? __bfloat162float(k[j]) : 0.0f;
    vr[i] = j < d ? __bfloat162float(v[j]) : 0.0f;
    dk[i] = 0.0f;
    dv[i] = 0.0f;
  }
  const int32_t doc = doc_start[s];
  for (int64_t t = s; t < n && doc_start[t] == doc; ++t) {
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      const bf16* q = qkv + t * width + h * d;
      const bf16* go = dout + t * heads * d + h * d;
      float dot = 0.0f, dp = 0.0f;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int64_t j = lane + 32 * i;
        if (j < d) {
          dot += __bfloat162float(q[j]) * kr[i];
          dp += __bfloat162float(go[j]) * vr[i];
        }
      }
      dot = warp_sum(dot);
      dp = warp_sum(dp);
      const float p = __expf(dot * scale - lse[t * heads + h]);
      const float ds = p * (dp - delta[t * heads + h]) * scale;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int64_t j = lane + 32 * i;
        if (j < d) {
          dk[i] += ds * __bfloat162float(q[j]);
          dv[i] += p * __bfloat162float(go[j]);
        }
      }
    }
  }
  bf16* dkr = dqkv + s * width + (heads + g) * d;
  bf16* dvr = dqkv + s * width + (heads + kv_heads + g) * d;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t j = lane + 32 * i;
    if (j < d) {
      dkr[j] = __float2bfloat16(dk[i]);
      dvr[j] = __float2bfloat16(dv[i]);
    }
  }
}

}  // namespace

cudaError_t attention_forward(bf16* out, float* lse, const bf16* qkv, const int32_t* doc_start, int64_t n,
                              int64_t heads, int64_t kv_heads, int64_t head_dim, cudaStream_t stream) {
  if (head_dim > kAttentionMaxHeadDim || heads % kv_heads != 0) return cudaErrorInvalidValue;
  const int64_t rows = n * heads;
  if (rows == 0) return cudaSuccess;
  const unsigned int blocks = static_cast<unsigned int>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  attention_forward_kernel<<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(
      out, lse, qkv, doc_start, n, heads, kv_heads, head_dim, 1.0f / sqrtf(static_cast<float>(head_dim)));
  return cudaGetLastError();
}

cudaError_t attention_backward(bf16* dqkv, float* delta_scratch, const bf16* dout, const bf16* out, const float* lse,
                               const bf16* qkv, const int32_t* doc_start, int64_t n, int64_t heads, int64_t kv_heads,
                               int64_t head_dim, cudaStream_t stream) {
  if (head_dim > kAttentionMaxHeadDim || heads % kv_heads != 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const float scale = 1.0f / sqrtf(static_cast<float>(head_dim));
  const int64_t q_rows = n * heads, kv_rows = n * kv_heads;
  attention_backward_dq_kernel<<<static_cast<unsigned int>((q_rows + kWarpsPerBlock - 1) / kWarpsPerBlock),
                                 32 * kWarpsPerBlock, 0, stream>>>(dqkv, delta_scratch, dout, out, lse, qkv, doc_start,
                                                                   n, heads, kv_heads, head_dim, scale);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  attention_backward_dkv_kernel<<<static_cast<unsigned int>((kv_rows + kWarpsPerBlock - 1) / kWarpsPerBlock),
                                  32 * kWarpsPerBlock, 0, stream>>>(dqkv, delta_scratch, dout, lse, qkv, doc_start, n,
                                                                    heads, kv_heads, head_dim, scale);
  return cudaGetLastError();
}

}  // namespace glm::cuda
