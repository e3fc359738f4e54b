// Tensor-core building blocks shared by the flash-attention and decode kernels: cp.async copies into
// shared memory, ldmatrix fragment loads and their addressing, the m16n8k16 bf16 MMA, bf16 packing
// and paired fp32 atomics.
#pragma once

#include "kernels/cuda/common.cuh"

namespace glm::cuda {

constexpr float kLog2e = 1.4426950408889634f;  // softmax in base 2: e^x = 2^(x log2 e)

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without staging in registers; !valid fills the 16 bytes with zeros.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }
// Waits until at most N of the thread's newest commit groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Four 8x8 bf16 matrices from shared memory; lane l gives the address of row (l & 7) of matrix l >> 3.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// Fragment addressing inside a shared tile with row stride ld (elements), for a warp's lane:
// A operand (16 x 16 at row0, col0) of a row-major [m][k] tile, non-transposed ldmatrix.
__device__ __forceinline__ const bf16* a_frag(const bf16* tile, int ld, int row0, int col0, int lane) {
  return tile + (row0 + (lane & 15)) * ld + col0 + (lane >> 4) * 8;
}
// B operands of two n8 tiles (n0, n0 + 8) x k16 from a [n][k] tile (keys x dims): regs {b0, b1} of
// n-tile n0, then of n0 + 8.
__device__ __forceinline__ const bf16* b_frag_nk(const bf16* tile, int ld, int n0, int k0, int lane) {
  const int m = lane >> 3;
  return tile + (n0 + (m >> 1) * 8 + (lane & 7)) * ld + k0 + (m & 1) * 8;
}
// The same from a [k][n] tile (transposed ldmatrix).
__device__ __forceinline__ const bf16* b_frag_kn(const bf16* tile, int ld, int k0, int n0, int lane) {
  const int m = lane >> 3;
  return tile + (k0 + (m & 1) * 8 + (lane & 7)) * ld + n0 + (m >> 1) * 8;
}

// One m16n8k16 bf16 tensor-core MMA with fp32 accumulation (PTX ISA "mma.sync.aligned.m16n8k16").
// Fragment layouts (lane = 4 * group + quad): A regs {row g, cols 2q..2q+1}, {row g+8, same},
// {row g, cols +8}, {row g+8, cols +8}; B regs {k 2q..2q+1, n g}, {k +8}; C {row g, cols 2q..2q+1},
// {row g+8, same}.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x on the SFU alone (ex2.approx.ftz: relative error about 2^-22, results below 2^-126 flushed
// to zero); exp2f wraps the same instruction in a denormal range fix-up of three more instructions.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Four adjacent fp32 accumulators (16-byte aligned) added atomically in one vector reduction (sm_90).
__device__ __forceinline__ void add4(float* p, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float4*>(p), make_float4(a, b, c, d));
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
  atomicAdd(p + 2, c);
  atomicAdd(p + 3, d);
#endif
}

// Two adjacent fp32 accumulators (8-byte aligned) added atomically in one vector reduction.
__device__ __forceinline__ void add2(float* p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(p), make_float2(a, b));
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
#endif
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

}  // namespace glm::cuda
