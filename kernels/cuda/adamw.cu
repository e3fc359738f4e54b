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
#include "kernels/cuda/adamw.cuh"
#include "kernels/cuda/vec.cuh"
#include "kernels/master_split.h"

namespace glm::cuda {
namespace {

struct AdamWScalars {
  float step_size, decay;
};

__device__ __forceinline__ float adamw_element(float g, float& master, float& m, float& v, const AdamWArgs& a,
                                               const AdamWScalars& s) {
  g *= a.grad_scale;
  m = a.beta1 * m + (1.0f - a.beta1) * g;
  v = a.beta2 * v + (1.0f - a.beta2) * g * g;
  master = master * s.decay - s.step_size * m / (sqrtf(v) / a.bias_correction2_sqrt + a.eps);
  return master;
}

__device__ __forceinline__ AdamWScalars scalars(const AdamWArgs& a) {
  return {a.lr / a.bias_correction1, 1.0f - a.lr * a.weight_decay};
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

}  // namespace

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
