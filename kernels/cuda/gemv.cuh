// Linear layers of a few rows (a decode step: one token per sequence), where the weight matrix is
// read once for every row and the time is the weight bytes over the memory bandwidth. cuBLASLt's
// heuristic for such shapes leaves much of that bandwidth unused (most of all with its bias
// epilogue); this kernel keeps many 16-byte weight loads in flight per warp instead:
//   out[r, o] = sum_i in[r, i] * weight[o, i] (+ bias[o]) (+ addend[r, o]),  r < rows <= kGemvMaxRows,
// weight [out_features, in_features] bf16 (the Hugging Face layout), in [rows, in_features] bf16,
// out [rows, out_features] bf16 or fp32, accumulated in fp32. addend may be out itself.
#pragma once

#include "kernels/cuda/common.cuh"

namespace glm::cuda {

constexpr int64_t kGemvMaxRows = 8;

// Whether the kernel takes the shape: rows in [1, kGemvMaxRows], in_features a multiple of 8 and
// every row 16-byte aligned (uint4 loads).
bool gemv_fits(int64_t rows, int64_t in_features, const void* in, const void* weight);

cudaError_t gemv(void* out, bool out_f32, const bf16* in, const bf16* weight, const bf16* bias, const void* addend,
                 int64_t rows, int64_t in_features, int64_t out_features, cudaStream_t stream);

}  // namespace glm::cuda
