// Flash attention for head_dim 128 on Hopper (wgmma, sm_90a): the forward, and the backward's main
// kernel (the delta pass, the accumulators and their conversion stay in flash_attention.cu).
#pragma once

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_rows.cuh"

namespace glm::cuda {

// True when this build holds sm_90a code, the current device is compute capability 9.0 and head_dim
// is 128.
bool flash_wgmma_available(int64_t head_dim);
// Dynamic shared memory per block the wgmma kernels ask for (the backward's, the larger).
size_t flash_wgmma_shared_bytes();

// Same contract as flash_attention_forward (whole rows) and flash_attention_forward_gathered
// (gathered: a context-parallel share's rows, flash_rows.cuh).
cudaError_t flash_forward_wgmma(bf16* out, float* lse, const FlashRows& rows, bool gathered,
                                const int32_t* doc_start, int64_t heads, int64_t kv_heads, cudaStream_t stream);

// The wgmma backward's dQ accumulator layout: per head, per 64-query tile and per 64-dim half, one
// contiguous 16 KB block in the order of the warpgroup's accumulator registers (float4 chunk j of
// thread t at (j * 128 + t) * 4), so that each thread adds a tile with 16-byte vector atomics and a
// warp's atomics cover 512 contiguous bytes. Rows are padded to whole tiles.
constexpr int64_t kWgmmaDqTile = 64;
// Tokens of dQ accumulator rows: n padded to whole tiles (flash_attention_scratch uses the same).
__host__ __device__ inline int64_t wgmma_dq_rows(int64_t n) { return (n + kWgmmaDqTile - 1) / kWgmmaDqTile * kWgmmaDqTile; }
// Index of dQ element (token t, head h, dim c < 128) in that layout.
__host__ __device__ inline int64_t wgmma_dq_index(int64_t t, int64_t h, int c, int64_t n) {
  const int64_t tiles = wgmma_dq_rows(n) / kWgmmaDqTile;
  const int r = static_cast<int>(t % kWgmmaDqTile), cc = c & 63;
  const int thread = (r >> 4) * 32 + (r & 7) * 4 + ((cc & 7) >> 1);
  const int in_chunk = ((r >> 3) & 1) * 2 + (cc & 1);
  return (((h * tiles + t / kWgmmaDqTile) * 2 + (c >> 6)) * 8 + (cc >> 3)) * 512 + thread * 4 + in_chunk;
}

// The backward's blocks of keys, and the int32 words of their query ranges (a first kernel finds,
// once for every head, which queries see each block's keys; two words a block).
constexpr int64_t kWgmmaBackwardKeys = 128;
__host__ __device__ inline int64_t wgmma_query_range_words(int64_t n_kv) {
  return 2 * ((n_kv + kWgmmaBackwardKeys - 1) / kWgmmaBackwardKeys);
}

// dK and dV ([rows.n_kv][kv_heads][128] each, by row position) and dQ (wgmma_dq_index's layout,
// wgmma_dq_rows(rows.n_q) x heads x 128) fp32 accumulators, cleared by the caller, receive this
// call's sums; delta = dout . out per (query, head). Blocks run in chunks of head_chunk heads; dQ is
// added by 16-byte atomics when dq_vector_atomics (and dq_acc is 16-byte aligned), else by paired
// ones. query_ranges: device memory of wgmma_query_range_words(rows.n_kv) int32, 8-byte aligned.
cudaError_t flash_backward_wgmma(float* dk_acc, float* dv_acc, float* dq_acc, int32_t* query_ranges,
                                 const float* delta, const bf16* dout, const float* lse, const FlashRows& rows,
                                 bool gathered, const int32_t* doc_start, int64_t heads, int64_t kv_heads,
                                 int head_chunk, bool dq_vector_atomics, cudaStream_t stream);

}  // namespace glm::cuda
