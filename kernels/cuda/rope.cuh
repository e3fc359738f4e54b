// Partial interleaved RoPE on the q and k blocks of the fused qkv activation, in place.
#pragma once

#include "kernels/cuda/common.cuh"

namespace glm::cuda {

// direction +1: forward rotation; -1: its gradient (rotation by the negative angle).
cudaError_t rope(bf16* qkv, const int32_t* positions, int64_t n, int64_t heads, int64_t kv_heads, int64_t head_dim,
                 int64_t rotary_dim, float base, float direction, cudaStream_t stream);

// Generation's RoPE (direction 1) and KV-cache store: rope() on qkv [n, (heads + 2 kv_heads) head_dim],
// then cache[cache_rows[t]] = row t's k | v columns (rows of 2 kv_heads head_dim), for t < n. One
// kernel where head_dim and rotary_dim are multiples of 8 and both buffers 16-byte aligned.
cudaError_t rope_store(bf16* qkv, bf16* cache, const int32_t* positions, const int32_t* cache_rows, int64_t n,
                       int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t rotary_dim, float base,
                       cudaStream_t stream);

}  // namespace glm::cuda
