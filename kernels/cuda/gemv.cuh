// Linear layers of one or two rows (a decode step of one or two sequences), where the weight matrix
// is read once and the time is the weight bytes over the memory bandwidth. cuBLASLt reads the
// weights at 0.5-0.85 of that bandwidth at such shapes; this kernel keeps many 16-byte weight loads
// in flight per warp and reaches 0.78-0.90 with one row. Each further row costs each weight vector
// another input load and 8 FMAs: from three rows cuBLASLt is the faster (benchmarks/RESULTS.md).
//   out[r, o] = sum_i in[r, i] * weight[o, i] (+ bias[o]) (+ addend[r, o]),  r < rows <= kGemvMaxRows,
// weight [out_features, in_features] bf16 (the Hugging Face layout), in [rows, in_features] bf16,
// out [rows, out_features] bf16 or fp32, accumulated in fp32. addend may be out itself.
#pragma once

#include "kernels/cuda/common.cuh"

namespace glm::cuda {

constexpr int64_t kGemvMaxRows = 2;
// The fused modes' staged input: 48 KiB of shared memory less the kernel's own 64 bytes.
constexpr int64_t kGemvMaxNormedFeatures = 12272;

// Whether the kernel takes the shape: rows in [1, kGemvMaxRows], in_features a multiple of 8 and
// every row 16-byte aligned (uint4 loads).
bool gemv_fits(int64_t rows, int64_t in_features, const void* in, const void* weight);

// Generation's RoPE and KV-cache store after the attention's q | k | v linear (rope_store() of
// rope.cuh on the GEMV's row): out's features [0, q_width) are the q heads, then kv_width of k | v
// heads (head_dim each); the rotary part (the first rotary_dim of each q and k head) rotated by
// position's angles, the k | v columns also written to cache row cache_row ([rows, kv_width]).
struct GemvRope {
  bf16* cache = nullptr;
  const int32_t* position = nullptr;   // one entry, on the device
  const int32_t* cache_row = nullptr;  // one entry, on the device
  int64_t q_width = 0, kv_width = 0;
  int head_dim = 0, rotary_dim = 0;
  float base = 0.0f;
};

// What a decode step of one sequence runs around a linear, fused into the GEMV
// (Backend::normed_linear_forward): with norm, the input is rmsnorm(in; norm, eps), scaled in fp32
// (not rounded to bf16 first), and with swiglu too (no bias), out [1, out_features / 2] = silu(gate)
// * up of the linear's two halves, each rounded to bf16 first as the linear's output would be; with
// rope.cache set (and norm, without swiglu), RoPE and the store on the output, rounded to bf16 first
// (rope_store's bits). One row only (two run faster as the separate ops), neither with an fp32 out
// nor an addend. Each block first stages norm * in in fp32 in shared memory (4 bytes a feature, at
// most kGemvMaxNormedFeatures) and the row's sum of squares, then multiplies its weights with that.
struct GemvFusion {
  const bf16* norm = nullptr;
  float eps = 0.0f;
  bool swiglu = false;
  GemvRope rope;
};

// Whether the kernel takes a fused shape (fused.norm set): gemv_fits' with one row and at most
// kGemvMaxNormedFeatures in_features, a 16-byte aligned norm weight, with swiglu an even
// out_features and no bias, with rope out_features = q_width + kv_width, even head_dim and q_width,
// and an even rotary_dim of at most head_dim.
bool gemv_fusion_fits(int64_t rows, int64_t in_features, int64_t out_features, const void* in, const void* weight,
                      bool bias, const GemvFusion& fused);

cudaError_t gemv(void* out, bool out_f32, const bf16* in, const bf16* weight, const bf16* bias, const void* addend,
                 int64_t rows, int64_t in_features, int64_t out_features, cudaStream_t stream,
                 const GemvFusion& fused = {});

}  // namespace glm::cuda
