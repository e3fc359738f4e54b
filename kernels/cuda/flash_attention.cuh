// Tensor-core (mma.sync bf16, fp32 accumulation) flash attention, forward and backward, for head_dim
// 32, 64 or 128: causal, grouped-query, packed documents (token t sees [doc_start[t], t]). Never
// materialises the n x n scores; softmax statistics (lse) in fp32. Same layouts as attention.cuh.
#pragma once

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_attention_sm90.cuh"

#include <string>

namespace glm::cuda {

bool flash_attention_supports(int64_t head_dim);
// Dynamic shared memory per block the mma.sync kernels at this head size need at least (the
// forward's, or the gathered backward's smallest variant); 0 where no flash kernel exists. A device
// whose opt-in limit (cudaDevAttrMaxSharedMemoryPerBlockOptin) is below it cannot run them.
size_t flash_attention_shared_bytes(int64_t head_dim);

// Kernel choices, fixed by the backend's configuration; the defaults are the tuned ones.
struct FlashOptions {
  bool allow_wgmma = true;        // Hopper's wgmma kernels where built and the device is sm_90
  int backward_head_chunk = 8;    // heads per chunk of the wgmma backward's block order
  bool dq_vector_atomics = true;  // wgmma backward's dQ by 16-byte atomics; false: paired ones
  // Dynamic shared memory per block the mma.sync backward may use (0: any): it runs its fastest
  // variant that fits (flash_backward_variant).
  size_t shared_limit = 0;
};

// The mma.sync backward's variant under a shared-memory limit (0: any), e.g. "128 keys, 2 stages";
// empty where none fits or head_dim has no flash kernel.
std::string flash_backward_variant(int64_t head_dim, bool gathered, size_t shared_limit);

cudaError_t flash_attention_forward(bf16* out, float* lse, const bf16* qkv, const int32_t* doc_start, int64_t n,
                                    int64_t heads, int64_t kv_heads, int64_t head_dim, cudaStream_t stream,
                                    const FlashOptions& options = {});

// dqkv overwritten. scratch: fp32 device memory of flash_attention_scratch(...) elements (dQ, dK
// and dV accumulators and the row statistic delta = dout . out).
// (dQ rows padded to whole 64-query tiles for the wgmma backward's layout: wgmma_dq_rows.)
// (Then the wgmma backward's query ranges, wgmma_query_range_words, from an even offset.)
inline int64_t flash_attention_scratch(int64_t n, int64_t heads, int64_t kv_heads, int64_t head_dim) {
  return wgmma_dq_rows(n) * heads * head_dim + n * heads + 2 * n * kv_heads * head_dim + 1 +
         wgmma_query_range_words(n);
}
cudaError_t flash_attention_backward(bf16* dqkv, float* scratch, const bf16* dout, const bf16* out, const float* lse,
                                     const bf16* qkv, const int32_t* doc_start, int64_t n, int64_t heads,
                                     int64_t kv_heads, int64_t head_dim, cudaStream_t stream,
                                     const FlashOptions& options = {});

// Context parallelism (model/context_attention.h): a share's n queries (the q blocks of qkv, query i
// at row position position[i], ascending) against the keys and values of the whole row gathered
// in kv ([n_kv, 2 * kv_heads * head_dim], k | v; row position p at row kv_row[p]); doc_start per
// query, in row positions. The same kernels as the whole-row path (wgmma or mma.sync), in their
// gathered variant.
cudaError_t flash_attention_forward_gathered(bf16* out, float* lse, const bf16* qkv, const bf16* kv,
                                             const int32_t* kv_row, const int32_t* position,
                                             const int32_t* doc_start, int64_t n, int64_t n_kv, int64_t heads,
                                             int64_t kv_heads, int64_t head_dim, cudaStream_t stream,
                                             const FlashOptions& options = {});
// dqkv: dq in the q blocks, zeros in the k and v blocks (overwritten); dkv (gathered rows) += the
// gradients of the row's keys and values from these queries. scratch: fp32 device memory of
// flash_attention_gathered_scratch(...) elements.
inline int64_t flash_attention_gathered_scratch(int64_t n, int64_t n_kv, int64_t heads, int64_t kv_heads,
                                                int64_t head_dim) {
  return wgmma_dq_rows(n) * heads * head_dim + n * heads + 2 * n_kv * kv_heads * head_dim + 1 +
         wgmma_query_range_words(n_kv);
}
cudaError_t flash_attention_backward_gathered(bf16* dqkv, bf16* dkv, float* scratch, const bf16* dout,
                                              const bf16* out, const float* lse, const bf16* qkv, const bf16* kv,
                                              const int32_t* kv_row, const int32_t* position,
                                              const int32_t* doc_start, int64_t n, int64_t n_kv, int64_t heads,
                                              int64_t kv_heads, int64_t head_dim, cudaStream_t stream,
                                              const FlashOptions& options = {});

}  // namespace glm::cuda
