// Few-row linear layers (see gemv.cuh).
#include "kernels/cuda/gemv.cuh"

#include "kernels/cuda/vec.cuh"

namespace glm::cuda {
namespace {

constexpr int kWarps = 8;   // output features a block, one a warp
constexpr int kUnroll = 4;  // 16-byte weight loads in flight per lane before the first is used
static_assert(kGemvMaxRows == 2, "gemv() launches the kernels of one and two rows");

// What the kernel does around the dot products.
enum class Mode {
  plain,   // out = W in (+ bias) (+ addend)
  normed,  // out = W rmsnorm(in) (+ bias): the norm's weight folded into the input loads, its scale at the end
  swiglu,  // out = swiglu(W rmsnorm(in)): a block's gate features and their up features side by side
};

// NORM: the input scaled by the norm's weight as loaded, its squares summed in ss (the warp covers
// the whole row).
template <int R, bool NORM>
__device__ __forceinline__ void dot_vectors(float acc[R], float ss[R], const uint4* w, const bf16* in,
                                            const bf16* norm, int64_t in_features, int64_t first, int64_t count) {
  float wf[8], xf[8], gf[8];
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
      if constexpr (NORM) unpack_bf16x8(__ldg(reinterpret_cast<const uint4*>(norm) + v), gf);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        unpack_bf16x8(__ldg(reinterpret_cast<const uint4*>(in + r * in_features) + v), xf);
        float a = acc[r];
        if constexpr (NORM) {
          float q = ss[r];
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            q = fmaf(xf[e], xf[e], q);
            a = fmaf(wf[e], gf[e] * xf[e], a);
          }
          ss[r] = q;
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) a = fmaf(wf[e], xf[e], a);
        }
        acc[r] = a;
      }
    }
  }
}

// Exact where exp(-g) overflows, as the SwiGLU kernel's.
__device__ __forceinline__ float silu(float g) { return g * __frcp_rn(1.0f + __expf(-g)); }

// A warp an output feature. swiglu: warp w < kWarps / 2 takes gate feature j = block * kWarps / 2 + w,
// warp w + kWarps / 2 the up feature ffn + j, and the first writes the product; out_features is
// then 2 ffn and out [rows, ffn].
template <int R, bool F32, Mode M>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(void* out, const bf16* in, const bf16* weight,
                                                           const bf16* bias, const void* addend, const bf16* norm,
                                                           float eps, int64_t in_features, int64_t out_features) {
  constexpr bool kNorm = M != Mode::plain;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t ffn = out_features / 2;
  int64_t o = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  bool active = o < out_features;
  if constexpr (M == Mode::swiglu) {
    const int64_t j = static_cast<int64_t>(blockIdx.x) * (kWarps / 2) + warp % (kWarps / 2);
    active = j < ffn;
    o = warp < kWarps / 2 ? j : ffn + j;
  } else {
    if (!active) return;
  }
  float acc[R], ss[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = ss[r] = 0.0f;
  const int64_t vectors = in_features / 8;
  if (active)
    dot_vectors<R, kNorm>(acc, ss, reinterpret_cast<const uint4*>(weight + o * in_features), in, norm, in_features,
                          lane, vectors);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    acc[r] = warp_sum(acc[r]);
    if constexpr (kNorm) acc[r] *= rsqrtf(warp_sum(ss[r]) / static_cast<float>(in_features) + eps);
  }
  // Lane r has row r: a register array indexed by a constant after the unrolled select.
  float value = 0.0f;
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (lane == r) value = acc[r];
  if constexpr (M == Mode::swiglu) {
    // The gate and up values rounded as the linear's output would be, then the SwiGLU kernel's arithmetic.
    __shared__ float up[kWarps / 2][R];
    if (warp >= kWarps / 2 && lane < R) up[warp - kWarps / 2][lane] = __bfloat162float(__float2bfloat16(value));
    __syncthreads();
    if (!active || warp >= kWarps / 2 || lane >= R) return;
    const float g = __bfloat162float(__float2bfloat16(value));
    static_cast<bf16*>(out)[lane * ffn + o] = __float2bfloat16(silu(g) * up[warp][lane]);
    return;
  }
  if (lane >= R) return;
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
                   const bf16* norm, float eps, bool swiglu, int64_t in_features, int64_t out_features,
                   cudaStream_t stream) {
  const int64_t per_block = swiglu ? kWarps / 2 : kWarps, features = swiglu ? out_features / 2 : out_features;
  const dim3 grid(static_cast<unsigned>((features + per_block - 1) / per_block));
  void (*kernel)(void*, const bf16*, const bf16*, const bf16*, const void*, const bf16*, float, int64_t, int64_t) =
      out_f32 ? gemv_kernel<R, true, Mode::plain> : gemv_kernel<R, false, Mode::plain>;
  if constexpr (R == 1) {  // the fused modes take one row (gemv() checks)
    if (swiglu) kernel = gemv_kernel<R, false, Mode::swiglu>;
    else if (norm != nullptr) kernel = gemv_kernel<R, false, Mode::normed>;
  }
  kernel<<<grid, kWarps * 32, 0, stream>>>(out, in, weight, bias, addend, norm, eps, in_features, out_features);
  return cudaGetLastError();
}

}  // namespace

bool gemv_fits(int64_t rows, int64_t in_features, const void* in, const void* weight) {
  return rows >= 1 && rows <= kGemvMaxRows && in_features > 0 && in_features % 8 == 0 && aligned16(in) &&
         aligned16(weight);
}

bool gemv_fusion_fits(int64_t rows, int64_t in_features, int64_t out_features, const void* in, const void* weight,
                      bool bias, const GemvFusion& fused) {
  return rows == 1 && gemv_fits(rows, in_features, in, weight) && fused.norm != nullptr && aligned16(fused.norm) &&
         !(fused.swiglu && (out_features % 2 != 0 || bias));
}

cudaError_t gemv(void* out, bool out_f32, const bf16* in, const bf16* weight, const bf16* bias, const void* addend,
                 int64_t rows, int64_t in_features, int64_t out_features, cudaStream_t stream,
                 const GemvFusion& fused) {
  if (out_features == 0) return cudaSuccess;
  const bool fusing = fused.norm != nullptr || fused.swiglu;
  if (!gemv_fits(rows, in_features, in, weight) || (out_features + kWarps - 1) / kWarps > 0x7fffffff ||
      (fusing && (out_f32 || addend != nullptr ||
                  !gemv_fusion_fits(rows, in_features, out_features, in, weight, bias != nullptr, fused))))
    return cudaErrorInvalidValue;
  const float eps = fused.eps;
  if (rows == 1)
    return launch<1>(out, out_f32, in, weight, bias, addend, fused.norm, eps, fused.swiglu, in_features, out_features,
                     stream);
  return launch<2>(out, out_f32, in, weight, bias, addend, fused.norm, eps, fused.swiglu, in_features, out_features,
                   stream);
}

}  // namespace glm::cuda
