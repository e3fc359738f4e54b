// Few-row linear layers (see gemv.cuh).
#include "kernels/cuda/gemv.cuh"

#include "kernels/cuda/vec.cuh"

namespace glm::cuda {
namespace {

constexpr int kWarps = 8;   // output features a block, one a warp
constexpr int kUnroll = 4;  // 16-byte weight loads in flight per lane before the first is used

template <int R>
__device__ __forceinline__ void dot_vectors(float acc[R], const uint4* w, const bf16* in, int64_t in_features,
                                            int64_t first, int64_t count) {
  float wf[8], xf[8];
  for (int64_t v0 = first; v0 < count; v0 += 32 * kUnroll) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = v0 + u * 32;
      wv[u] = v < count ? __ldcs(w + v) : make_uint4(0, 0, 0, 0);  // streamed: no reuse
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = v0 + u * 32;
      if (v >= count) break;
      unpack_bf16x8(wv[u], wf);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        unpack_bf16x8(__ldg(reinterpret_cast<const uint4*>(in + r * in_features) + v), xf);
        float a = acc[r];
#pragma unroll
        for (int e = 0; e < 8; ++e) a = fmaf(wf[e], xf[e], a);
        acc[r] = a;
      }
    }
  }
}

template <int R, bool F32>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(void* out, const bf16* in, const bf16* weight,
                                                           const bf16* bias, const void* addend, int64_t in_features,
                                                           int64_t out_features) {
  const int lane = threadIdx.x & 31;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (o >= out_features) return;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  const int64_t vectors = in_features / 8;
  dot_vectors<R>(acc, reinterpret_cast<const uint4*>(weight + o * in_features), in, in_features, lane, vectors);
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = warp_sum(acc[r]);
  if (lane >= R) return;
  // Lane r writes row r: a register array indexed by a constant after the unrolled select.
  float value = 0.0f;
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (lane == r) value = acc[r];
  if (bias != nullptr) value += __bfloat162float(bias[o]);
  const int64_t at = lane * out_features + o;
  if constexpr (F32) {
    if (addend != nullptr) value += static_cast<const float*>(addend)[at];
    static_cast<float*>(out)[at] = value;
  } else {
    if (addend != nullptr) value += __bfloat162float(static_cast<const bf16*>(addend)[at]);
    static_cast<bf16*>(out)[at] = __float2bfloat16(value);
  }
}

template <int R>
cudaError_t launch(void* out, bool out_f32, const bf16* in, const bf16* weight, const bf16* bias, const void* addend,
                   int64_t in_features, int64_t out_features, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((out_features + kWarps - 1) / kWarps));
  if (out_f32)
    gemv_kernel<R, true><<<grid, kWarps * 32, 0, stream>>>(out, in, weight, bias, addend, in_features, out_features);
  else
    gemv_kernel<R, false><<<grid, kWarps * 32, 0, stream>>>(out, in, weight, bias, addend, in_features, out_features);
  return cudaGetLastError();
}

}  // namespace

bool gemv_fits(int64_t rows, int64_t in_features, const void* in, const void* weight) {
  return rows >= 1 && rows <= kGemvMaxRows && in_features > 0 && in_features % 8 == 0 && aligned16(in) &&
         aligned16(weight);
}

cudaError_t gemv(void* out, bool out_f32, const bf16* in, const bf16* weight, const bf16* bias, const void* addend,
                 int64_t rows, int64_t in_features, int64_t out_features, cudaStream_t stream) {
  if (out_features == 0) return cudaSuccess;
  if (!gemv_fits(rows, in_features, in, weight) || (out_features + kWarps - 1) / kWarps > 0x7fffffff)
    return cudaErrorInvalidValue;
  switch (rows) {
    case 1: return launch<1>(out, out_f32, in, weight, bias, addend, in_features, out_features, stream);
    case 2: return launch<2>(out, out_f32, in, weight, bias, addend, in_features, out_features, stream);
    case 3: return launch<3>(out, out_f32, in, weight, bias, addend, in_features, out_features, stream);
    case 4: return launch<4>(out, out_f32, in, weight, bias, addend, in_features, out_features, stream);
    case 5: return launch<5>(out, out_f32, in, weight, bias, addend, in_features, out_features, stream);
    case 6: return launch<6>(out, out_f32, in, weight, bias, addend, in_features, out_features, stream);
    case 7: return launch<7>(out, out_f32, in, weight, bias, addend, in_features, out_features, stream);
    default: return launch<8>(out, out_f32, in, weight, bias, addend, in_features, out_features, stream);
  }
}

}  // namespace glm::cuda
