// Flash attention for head_dim 128 on Hopper (wgmma, sm_90a): the forward, and the backward's main
// kernel (the delta pass, the accumulators and their conversion stay in flash_attention.cu).
#pragma once

#include "kernels/cuda/common.cuh"

namespace glm::cuda {

// True when this build holds sm_90a code, the current device is compute capability 9.0, head_dim
// is 128 and GLM_FLASH is not "mma" (which selects the mma.sync kernels, for comparisons).
bool flash_wgmma_available(int64_t head_dim);

// Same contract as flash_attention_forward.
cudaError_t flash_forward_wgmma(bf16* out, float* lse, const bf16* qkv, const int32_t* doc_start, int64_t n,
                                int64_t heads, int64_t kv_heads, cudaStream_t stream);

// dK/dV ([2][n][kv_heads][128]) and dQ ([n][heads][128]) fp32 accumulators, cleared by the caller,
// receive this call's sums; delta = dout . out per (token, head).
cudaError_t flash_backward_wgmma(float* dkv_acc, float* dq_acc, const float* delta, const bf16* dout, const float* lse,
                                 const bf16* qkv, const int32_t* doc_start, int64_t n, int64_t heads, int64_t kv_heads,
                                 cudaStream_t stream);

}  // namespace glm::cuda
