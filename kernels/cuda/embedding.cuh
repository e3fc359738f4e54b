// Embedding lookup, its backward (bf16), and row gathers and scatters of any element size.
#pragma once

#include "kernels/cuda/common.cuh"

namespace glm::cuda {

cudaError_t embedding_forward(bf16* out, const bf16* table, const int32_t* tokens, int64_t n, int64_t hidden,
                              cudaStream_t stream);
// dtable[tokens[t]] += dout[t]: one block per run of one token (token_order[token_runs[r] ..
// token_runs[r + 1]) are its positions), whose rows are summed in fp32 in that order and added to
// the table's row once, rounded to bf16 once. Deterministic, and a token seen hundreds of times in
// a batch keeps its small terms (bf16 atomics would drop each below half a unit of the sum).
cudaError_t embedding_backward(bf16* dtable, const bf16* dout, const int32_t* tokens, const int32_t* token_order,
                               const int32_t* token_runs, int64_t runs, int64_t hidden, cudaStream_t stream);
// Rows of row_bytes bytes: gather dst[i] = src[rows[i]], or scatter dst[rows[i]] = src[i], i < count;
// a scatter with src null writes zeros.
cudaError_t move_rows(void* dst, const void* src, const int32_t* rows, int64_t count, int64_t row_bytes, bool gather,
                      cudaStream_t stream);

}  // namespace glm::cuda
