// Grid-stride update, torch.optim.AdamW arithmetic in fp32. The update moves 28 bytes per element
// (fp32 master and moments read and written, bf16 gradient read and working copy written), or 26
// with the master split (kernels/master_split.h: the bf16 working copy and a 16-bit low half read
// and written in its place), so it is memory-bound: where every pointer is 16-byte aligned each
// thread moves 8 elements per iteration in 16-byte vectors (two float4 per fp32 array, one uint4
// per 16-bit array); the last n % 8 elements and misaligned views take the element-wise loop.
// Both apply the same per-element arithmetic, so the two paths agree bit for bit. With kNorm each thread also sums the squares of
// the gradients it read (fp32), each block adds its total to one fp64 accumulator; the grid is then
// one resident wave so that the atomics stay few, or, beside other work, blocks of at most 8 items
// per thread (vectors of 8 or, misaligned, single elements) that hand their SMs back as they finish.
#include <type_traits>

#include "kernels/cuda/adamw.cuh"
#include "kernels/cuda/vec.cuh"
#include "kernels/master_split.h"

namespace glm::cuda {
namespace {

struct AdamWScalars {
  float step_size, decay;
};

// Every rounding spelled out (intrinsics the compiler neither contracts nor reorders), so that the
// whole-table kernels and the deferred rows' kernel, compiled apart, give the same bits.
__device__ __forceinline__ float adamw_element(float g, float& master, float& m, float& v, const AdamWArgs& a,
                                               const AdamWScalars& s) {
  g = __fmul_rn(g, a.grad_scale);
  m = __fmaf_rn(a.beta1, m, __fmul_rn(1.0f - a.beta1, g));
  v = __fmaf_rn(a.beta2, v, __fmul_rn(__fmul_rn(1.0f - a.beta2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), a.bias_correction2_sqrt), a.eps);
  master = __fmaf_rn(master, s.decay, -__fdiv_rn(__fmul_rn(s.step_size, m), denom));
  return master;
}

__device__ __forceinline__ AdamWScalars scalars(const AdamWArgs& a) {
  return {__fdiv_rn(a.lr, a.bias_correction1), __fsub_rn(1.0f, __fmul_rn(a.lr, a.weight_decay))};
}

template <bool kNorm>
__device__ __forceinline__ void add_block_sum(double* grad_sq_sum, float squares) {
  if constexpr (kNorm) {
    squares = block_sum(squares);
    if (threadIdx.x == 0) atomicAdd(grad_sq_sum, static_cast<double>(squares));
  }
}

// The fp32 master of element i: in master[i], or split (kSplit) into param[i] (the high half, the
// bf16 working copy) and master_lo[i] (kernels/master_split.h).
template <bool kSplit>
__device__ __forceinline__ float load_master(const bf16* param, const float* master, const int16_t* master_lo,
                                             int64_t i) {
  if constexpr (kSplit) return join_master(__bfloat16_as_ushort(param[i]), master_lo[i]);
  return master[i];
}

template <bool kSplit>
__device__ __forceinline__ void store_master(bf16* param, float* master, int16_t* master_lo, int64_t i, float p) {
  if constexpr (kSplit) {
    uint16_t hi;
    split_master(p, hi, master_lo[i]);
    param[i] = __ushort_as_bfloat16(hi);
  } else {
    master[i] = p;
    if (param != nullptr) param[i] = __float2bfloat16(p);
  }
}

// Elements [begin, n) one by one.
template <bool kNorm, bool kSplit>
__global__ void adamw_kernel(bf16* param, float* master, int16_t* master_lo, const bf16* grad, float* exp_avg,
                             float* exp_avg_sq, int64_t begin, int64_t n, AdamWArgs a, double* grad_sq_sum) {
  const AdamWScalars s = scalars(a);
  float squares = 0.0f;
  for (int64_t i = begin + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float p = load_master<kSplit>(param, master, master_lo, i), m = exp_avg[i], v = exp_avg_sq[i];
    const float g = __bfloat162float(grad[i]);
    if constexpr (kNorm) squares += g * g;
    adamw_element(g, p, m, v, a, s);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    store_master<kSplit>(param, master, master_lo, i, p);
  }
  add_block_sum<kNorm>(grad_sq_sum, squares);
}

// Every byte is touched once per step: loads and stores are marked evict-first (streaming), so the
// update does not push out what kernels running beside it keep in L2.
__device__ __forceinline__ void load8(const float* x, int64_t vec, float f[8]) {
  const float4 lo = __ldcs(reinterpret_cast<const float4*>(x) + 2 * vec);
  const float4 hi = __ldcs(reinterpret_cast<const float4*>(x) + 2 * vec + 1);
  f[0] = lo.x, f[1] = lo.y, f[2] = lo.z, f[3] = lo.w, f[4] = hi.x, f[5] = hi.y, f[6] = hi.z, f[7] = hi.w;
}

__device__ __forceinline__ void store8(float* x, int64_t vec, const float f[8]) {
  __stcs(reinterpret_cast<float4*>(x) + 2 * vec, make_float4(f[0], f[1], f[2], f[3]));
  __stcs(reinterpret_cast<float4*>(x) + 2 * vec + 1, make_float4(f[4], f[5], f[6], f[7]));
}

// Eight 16-bit halves in one 16-byte vector, as uint16_t (high halves) or int16_t (low halves).
template <typename T>
__device__ __forceinline__ void unpack16x8(const uint4& v, T h[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    h[2 * k] = static_cast<T>(w[k] & 0xffffu);
    h[2 * k + 1] = static_cast<T>(w[k] >> 16);
  }
}

template <typename T>
__device__ __forceinline__ uint4 pack16x8(const T h[8]) {
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k)
    w[k] = static_cast<uint32_t>(static_cast<uint16_t>(h[2 * k])) |
           (static_cast<uint32_t>(static_cast<uint16_t>(h[2 * k + 1])) << 16);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Vectors [0, vecs) of 8 elements; every pointer 16-byte aligned.
template <bool kNorm, bool kSplit>
__global__ void adamw_vec_kernel(bf16* param, float* master, int16_t* master_lo, const bf16* grad, float* exp_avg,
                                 float* exp_avg_sq, int64_t vecs, AdamWArgs a, double* grad_sq_sum) {
  const AdamWScalars s = scalars(a);
  float squares = 0.0f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float g[8], p[8], m[8], v[8];
    unpack_bf16x8(__ldcs(reinterpret_cast<const uint4*>(grad) + i), g);
    uint16_t hi[8];
    int16_t lo[8];
    if constexpr (kSplit) {
      unpack16x8(__ldcs(reinterpret_cast<const uint4*>(param) + i), hi);
      unpack16x8(__ldcs(reinterpret_cast<const uint4*>(master_lo) + i), lo);
#pragma unroll
      for (int k = 0; k < 8; ++k) p[k] = join_master(hi[k], lo[k]);
    } else {
      load8(master, i, p);
    }
    load8(exp_avg, i, m);
    load8(exp_avg_sq, i, v);
    if constexpr (kNorm) {
#pragma unroll
      for (int k = 0; k < 8; ++k) squares += g[k] * g[k];
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) adamw_element(g[k], p[k], m[k], v[k], a, s);
    store8(exp_avg, i, m);
    store8(exp_avg_sq, i, v);
    if constexpr (kSplit) {
#pragma unroll
      for (int k = 0; k < 8; ++k) split_master(p[k], hi[k], lo[k]);
      __stcs(reinterpret_cast<uint4*>(param) + i, pack16x8(hi));
      __stcs(reinterpret_cast<uint4*>(master_lo) + i, pack16x8(lo));
    } else {
      store8(master, i, p);
      if (param != nullptr) __stcs(reinterpret_cast<uint4*>(param) + i, pack_bf16x8(p));
    }
  }
  add_block_sum<kNorm>(grad_sq_sum, squares);
}

// The fused norm's grid: at most one resident wave of 256-thread blocks (no partial second wave,
// few atomics), each striding over its share. One cached wave per kernel (not per signature: the
// split and whole kernels share theirs).
template <auto kernel>
unsigned int one_wave(int64_t items) {
  const unsigned int g = grid_for(items, 256);
  static const unsigned int wave = [] {
    int sms = 0, per_sm = 0;
    if (multiprocessor_count(&sms) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 256, 0) != cudaSuccess || per_sm < 1)
      return 1024u;
    return static_cast<unsigned int>(sms * per_sm);
  }();
  return g < wave ? g : wave;
}

// The vector body, then the element-wise tail; with kNorm both grids are one resident wave, or
// beside other work blocks of at most 8 items per thread.
template <bool kNorm, bool kSplit>
cudaError_t launch(bf16* param, float* master, int16_t* master_lo, const bf16* grad, float* exp_avg,
                   float* exp_avg_sq, int64_t n, int64_t vecs, const AdamWArgs& args, double* grad_sq_sum,
                   cudaStream_t stream, bool beside) {
  constexpr auto vec_kernel = adamw_vec_kernel<kNorm, kSplit>;
  constexpr auto tail_kernel = adamw_kernel<kNorm, kSplit>;
  auto grid = [beside](auto wave, int64_t items) -> unsigned int {
    if constexpr (kNorm) return beside ? grid_for((items + 7) / 8, 256) : wave(items);
    return grid_for(items, 256);
  };
  if (vecs > 0) {
    vec_kernel<<<grid(one_wave<vec_kernel>, vecs), 256, 0, stream>>>(param, master, master_lo, grad, exp_avg,
                                                                     exp_avg_sq, vecs, args, grad_sq_sum);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  const int64_t done = vecs * kBf16PerVec;
  if (done == n) return cudaSuccess;
  tail_kernel<<<grid(one_wave<tail_kernel>, n - done), 256, 0, stream>>>(param, master, master_lo, grad, exp_avg,
                                                                         exp_avg_sq, done, n, args, grad_sq_sum);
  return cudaGetLastError();
}

template <bool kSplit>
cudaError_t dispatch(bf16* param, float* master, int16_t* master_lo, const bf16* grad, float* exp_avg,
                     float* exp_avg_sq, int64_t n, const AdamWArgs& args, double* grad_sq_sum, cudaStream_t stream,
                     bool beside) {
  if (n == 0) return cudaSuccess;
  const bool vectorized = aligned16(grad) && aligned16(exp_avg) && aligned16(exp_avg_sq) &&
                          (master == nullptr || aligned16(master)) && (master_lo == nullptr || aligned16(master_lo)) &&
                          (param == nullptr || aligned16(param));
  const int64_t vecs = vectorized ? n / kBf16PerVec : 0;
  if (grad_sq_sum != nullptr)
    return launch<true, kSplit>(param, master, master_lo, grad, exp_avg, exp_avg_sq, n, vecs, args, grad_sq_sum,
                                stream, beside);
  return launch<false, kSplit>(param, master, master_lo, grad, exp_avg, exp_avg_sq, n, vecs, args, nullptr, stream,
                               beside);
}

// kN consecutive elements of the optimizer state from group `at` (element at * kN); kN = 8 moves
// 16-byte vectors (every pointer aligned), kN = 1 single elements.
template <int kN, bool kSplit>
__device__ __forceinline__ void load_state(const bf16* param, const float* master, const int16_t* master_lo,
                                           const float* exp_avg, const float* exp_avg_sq, int64_t at, float p[kN],
                                           float m[kN], float v[kN]) {
  if constexpr (kN == 8) {
    if constexpr (kSplit) {
      uint16_t hi[8];
      int16_t lo[8];
      unpack16x8(reinterpret_cast<const uint4*>(param)[at], hi);
      unpack16x8(reinterpret_cast<const uint4*>(master_lo)[at], lo);
#pragma unroll
      for (int k = 0; k < 8; ++k) p[k] = join_master(hi[k], lo[k]);
    } else {
      load8(master, at, p);
    }
    load8(exp_avg, at, m);
    load8(exp_avg_sq, at, v);
  } else {
    p[0] = load_master<kSplit>(param, master, master_lo, at);
    m[0] = exp_avg[at];
    v[0] = exp_avg_sq[at];
  }
}

template <int kN, bool kSplit>
__device__ __forceinline__ void store_state(bf16* param, float* master, int16_t* master_lo, float* exp_avg,
                                            float* exp_avg_sq, int64_t at, const float p[kN], const float m[kN],
                                            const float v[kN]) {
  if constexpr (kN == 8) {
    store8(exp_avg, at, m);
    store8(exp_avg_sq, at, v);
    if constexpr (kSplit) {
      uint16_t hi[8];
      int16_t lo[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) split_master(p[k], hi[k], lo[k]);
      reinterpret_cast<uint4*>(param)[at] = pack16x8(hi);
      reinterpret_cast<uint4*>(master_lo)[at] = pack16x8(lo);
    } else {
      store8(master, at, p);
      if (param != nullptr) reinterpret_cast<uint4*>(param)[at] = pack_bf16x8(p);
    }
  } else {
    exp_avg[at] = m[0];
    exp_avg_sq[at] = v[0];
    store_master<kSplit>(param, master, master_lo, at, p[0]);
  }
}

// One item is kN elements of one listed row; it applies that row's missing steps in registers.
// `zero` is a zero the compiler cannot see (a kernel argument): a skipped step's gradient goes
// through adamw_element exactly as a stored zero gradient does in adamw_kernel.
template <int kN, bool kNorm, bool kSplit>
__global__ void adamw_rows_kernel(bf16* param, float* master, int16_t* master_lo, const bf16* grad, float* exp_avg,
                                  float* exp_avg_sq, const int32_t* rows, int64_t count, int64_t groups_per_row,
                                  const int32_t* row_step, int64_t floor, int64_t until, bool gradient,
                                  const __grid_constant__ AdamWHistory h, float zero, double* grad_sq_sum) {
  float squares = 0.0f;
  const int64_t items = count * groups_per_row;
  for (int64_t item = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; item < items;
       item += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = item / groups_per_row;
    const int64_t row = rows != nullptr ? rows[i] : i;
    int64_t first = max(static_cast<int64_t>(row_step[row]), floor) + 1;
    if (first > until) continue;
    const int64_t at = row * groups_per_row + (item - i * groups_per_row);
    float p[kN], m[kN], v[kN];
    load_state<kN, kSplit>(param, master, master_lo, exp_avg, exp_avg_sq, at, p, m, v);
    // Moments that are zero (a row no token has reached yet) stay +0 through zero-gradient steps:
    // g = +0, m = fma(b1, m, +0) = +0, v likewise, the update +0 / eps = +0, and the master
    // fma(p, decay, -0) = p * decay rounded (sign of zero included). One multiply a step then gives
    // the same bits as the whole arithmetic (lr and the gradient scale finite and not negative; with
    // eps = 0 or beta2 = 1 the whole arithmetic makes NaNs of zero moments: not taken then).
    bool zero_moments = h.eps > 0.0f && h.beta2 < 1.0f;
#pragma unroll
    for (int j = 0; j < kN; ++j) zero_moments = zero_moments && m[j] == 0.0f && v[j] == 0.0f;
    const int64_t zero_steps_until = gradient ? until - 1 : until;
    if (zero_moments && first <= zero_steps_until) {
      for (int64_t k = first; k <= zero_steps_until; ++k) {
        const int s = static_cast<int>(k - floor - 1);
        const float decay = __fsub_rn(1.0f, __fmul_rn(h.lr[s], h.weight_decay));
#pragma unroll
        for (int j = 0; j < kN; ++j) p[j] = __fmul_rn(p[j], decay);
      }
#pragma unroll
      for (int j = 0; j < kN; ++j) m[j] = v[j] = 0.0f;
      first = zero_steps_until + 1;
    }
    for (int64_t k = first; k <= until; ++k) {
      const int s = static_cast<int>(k - floor - 1);
      AdamWArgs a;
      a.lr = h.lr[s];
      a.beta1 = h.beta1;
      a.beta2 = h.beta2;
      a.eps = h.eps;
      a.weight_decay = h.weight_decay;
      a.grad_scale = h.grad_scale[s];
      a.bias_correction1 = h.bias_correction1[s];
      a.bias_correction2_sqrt = h.bias_correction2_sqrt[s];
      const AdamWScalars sc = scalars(a);
      float g[kN];
      if (gradient && k == until) {
        if constexpr (kN == 8) {
          unpack_bf16x8(reinterpret_cast<const uint4*>(grad)[at], g);
        } else {
          g[0] = __bfloat162float(grad[at]);
        }
        if constexpr (kNorm) {
#pragma unroll
          for (int j = 0; j < kN; ++j) squares += g[j] * g[j];
        }
      } else {
#pragma unroll
        for (int j = 0; j < kN; ++j) g[j] = zero;
      }
#pragma unroll
      for (int j = 0; j < kN; ++j) adamw_element(g[j], p[j], m[j], v[j], a, sc);
    }
    store_state<kN, kSplit>(param, master, master_lo, exp_avg, exp_avg_sq, at, p, m, v);
  }
  add_block_sum<kNorm>(grad_sq_sum, squares);
}

__global__ void set_row_steps_kernel(int32_t* row_step, const int32_t* rows, int64_t count, int32_t until) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    row_step[rows[i]] = until;
}

template <int kN, bool kNorm, bool kSplit>
cudaError_t launch_rows(bf16* param, float* master, int16_t* master_lo, const bf16* grad, float* exp_avg,
                        float* exp_avg_sq, const int32_t* rows, int64_t count, int64_t width, int32_t* row_step,
                        int64_t floor, int64_t until, bool gradient, const AdamWHistory& h, double* grad_sq_sum,
                        cudaStream_t stream, bool beside) {
  constexpr auto kernel = adamw_rows_kernel<kN, kNorm, kSplit>;
  const int64_t items = count * (width / kN);
  // With the norm's atomics: one resident wave, or beside other work blocks of at most 8 items per thread.
  const unsigned int grid =
      kNorm ? (beside ? grid_for((items + 7) / 8, 256) : one_wave<kernel>(items)) : grid_for(items, 256);
  kernel<<<grid, 256, 0, stream>>>(param, master, master_lo, grad, exp_avg, exp_avg_sq, rows, count, width / kN,
                                   row_step, floor, until, gradient, h, 0.0f, grad_sq_sum);
  return cudaGetLastError();
}

template <int kN, bool kSplit>
cudaError_t dispatch_rows(bf16* param, float* master, int16_t* master_lo, const bf16* grad, float* exp_avg,
                          float* exp_avg_sq, const int32_t* rows, int64_t count, int64_t width, int32_t* row_step,
                          int64_t floor, int64_t until, bool gradient, const AdamWHistory& h, double* grad_sq_sum,
                          cudaStream_t stream, bool beside) {
  if (gradient && grad_sq_sum != nullptr)
    return launch_rows<kN, true, kSplit>(param, master, master_lo, grad, exp_avg, exp_avg_sq, rows, count, width,
                                         row_step, floor, until, gradient, h, grad_sq_sum, stream, beside);
  return launch_rows<kN, false, kSplit>(param, master, master_lo, grad, exp_avg, exp_avg_sq, rows, count, width,
                                        row_step, floor, until, gradient, h, nullptr, stream, beside);
}

}  // namespace

cudaError_t adamw_rows(bf16* param, float* master, int16_t* master_lo, const bf16* grad, float* exp_avg,
                       float* exp_avg_sq, const int32_t* rows, int64_t count, int64_t width, int32_t* row_step,
                       int64_t floor, int64_t until, bool gradient, const AdamWHistory& history,
                       double* grad_sq_sum, cudaStream_t stream, bool beside_other_work) {
  if (count == 0 || until <= floor) return cudaSuccess;
  const bool split = master_lo != nullptr;
  const bool vectorized = width % kBf16PerVec == 0 && aligned16(grad) && aligned16(exp_avg) &&
                          aligned16(exp_avg_sq) && (master == nullptr || aligned16(master)) &&
                          (master_lo == nullptr || aligned16(master_lo)) && (param == nullptr || aligned16(param));
  auto go = [&](auto vec, auto split_master) {
    return dispatch_rows<decltype(vec)::value ? kBf16PerVec : 1, decltype(split_master)::value>(
        param, master, master_lo, grad, exp_avg, exp_avg_sq, rows, count, width, row_step, floor, until, gradient,
        history, grad_sq_sum, stream, beside_other_work);
  };
  using yes = std::true_type;
  using no = std::false_type;
  const cudaError_t err =
      vectorized ? (split ? go(yes{}, yes{}) : go(yes{}, no{})) : (split ? go(no{}, yes{}) : go(no{}, no{}));
  if (err != cudaSuccess || rows == nullptr) return err;
  set_row_steps_kernel<<<grid_for(count, 256), 256, 0, stream>>>(row_step, rows, count, static_cast<int32_t>(until));
  return cudaGetLastError();
}

cudaError_t adamw(bf16* param, float* master, const bf16* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                  const AdamWArgs& args, double* grad_sq_sum, cudaStream_t stream, bool beside_other_work) {
  return dispatch<false>(param, master, nullptr, grad, exp_avg, exp_avg_sq, n, args, grad_sq_sum, stream,
                         beside_other_work);
}

cudaError_t adamw_split(bf16* param, int16_t* master_lo, const bf16* grad, float* exp_avg, float* exp_avg_sq,
                        int64_t n, const AdamWArgs& args, double* grad_sq_sum, cudaStream_t stream,
                        bool beside_other_work) {
  return dispatch<true>(param, nullptr, master_lo, grad, exp_avg, exp_avg_sq, n, args, grad_sq_sum, stream,
                        beside_other_work);
}

}  // namespace glm::cuda
