// FlashAttention-2 tiling on m16n8k16 bf16 tensor-core MMAs (fp32 accumulation). Blocks of 64
// queries (forward) or 64 keys (backward), 4 warps of 16 rows each; scores, probabilities and
// accumulators stay in registers, in the MMA fragment layout; K/V/Q/dO tiles in shared memory.
#include "kernels/cuda/flash_attention.cuh"

namespace glm::cuda {
namespace {

constexpr int kTile = 64;  // queries per forward block, keys per backward block, keys/queries per step
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kPadB = 8;             // bf16 padding per row: 16-byte aligned rows, spread banks
constexpr int kPld = kTile + kPadB;  // bf16 dS^T tile

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

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t pack_bf16(bf16 lo, bf16 hi) {
  __nv_bfloat162 v;
  v.x = lo;
  v.y = hi;
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t load_pair(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// FlashAttention-2 forward on raw MMAs: each warp keeps its 16 query rows, their scores,
// probabilities and output accumulators in registers; only K and V tiles go through shared memory.
template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(bf16* out, float* lse, const bf16* qkv, const int32_t* doc_start, int64_t n, int64_t heads,
                         int64_t kv_heads, float scale) {
  constexpr int ld = D + kPadB;
  __shared__ __align__(16) bf16 Ks[kTile * ld];
  __shared__ __align__(16) bf16 Vs[kTile * ld];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, grp = lane >> 2, quad = lane & 3;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kTile, h = blockIdx.y;
  const int64_t g = h / (heads / kv_heads), width = (heads + 2 * kv_heads) * D;
  const int q_valid = static_cast<int>(min(static_cast<int64_t>(kTile), n - q0));
  const int64_t r_lo = q0 + warp * 16 + grp, r_hi = r_lo + 8;
  const int64_t doc_lo = r_lo < n ? doc_start[r_lo] : INT64_MAX, doc_hi = r_hi < n ? doc_start[r_hi] : INT64_MAX;

  uint32_t qf[D / 16][4];
#pragma unroll
  for (int kt = 0; kt < D / 16; ++kt) {
    const int col = kt * 16 + quad * 2;
    const bf16* lo = qkv + r_lo * width + h * D + col;
    const bf16* hi = qkv + r_hi * width + h * D + col;
    qf[kt][0] = r_lo < n ? load_pair(lo) : 0u;
    qf[kt][1] = r_hi < n ? load_pair(hi) : 0u;
    qf[kt][2] = r_lo < n ? load_pair(lo + 8) : 0u;
    qf[kt][3] = r_hi < n ? load_pair(hi + 8) : 0u;
  }
  float o[D / 8][4];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;

  const int64_t k_lo = doc_start[q0], k_hi = q0 + q_valid - 1;
  for (int64_t k0 = k_lo; k0 <= k_hi; k0 += kTile) {
    const int k_valid = static_cast<int>(min(static_cast<int64_t>(kTile), k_hi - k0 + 1));
    __syncthreads();
    load_rows<D>(Ks, ld, qkv + k0 * width + (heads + g) * D, width, k_valid);
    load_rows<D>(Vs, ld, qkv + k0 * width + (heads + kv_heads + g) * D, width, k_valid);
    __syncthreads();
    float s[kTile / 8][4];
#pragma unroll
    for (int jt = 0; jt < kTile / 8; ++jt) {
      s[jt][0] = s[jt][1] = s[jt][2] = s[jt][3] = 0.0f;
      const bf16* krow = Ks + (jt * 8 + grp) * ld + quad * 2;
#pragma unroll
      for (int kt = 0; kt < D / 16; ++kt)
        mma_bf16(s[jt], qf[kt], load_pair(krow + kt * 16), load_pair(krow + kt * 16 + 8));
    }
    // Mask (causal, document, tile end), scale, and the running maxima of rows lo and hi.
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
    for (int jt = 0; jt < kTile / 8; ++jt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t key = k0 + jt * 8 + quad * 2 + (e & 1);
        const int64_t row = e < 2 ? r_lo : r_hi, doc = e < 2 ? doc_lo : doc_hi;
        const bool ok = key - k0 < k_valid && key <= row && key >= doc;
        s[jt][e] = ok ? s[jt][e] * scale : -INFINITY;
      }
      mx_lo = fmaxf(mx_lo, fmaxf(s[jt][0], s[jt][1]));
      mx_hi = fmaxf(mx_hi, fmaxf(s[jt][2], s[jt][3]));
    }
    mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
    mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
    mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
    mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
    const float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
    const float c_lo = m_lo == -INFINITY ? 0.0f : __expf(m_lo - mn_lo);
    const float c_hi = m_hi == -INFINITY ? 0.0f : __expf(m_hi - mn_hi);
    float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
    for (int jt = 0; jt < kTile / 8; ++jt) {
      s[jt][0] = mn_lo == -INFINITY ? 0.0f : __expf(s[jt][0] - mn_lo);
      s[jt][1] = mn_lo == -INFINITY ? 0.0f : __expf(s[jt][1] - mn_lo);
      s[jt][2] = mn_hi == -INFINITY ? 0.0f : __expf(s[jt][2] - mn_hi);
      s[jt][3] = mn_hi == -INFINITY ? 0.0f : __expf(s[jt][3] - mn_hi);
      sum_lo += s[jt][0] + s[jt][1];
      sum_hi += s[jt][2] + s[jt][3];
    }
    sum_lo += __shfl_xor_sync(0xffffffffu, sum_lo, 1);
    sum_lo += __shfl_xor_sync(0xffffffffu, sum_lo, 2);
    sum_hi += __shfl_xor_sync(0xffffffffu, sum_hi, 1);
    sum_hi += __shfl_xor_sync(0xffffffffu, sum_hi, 2);
    l_lo = l_lo * c_lo + sum_lo;
    l_hi = l_hi * c_hi + sum_hi;
    m_lo = mn_lo;
    m_hi = mn_hi;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      o[dt][0] *= c_lo;
      o[dt][1] *= c_lo;
      o[dt][2] *= c_hi;
      o[dt][3] *= c_hi;
    }
    // O += P V: the score accumulators are already laid out as the A operand.
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      const uint32_t a[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                             pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      const bf16* v0 = Vs + (kk * 16 + quad * 2) * ld + grp;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        const bf16* v = v0 + dt * 8;
        mma_bf16(o[dt], a, pack_bf16(v[0], v[ld]), pack_bf16(v[8 * ld], v[9 * ld]));
      }
    }
  }
  const float inv_lo = l_lo > 0.0f ? 1.0f / l_lo : 0.0f, inv_hi = l_hi > 0.0f ? 1.0f / l_hi : 0.0f;
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    const int col = dt * 8 + quad * 2;
    if (r_lo < n)
      *reinterpret_cast<uint32_t*>(out + r_lo * heads * D + h * D + col) =
          pack_bf16(o[dt][0] * inv_lo, o[dt][1] * inv_lo);
    if (r_hi < n)
      *reinterpret_cast<uint32_t*>(out + r_hi * heads * D + h * D + col) =
          pack_bf16(o[dt][2] * inv_hi, o[dt][3] * inv_hi);
  }
  if (quad == 0) {
    if (r_lo < n) lse[r_lo * heads + h] = m_lo + __logf(l_lo);
    if (r_hi < n) lse[r_hi * heads + h] = m_hi + __logf(l_hi);
  }
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

// FlashAttention-2 backward on raw MMAs. One block per (64 keys, query head); each warp owns 16
// keys and keeps their dK and dV accumulators in registers while the block walks the query tiles
// that can see them. S^T, P^T, dP^T and dS^T live in registers; dS^T goes through shared memory
// once so that dQ (summed over the block's keys) can be formed and added to fp32 accumulators.
template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_backward_kernel(float* dkv_acc, float* dq_acc, const float* delta, const bf16* dout, const float* lse,
                          const bf16* qkv, const int32_t* doc_start, int64_t n, int64_t heads, int64_t kv_heads,
                          float scale) {
  constexpr int ld = D + kPadB;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Ks = reinterpret_cast<bf16*>(smem);
  bf16* Vs = Ks + kTile * ld;
  bf16* Qs = Vs + kTile * ld;
  bf16* dOs = Qs + kTile * ld;
  bf16* dSs = dOs + kTile * ld;  // dS^T [key][query]
  float* q_lse = reinterpret_cast<float*>(dSs + kTile * kPld);
  float* q_delta = q_lse + kTile;
  int64_t* q_doc = reinterpret_cast<int64_t*>(q_delta + kTile);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, grp = lane >> 2, quad = lane & 3;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kTile, h = blockIdx.y;
  const int64_t g = h / (heads / kv_heads), width = (heads + 2 * kv_heads) * D;
  const int k_valid = static_cast<int>(min(static_cast<int64_t>(kTile), n - k0));
  const int64_t k_last = k0 + k_valid - 1;
  int64_t lo = k_last, hi = n;  // first query whose document starts after the last key
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (doc_start[mid] <= k_last)
      lo = mid + 1;
    else
      hi = mid;
  }
  const int64_t q_end = lo;
  load_rows<D>(Ks, ld, qkv + k0 * width + (heads + g) * D, width, k_valid);
  load_rows<D>(Vs, ld, qkv + k0 * width + (heads + kv_heads + g) * D, width, k_valid);
  const int key_lo = warp * 16 + grp, key_hi = key_lo + 8;  // rows of this thread in the key tile

  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.0f;

  for (int64_t q0 = k0; q0 < q_end; q0 += kTile) {
    const int q_valid = static_cast<int>(min(static_cast<int64_t>(kTile), q_end - q0));
    __syncthreads();
    load_rows<D>(Qs, ld, qkv + q0 * width + h * D, width, q_valid);
    load_rows<D>(dOs, ld, dout + q0 * heads * D + h * D, heads * D, q_valid);
    for (int r = threadIdx.x; r < kTile; r += kThreads) {
      const bool in = r < q_valid;
      q_lse[r] = in ? lse[(q0 + r) * heads + h] : 0.0f;
      q_delta[r] = in ? delta[(q0 + r) * heads + h] : 0.0f;
      q_doc[r] = in ? doc_start[q0 + r] : INT64_MAX;
    }
    __syncthreads();
    // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys against the 64 queries.
    float st[kTile / 8][4], dpt[kTile / 8][4];
#pragma unroll
    for (int jt = 0; jt < kTile / 8; ++jt)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[jt][e] = dpt[jt][e] = 0.0f;
#pragma unroll
    for (int kt = 0; kt < D / 16; ++kt) {
      const int col = kt * 16 + quad * 2;
      const uint32_t ka[4] = {load_pair(Ks + key_lo * ld + col), load_pair(Ks + key_hi * ld + col),
                              load_pair(Ks + key_lo * ld + col + 8), load_pair(Ks + key_hi * ld + col + 8)};
      const uint32_t va[4] = {load_pair(Vs + key_lo * ld + col), load_pair(Vs + key_hi * ld + col),
                              load_pair(Vs + key_lo * ld + col + 8), load_pair(Vs + key_hi * ld + col + 8)};
#pragma unroll
      for (int jt = 0; jt < kTile / 8; ++jt) {
        const bf16* qrow = Qs + (jt * 8 + grp) * ld + col;
        const bf16* orow = dOs + (jt * 8 + grp) * ld + col;
        mma_bf16(st[jt], ka, load_pair(qrow), load_pair(qrow + 8));
        mma_bf16(dpt[jt], va, load_pair(orow), load_pair(orow + 8));
      }
    }
    // P^T and dS^T in place (st becomes P^T, dpt becomes dS^T); dS^T also to shared memory.
#pragma unroll
    for (int jt = 0; jt < kTile / 8; ++jt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qc = jt * 8 + quad * 2 + (e & 1);
        const int64_t key = k0 + (e < 2 ? key_lo : key_hi), q = q0 + qc;
        const bool ok = qc < q_valid && key - k0 < k_valid && key <= q && key >= q_doc[qc];
        const float p = ok ? __expf(st[jt][e] * scale - q_lse[qc]) : 0.0f;
        st[jt][e] = p;
        dpt[jt][e] = p * (dpt[jt][e] - q_delta[qc]) * scale;
      }
      *reinterpret_cast<uint32_t*>(dSs + key_lo * kPld + jt * 8 + quad * 2) = pack_bf16(dpt[jt][0], dpt[jt][1]);
      *reinterpret_cast<uint32_t*>(dSs + key_hi * kPld + jt * 8 + quad * 2) = pack_bf16(dpt[jt][2], dpt[jt][3]);
    }
    // dV += P^T dO and dK += dS^T Q (k = the 64 queries).
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      const uint32_t pa[4] = {pack_bf16(st[2 * kk][0], st[2 * kk][1]), pack_bf16(st[2 * kk][2], st[2 * kk][3]),
                              pack_bf16(st[2 * kk + 1][0], st[2 * kk + 1][1]),
                              pack_bf16(st[2 * kk + 1][2], st[2 * kk + 1][3])};
      const uint32_t sa[4] = {pack_bf16(dpt[2 * kk][0], dpt[2 * kk][1]), pack_bf16(dpt[2 * kk][2], dpt[2 * kk][3]),
                              pack_bf16(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]),
                              pack_bf16(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3])};
      const bf16* o0 = dOs + (kk * 16 + quad * 2) * ld + grp;
      const bf16* x0 = Qs + (kk * 16 + quad * 2) * ld + grp;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        const bf16* o = o0 + dt * 8;
        const bf16* x = x0 + dt * 8;
        mma_bf16(dv[dt], pa, pack_bf16(o[0], o[ld]), pack_bf16(o[8 * ld], o[9 * ld]));
        mma_bf16(dk[dt], sa, pack_bf16(x[0], x[ld]), pack_bf16(x[8 * ld], x[9 * ld]));
      }
    }
    __syncthreads();  // dS^T of every warp is in shared memory
    // dQ for this warp's 16 queries = dS (16 x 64 keys) K, added to the fp32 accumulators.
    const int qa = warp * 16 + grp, qb = qa + 8;
#pragma unroll 1
    for (int dt = 0; dt < D / 8; ++dt) {
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        const int kc = kk * 16 + quad * 2;  // key index (the k dimension)
        const uint32_t a[4] = {pack_bf16(dSs[kc * kPld + qa], dSs[(kc + 1) * kPld + qa]),
                               pack_bf16(dSs[kc * kPld + qb], dSs[(kc + 1) * kPld + qb]),
                               pack_bf16(dSs[(kc + 8) * kPld + qa], dSs[(kc + 9) * kPld + qa]),
                               pack_bf16(dSs[(kc + 8) * kPld + qb], dSs[(kc + 9) * kPld + qb])};
        const bf16* k = Ks + kc * ld + dt * 8 + grp;
        mma_bf16(acc, a, pack_bf16(k[0], k[ld]), pack_bf16(k[8 * ld], k[9 * ld]));
      }
      const int col = dt * 8 + quad * 2;
      if (qa < q_valid) {
        float* d = dq_acc + ((q0 + qa) * heads + h) * D + col;
        atomicAdd(d, acc[0]);
        atomicAdd(d + 1, acc[1]);
      }
      if (qb < q_valid) {
        float* d = dq_acc + ((q0 + qb) * heads + h) * D + col;
        atomicAdd(d, acc[2]);
        atomicAdd(d + 1, acc[3]);
      }
    }
  }
  // This head's dK and dV into the KV group's fp32 accumulators.
  float* dk_acc = dkv_acc;
  float* dv_acc = dkv_acc + n * kv_heads * D;
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    const int col = dt * 8 + quad * 2;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int key = half == 0 ? key_lo : key_hi;
      if (key >= k_valid) continue;
      const int64_t at = ((k0 + key) * kv_heads + g) * D + col;
      atomicAdd(dk_acc + at, dk[dt][2 * half]);
      atomicAdd(dk_acc + at + 1, dk[dt][2 * half + 1]);
      atomicAdd(dv_acc + at, dv[dt][2 * half]);
      atomicAdd(dv_acc + at + 1, dv[dt][2 * half + 1]);
    }
  }
}

template <int D>
constexpr size_t backward_smem_bytes() {
  return sizeof(bf16) * (4 * kTile * (D + kPadB) + kTile * kPld) + 2 * sizeof(float) * kTile + sizeof(int64_t) * kTile;
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
  dim3 grid(static_cast<unsigned int>((n + kTile - 1) / kTile), static_cast<unsigned int>(heads));
  flash_forward_kernel<D><<<grid, kThreads, 0, stream>>>(out, lse, qkv, doc_start, n, heads, kv_heads,
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
  const size_t smem = backward_smem_bytes<D>();
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
