// FlashAttention-2 style tiling with WMMA 16x16x16 bf16 fragments. Blocks of 64 queries (forward,
// dQ) or 64 keys (dK/dV); 4 warps, each owning 16 rows of the tile. Scores, probabilities and
// accumulators live in shared memory so that row-wise rescaling needs no fragment layout.
#include <mma.h>

#include "kernels/cuda/flash_attention.cuh"

namespace glm::cuda {
namespace {

using namespace nvcuda;

constexpr int kTile = 64;  // queries per forward block, keys per backward block, keys/queries per step
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kPadB = 8;             // bf16 padding per row (keeps WMMA's 16-byte ldm and spreads banks)
constexpr int kPadF = 4;             // fp32 padding per row
constexpr int kSld = kTile + kPadF;  // fp32 score tiles
constexpr int kPld = kTile + kPadB;  // bf16 probability tiles

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragAc = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major>;
using FragBr = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBc = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// rows x D bf16 rows of a strided global matrix into shared memory; rows past `valid` become 0.
template <int D>
__device__ void load_rows(bf16* dst, int ld, const bf16* src, int64_t src_stride, int valid) {
  constexpr int chunks = D / 8;  // 16-byte vectors per row
  for (int i = threadIdx.x; i < kTile * chunks; i += kThreads) {
    const int r = i / chunks, c = (i % chunks) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < valid) v = *reinterpret_cast<const uint4*>(src + r * src_stride + c);
    *reinterpret_cast<uint4*>(dst + r * ld + c) = v;
  }
}

template <int D>
struct ForwardSmem {
  static constexpr int ld = D + kPadB, old = D + kPadF;
  static constexpr size_t bytes = sizeof(bf16) * 3 * kTile * ld + sizeof(float) * kTile * kSld +
                                  sizeof(bf16) * kTile * kPld + sizeof(float) * 2 * kTile * old +
                                  sizeof(float) * 3 * kTile;
};

template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(bf16* out, float* lse, const bf16* qkv, const int32_t* doc_start, int64_t n, int64_t heads,
                         int64_t kv_heads, float scale) {
  using S = ForwardSmem<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Ks = Qs + kTile * S::ld;
  bf16* Vs = Ks + kTile * S::ld;
  float* Ss = reinterpret_cast<float*>(Vs + kTile * S::ld);
  bf16* Ps = reinterpret_cast<bf16*>(Ss + kTile * kSld);
  float* Ot = reinterpret_cast<float*>(Ps + kTile * kPld);
  float* Os = Ot + kTile * S::old;
  float* row_m = Os + kTile * S::old;
  float* row_l = row_m + kTile;
  float* row_c = row_l + kTile;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kTile, h = blockIdx.y;
  const int64_t g = h / (heads / kv_heads), width = (heads + 2 * kv_heads) * D;
  const int q_valid = static_cast<int>(min(static_cast<int64_t>(kTile), n - q0));
  load_rows<D>(Qs, S::ld, qkv + q0 * width + h * D, width, q_valid);
  for (int i = threadIdx.x; i < kTile * S::old; i += kThreads) Os[i] = 0.0f;
  for (int i = threadIdx.x; i < kTile; i += kThreads) {
    row_m[i] = -INFINITY;
    row_l[i] = 0.0f;
  }
  const int64_t k_lo = doc_start[q0], k_hi = q0 + q_valid - 1;
  // This lane's row and half of the tile for the softmax step.
  const int my_row = warp * 16 + (lane >> 1), half = lane & 1;
  const int64_t t = q0 + my_row;
  const int64_t t_doc = t < n ? doc_start[t] : INT64_MAX;

  for (int64_t k0 = k_lo; k0 <= k_hi; k0 += kTile) {
    const int k_valid = static_cast<int>(min(static_cast<int64_t>(kTile), k_hi - k0 + 1));
    __syncthreads();
    load_rows<D>(Ks, S::ld, qkv + k0 * width + (heads + g) * D, width, k_valid);
    load_rows<D>(Vs, S::ld, qkv + k0 * width + (heads + kv_heads + g) * D, width, k_valid);
    __syncthreads();
    // Scores of this warp's 16 queries against the 64 keys.
    for (int c0 = 0; c0 < kTile; c0 += 16) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int d0 = 0; d0 < D; d0 += 16) {
        FragA a;
        FragBc b;
        wmma::load_matrix_sync(a, Qs + warp * 16 * S::ld + d0, S::ld);
        wmma::load_matrix_sync(b, Ks + c0 * S::ld + d0, S::ld);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(Ss + warp * 16 * kSld + c0, acc, kSld, wmma::mem_row_major);
    }
    __syncwarp();
    // Online softmax: two lanes per row, 32 columns each.
    float mx = -INFINITY;
    float* srow = Ss + my_row * kSld + half * 32;
    for (int c = 0; c < 32; ++c) {
      const int64_t s = k0 + half * 32 + c;
      const bool ok = s <= t && s >= t_doc && s - k0 < k_valid;
      const float v = ok ? srow[c] * scale : -INFINITY;
      srow[c] = v;
      mx = fmaxf(mx, v);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_old = row_m[my_row], m_new = fmaxf(m_old, mx);
    float sum = 0.0f;
    bf16* prow = Ps + my_row * kPld + half * 32;
    for (int c = 0; c < 32; ++c) {
      const float p = m_new == -INFINITY ? 0.0f : __expf(srow[c] - m_new);
      prow[c] = __float2bfloat16(p);
      sum += p;  // the normaliser in fp32, as FlashAttention-2 keeps it
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    const float corr = m_old == -INFINITY ? 0.0f : __expf(m_old - m_new);
    __syncwarp();
    if (half == 0) {
      row_m[my_row] = m_new;
      row_l[my_row] = row_l[my_row] * corr + sum;
      row_c[my_row] = corr;
    }
    // P V for this warp's rows.
    float* ot = Ot + warp * 16 * S::old;
    for (int d0 = 0; d0 < D; d0 += 16) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int c0 = 0; c0 < kTile; c0 += 16) {
        FragA a;
        FragBr b;
        wmma::load_matrix_sync(a, Ps + warp * 16 * kPld + c0, kPld);
        wmma::load_matrix_sync(b, Vs + c0 * S::ld + d0, S::ld);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(ot + d0, acc, S::old, wmma::mem_row_major);
    }
    __syncwarp();
    for (int i = lane; i < 16 * D; i += 32) {
      const int r = warp * 16 + i / D, j = i % D;
      Os[r * S::old + j] = Os[r * S::old + j] * row_c[r] + ot[(i / D) * S::old + j];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < q_valid * D; i += kThreads) {
    const int r = i / D, j = i % D;
    out[(q0 + r) * heads * D + h * D + j] = __float2bfloat16(Os[r * S::old + j] / row_l[r]);
  }
  for (int r = threadIdx.x; r < q_valid; r += kThreads) lse[(q0 + r) * heads + h] = row_m[r] + __logf(row_l[r]);
}

// delta[t, h] = dout . out (fp32), and the dQ accumulators cleared.
__global__ void delta_kernel(float* delta, float* dq_acc, const bf16* dout, const bf16* out, int64_t n, int64_t heads,
                             int64_t d) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarps) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= n * heads) return;
  float acc = 0.0f;
  for (int64_t j = lane; j < d; j += 32) {
    acc += __bfloat162float(dout[row * d + j]) * __bfloat162float(out[row * d + j]);
    dq_acc[row * d + j] = 0.0f;
  }
  acc = warp_sum(acc);
  if (lane == 0) delta[row] = acc;
}

template <int D>
struct BackwardSmem {
  static constexpr int ld = D + kPadB, old = D + kPadF;
  static constexpr size_t bytes = sizeof(bf16) * 4 * kTile * ld + sizeof(float) * 2 * kTile * old +
                                  sizeof(float) * 2 * kTile * kSld + sizeof(bf16) * 2 * kTile * kPld +
                                  sizeof(float) * kWarps * 16 * 20 + sizeof(float) * 2 * kTile;
};

// One block per (64 keys, query head): loops over the query tiles that can see these keys. dK/dV
// accumulate in shared memory, then into fp32 accumulators shared by the KV group's heads; dQ goes
// to fp32 accumulators with atomics.
template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_backward_kernel(float* dkv_acc, float* dq_acc, const float* delta, const bf16* dout, const float* lse,
                          const bf16* qkv, const int32_t* doc_start, int64_t n, int64_t heads, int64_t kv_heads,
                          float scale) {
  using S = BackwardSmem<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Ks = reinterpret_cast<bf16*>(smem);
  bf16* Vs = Ks + kTile * S::ld;
  bf16* Qs = Vs + kTile * S::ld;
  bf16* dOs = Qs + kTile * S::ld;
  float* dKs = reinterpret_cast<float*>(dOs + kTile * S::ld);
  float* dVs = dKs + kTile * S::old;
  float* Ss = dVs + kTile * S::old;  // P in fp32
  float* dPs = Ss + kTile * kSld;
  bf16* Ps = reinterpret_cast<bf16*>(dPs + kTile * kSld);
  bf16* dSs = Ps + kTile * kPld;
  float* tmp = reinterpret_cast<float*>(dSs + kTile * kPld);
  float* row_lse = tmp + kWarps * 16 * 20;
  float* row_delta = row_lse + kTile;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kTile, h = blockIdx.y;
  const int64_t g = h / (heads / kv_heads), width = (heads + 2 * kv_heads) * D;
  const int k_valid = static_cast<int>(min(static_cast<int64_t>(kTile), n - k0));
  const int64_t k_last = k0 + k_valid - 1;
  // Queries that can see these keys: from k0 to the end of the document holding k_last.
  int64_t lo = k_last, hi = n;  // first t with doc_start[t] > k_last
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (doc_start[mid] <= k_last)
      lo = mid + 1;
    else
      hi = mid;
  }
  const int64_t q_end = lo;

  load_rows<D>(Ks, S::ld, qkv + k0 * width + (heads + g) * D, width, k_valid);
  load_rows<D>(Vs, S::ld, qkv + k0 * width + (heads + kv_heads + g) * D, width, k_valid);
  for (int i = threadIdx.x; i < kTile * S::old; i += kThreads) dKs[i] = dVs[i] = 0.0f;
  const int my_row = warp * 16 + (lane >> 1), half = lane & 1;

  {
    for (int64_t q0 = k0; q0 < q_end; q0 += kTile) {
      const int q_valid = static_cast<int>(min(static_cast<int64_t>(kTile), q_end - q0));
      __syncthreads();
      load_rows<D>(Qs, S::ld, qkv + q0 * width + h * D, width, q_valid);
      load_rows<D>(dOs, S::ld, dout + q0 * heads * D + h * D, heads * D, q_valid);
      for (int r = threadIdx.x; r < kTile; r += kThreads) {
        row_lse[r] = r < q_valid ? lse[(q0 + r) * heads + h] : 0.0f;
        row_delta[r] = r < q_valid ? delta[(q0 + r) * heads + h] : 0.0f;
      }
      __syncthreads();
      // S = Q K^T and dP = dO V^T for this warp's 16 queries.
      for (int c0 = 0; c0 < kTile; c0 += 16) {
        FragC s_acc, dp_acc;
        wmma::fill_fragment(s_acc, 0.0f);
        wmma::fill_fragment(dp_acc, 0.0f);
#pragma unroll
        for (int d0 = 0; d0 < D; d0 += 16) {
          FragA a;
          FragBc b;
          wmma::load_matrix_sync(a, Qs + warp * 16 * S::ld + d0, S::ld);
          wmma::load_matrix_sync(b, Ks + c0 * S::ld + d0, S::ld);
          wmma::mma_sync(s_acc, a, b, s_acc);
          wmma::load_matrix_sync(a, dOs + warp * 16 * S::ld + d0, S::ld);
          wmma::load_matrix_sync(b, Vs + c0 * S::ld + d0, S::ld);
          wmma::mma_sync(dp_acc, a, b, dp_acc);
        }
        wmma::store_matrix_sync(Ss + warp * 16 * kSld + c0, s_acc, kSld, wmma::mem_row_major);
        wmma::store_matrix_sync(dPs + warp * 16 * kSld + c0, dp_acc, kSld, wmma::mem_row_major);
      }
      __syncwarp();
      {
        const int64_t t = q0 + my_row;
        const int64_t t_doc = my_row < q_valid ? doc_start[t] : INT64_MAX;
        for (int c = half * 32; c < half * 32 + 32; ++c) {
          const int64_t s = k0 + c;
          const bool ok = my_row < q_valid && c < k_valid && s <= t && s >= t_doc;
          const float p = ok ? __expf(Ss[my_row * kSld + c] * scale - row_lse[my_row]) : 0.0f;
          const float ds = p * (dPs[my_row * kSld + c] - row_delta[my_row]) * scale;
          Ps[my_row * kPld + c] = __float2bfloat16(p);
          dSs[my_row * kPld + c] = __float2bfloat16(ds);
        }
      }
      __syncwarp();
      // dQ (this warp's 16 queries) = dS K, added to the fp32 accumulators.
      float* wt = tmp + warp * 16 * 20;
      for (int d0 = 0; d0 < D; d0 += 16) {
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int c0 = 0; c0 < kTile; c0 += 16) {
          FragA a;
          FragBr b;
          wmma::load_matrix_sync(a, dSs + warp * 16 * kPld + c0, kPld);
          wmma::load_matrix_sync(b, Ks + c0 * S::ld + d0, S::ld);
          wmma::mma_sync(acc, a, b, acc);
        }
        wmma::store_matrix_sync(wt, acc, 20, wmma::mem_row_major);
        __syncwarp();
        for (int i = lane; i < 256; i += 32) {
          const int r = i / 16, j = i % 16;
          const int row = warp * 16 + r;
          if (row < q_valid) atomicAdd(dq_acc + ((q0 + row) * heads + h) * D + d0 + j, wt[r * 20 + j]);
        }
        __syncwarp();
      }
      __syncthreads();  // every warp's P and dS rows are in shared memory
      // dV += P^T dO and dK += dS^T Q for this warp's 16 keys.
      for (int d0 = 0; d0 < D; d0 += 16) {
        FragC dv, dk;
        wmma::load_matrix_sync(dv, dVs + warp * 16 * S::old + d0, S::old, wmma::mem_row_major);
        wmma::load_matrix_sync(dk, dKs + warp * 16 * S::old + d0, S::old, wmma::mem_row_major);
#pragma unroll
        for (int r0 = 0; r0 < kTile; r0 += 16) {
          FragAc a;
          FragBr b;
          wmma::load_matrix_sync(a, Ps + r0 * kPld + warp * 16, kPld);
          wmma::load_matrix_sync(b, dOs + r0 * S::ld + d0, S::ld);
          wmma::mma_sync(dv, a, b, dv);
          wmma::load_matrix_sync(a, dSs + r0 * kPld + warp * 16, kPld);
          wmma::load_matrix_sync(b, Qs + r0 * S::ld + d0, S::ld);
          wmma::mma_sync(dk, a, b, dk);
        }
        wmma::store_matrix_sync(dVs + warp * 16 * S::old + d0, dv, S::old, wmma::mem_row_major);
        wmma::store_matrix_sync(dKs + warp * 16 * S::old + d0, dk, S::old, wmma::mem_row_major);
      }
    }
  }
  __syncthreads();
  float* dk_acc = dkv_acc;
  float* dv_acc = dkv_acc + n * kv_heads * D;
  for (int i = threadIdx.x; i < k_valid * D; i += kThreads) {
    const int r = i / D, j = i % D;
    atomicAdd(dk_acc + ((k0 + r) * kv_heads + g) * D + j, dKs[r * S::old + j]);
    atomicAdd(dv_acc + ((k0 + r) * kv_heads + g) * D + j, dVs[r * S::old + j]);
  }
}

// The fp32 accumulators [n, heads, d] (dQ) and [n, kv_heads, d] (dK, dV) into the bf16 dqkv rows.
__global__ void write_dqkv_kernel(bf16* dqkv, const float* dq_acc, const float* dkv_acc, int64_t n, int64_t heads,
                                  int64_t kv_heads, int64_t d) {
  const int64_t per_token = (heads + 2 * kv_heads) * d, q_width = heads * d, kv_width = kv_heads * d;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n * per_token;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / per_token, c = i % per_token;
    float v;
    if (c < q_width)
      v = dq_acc[t * q_width + c];
    else if (c < q_width + kv_width)
      v = dkv_acc[t * kv_width + (c - q_width)];
    else
      v = dkv_acc[n * kv_width + t * kv_width + (c - q_width - kv_width)];
    dqkv[i] = __float2bfloat16(v);
  }
}

template <int D>
cudaError_t forward_impl(bf16* out, float* lse, const bf16* qkv, const int32_t* doc_start, int64_t n, int64_t heads,
                         int64_t kv_heads, cudaStream_t stream) {
  const size_t smem = ForwardSmem<D>::bytes;
  cudaError_t e = cudaFuncSetAttribute(flash_forward_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  dim3 grid(static_cast<unsigned int>((n + kTile - 1) / kTile), static_cast<unsigned int>(heads));
  flash_forward_kernel<D><<<grid, kThreads, smem, stream>>>(out, lse, qkv, doc_start, n, heads, kv_heads,
                                                            1.0f / sqrtf(static_cast<float>(D)));
  return cudaGetLastError();
}

template <int D>
cudaError_t backward_impl(bf16* dqkv, float* scratch, const bf16* dout, const bf16* out, const float* lse,
                          const bf16* qkv, const int32_t* doc_start, int64_t n, int64_t heads, int64_t kv_heads,
                          cudaStream_t stream) {
  float* dq_acc = scratch;
  float* delta = dq_acc + n * heads * D;
  float* dkv_acc = delta + n * heads;
  const int64_t rows = n * heads;
  cudaError_t e = cudaMemsetAsync(dkv_acc, 0, sizeof(float) * 2 * n * kv_heads * D, stream);
  if (e != cudaSuccess) return e;
  delta_kernel<<<static_cast<unsigned int>((rows + kWarps - 1) / kWarps), kThreads, 0, stream>>>(delta, dq_acc, dout,
                                                                                                 out, n, heads, D);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const size_t smem = BackwardSmem<D>::bytes;
  e = cudaFuncSetAttribute(flash_backward_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  dim3 grid(static_cast<unsigned int>((n + kTile - 1) / kTile), static_cast<unsigned int>(heads));
  flash_backward_kernel<D><<<grid, kThreads, smem, stream>>>(dkv_acc, dq_acc, delta, dout, lse, qkv, doc_start, n,
                                                             heads, kv_heads, 1.0f / sqrtf(static_cast<float>(D)));
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  write_dqkv_kernel<<<grid_for(n * (heads + 2 * kv_heads) * D, 256), 256, 0, stream>>>(dqkv, dq_acc, dkv_acc, n, heads,
                                                                                       kv_heads, D);
  return cudaGetLastError();
}

}  // namespace

bool flash_attention_supports(int64_t head_dim) { return head_dim == 32 || head_dim == 64 || head_dim == 128; }

cudaError_t flash_attention_forward(bf16* out, float* lse, const bf16* qkv, const int32_t* doc_start, int64_t n,
                                    int64_t heads, int64_t kv_heads, int64_t head_dim, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (heads % kv_heads != 0) return cudaErrorInvalidValue;
  switch (head_dim) {
    case 32:
      return forward_impl<32>(out, lse, qkv, doc_start, n, heads, kv_heads, stream);
    case 64:
      return forward_impl<64>(out, lse, qkv, doc_start, n, heads, kv_heads, stream);
    case 128:
      return forward_impl<128>(out, lse, qkv, doc_start, n, heads, kv_heads, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t flash_attention_backward(bf16* dqkv, float* scratch, const bf16* dout, const bf16* out, const float* lse,
                                     const bf16* qkv, const int32_t* doc_start, int64_t n, int64_t heads,
                                     int64_t kv_heads, int64_t head_dim, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (heads % kv_heads != 0) return cudaErrorInvalidValue;
  switch (head_dim) {
    case 32:
      return backward_impl<32>(dqkv, scratch, dout, out, lse, qkv, doc_start, n, heads, kv_heads, stream);
    case 64:
      return backward_impl<64>(dqkv, scratch, dout, out, lse, qkv, doc_start, n, heads, kv_heads, stream);
    case 128:
      return backward_impl<128>(dqkv, scratch, dout, out, lse, qkv, doc_start, n, heads, kv_heads, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace glm::cuda
