// Few-row linear layers (see gemv.cuh).
#include "kernels/cuda/gemv.cuh"

#include "kernels/cuda/rope_math.cuh"
#include "kernels/cuda/vec.cuh"

namespace glm::cuda {
namespace {

constexpr int kWarps = 8;   // output features a block, one a warp
constexpr int kUnroll = 4;  // 16-byte weight loads in flight per lane before the first is used
constexpr int kNormedBlocks = 5;  // the normed modes' resident blocks an SM
// The staged input and the normed modes' static shared memory (partial, and up or linear_s) within
// the 48 KiB a block has without opting in.
static_assert(sizeof(float) * (kGemvMaxNormedFeatures + 2 * kWarps) <= 48 * 1024, "the staged input fits");
static_assert(kGemvMaxRows == 2, "gemv() launches the kernels of one and two rows");

// What the kernel does around the dot products.
enum class Mode {
  plain,   // out = W in (+ bias) (+ addend)
  normed,  // out = W rmsnorm(in) (+ bias): norm * in staged in shared memory (stage_normed), its scale at the end
  swiglu,  // out = swiglu(W rmsnorm(in)): a block's gate features and their up features side by side
  rope,    // normed, then RoPE and the KV-cache store (GemvRope): a rotated pair's two features in one block
};

// The plain mode's dot products of rows in[r] with the weight row w (the normed modes stage their
// input: dot_staged).
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

// The normed modes' input, staged once a block in shared memory: norm * in in fp32, a vector's
// first four products in lo and its last four in hi (a warp's loads of either are consecutive: no
// bank conflicts); returns the row's sum of squares, the same value in every thread.
__device__ __forceinline__ float stage_normed(float4* lo, float4* hi, const bf16* in, const bf16* norm, int64_t count) {
  __shared__ float partial[kWarps];
  float q = 0.0f, xf[8], gf[8];
  for (int64_t v = threadIdx.x; v < count; v += kWarps * 32) {
    unpack_bf16x8(__ldg(reinterpret_cast<const uint4*>(in) + v), xf);
    unpack_bf16x8(__ldg(reinterpret_cast<const uint4*>(norm) + v), gf);
#pragma unroll
    for (int e = 0; e < 8; ++e) q = fmaf(xf[e], xf[e], q);
    lo[v] = make_float4(gf[0] * xf[0], gf[1] * xf[1], gf[2] * xf[2], gf[3] * xf[3]);
    hi[v] = make_float4(gf[4] * xf[4], gf[5] * xf[5], gf[6] * xf[6], gf[7] * xf[7]);
  }
  q = warp_sum(q);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = q;
  __syncthreads();  // the staged input and every warp's share of the squares
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += partial[w];
  return total;
}

// The dot product of the weight row w (count vectors, every 32nd from the lane's) with the staged
// input; wv holds the lane's first kUnroll weight vectors, loaded before the input was staged.
__device__ __forceinline__ float dot_staged(const uint4* w, const float4* lo, const float4* hi, int64_t count,
                                            uint4 (&wv)[kUnroll]) {
  const int lane = threadIdx.x & 31;
  float a = 0.0f, wf[8];
  for (int64_t v0 = lane; v0 < count; v0 += 32 * kUnroll) {
    if (v0 != lane)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t v = v0 + u * 32;
        wv[u] = v < count ? __ldcs(w + v) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = v0 + u * 32;
      if (v >= count) break;
      unpack_bf16x8(wv[u], wf);
      const float4 l = lo[v], h = hi[v];
      const float x[8] = {l.x, l.y, l.z, l.w, h.x, h.y, h.z, h.w};
#pragma unroll
      for (int e = 0; e < 8; ++e) a = fmaf(wf[e], x[e], a);
    }
  }
  return a;
}

// Exact where exp(-g) overflows, as the SwiGLU kernel's.
__device__ __forceinline__ float silu(float g) { return g * __frcp_rn(1.0f + __expf(-g)); }

// A warp an output feature. swiglu: warp w < kWarps / 2 takes gate feature j = block * kWarps / 2 + w,
// warp w + kWarps / 2 the up feature ffn + j, and the first writes the product; out_features is
// then 2 ffn and out [rows, ffn].
// rope: a block's features start at a multiple of kWarps, so that the pair (2 p, 2 p + 1) of a head's
// rotary part (q_width and head_dim even) is warps w and w + 1 of one block.
template <int R, bool F32, Mode M>
__device__ __forceinline__ void gemv_body(void* out, const bf16* in, const bf16* weight, const bf16* bias,
                                          const void* addend, const bf16* norm, float eps, int64_t in_features,
                                          int64_t out_features, const GemvRope& rope) {
  constexpr bool kNorm = M != Mode::plain;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t ffn = out_features / 2;
  int64_t o = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  bool active = o < out_features;
  if constexpr (M == Mode::swiglu) {
    const int64_t j = static_cast<int64_t>(blockIdx.x) * (kWarps / 2) + warp % (kWarps / 2);
    active = j < ffn;
    o = warp < kWarps / 2 ? j : ffn + j;
  } else if constexpr (!kNorm) {
    if (!active) return;  // the normed modes' warps all stage the input
  }
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  const int64_t vectors = in_features / 8;
  const uint4* w = reinterpret_cast<const uint4*>(weight + o * in_features);
  if constexpr (kNorm) {
    static_assert(R == 1, "the normed modes take one row");
    extern __shared__ float4 staged[];  // [2][vectors]
    uint4 wv[kUnroll];                  // the first weights in flight while the input is staged
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = lane + u * 32;
      wv[u] = active && v < vectors ? __ldcs(w + v) : make_uint4(0, 0, 0, 0);
    }
    const float squares = stage_normed(staged, staged + vectors, in, norm, vectors);
    if (active) acc[0] = dot_staged(w, staged, staged + vectors, vectors, wv);
    acc[0] = warp_sum(acc[0]) * rsqrtf(squares / static_cast<float>(in_features) + eps);
  } else {
    dot_vectors<R>(acc, w, in, in_features, lane, vectors);
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = warp_sum(acc[r]);
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
  if constexpr (M == Mode::rope) {
    static_assert(R == 1 && kWarps % 2 == 0, "a pair's two features in one block, one row");
    // The linear's output rounded as rope_store would read it, then the pair's rotation.
    __shared__ float linear_s[kWarps];
    const float biased = active && bias != nullptr ? value + __bfloat162float(bias[o]) : value;
    if (lane == 0) linear_s[warp] = active ? __bfloat162float(__float2bfloat16(biased)) : 0.0f;
    __syncthreads();
    if (!active || lane != 0) return;
    const bool q = o < rope.q_width;
    const int64_t col = q ? o : o - rope.q_width;
    const int dim = static_cast<int>(col % rope.head_dim);
    float y = linear_s[warp];
    if (dim < rope.rotary_dim && (q || col < rope.kv_width / 2)) {  // a q head's or a k head's rotary part
      float sn, cs;
      rope_sincos(static_cast<float>(*rope.position), rope_inv_freq(dim / 2, rope.rotary_dim, rope.base), sn, cs);
      const float x0 = linear_s[warp & ~1], x1 = linear_s[warp | 1];
      y = dim % 2 == 0 ? rotated_first(x0, x1, cs, sn) : rotated_second(x0, x1, cs, sn);
    }
    const bf16 result = __float2bfloat16(y);
    static_cast<bf16*>(out)[o] = result;
    if (!q) rope.cache[static_cast<int64_t>(*rope.cache_row) * rope.kv_width + col] = result;
    return;
  }
  if (!active || lane >= R) return;
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

// The plain mode's kernels, and the normed modes' with at most 48 registers a thread (five blocks
// an SM, as before the staged input).
template <int R, bool F32>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(void* out, const bf16* in, const bf16* weight, const bf16* bias, const void* addend, const bf16* norm,
                float eps, int64_t in_features, int64_t out_features, GemvRope rope) {
  gemv_body<R, F32, Mode::plain>(out, in, weight, bias, addend, norm, eps, in_features, out_features, rope);
}
template <Mode M>
__global__ void __launch_bounds__(kWarps * 32, kNormedBlocks)
    gemv_normed_kernel(void* out, const bf16* in, const bf16* weight, const bf16* bias, const void* addend,
                       const bf16* norm, float eps, int64_t in_features, int64_t out_features, GemvRope rope) {
  gemv_body<1, false, M>(out, in, weight, bias, addend, norm, eps, in_features, out_features, rope);
}

template <int R>
cudaError_t launch(void* out, bool out_f32, const bf16* in, const bf16* weight, const bf16* bias, const void* addend,
                   const bf16* norm, float eps, bool swiglu, const GemvRope& rope, int64_t in_features,
                   int64_t out_features, cudaStream_t stream) {
  const int64_t per_block = swiglu ? kWarps / 2 : kWarps, features = swiglu ? out_features / 2 : out_features;
  const dim3 grid(static_cast<unsigned>((features + per_block - 1) / per_block));
  void (*kernel)(void*, const bf16*, const bf16*, const bf16*, const void*, const bf16*, float, int64_t, int64_t,
                 GemvRope) = out_f32 ? gemv_kernel<R, true> : gemv_kernel<R, false>;
  if constexpr (R == 1) {  // the fused modes take one row (gemv() checks)
    if (swiglu) {
      kernel = gemv_normed_kernel<Mode::swiglu>;
    } else if (rope.cache != nullptr) {
      kernel = gemv_normed_kernel<Mode::rope>;
    } else if (norm != nullptr) {
      kernel = gemv_normed_kernel<Mode::normed>;
    }
  }
  const size_t staged = norm != nullptr ? sizeof(float) * static_cast<size_t>(in_features) : 0;  // the normed modes'
  kernel<<<grid, kWarps * 32, staged, stream>>>(out, in, weight, bias, addend, norm, eps, in_features, out_features,
                                                rope);
  return cudaGetLastError();
}

}  // namespace

bool gemv_fits(int64_t rows, int64_t in_features, const void* in, const void* weight) {
  return rows >= 1 && rows <= kGemvMaxRows && in_features > 0 && in_features % 8 == 0 && aligned16(in) &&
         aligned16(weight);
}

bool gemv_fusion_fits(int64_t rows, int64_t in_features, int64_t out_features, const void* in, const void* weight,
                      bool bias, const GemvFusion& fused) {
  const GemvRope& r = fused.rope;
  const bool rope_fits = r.cache == nullptr ||
                         (!fused.swiglu && r.position != nullptr && r.cache_row != nullptr && r.head_dim > 0 &&
                          r.head_dim % 2 == 0 && r.q_width % 2 == 0 && r.q_width % r.head_dim == 0 &&
                          r.kv_width > 0 && r.kv_width % (2 * r.head_dim) == 0 && r.rotary_dim >= 0 &&
                          r.rotary_dim % 2 == 0 && r.rotary_dim <= r.head_dim && out_features == r.q_width + r.kv_width);
  return rows == 1 && gemv_fits(rows, in_features, in, weight) && in_features <= kGemvMaxNormedFeatures &&
         fused.norm != nullptr && aligned16(fused.norm) && !(fused.swiglu && (out_features % 2 != 0 || bias)) &&
         rope_fits;
}

cudaError_t gemv(void* out, bool out_f32, const bf16* in, const bf16* weight, const bf16* bias, const void* addend,
                 int64_t rows, int64_t in_features, int64_t out_features, cudaStream_t stream,
                 const GemvFusion& fused) {
  if (out_features == 0) return cudaSuccess;
  const bool fusing = fused.norm != nullptr || fused.swiglu || fused.rope.cache != nullptr;
  if (!gemv_fits(rows, in_features, in, weight) || (out_features + kWarps - 1) / kWarps > 0x7fffffff ||
      (fusing && (out_f32 || addend != nullptr ||
                  !gemv_fusion_fits(rows, in_features, out_features, in, weight, bias != nullptr, fused))))
    return cudaErrorInvalidValue;
  const float eps = fused.eps;
  if (rows == 1)
    return launch<1>(out, out_f32, in, weight, bias, addend, fused.norm, eps, fused.swiglu, fused.rope, in_features,
                     out_features, stream);
  return launch<2>(out, out_f32, in, weight, bias, addend, fused.norm, eps, fused.swiglu, fused.rope, in_features,
                   out_features, stream);
}

}  // namespace glm::cuda
