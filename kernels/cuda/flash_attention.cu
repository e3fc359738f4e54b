// FlashAttention-2 on m16n8k16 bf16 tensor-core MMAs (fp32 accumulation), fragments loaded with
// ldmatrix, tiles brought in with cp.async so that the next tile's loads overlap this tile's math.
//
// Forward: one block per (128 queries, head), 4 warps of 32 query rows (two 16-row MMA tiles each,
// so every K/V fragment read from shared memory feeds two MMAs); scores, probabilities and output
// accumulators stay in registers; K and V tiles of kFwdKeys keys are loaded alternately so that
// V(j) arrives while S(j) = Q K(j)^T is computed and K(j+1) while O += P V(j) is.
// Backward: one block per (64 keys, head) walks the query tiles that can see its keys (the next
// tile's Q and dO prefetched), its 4 warps in a 2 x 2 tiling of every product; P^T and dS^T go
// through shared memory; dK and dV stay in registers; dQ = dS K is added to fp32 accumulators.
// Tiles that lie wholly below the diagonal and inside every row's document skip the masks.
// Heavy blocks are scheduled first (the last query tiles forward, the first key tiles backward).
#include "kernels/cuda/flash_attention.cuh"

#include "kernels/cuda/flash_attention_sm90.cuh"
#include "kernels/cuda/tensor_core.cuh"

#include <algorithm>
#include <climits>
#include <iterator>
#include <string>
#include <type_traits>

namespace glm::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kPadB = 8;           // bf16 padding per shared row: 16-byte aligned rows, conflict-free ldmatrix
constexpr int kFwdRows = 128;      // queries per forward block (32 per warp)
constexpr int kBwdRows = 64;       // queries per backward step
constexpr int kPld = kBwdRows + kPadB;  // dS^T tile [key][query]

// A operand (16 rows m0.. x 16 k k0..) of a tile stored transposed, [k][m] (transposed ldmatrix).
__device__ __forceinline__ const bf16* a_frag_t(const bf16* tile, int ld, int m0, int k0, int lane) {
  const int m = lane >> 3;
  return tile + (k0 + (m >> 1) * 8 + (lane & 7)) * ld + m0 + (m & 1) * 8;
}

// rows x D bf16 rows of a strided global matrix into shared memory by cp.async; rows from `valid`
// on become zeros.
template <int D, int Rows, int Threads = kThreads>
__device__ __forceinline__ void async_rows(bf16* dst, int ld, const bf16* src, int64_t src_stride, int valid) {
  constexpr int chunks = D / 8;  // 16-byte vectors per row
#pragma unroll
  for (int i = threadIdx.x; i < Rows * chunks; i += Threads) {
    const int r = i / chunks, c = (i % chunks) * 8;
    const bool ok = r < valid;
    cp_async16(dst + r * ld + c, ok ? src + r * src_stride + c : src, ok);
  }
}

// Rows x D key (or value) rows of positions k0.. into shared memory, as async_rows; base is the
// row of position 0's head (position p at row kv_row[p] when Gathered, unless kv_row is null).
template <int D, int Rows, bool Gathered, int Threads = kThreads>
__device__ __forceinline__ void async_key_rows(bf16* dst, int ld, const bf16* base, int64_t stride,
                                               const int32_t* kv_row, int64_t k0, int valid) {
  if (!Gathered || kv_row == nullptr) {
    async_rows<D, Rows, Threads>(dst, ld, base + k0 * stride, stride, valid);
  } else {
    constexpr int chunks = D / 8;
#pragma unroll
    for (int i = threadIdx.x; i < Rows * chunks; i += Threads) {
      const int r = i / chunks, c = (i % chunks) * 8;
      const bool ok = r < valid;
      cp_async16(dst + r * ld + c, ok ? base + static_cast<int64_t>(kv_row[k0 + r]) * stride + c : base, ok);
    }
  }
}

template <int D, int BN>
constexpr size_t forward_smem_bytes() {
  return sizeof(bf16) * (kFwdRows + 2 * BN) * (D + kPadB);
}

template <int D, int BN, bool Gathered>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(bf16* out, float* lse, FlashRows rows, const int32_t* doc_start, int64_t heads,
                         int64_t kv_heads, float scale_log2) {
  constexpr int ld = D + kPadB, KT = D / 16, NT = BN / 8, DT = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Ks = Qs + kFwdRows * ld;
  bf16* Vs = Ks + BN * ld;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, grp = lane >> 2, quad = lane & 3;
  const int64_t h = blockIdx.x;
  const int64_t q0 = static_cast<int64_t>(gridDim.y - 1 - blockIdx.y) * kFwdRows;  // heavy tiles first
  const int64_t g = h / (heads / kv_heads), kv_stride = rows.kv_stride;
  const int q_valid = static_cast<int>(min(static_cast<int64_t>(kFwdRows), rows.n_q - q0));
  const bf16* k_base = rows.k + g * D;
  const bf16* v_base = rows.v + g * D;

  // Rows of this thread, relative to q0: warp * 32 + mi * 16 + half * 8 + grp; their document
  // starts and row positions (q0 + the row unless Gathered).
  const int row0 = warp * 32 + grp;
  int doc[2][2], at[2][2];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = row0 + mi * 16 + hf * 8;
      doc[mi][hf] = r < q_valid ? doc_start[q0 + r] : INT_MAX;
      at[mi][hf] = r < q_valid ? query_position<Gathered>(rows, q0 + r) : -1;
    }
  // Keys from the first row's document start (tile-aligned) to the last row's position; doc_max is
  // the latest document start of the block: tiles that end before the first row's position and
  // start at or after doc_max need no mask. Token indices fit in int (doc_start is int32); pointer
  // offsets are 64-bit.
  const int k_first = doc_start[q0] / BN * BN, k_end = query_position<Gathered>(rows, q0 + q_valid - 1) + 1;
  const int doc_max = doc_start[q0 + q_valid - 1], first_at = query_position<Gathered>(rows, q0);

  async_rows<D, kFwdRows>(Qs, ld, rows.q + q0 * rows.q_stride + h * D, rows.q_stride, q_valid);
  async_key_rows<D, BN, Gathered>(Ks, ld, k_base, kv_stride, rows.kv_row, k_first, min(BN, k_end - k_first));
  cp_async_commit();

  float o[2][DT][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) o[mi][dt][0] = o[mi][dt][1] = o[mi][dt][2] = o[mi][dt][3] = 0.0f;
  float m_run[2][2], l_run[2][2];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) m_run[mi][0] = m_run[mi][1] = -INFINITY, l_run[mi][0] = l_run[mi][1] = 0.0f;

  for (int k0 = k_first; k0 < k_end; k0 += BN) {
    const int k_valid = min(BN, k_end - k0);
    cp_async_wait_all();
    __syncthreads();  // K(j) (and Q) in shared memory; every warp is done with V(j-1)
    async_key_rows<D, BN, Gathered>(Vs, ld, v_base, kv_stride, rows.kv_row, k0, k_valid);
    cp_async_commit();

    float s[2][NT][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) s[mi][nt][0] = s[mi][nt][1] = s[mi][nt][2] = s[mi][nt][3] = 0.0f;
#pragma unroll
    for (int kt = 0; kt < KT; ++kt) {
      uint32_t a[2][4];
      ldsm_x4(a[0], a_frag(Qs, ld, warp * 32, kt * 16, lane));
      ldsm_x4(a[1], a_frag(Qs, ld, warp * 32 + 16, kt * 16, lane));
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t b[4];
        ldsm_x4(b, b_frag_nk(Ks, ld, np * 16, kt * 16, lane));
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          mma_bf16(s[mi][2 * np], a[mi], b[0], b[1]);
          mma_bf16(s[mi][2 * np + 1], a[mi], b[2], b[3]);
        }
      }
    }
    // Masks only where the tile can cross the diagonal, a document start or the end.
    if (k0 + BN > first_at || k0 < doc_max) {
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int j = nt * 8 + quad * 2 + (e & 1), r = row0 + mi * 16 + (e >> 1) * 8;
            const int row_at = Gathered ? at[mi][e >> 1] : static_cast<int>(q0) + r;
            const bool ok = j < k_valid && k0 + j <= row_at && k0 + j >= doc[mi][e >> 1];
            if (!ok) s[mi][nt][e] = -INFINITY;
          }
    }
    // Online softmax in the log2 domain: p = 2^(s * scale * log2(e) - m).
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[mi][nt][2 * hf], s[mi][nt][2 * hf + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m_run[mi][hf], mx * scale_log2);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing visible yet
        const float corr = exp2f(m_run[mi][hf] - m_use);
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const float p0 = exp2f(s[mi][nt][2 * hf] * scale_log2 - m_use);
          const float p1 = exp2f(s[mi][nt][2 * hf + 1] * scale_log2 - m_use);
          s[mi][nt][2 * hf] = p0;
          s[mi][nt][2 * hf + 1] = p1;
          sum += p0 + p1;
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        l_run[mi][hf] = l_run[mi][hf] * corr + sum;
        m_run[mi][hf] = m_new;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          o[mi][dt][2 * hf] *= corr;
          o[mi][dt][2 * hf + 1] *= corr;
        }
      }
    cp_async_wait_all();
    __syncthreads();  // V(j) in shared memory; every warp is done with K(j)
    if (k0 + BN < k_end) {
      async_key_rows<D, BN, Gathered>(Ks, ld, k_base, kv_stride, rows.kv_row, k0 + BN, min(BN, k_end - k0 - BN));
      cp_async_commit();
    }
    // O += P V: the score accumulators are already laid out as the A operand.
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t a[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        a[mi][0] = pack_bf16(s[mi][2 * kk][0], s[mi][2 * kk][1]);
        a[mi][1] = pack_bf16(s[mi][2 * kk][2], s[mi][2 * kk][3]);
        a[mi][2] = pack_bf16(s[mi][2 * kk + 1][0], s[mi][2 * kk + 1][1]);
        a[mi][3] = pack_bf16(s[mi][2 * kk + 1][2], s[mi][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        uint32_t b[4];
        ldsm_x4_t(b, b_frag_kn(Vs, ld, kk * 16, dp * 16, lane));
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          mma_bf16(o[mi][2 * dp], a[mi], b[0], b[1]);
          mma_bf16(o[mi][2 * dp + 1], a[mi], b[2], b[3]);
        }
      }
    }
  }
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int64_t r = q0 + row0 + mi * 16 + hf * 8;
      if (r >= rows.n_q) continue;
      const float l = l_run[mi][hf], inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
        *reinterpret_cast<uint32_t*>(out + r * heads * D + h * D + dt * 8 + quad * 2) =
            pack_bf16(o[mi][dt][2 * hf] * inv, o[mi][dt][2 * hf + 1] * inv);
      if (quad == 0) lse[r * heads + h] = (m_run[mi][hf] + __log2f(l)) / kLog2e;
    }
}

// delta[t, h] = dout . out (fp32), and the [n][heads][d] dQ accumulators cleared when given.
__global__ void delta_kernel(float* delta, float* dq_acc, const bf16* dout, const bf16* out, int64_t n, int64_t heads,
                             int64_t d) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarps) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= n * heads) return;
  float acc = 0.0f;
  for (int64_t j = lane; j < d; j += 32) {
    acc += __bfloat162float(dout[row * d + j]) * __bfloat162float(out[row * d + j]);
    if (dq_acc != nullptr) dq_acc[row * d + j] = 0.0f;
  }
  acc = warp_sum(acc);
  if (lane == 0) delta[row] = acc;
}

// The backward's variants: Keys keys per block (128: 8 warps; 64: 4 warps), and Stages buffers of
// the query tiles (2: the next tile loads while this one is computed; 1: it loads after). Listed
// from the fastest to the smallest; the first that fits the device's shared memory runs: at head_dim
// 128, (128, 2) needs 174 KiB (Hopper), (128, 1) 139 KiB (A100: 163), (64, 1) 87 KiB (sm_86 and
// sm_89: 99).
struct BackwardTiles {
  int keys, stages;
};
constexpr BackwardTiles kBackwardVariants[] = {{128, 2}, {128, 1}, {64, 1}};

// Shared memory of the backward: K and V of the block's keys, Stages buffers of Q, dO and their row
// statistics (with the row positions when Gathered), P^T and dS^T.
template <int D, bool Gathered>
constexpr size_t backward_smem_bytes(BackwardTiles t) {
  return sizeof(bf16) *
             (2 * static_cast<size_t>(t.keys) * (D + kPadB) + t.stages * 2 * kBwdRows * (D + kPadB) +
              2 * static_cast<size_t>(t.keys) * kPld) +
         t.stages * (2 * sizeof(float) + (Gathered ? 2 : 1) * sizeof(int32_t)) * kBwdRows;
}

// Q, dO and the row statistics (lse, delta, document start; the row position when Gathered) of one
// query tile.
template <int D, bool Gathered, int Threads>
__device__ __forceinline__ void async_query_tile(bf16* Qs, bf16* dOs, float* q_lse, float* q_delta, int32_t* q_doc,
                                                 int32_t* q_at, const FlashRows& rows, const bf16* dout,
                                                 const float* lse, const float* delta, const int32_t* doc_start,
                                                 int64_t q0, int q_valid, int64_t h, int64_t heads) {
  constexpr int ld = D + kPadB;
  async_rows<D, kBwdRows, Threads>(Qs, ld, rows.q + q0 * rows.q_stride + h * D, rows.q_stride, q_valid);
  async_rows<D, kBwdRows, Threads>(dOs, ld, dout + q0 * heads * D + h * D, heads * D, q_valid);
  for (int r = threadIdx.x; r < kBwdRows; r += Threads) {
    const bool in = r < q_valid;
    const int64_t t = in ? q0 + r : 0;
    cp_async4(q_lse + r, lse + t * heads + h, in);
    cp_async4(q_delta + r, delta + t * heads + h, in);
    cp_async4(q_doc + r, doc_start + t, in);
    if constexpr (Gathered) cp_async4(q_at + r, rows.pos + t, in);
  }
  cp_async_commit();
}

// FlashAttention-2 backward. One block per (Keys keys, query head) walks the 64-query tiles that
// can see its keys; with two Stages the next tile's Q and dO load while this one is computed. The
// Keys / 16 warps tile every product in two dimensions so that each shared-memory fragment feeds
// several MMAs: warp w computes S^T and dP^T for keys 32 (w / 2).. x queries 32 (w % 2)..; P^T and
// dS^T go to shared memory; then the warp accumulates dV and dK for keys 32 (w / 2).. x dims (D / 2)
// (w % 2).. in registers over all query tiles, and dQ = dS K for one (query, dim) block of the tile
// into fp32 accumulators.
template <int D, bool Gathered, int Keys, int Stages>
__global__ void __launch_bounds__(Keys * 2)
    flash_backward_kernel(float* dk_acc, float* dv_acc, float* dq_acc, const float* delta, const bf16* dout,
                          const float* lse, FlashRows rows, const int32_t* doc_start, int64_t heads, int64_t kv_heads,
                          float scale) {
  constexpr int Warps = Keys / 16, Threads = 32 * Warps;
  constexpr int ld = D + kPadB, KT = D / 16, DH = D / 2, DT = DH / 8;
  // dQ (64 queries x D) over the warps: QW warps along the queries, Warps / QW along the dims.
  constexpr int QW = D >= 64 ? 2 : 4, QM = kBwdRows / QW / 16, QD = D / (Warps / QW), QDT = QD / 8;
  static_assert((Keys == 128 || Keys == 64) && kBwdRows == 64, "the warp tiling assumes (Keys / 32) x 2 warps of 32");
  static_assert(Stages == 1 || Stages == 2, "one or two query-tile buffers");
  static_assert(DT % 2 == 0 && QDT % 2 == 0 && Warps % QW == 0, "head_dim too small for the warp tiling");
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Ks = reinterpret_cast<bf16*>(smem);
  bf16* Vs = Ks + Keys * ld;
  bf16* Qbuf = Vs + Keys * ld;                  // [Stages][kBwdRows * ld]
  bf16* dObuf = Qbuf + Stages * kBwdRows * ld;  // [Stages][kBwdRows * ld]
  bf16* Ps = dObuf + Stages * kBwdRows * ld;    // P^T [key][query]
  bf16* dSs = Ps + Keys * kPld;                 // dS^T [key][query]
  float* lse_buf = reinterpret_cast<float*>(dSs + Keys * kPld);                  // [Stages][kBwdRows]
  float* delta_buf = lse_buf + Stages * kBwdRows;                               // [Stages][kBwdRows]
  int32_t* doc_buf = reinterpret_cast<int32_t*>(delta_buf + Stages * kBwdRows);  // [Stages][kBwdRows]
  int32_t* at_buf = doc_buf + Stages * kBwdRows;  // [Stages][kBwdRows] when Gathered

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, grp = lane >> 2, quad = lane & 3;
  const int wk = warp >> 1, wq = warp & 1;  // key quarter; query half of S and dim half of dK/dV
  const int wdq = warp / (Warps / QW), wdd = warp % (Warps / QW);  // dQ: query block, dim block
  const int64_t h = blockIdx.x, k0 = static_cast<int64_t>(blockIdx.y) * Keys;  // first key tiles first
  const int64_t g = h / (heads / kv_heads);
  const int k_valid = static_cast<int>(min(static_cast<int64_t>(Keys), rows.n_kv - k0));
  const int64_t k_last = k0 + k_valid - 1;
  int64_t q_begin = 0, q_end = 0;
  queries_seeing<Gathered>(rows, doc_start, k0, k_last, q_begin, q_end);
  if (q_begin >= q_end) return;  // the whole block: no query of this call sees these keys
  const float scale_log2 = scale * kLog2e;
  async_key_rows<D, Keys, Gathered, Threads>(Ks, ld, rows.k + g * D, rows.kv_stride, rows.kv_row, k0, k_valid);
  async_key_rows<D, Keys, Gathered, Threads>(Vs, ld, rows.v + g * D, rows.kv_stride, rows.kv_row, k0, k_valid);
  // The query tile from q0 into stage `to`'s buffers.
  auto load_query_tile = [&](int64_t q0, int to) {
    async_query_tile<D, Gathered, Threads>(Qbuf + to * kBwdRows * ld, dObuf + to * kBwdRows * ld,
                                           lse_buf + to * kBwdRows, delta_buf + to * kBwdRows,
                                           doc_buf + to * kBwdRows, at_buf + to * kBwdRows, rows, dout, lse, delta,
                                           doc_start, q0,
                                           static_cast<int>(min(static_cast<int64_t>(kBwdRows), q_end - q0)), h, heads);
  };
  load_query_tile(q_begin, 0);

  float dk[2][DT][4], dv[2][DT][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[mi][dt][e] = dv[mi][dt][e] = 0.0f;

  int stage = 0;
  for (int64_t q0 = q_begin; q0 < q_end; q0 += kBwdRows, stage = (stage + 1) % Stages) {
    const int q_valid = static_cast<int>(min(static_cast<int64_t>(kBwdRows), q_end - q0));
    const bf16* Qs = Qbuf + stage * kBwdRows * ld;
    const bf16* dOs = dObuf + stage * kBwdRows * ld;
    const float* q_lse = lse_buf + stage * kBwdRows;
    const float* q_delta = delta_buf + stage * kBwdRows;
    const int32_t* q_doc = doc_buf + stage * kBwdRows;
    const int32_t* q_at = at_buf + stage * kBwdRows;
    cp_async_wait_all();
    __syncthreads();  // this tile in shared memory; every warp is done with the previous tile
    if (Stages == 2 && q0 + kBwdRows < q_end) load_query_tile(q0 + kBwdRows, stage ^ 1);
    const int64_t first_at = Gathered ? q_at[0] : q0;
    const bool masked = first_at < k0 + Keys || q_valid < kBwdRows || k_valid < Keys || q_doc[q_valid - 1] > k0;
    {
      // S^T = K Q^T and dP^T = V dO^T: keys 32 wk + 16 mi + {grp, grp + 8}, queries 32 wq + 8 nt + ...
      float st[2][4][4], dpt[2][4][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) st[mi][nt][e] = dpt[mi][nt][e] = 0.0f;
#pragma unroll
      for (int kt = 0; kt < KT; ++kt) {
        uint32_t ka[2][4], va[2][4];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          ldsm_x4(ka[mi], a_frag(Ks, ld, wk * 32 + mi * 16, kt * 16, lane));
          ldsm_x4(va[mi], a_frag(Vs, ld, wk * 32 + mi * 16, kt * 16, lane));
        }
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          uint32_t qb[4], ob[4];
          ldsm_x4(qb, b_frag_nk(Qs, ld, wq * 32 + np * 16, kt * 16, lane));
          ldsm_x4(ob, b_frag_nk(dOs, ld, wq * 32 + np * 16, kt * 16, lane));
#pragma unroll
          for (int mi = 0; mi < 2; ++mi) {
            mma_bf16(st[mi][2 * np], ka[mi], qb[0], qb[1]);
            mma_bf16(st[mi][2 * np + 1], ka[mi], qb[2], qb[3]);
            mma_bf16(dpt[mi][2 * np], va[mi], ob[0], ob[1]);
            mma_bf16(dpt[mi][2 * np + 1], va[mi], ob[2], ob[3]);
          }
        }
      }
      // P^T and dS^T (bf16) to shared memory.
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const int kr = wk * 32 + mi * 16 + grp;  // key row in the tile (and kr + 8)
          float p[4], ds[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int qc = wq * 32 + nt * 8 + quad * 2 + (e & 1);
            p[e] = exp2f(st[mi][nt][e] * scale_log2 - q_lse[qc] * kLog2e);
            if (masked) {
              const int64_t key = k0 + kr + (e >> 1) * 8, q = Gathered ? q_at[qc] : q0 + qc;
              if (!(qc < q_valid && key <= k_last && key <= q && key >= q_doc[qc])) p[e] = 0.0f;
            }
            ds[e] = p[e] * (dpt[mi][nt][e] - q_delta[qc]) * scale;
          }
          const int col = wq * 32 + nt * 8 + quad * 2;
          *reinterpret_cast<uint32_t*>(Ps + kr * kPld + col) = pack_bf16(p[0], p[1]);
          *reinterpret_cast<uint32_t*>(Ps + (kr + 8) * kPld + col) = pack_bf16(p[2], p[3]);
          *reinterpret_cast<uint32_t*>(dSs + kr * kPld + col) = pack_bf16(ds[0], ds[1]);
          *reinterpret_cast<uint32_t*>(dSs + (kr + 8) * kPld + col) = pack_bf16(ds[2], ds[3]);
        }
    }
    __syncthreads();  // P^T and dS^T of the whole tile in shared memory
    // dV += P^T dO and dK += dS^T Q: keys 32 wk + 16 mi.., dims DH wq + 8 dt.., k = the 64 queries.
#pragma unroll
    for (int kk = 0; kk < kBwdRows / 16; ++kk) {
      uint32_t pa[2][4], sa[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        ldsm_x4(pa[mi], a_frag(Ps, kPld, wk * 32 + mi * 16, kk * 16, lane));
        ldsm_x4(sa[mi], a_frag(dSs, kPld, wk * 32 + mi * 16, kk * 16, lane));
      }
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        uint32_t ob[4], qb[4];
        ldsm_x4_t(ob, b_frag_kn(dOs, ld, kk * 16, wq * DH + dp * 16, lane));
        ldsm_x4_t(qb, b_frag_kn(Qs, ld, kk * 16, wq * DH + dp * 16, lane));
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          mma_bf16(dv[mi][2 * dp], pa[mi], ob[0], ob[1]);
          mma_bf16(dv[mi][2 * dp + 1], pa[mi], ob[2], ob[3]);
          mma_bf16(dk[mi][2 * dp], sa[mi], qb[0], qb[1]);
          mma_bf16(dk[mi][2 * dp + 1], sa[mi], qb[2], qb[3]);
        }
      }
    }
    // dQ = dS K for queries 16 QM wdq + 16 mi.., dims QD wdd + 8 dt.., k = the 128 keys.
    if (wdq * QM * 16 < q_valid) {
      float acc[QM][QDT][4];
#pragma unroll
      for (int mi = 0; mi < QM; ++mi)
#pragma unroll
        for (int dt = 0; dt < QDT; ++dt) acc[mi][dt][0] = acc[mi][dt][1] = acc[mi][dt][2] = acc[mi][dt][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < Keys / 16; ++kk) {
        uint32_t a[QM][4];
#pragma unroll
        for (int mi = 0; mi < QM; ++mi)
          ldsm_x4_t(a[mi], a_frag_t(dSs, kPld, (wdq * QM + mi) * 16, kk * 16, lane));
#pragma unroll
        for (int dp = 0; dp < QDT / 2; ++dp) {
          uint32_t b[4];
          ldsm_x4_t(b, b_frag_kn(Ks, ld, kk * 16, wdd * QD + dp * 16, lane));
#pragma unroll
          for (int mi = 0; mi < QM; ++mi) {
            mma_bf16(acc[mi][2 * dp], a[mi], b[0], b[1]);
            mma_bf16(acc[mi][2 * dp + 1], a[mi], b[2], b[3]);
          }
        }
      }
#pragma unroll
      for (int mi = 0; mi < QM; ++mi) {
        const int qa = (wdq * QM + mi) * 16 + grp;
#pragma unroll
        for (int dt = 0; dt < QDT; ++dt) {
          const int col = wdd * QD + dt * 8 + quad * 2;
          if (qa < q_valid) add2(dq_acc + ((q0 + qa) * heads + h) * D + col, acc[mi][dt][0], acc[mi][dt][1]);
          if (qa + 8 < q_valid)
            add2(dq_acc + ((q0 + qa + 8) * heads + h) * D + col, acc[mi][dt][2], acc[mi][dt][3]);
        }
      }
    }
    if (Stages == 1 && q0 + kBwdRows < q_end) {
      __syncthreads();  // every warp is done with this tile's Q, dO and statistics
      load_query_tile(q0 + kBwdRows, 0);
    }
    // The next iteration's first barrier orders these reads of P^T, dS^T and this stage before
    // they are overwritten.
  }
  cp_async_wait_all();  // nothing outstanding when the block exits
  // This head's dK and dV into the KV group's fp32 accumulators (by row position).
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int key = wk * 32 + mi * 16 + hf * 8 + grp;
      if (key >= k_valid) continue;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        const int64_t at = ((k0 + key) * kv_heads + g) * D + wq * DH + dt * 8 + quad * 2;
        add2(dk_acc + at, dk[mi][dt][2 * hf], dk[mi][dt][2 * hf + 1]);
        add2(dv_acc + at, dv[mi][dt][2 * hf], dv[mi][dt][2 * hf + 1]);
      }
    }
}

// The fp32 accumulators dQ ([n, heads, D], or wgmma_dq_index's layout when dq_tiled) and
// [n, kv_heads, D] (dK, dV) into the bf16 dqkv rows: four consecutive columns per thread (D a power
// of two, so no divisions), 16-byte loads and 8-byte stores when Vec; tokens from blockIdx.y in
// steps of gridDim.y (at most 65,535).
template <int D, bool Vec>
__global__ void write_dqkv_kernel(bf16* dqkv, const float* dq_acc, const float* dkv_acc, int64_t n, int heads,
                                  int kv_heads, bool dq_tiled) {
  const int q_width = heads * D, kv_width = kv_heads * D, per_token = q_width + 2 * kv_width;
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
  if (c >= per_token) return;
  for (int64_t t = blockIdx.y; t < n; t += gridDim.y) {
    const float* src;
    if (c < q_width)
      src = dq_acc + t * q_width + c;
    else if (c < q_width + kv_width)
      src = dkv_acc + t * kv_width + (c - q_width);
    else
      src = dkv_acc + (n + t) * kv_width + (c - q_width - kv_width);
    float v[4];
    // The wgmma layout exists for head_dim 128 only. Columns (c, c + 1) and (c + 2, c + 3) are two
    // adjacent pairs of it.
    if (D == 128 && c < q_width && dq_tiled) {
      const int64_t i0 = wgmma_dq_index(t, c / D, c % D, n), i1 = wgmma_dq_index(t, c / D, c % D + 2, n);
      v[0] = dq_acc[i0], v[1] = dq_acc[i0 + 1], v[2] = dq_acc[i1], v[3] = dq_acc[i1 + 1];
    } else if constexpr (Vec) {
      const float4 x = *reinterpret_cast<const float4*>(src);
      v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = src[k];
    }
    bf16* dst = dqkv + t * per_token + c;
    if constexpr (Vec) {
      *reinterpret_cast<uint2*>(dst) = make_uint2(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]));
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) dst[k] = __float2bfloat16(v[k]);
    }
  }
}

// dq into the q columns of dqkv (fp32 accumulators [n, q_width], or wgmma_dq_index's layout for
// head_dim d when dq_tiled) and zeros into its k and v columns; each row position's dK | dV added to
// its gathered row kv_row[p] of dkv.
__global__ void write_gathered_grads_kernel(bf16* dqkv, bf16* dkv, const float* dq_acc, const float* dk_acc,
                                            const float* dv_acc, const int32_t* kv_row, int64_t n, int64_t n_kv,
                                            int64_t q_width, int64_t kv_width, int64_t d, bool dq_tiled) {
  const int64_t width = q_width + 2 * kv_width, step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n * width; i += step) {
    const int64_t t = i / width, c = i % width;
    float grad = 0.0f;
    if (c < q_width)
      grad = dq_tiled ? dq_acc[wgmma_dq_index(t, c / d, static_cast<int>(c % d), n)] : dq_acc[t * q_width + c];
    dqkv[i] = __float2bfloat16(grad);
  }
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n_kv * 2 * kv_width; i += step) {
    const int64_t p = i / (2 * kv_width), c = i % (2 * kv_width);
    const float grad = c < kv_width ? dk_acc[p * kv_width + c] : dv_acc[p * kv_width + c - kv_width];
    bf16& d = dkv[static_cast<int64_t>(kv_row[p]) * 2 * kv_width + c];
    d = __float2bfloat16(__bfloat162float(d) + grad);
  }
}

// The wgmma backward's query ranges in the scratch after delta ([delta_words] fp32), from an even
// offset (flash_attention_scratch's slack word).
int32_t* query_ranges(float* delta, int64_t delta_words) {
  return reinterpret_cast<int32_t*>(delta + (delta_words + 1) / 2 * 2);
}

template <int D, int BN, bool Gathered>
cudaError_t forward_launch(bf16* out, float* lse, const FlashRows& rows, const int32_t* doc_start, int64_t heads,
                           int64_t kv_heads, cudaStream_t stream) {
  const size_t smem = forward_smem_bytes<D, BN>();
  cudaError_t e = cudaFuncSetAttribute(flash_forward_kernel<D, BN, Gathered>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  dim3 grid(static_cast<unsigned int>(heads), static_cast<unsigned int>((rows.n_q + kFwdRows - 1) / kFwdRows));
  flash_forward_kernel<D, BN, Gathered><<<grid, kThreads, smem, stream>>>(out, lse, rows, doc_start, heads, kv_heads,
                                                                          kLog2e / sqrtf(static_cast<float>(D)));
  return cudaGetLastError();
}

template <int D, bool Gathered, int Keys, int Stages>
cudaError_t backward_launch_tiles(float* dk_acc, float* dv_acc, float* dq_acc, const float* delta, const bf16* dout,
                                  const float* lse, const FlashRows& rows, const int32_t* doc_start, int64_t heads,
                                  int64_t kv_heads, cudaStream_t stream) {
  const size_t smem = backward_smem_bytes<D, Gathered>({Keys, Stages});
  auto* kernel = flash_backward_kernel<D, Gathered, Keys, Stages>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  dim3 grid(static_cast<unsigned int>(heads), static_cast<unsigned int>((rows.n_kv + Keys - 1) / Keys));
  kernel<<<grid, 2 * Keys, smem, stream>>>(dk_acc, dv_acc, dq_acc, delta, dout, lse, rows, doc_start, heads, kv_heads,
                                           1.0f / sqrtf(static_cast<float>(D)));
  return cudaGetLastError();
}

// The first backward variant whose shared memory fits shared_limit (0: no limit); keys 0 where none
// does.
template <int D, bool Gathered>
BackwardTiles backward_tiles(size_t shared_limit) {
  for (const BackwardTiles& t : kBackwardVariants)
    if (shared_limit == 0 || backward_smem_bytes<D, Gathered>(t) <= shared_limit) return t;
  return {0, 0};
}

template <int D, bool Gathered>
cudaError_t backward_launch(float* dk_acc, float* dv_acc, float* dq_acc, const float* delta, const bf16* dout,
                            const float* lse, const FlashRows& rows, const int32_t* doc_start, int64_t heads,
                            int64_t kv_heads, cudaStream_t stream, size_t shared_limit) {
  const BackwardTiles t = backward_tiles<D, Gathered>(shared_limit);
  static_assert(std::size(kBackwardVariants) == 3, "a launch below for each variant");
  if (t.keys == 128 && t.stages == 2)
    return backward_launch_tiles<D, Gathered, 128, 2>(dk_acc, dv_acc, dq_acc, delta, dout, lse, rows, doc_start,
                                                      heads, kv_heads, stream);
  if (t.keys == 128 && t.stages == 1)
    return backward_launch_tiles<D, Gathered, 128, 1>(dk_acc, dv_acc, dq_acc, delta, dout, lse, rows, doc_start,
                                                      heads, kv_heads, stream);
  if (t.keys == 64 && t.stages == 1)
    return backward_launch_tiles<D, Gathered, 64, 1>(dk_acc, dv_acc, dq_acc, delta, dout, lse, rows, doc_start, heads,
                                                     kv_heads, stream);
  return cudaErrorInvalidConfiguration;  // flash_attention_shared_bytes says what a device must allow
}

// 64-key steps: half the barriers and output rescales of 32-key steps per query tile, which
// outweighs the few registers they spill at head_dim 128 (32-key steps spill none yet run slower).
template <int D>
cudaError_t forward_impl(bf16* out, float* lse, const bf16* qkv, const int32_t* doc_start, int64_t n, int64_t heads,
                         int64_t kv_heads, cudaStream_t stream, const FlashOptions& options) {
  const FlashRows rows = whole_rows(qkv, n, heads, kv_heads, D);
  if (options.allow_wgmma && flash_wgmma_available(D))
    return flash_forward_wgmma(out, lse, rows, false, doc_start, heads, kv_heads, stream);
  return forward_launch<D, 64, false>(out, lse, rows, doc_start, heads, kv_heads, stream);
}

template <int D>
cudaError_t backward_impl(bf16* dqkv, float* scratch, const bf16* dout, const bf16* out, const float* lse,
                          const bf16* qkv, const int32_t* doc_start, int64_t n, int64_t heads, int64_t kv_heads,
                          cudaStream_t stream, const FlashOptions& options) {
  // dQ and dK/dV first: even offsets keep them 8-byte aligned for add2. dQ's rows are padded to
  // whole tiles (flash_attention_scratch) for the wgmma kernel's layout.
  const bool wgmma = options.allow_wgmma && flash_wgmma_available(D);
  float* dq_acc = scratch;
  float* dkv_acc = dq_acc + wgmma_dq_rows(n) * heads * D;
  float* delta = dkv_acc + 2 * n * kv_heads * D;
  const int64_t rows = n * heads;
  // The wgmma path clears dQ's padded tiles with dK/dV; the mma.sync one while computing delta.
  float* clear_from = wgmma ? dq_acc : dkv_acc;
  cudaError_t e = cudaMemsetAsync(clear_from, 0, sizeof(float) * (delta - clear_from), stream);
  if (e != cudaSuccess) return e;
  delta_kernel<<<static_cast<unsigned int>((rows + kWarps - 1) / kWarps), kThreads, 0, stream>>>(
      delta, wgmma ? nullptr : dq_acc, dout, out, n, heads, D);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  if (wgmma) {
    e = flash_backward_wgmma(dkv_acc, dkv_acc + n * kv_heads * D, dq_acc, query_ranges(delta, rows), delta, dout, lse,
                             whole_rows(qkv, n, heads, kv_heads, D), false, doc_start, heads, kv_heads,
                             options.backward_head_chunk, options.dq_vector_atomics, stream);
  } else {
    e = backward_launch<D, false>(dkv_acc, dkv_acc + n * kv_heads * D, dq_acc, delta, dout, lse,
                                  whole_rows(qkv, n, heads, kv_heads, D), doc_start, heads, kv_heads, stream,
                                  options.shared_limit);
  }
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned int>(((heads + 2 * kv_heads) * D / 4 + 255) / 256),
                  static_cast<unsigned int>(std::min<int64_t>(n, 65535)));
  const bool vec = reinterpret_cast<uintptr_t>(dqkv) % 8 == 0 && reinterpret_cast<uintptr_t>(dq_acc) % 16 == 0;
  const int h = static_cast<int>(heads), kvh = static_cast<int>(kv_heads);
  if (vec)
    write_dqkv_kernel<D, true><<<grid, 256, 0, stream>>>(dqkv, dq_acc, dkv_acc, n, h, kvh, wgmma);
  else
    write_dqkv_kernel<D, false><<<grid, 256, 0, stream>>>(dqkv, dq_acc, dkv_acc, n, h, kvh, wgmma);
  return cudaGetLastError();
}

// The flash kernels (wgmma where the whole-row path would use them, else mma.sync) over a share's
// queries and its gathered row: dQ per query as the whole-row path, dK and dV per row position,
// then written out as flash_attention_backward_gathered says.
template <int D>
cudaError_t backward_gathered_impl(bf16* dqkv, bf16* dkv, float* scratch, const bf16* dout, const bf16* out,
                                   const float* lse, const FlashRows& rows, const int32_t* doc_start, int64_t heads,
                                   int64_t kv_heads, cudaStream_t stream, const FlashOptions& options) {
  const bool wgmma = options.allow_wgmma && flash_wgmma_available(D);
  const int64_t n = rows.n_q, n_kv = rows.n_kv;
  float* dq_acc = scratch;
  float* dk_acc = dq_acc + wgmma_dq_rows(n) * heads * D;
  float* dv_acc = dk_acc + n_kv * kv_heads * D;
  float* delta = dv_acc + n_kv * kv_heads * D;
  // As the whole-row path: the wgmma layout's padded dQ tiles cleared here, mma.sync's dQ by delta.
  float* clear_from = wgmma ? dq_acc : dk_acc;
  cudaError_t e = cudaMemsetAsync(clear_from, 0, sizeof(float) * (delta - clear_from), stream);
  if (e != cudaSuccess) return e;
  delta_kernel<<<static_cast<unsigned int>((n * heads + kWarps - 1) / kWarps), kThreads, 0, stream>>>(
      delta, wgmma ? nullptr : dq_acc, dout, out, n, heads, D);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  if (wgmma)
    e = flash_backward_wgmma(dk_acc, dv_acc, dq_acc, query_ranges(delta, n * heads), delta, dout, lse, rows, true,
                             doc_start, heads, kv_heads, options.backward_head_chunk, options.dq_vector_atomics,
                             stream);
  else
    e = backward_launch<D, true>(dk_acc, dv_acc, dq_acc, delta, dout, lse, rows, doc_start, heads, kv_heads, stream,
                                 options.shared_limit);
  if (e != cudaSuccess) return e;
  write_gathered_grads_kernel<<<grid_for(std::max(n * (heads + 2 * kv_heads), n_kv * 2 * kv_heads) * D, 256), 256, 0,
                                stream>>>(dqkv, dkv, dq_acc, dk_acc, dv_acc, rows.kv_row, n, n_kv, heads * D,
                                          kv_heads * D, D, wgmma);
  return cudaGetLastError();
}

}  // namespace

bool flash_attention_supports(int64_t head_dim) { return head_dim == 32 || head_dim == 64 || head_dim == 128; }

namespace {

template <int D>
using HeadDim = std::integral_constant<int, D>;

// launch(HeadDim<D>{}) for the head sizes the flash kernels are built for
// (flash_attention_supports); cudaErrorInvalidValue for any other.
template <typename Launch>
cudaError_t with_head_dim(int64_t head_dim, Launch&& launch) {
  switch (head_dim) {
    case 32:
      return launch(HeadDim<32>{});
    case 64:
      return launch(HeadDim<64>{});
    case 128:
      return launch(HeadDim<128>{});
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

size_t flash_attention_shared_bytes(int64_t head_dim) {
  size_t need = 0;
  const cudaError_t e = with_head_dim(head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    need = std::max(forward_smem_bytes<D, 64>(), backward_smem_bytes<D, true>(std::end(kBackwardVariants)[-1]));
    return cudaSuccess;
  });
  return e == cudaSuccess ? need : 0;
}

std::string flash_backward_variant(int64_t head_dim, bool gathered, size_t shared_limit) {
  BackwardTiles t{0, 0};
  with_head_dim(head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    t = gathered ? backward_tiles<D, true>(shared_limit) : backward_tiles<D, false>(shared_limit);
    return cudaSuccess;
  });
  if (t.keys == 0) return {};
  return std::to_string(t.keys) + " keys, " + std::to_string(t.stages) + (t.stages == 1 ? " stage" : " stages");
}

cudaError_t flash_attention_forward(bf16* out, float* lse, const bf16* qkv, const int32_t* doc_start, int64_t n,
                                    int64_t heads, int64_t kv_heads, int64_t head_dim, cudaStream_t stream,
                                    const FlashOptions& options) {
  if (n == 0) return cudaSuccess;
  if (heads % kv_heads != 0) return cudaErrorInvalidValue;
  return with_head_dim(head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    return forward_impl<D>(out, lse, qkv, doc_start, n, heads, kv_heads, stream, options);
  });
}

cudaError_t flash_attention_backward(bf16* dqkv, float* scratch, const bf16* dout, const bf16* out, const float* lse,
                                     const bf16* qkv, const int32_t* doc_start, int64_t n, int64_t heads,
                                     int64_t kv_heads, int64_t head_dim, cudaStream_t stream,
                                     const FlashOptions& options) {
  if (n == 0) return cudaSuccess;
  if (heads % kv_heads != 0) return cudaErrorInvalidValue;
  return with_head_dim(head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    return backward_impl<D>(dqkv, scratch, dout, out, lse, qkv, doc_start, n, heads, kv_heads, stream, options);
  });
}

cudaError_t flash_attention_forward_gathered(bf16* out, float* lse, const bf16* qkv, const bf16* kv,
                                             const int32_t* kv_row, const int32_t* position,
                                             const int32_t* doc_start, int64_t n, int64_t n_kv, int64_t heads,
                                             int64_t kv_heads, int64_t head_dim, cudaStream_t stream,
                                             const FlashOptions& options) {
  if (n == 0) return cudaSuccess;
  if (heads % kv_heads != 0 || n_kv <= 0) return cudaErrorInvalidValue;
  const FlashRows rows = gathered_rows(qkv, kv, kv_row, position, n, n_kv, heads, kv_heads, head_dim);
  return with_head_dim(head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    if (options.allow_wgmma && flash_wgmma_available(D))
      return flash_forward_wgmma(out, lse, rows, true, doc_start, heads, kv_heads, stream);
    return forward_launch<D, 64, true>(out, lse, rows, doc_start, heads, kv_heads, stream);
  });
}

cudaError_t flash_attention_backward_gathered(bf16* dqkv, bf16* dkv, float* scratch, const bf16* dout,
                                              const bf16* out, const float* lse, const bf16* qkv, const bf16* kv,
                                              const int32_t* kv_row, const int32_t* position,
                                              const int32_t* doc_start, int64_t n, int64_t n_kv, int64_t heads,
                                              int64_t kv_heads, int64_t head_dim, cudaStream_t stream,
                                              const FlashOptions& options) {
  if (n == 0) return cudaSuccess;
  if (heads % kv_heads != 0 || n_kv <= 0) return cudaErrorInvalidValue;
  const FlashRows rows = gathered_rows(qkv, kv, kv_row, position, n, n_kv, heads, kv_heads, head_dim);
  return with_head_dim(head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    return backward_gathered_impl<D>(dqkv, dkv, scratch, dout, out, lse, rows, doc_start, heads, kv_heads, stream,
                                     options);
  });
}

}  // namespace glm::cuda
