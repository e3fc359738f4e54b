// Counter-based random numbers shared by the CPU and CUDA backends: element i of a stream keyed by
// `key` depends only on (key, i), so initialisation and dropout masks are the same on any backend,
// thread count or chunking (splitmix64 mixing, Box-Muller).
#pragma once

#include <cmath>
#include <cstdint>

#include "base/host_device.h"

namespace glm {

GLM_HOST_DEVICE inline uint64_t splitmix64_mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The 64 random bits of element i of the stream `key`.
GLM_HOST_DEVICE inline uint64_t counter_bits(uint64_t key, uint64_t i) {
  return splitmix64_mix(key ^ (i * 0x9e3779b97f4a7c15ULL));
}

// Uniform in (0, 1).
GLM_HOST_DEVICE inline double counter_uniform(uint64_t key, uint64_t i) {
  const double u = static_cast<double>(counter_bits(key, i) >> 11) * 0x1.0p-53;
  return u > 0.0 ? u : 0x1.0p-53;
}

// Dropout with probability p in [0, 1): element i is kept when its bits are >= p * 2^64. An integer
// comparison, so every backend keeps exactly the same elements; P(keep) = 1 - p to within 2^-53.
inline uint64_t dropout_threshold(double p) { return p <= 0.0 ? 0 : static_cast<uint64_t>(std::ldexp(p, 64)); }
GLM_HOST_DEVICE inline bool counter_keep(uint64_t key, uint64_t i, uint64_t threshold) {
  return counter_bits(key, i) >= threshold;
}

// Standard normal number i of the stream `key`.
GLM_HOST_DEVICE inline double counter_normal(uint64_t key, uint64_t i) {
  const double u1 = counter_uniform(key, 2 * i), u2 = counter_uniform(key, 2 * i + 1);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925286766559 * u2);
}

}  // namespace glm
