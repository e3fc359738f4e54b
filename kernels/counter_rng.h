// Counter-based random numbers shared by the CPU and CUDA backends: element i of a stream keyed by
// `key` depends only on (key, i), so initialisation is the same on any backend, thread count or
// chunking (splitmix64 mixing, Box-Muller).
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define GLM_HOST_DEVICE __host__ __device__
#else
#define GLM_HOST_DEVICE
#endif

namespace glm {

GLM_HOST_DEVICE inline uint64_t splitmix64_mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform in (0, 1).
GLM_HOST_DEVICE inline double counter_uniform(uint64_t key, uint64_t i) {
  const double u = static_cast<double>(splitmix64_mix(key ^ (i * 0x9e3779b97f4a7c15ULL)) >> 11) * 0x1.0p-53;
  return u > 0.0 ? u : 0x1.0p-53;
}

// Standard normal number i of the stream `key`.
GLM_HOST_DEVICE inline double counter_normal(uint64_t key, uint64_t i) {
  const double u1 = counter_uniform(key, 2 * i), u2 = counter_uniform(key, 2 * i + 1);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925286766559 * u2);
}

}  // namespace glm
