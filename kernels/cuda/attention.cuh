// Causal grouped-query attention over packed documents (token t sees [doc_start[t], t]), bf16
// inputs, fp32 softmax statistics and accumulation. Layout as kernels/cpu/cpu_ops.h: qkv
// [n, (heads + 2 kv_heads) * head_dim] blocks q | k | v; out [n, heads * head_dim]; lse [n, heads].
// One warp per (query, head) with an online softmax: simple and right for any head size up to
// 256; the CUDA backend uses it where the tensor-core flash kernel (flash_attention.cuh) does not
// apply (head sizes other than 32, 64 and 128).
#pragma once

#include "kernels/cuda/common.cuh"

namespace glm::cuda {

constexpr int64_t kAttentionMaxHeadDim = 256;

cudaError_t attention_forward(bf16* out, float* lse, const bf16* qkv, const int32_t* doc_start, int64_t n,
                              int64_t heads, int64_t kv_heads, int64_t head_dim, cudaStream_t stream);
// dqkv is overwritten. delta_scratch: fp32 device memory of n * heads elements. Two passes, no
// atomics: dQ per (query, head), then dK/dV per (key, KV group).
cudaError_t attention_backward(bf16* dqkv, float* delta_scratch, const bf16* dout, const bf16* out, const float* lse,
                               const bf16* qkv, const int32_t* doc_start, int64_t n, int64_t heads, int64_t kv_heads,
                               int64_t head_dim, cudaStream_t stream);

}  // namespace glm::cuda
