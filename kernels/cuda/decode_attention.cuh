// Generation's attention over a KV cache (model/kv_cache.h) for decode steps, where each query is
// the newest token of its own sequence: query i, at row position position[i], attends to the row
// positions [doc_start[i], position[i]], whose k | v rows in kv ([rows, 2 * kv_heads * head_dim])
// are kv_row[p]. The contract of flash_attention_forward_gathered (and of the CPU reference,
// kernels/cpu/cpu_ops.h attention_forward_gathered); that kernel tiles 64-128 queries of one row,
// which a decode step does not have. Here a block per (query, KV head, key split) reads each key
// and value row once for up to 16 query heads of its group (GQA: GLM-4-9B-Chat's 16 heads per KV
// head are the rows of a tensor-core MMA), with the online softmax in fp32; with more than one split
// the splits' partial results are merged (flash-decoding), so one long sequence still fills the GPU:
// on Hopper and later, up to 8 splits are one thread-block cluster that merges through distributed
// shared memory, elsewhere (and past 8 splits) a second kernel merges them.
#pragma once

#include "kernels/cuda/common.cuh"

namespace glm::cuda {

// What the kernel takes: head_dim a multiple of 8 up to 256 and at most 32 query heads per KV head.
bool decode_attention_supported(int64_t heads, int64_t kv_heads, int64_t head_dim);
// Whether the cluster form can run here: a GPU of compute capability 9.0 or later and the kernels'
// code built for it (sm_90 or later, not JIT-compiled from older PTX).
bool decode_attention_clusters_available();
// The splits of the grid: each query uses as many of them as its length fills with 64 keys each (at
// most all). decode_attention_splits sizes the grid for n queries whose sequences hold n_kv rows
// together (their mean length; a query of more keys gets longer splits, never wrong ones): about two
// blocks for each of the GPU's multiprocessors, fewer where the keys do not fill them. With
// `clusters`, 9-16 splits become 8 longer ones (one cluster, no merge kernel).
constexpr int kDecodeMaxSplits = 128;
constexpr int kDecodeClusterSplits = 8;  // the most splits of one cluster (the portable cluster size)
int decode_attention_splits(int64_t n, int64_t n_kv, int64_t heads, int64_t kv_heads, int multiprocessors,
                            bool clusters);
// The fp32 scratch of the partial results (unused with one split).
inline int64_t decode_attention_scratch(int64_t n, int splits, int64_t heads, int64_t head_dim) {
  return n * splits * heads * (head_dim + 2);
}
// out [n, heads * head_dim] bf16, lse [n, heads] (natural log of the scaled scores' exp-sum).
// `clusters` (where available) merges 2-8 splits in their cluster; scratch is then unused.
cudaError_t decode_attention(bf16* out, float* lse, float* scratch, const bf16* qkv, const bf16* kv,
                             const int32_t* kv_row, const int32_t* position, const int32_t* doc_start, int64_t n,
                             int splits, int64_t heads, int64_t kv_heads, int64_t head_dim, bool clusters,
                             cudaStream_t stream);

}  // namespace glm::cuda
