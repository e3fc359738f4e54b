// Partial interleaved RoPE on the q and k blocks of the fused qkv activation, in place.
#pragma once

#include "kernels/cuda/common.cuh"

namespace glm::cuda {

// direction +1: forward rotation; -1: its gradient (rotation by the negative angle).
cudaError_t rope(bf16* qkv, const int32_t* positions, int64_t n, int64_t heads, int64_t kv_heads, int64_t head_dim,
                 int64_t rotary_dim, float base, float direction, cudaStream_t stream);

}  // namespace glm::cuda
