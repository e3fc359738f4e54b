// Where a flash-attention call's query and key rows live (FlashRows: one sequence's fused qkv, or a
// context-parallel share against its gathered row), and the searches over them that both the
// mma.sync and the wgmma kernels use.
#pragma once

#include "kernels/cuda/common.cuh"

namespace glm::cuda {

// Queries: n_q rows of q (row stride q_stride), query i at row position i, or pos[i] when Gathered
// (ascending). Keys and values: row position p at row p of k and v (stride kv_stride), or at row
// kv_row[p] when Gathered and kv_row is not null; n_kv positions.
struct FlashRows {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  const int32_t* pos;
  const int32_t* kv_row;
  int64_t q_stride, kv_stride, n_q, n_kv;
};

// The rows of one sequence's fused qkv (queries, keys and values all in it, positions 0..n-1).
inline FlashRows whole_rows(const bf16* qkv, int64_t n, int64_t heads, int64_t kv_heads, int64_t d) {
  const int64_t width = (heads + 2 * kv_heads) * d;
  return FlashRows{qkv, qkv + heads * d, qkv + (heads + kv_heads) * d, nullptr, nullptr, width, width, n, n};
}

// A context-parallel share's queries (in qkv) against its gathered row kv ([n_kv, 2 kv_heads d],
// k | v).
inline FlashRows gathered_rows(const bf16* qkv, const bf16* kv, const int32_t* kv_row, const int32_t* position,
                               int64_t n, int64_t n_kv, int64_t heads, int64_t kv_heads, int64_t d) {
  return FlashRows{qkv,      kv, kv + kv_heads * d, position, kv_row, (heads + 2 * kv_heads) * d, 2 * kv_heads * d,
                   n,        n_kv};
}

#ifdef __CUDACC__
template <bool Gathered>
__device__ __forceinline__ int query_position(const FlashRows& rows, int64_t i) {
  if constexpr (Gathered) return rows.pos[i];
  return static_cast<int>(i);
}

// Row position p's row in k and v.
template <bool Gathered>
__device__ __forceinline__ int64_t key_row(const FlashRows& rows, int64_t p) {
  if (Gathered && rows.kv_row != nullptr) return rows.kv_row[p];
  return p;
}

// First index i in [lo, hi) with a[i] >= value (a nondecreasing there), or hi.
__device__ __forceinline__ int64_t first_at_least(const int32_t* a, int64_t lo, int64_t hi, int64_t value) {
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (a[mid] < value)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// The queries [begin, end) that can see some key of row positions [k0, k_last]: those at or after
// position k0 whose document starts by k_last (positions and document starts are nondecreasing;
// positions are distinct, so the first at or after k_last is at most k_last - k0 after begin).
// Empty where no query of the call sees them.
template <bool Gathered>
__device__ __forceinline__ void queries_seeing(const FlashRows& rows, const int32_t* doc_start, int64_t k0,
                                               int64_t k_last, int64_t& begin, int64_t& end) {
  if constexpr (Gathered) {
    begin = first_at_least(rows.pos, 0, rows.n_q, k0);
    const int64_t at_last = first_at_least(rows.pos, begin, min(rows.n_q, begin + k_last - k0 + 1), k_last);
    end = first_at_least(doc_start, at_last, rows.n_q, k_last + 1);
  } else {
    begin = k0;
    end = first_at_least(doc_start, k_last, rows.n_q, k_last + 1);
  }
}
#endif

}  // namespace glm::cuda
