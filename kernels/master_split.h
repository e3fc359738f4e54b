// The fp32 master weight stored as two 16-bit halves: the bf16 working copy (the high half, what
// the forward's GEMMs read) and a signed 16-bit offset (the low half). Exact both ways, so the
// optimizer keeps a true fp32 master in 4 bytes a parameter with the working copy included,
// instead of 6 (fp32 master + bf16 copy): a GLM-4-9B-shaped model saves 2 bytes a parameter of
// memory and of the update's traffic.
//
// hi is x rounded to the nearest bf16 with ties away from zero (round-to-nearest-even differs
// only on exact ties, one value in 65,536, by one bf16 step): with ties rounded up in magnitude,
// bits(x) - (bits(hi) << 16) lies in [-32768, 32767] and fits the offset; with ties to even,
// +32768 would not. Infinities and NaNs keep their high half unrounded.
#pragma once

#include <cstdint>
#include <cstring>

#include "base/host_device.h"

namespace glm {

GLM_HOST_DEVICE inline uint32_t float_bits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
#endif
}

GLM_HOST_DEVICE inline float bits_float(uint32_t b) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(b);
#else
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
#endif
}

// x -> (hi: bf16 bits, lo: offset of x's bits from hi's).
GLM_HOST_DEVICE inline void split_master(float x, uint16_t& hi, int16_t& lo) {
  const uint32_t b = float_bits(x);
  const uint32_t up = b >> 16;
  if ((b & 0x7f800000u) == 0x7f800000u) {  // infinity stays one; a NaN stays a NaN (quiet bit set)
    hi = static_cast<uint16_t>((b & 0x007fffffu) != 0 ? (up | 0x0040u) : up);
    lo = 0;
    return;
  }
  const uint32_t h = up + ((b & 0xffffu) >= 0x8000u ? 1u : 0u);
  hi = static_cast<uint16_t>(h);
  lo = static_cast<int16_t>(static_cast<int32_t>(b - (h << 16)));
}

GLM_HOST_DEVICE inline float join_master(uint16_t hi, int16_t lo) {
  return bits_float((static_cast<uint32_t>(hi) << 16) + static_cast<uint32_t>(static_cast<int32_t>(lo)));
}

}  // namespace glm
