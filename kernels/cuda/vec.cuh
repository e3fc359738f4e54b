// 16-byte vectors of 8 bf16 for the memory-bound kernels (RMSNorm, SwiGLU, RoPE): conversion to
// and from fp32 in registers, the host-side test whether pointers and row lengths allow them, and
// the device's multiprocessor count for sizing persistent grids.
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace glm::cuda {

constexpr int kBf16PerVec = 8;  // one uint4 = 16 bytes, the widest single load/store

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Multiprocessors of the current device.
inline cudaError_t multiprocessor_count(int* count) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  return cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device);
}

#ifdef __CUDACC__
// bf16 -> fp32 is exact: the bf16 bits are the high half of the fp32 bits.
__device__ __forceinline__ void unpack_bf16x8(const uint4& v, float f[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// Round-to-nearest-even pairs, as __float2bfloat16 does element by element.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ uint4 pack_bf16x8(const float f[8]) {
  return make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]),
                    pack_bf16x2(f[6], f[7]));
}
#endif

}  // namespace glm::cuda
