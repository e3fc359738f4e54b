// bf16 as 16-bit patterns on the host: fp32 to bf16 with round to nearest even (what the CUDA
// conversion and the exported tensors use) and back.
#pragma once

#include <cstdint>
#include <cstring>

namespace glm {

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0)
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN, sign kept
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

inline float bf16_bits_to_float(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace glm
