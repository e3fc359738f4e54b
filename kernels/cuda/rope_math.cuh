// RoPE's arithmetic, shared by every kernel that rotates (rope.cu's, the GEMV's epilogue): each
// rotates a pair with the same bits.
#pragma once

#include "kernels/cuda/common.cuh"

namespace glm::cuda {

// The inverse frequency of pair `pair` of a rotary part of rotary_dim dimensions, in fp32 as
// transformers computes it.
__device__ __forceinline__ float rope_inv_freq(int pair, int rotary_dim, float base) {
  return 1.0f / powf(base, static_cast<float>(2 * pair) / static_cast<float>(rotary_dim));
}

// The sine and cosine of position pos's angle at a pair of inverse frequency inv_freq.
__device__ __forceinline__ void rope_sincos(float pos, float inv_freq, float& s, float& c) {
  sincosf(__fmul_rn(pos, inv_freq), &s, &c);
}

// The pair (x0, x1) rotated by the angle of cosine c and sine s: its first and its second element,
// each one rounding of a product and one fused multiply-add, whatever the compiler contracts around.
__device__ __forceinline__ float rotated_first(float x0, float x1, float c, float s) {
  return __fmaf_rn(x0, c, -__fmul_rn(x1, s));
}
__device__ __forceinline__ float rotated_second(float x0, float x1, float c, float s) {
  return __fmaf_rn(x1, c, __fmul_rn(x0, s));
}

}  // namespace glm::cuda
