// SwiGLU on the fused [n, gate | up] layout. Where ffn is a multiple of 8 and the buffers are
// 16-byte aligned: 8 bf16 per load/store, two vectors per thread in flight before any math, the
// row/column split of a vector index in 32-bit arithmetic when the total allows. Elsewhere (the
// tiny configs' odd sizes) one element per thread.
#include <algorithm>

#include "kernels/cuda/swiglu.cuh"
#include "kernels/cuda/vec.cuh"

namespace glm::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 2;  // vectors per thread per iteration

// Exact where exp(-g) overflows: g * rcp(inf) = -0, the limit of silu.
__device__ __forceinline__ float sigmoid(float g) { return __frcp_rn(1.0f + __expf(-g)); }

__global__ void swiglu_forward_scalar_kernel(bf16* out, const bf16* gate_up, int64_t n, int64_t ffn) {
  const int64_t total = n * ffn;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / ffn, j = i % ffn;
    const float g = __bfloat162float(gate_up[t * 2 * ffn + j]), u = __bfloat162float(gate_up[t * 2 * ffn + ffn + j]);
    out[i] = __float2bfloat16(g * sigmoid(g) * u);
  }
}

__global__ void swiglu_backward_scalar_kernel(bf16* dgate_up, const bf16* dout, const bf16* gate_up, int64_t n,
                                              int64_t ffn) {
  const int64_t total = n * ffn;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / ffn, j = i % ffn;
    const float g = __bfloat162float(gate_up[t * 2 * ffn + j]), u = __bfloat162float(gate_up[t * 2 * ffn + ffn + j]);
    const float d = __bfloat162float(dout[i]);
    const float s = sigmoid(g);
    dgate_up[t * 2 * ffn + j] = __float2bfloat16(d * u * s * (1.0f + g * (1.0f - s)));
    dgate_up[t * 2 * ffn + ffn + j] = __float2bfloat16(d * g * s);
  }
}

// Vector i of the [n, ffn] output lies in row i / vpr (vpr = ffn / 8 vectors per row); its gate is
// vector row * 2 vpr + column of gate_up, its up vpr further.
template <bool kWide>
__device__ __forceinline__ int64_t gate_vector(int64_t i, int64_t vpr) {
  if constexpr (kWide) {
    const int64_t row = i / vpr;
    return i + row * vpr;
  } else {
    const uint32_t row = static_cast<uint32_t>(i) / static_cast<uint32_t>(vpr);
    return i + static_cast<int64_t>(row) * vpr;
  }
}

template <bool kWide>
__global__ void __launch_bounds__(kThreads) swiglu_forward_vec_kernel(uint4* out, const uint4* gate_up, int64_t total,
                                                                     int64_t vpr) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x * kUnroll;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x * kUnroll + threadIdx.x; base < total;
       base += step) {
    uint4 gv[kUnroll], uv[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int64_t i = base + k * static_cast<int64_t>(blockDim.x);
      if (i < total) {
        const int64_t gi = gate_vector<kWide>(i, vpr);
        gv[k] = gate_up[gi];
        uv[k] = gate_up[gi + vpr];
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int64_t i = base + k * static_cast<int64_t>(blockDim.x);
      if (i < total) {
        float g[8], u[8];
        unpack_bf16x8(gv[k], g);
        unpack_bf16x8(uv[k], u);
#pragma unroll
        for (int e = 0; e < 8; ++e) g[e] = g[e] * sigmoid(g[e]) * u[e];
        out[i] = pack_bf16x8(g);
      }
    }
  }
}

template <bool kWide>
__global__ void __launch_bounds__(kThreads) swiglu_backward_vec_kernel(uint4* dgate_up, const uint4* dout,
                                                                      const uint4* gate_up, int64_t total,
                                                                      int64_t vpr) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x * kUnroll;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x * kUnroll + threadIdx.x; base < total;
       base += step) {
    uint4 gv[kUnroll], uv[kUnroll], dv[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int64_t i = base + k * static_cast<int64_t>(blockDim.x);
      if (i < total) {
        const int64_t gi = gate_vector<kWide>(i, vpr);
        gv[k] = gate_up[gi];
        uv[k] = gate_up[gi + vpr];
        dv[k] = dout[i];
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int64_t i = base + k * static_cast<int64_t>(blockDim.x);
      if (i < total) {
        float g[8], u[8], d[8], dg[8], du[8];
        unpack_bf16x8(gv[k], g);
        unpack_bf16x8(uv[k], u);
        unpack_bf16x8(dv[k], d);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float s = sigmoid(g[e]);
          dg[e] = d[e] * u[e] * s * (1.0f + g[e] * (1.0f - s));
          du[e] = d[e] * g[e] * s;
        }
        const int64_t gi = gate_vector<kWide>(i, vpr);
        dgate_up[gi] = pack_bf16x8(dg);
        dgate_up[gi + vpr] = pack_bf16x8(du);
      }
    }
  }
}

unsigned int vec_grid(int64_t total) {
  const int64_t blocks = (total + int64_t{kThreads} * kUnroll - 1) / (int64_t{kThreads} * kUnroll);
  return static_cast<unsigned int>(std::min<int64_t>(std::max<int64_t>(blocks, 1), 0x7fffffff));
}

}  // namespace

cudaError_t swiglu_forward(bf16* out, const bf16* gate_up, int64_t n, int64_t ffn, cudaStream_t stream) {
  if (n * ffn == 0) return cudaSuccess;
  if (ffn % kBf16PerVec == 0 && aligned16(out) && aligned16(gate_up)) {
    const int64_t vpr = ffn / kBf16PerVec, total = n * vpr;
    auto* o = reinterpret_cast<uint4*>(out);
    const auto* gu = reinterpret_cast<const uint4*>(gate_up);
    // 32-bit division needs the vector index below 2^32 (the gate index is never divided).
    if (total <= int64_t{0xffffffff})
      swiglu_forward_vec_kernel<false><<<vec_grid(total), kThreads, 0, stream>>>(o, gu, total, vpr);
    else
      swiglu_forward_vec_kernel<true><<<vec_grid(total), kThreads, 0, stream>>>(o, gu, total, vpr);
    return cudaGetLastError();
  }
  swiglu_forward_scalar_kernel<<<grid_for(n * ffn, kThreads), kThreads, 0, stream>>>(out, gate_up, n, ffn);
  return cudaGetLastError();
}

cudaError_t swiglu_backward(bf16* dgate_up, const bf16* dout, const bf16* gate_up, int64_t n, int64_t ffn,
                            cudaStream_t stream) {
  if (n * ffn == 0) return cudaSuccess;
  if (ffn % kBf16PerVec == 0 && aligned16(dgate_up) && aligned16(dout) && aligned16(gate_up)) {
    const int64_t vpr = ffn / kBf16PerVec, total = n * vpr;
    auto* dgu = reinterpret_cast<uint4*>(dgate_up);
    const auto* d = reinterpret_cast<const uint4*>(dout);
    const auto* gu = reinterpret_cast<const uint4*>(gate_up);
    if (total <= int64_t{0xffffffff})
      swiglu_backward_vec_kernel<false><<<vec_grid(total), kThreads, 0, stream>>>(dgu, d, gu, total, vpr);
    else
      swiglu_backward_vec_kernel<true><<<vec_grid(total), kThreads, 0, stream>>>(dgu, d, gu, total, vpr);
    return cudaGetLastError();
  }
  swiglu_backward_scalar_kernel<<<grid_for(n * ffn, kThreads), kThreads, 0, stream>>>(dgate_up, dout, gate_up, n,
                                                                                      ffn);
  return cudaGetLastError();
}

}  // namespace glm::cuda
