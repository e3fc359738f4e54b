// Embedding lookup and its scatter-add backward (bf16).
#pragma once

#include "kernels/cuda/common.cuh"

namespace glm::cuda {

cudaError_t embedding_forward(bf16* out, const bf16* table, const int32_t* tokens, int64_t n, int64_t hidden,
                              cudaStream_t stream);
// dtable[tokens[t]] += dout[t] (atomic bf16 adds).
cudaError_t embedding_backward(bf16* dtable, const bf16* dout, const int32_t* tokens, int64_t n, int64_t hidden,
                               cudaStream_t stream);

}  // namespace glm::cuda
