// Flash attention for head_dim 128 on Hopper's warpgroup MMAs (wgmma.mma_async, sm_90a). Every
// tile lives in shared memory in the 128-byte-swizzled layout that wgmma reads through matrix
// descriptors (64-column blocks of 128-byte rows, 16-byte unit u of row r stored at u ^ (r % 8)),
// brought in by cp.async one tile ahead; accumulator registers are already the A operand of the
// next product.
//
// Forward: one block per (128 queries, head) of three warpgroups, one loading and two computing
// (FlashAttention-3's warp specialization, with cp.async and mbarriers); S = Q K^T of the next key
// tile is issued before O += P V of this one, so that its softmax runs while P V is on the tensor
// cores, and the computing warpgroups take turns, one's softmax beside the other's products.
//
// Backward: one block of two warpgroups per (128 keys, query head) walks the 64-query tiles that
// can see its keys, the next tile loading (three stages) while one is computed. Warpgroup w owns
// keys 64 w.. of the block:
//   S^T = K Q^T and dP^T = V dO^T    (64 x 64 each, both operands from shared memory),
//   P^T and dS^T computed in the accumulator registers, the A operands of
//   dV += P^T dO and dK += dS^T Q   (64 x 128 each, A from registers, dK/dV stay in registers),
//   dS^T also to shared memory for dQ = dS K (warpgroup w: dims 64 w.., all 128 keys), whose fp32
//   64 x 64 tile goes straight from the accumulator registers to the dQ accumulators, laid out in
//   register order (wgmma_dq_index): one 16-byte vector atomic per thread and 4 floats, a warp's
//   512 contiguous bytes. Those atomics go out after the next tile's copies are fenced for wgmma:
//   a proxy fence waits for the thread's outstanding memory operations, so right after the atomics
//   it would wait for their round trip to L2. Atomics straight from the registers need no staging
//   copy in shared memory, no warpgroup barrier and no bulk reduction.
// dK += dS^T Q of a tile is still running when the next tile starts: its first wait (for S^T)
// covers it, so the tensor cores stay busy across the block barrier between tiles.
// The masks, statistics and accumulators are the same as the mma.sync kernels' in
// flash_attention.cu, which the other head sizes and GPUs keep using.
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/flash_attention_sm90.cuh"
#include "kernels/cuda/tensor_core.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GLM_FLASH_WGMMA 1
#endif

namespace glm::cuda {
namespace {

constexpr int kD = 128;
constexpr int kKeys = 128;     // keys per block, 64 per warpgroup
constexpr int kRows = 64;      // queries per step
constexpr int kThreads = 256;  // two warpgroups
constexpr int tile_bytes(int rows) { return rows * kD * 2; }
static_assert(kRows == kWgmmaDqTile && kD == 128, "wgmma_dq_index's layout: 64-query tiles, two 64-dim halves");
constexpr int kStages = 3;  // query tiles (Q, dO, statistics) in shared memory
// Backward: K, V, three stages of Q and dO, dS^T, three stages of the row statistics (lse, delta,
// document start; the row position when Gathered), alignment slack.
template <bool Gathered>
constexpr size_t backward_smem_bytes() {
  return 2 * tile_bytes(kKeys) + 2 * kStages * tile_bytes(kRows) + kKeys * kRows * 2 +
         kStages * kRows * (2 * sizeof(float) + (Gathered ? 2 : 1) * sizeof(int32_t)) + 1024;
}

#ifdef GLM_FLASH_WGMMA
constexpr int kDqBlock = kRows * 64;  // floats of one warpgroup's dQ tile (16 KB)
constexpr int kRowBytes = 128;           // one swizzle row: 64 bf16
constexpr int kUnit16 = 16 * kRowBytes;  // 16 rows: one k16 step along a [k][mn] tile

// Byte offset of element (r, c) in a [rows][cols] bf16 tile stored as 64-column blocks of
// [rows][64] with the 128-byte swizzle; tiles start 1024-byte aligned.
__device__ __forceinline__ uint32_t swizzled(int rows, int r, int c) {
  return (c >> 6) * rows * kRowBytes + r * kRowBytes + ((((c >> 3) & 7) ^ (r & 7)) << 4) + (c & 7) * 2;
}

// Rows x kD bf16 rows of a strided global matrix into a swizzled tile; rows from `valid` on become
// zeros. Copied by Threads threads, this one being thread `tid` of them: thread t copies 16-byte
// unit t % 16 of rows t / 16 + (Threads / 16) k, the same swizzle phase in every pass, so one
// address pair is computed and then stepped.
template <int Rows, int Threads = kThreads>
__device__ __forceinline__ void async_tile(unsigned char* dst, const bf16* src, int64_t stride, int valid,
                                           int tid = static_cast<int>(threadIdx.x)) {
  constexpr int units = kD / 8, rows_per_pass = Threads / units;
  static_assert(Rows % rows_per_pass == 0 && rows_per_pass % 8 == 0);
  const int r0 = tid / units, c = (tid % units) * 8;
  unsigned char* d = dst + swizzled(Rows, r0, c);
  const bf16* s = src + r0 * stride + c;
#pragma unroll
  for (int k = 0; k < Rows / rows_per_pass; ++k) {
    const bool ok = r0 + k * rows_per_pass < valid;
    cp_async16(d + k * rows_per_pass * kRowBytes, ok ? s + k * rows_per_pass * stride : src, ok);
  }
}

// Rows x kD key (or value) rows of row positions k0.. into a swizzled tile, as async_tile; base is
// the row of position 0's head (rows.k or rows.v plus the KV group's columns). Gathered (and
// rows.kv_row not null): position k0 + r is at row tile_rows[r], rows.kv_row[k0 + r] or the same
// copied to shared memory; one_run (the same in every thread) says that those rows are
// tile_rows[0], tile_rows[0] + 1, ..., so that the tile is copied without a row index per copy.
template <int Rows, bool Gathered, int Threads = kThreads>
__device__ __forceinline__ void async_key_tile(unsigned char* dst, const FlashRows& rows, const bf16* base, int64_t k0,
                                               int valid, int tid = static_cast<int>(threadIdx.x),
                                               const int32_t* tile_rows = nullptr, bool one_run = false) {
  if (!Gathered || rows.kv_row == nullptr) {
    async_tile<Rows, Threads>(dst, base + k0 * rows.kv_stride, rows.kv_stride, valid, tid);
  } else if (one_run) {
    async_tile<Rows, Threads>(dst, base + static_cast<int64_t>(tile_rows[0]) * rows.kv_stride, rows.kv_stride, valid,
                              tid);
  } else {
    if (tile_rows == nullptr) tile_rows = rows.kv_row + k0;
    constexpr int units = kD / 8, rows_per_pass = Threads / units;
    const int r0 = tid / units, c = (tid % units) * 8;
    unsigned char* d = dst + swizzled(Rows, r0, c);
#pragma unroll
    for (int k = 0; k < Rows / rows_per_pass; ++k) {
      const int r = r0 + k * rows_per_pass;
      const bool ok = r < valid;
      const bf16* src = ok ? base + static_cast<int64_t>(tile_rows[r]) * rows.kv_stride + c : base;
      cp_async16(d + k * rows_per_pass * kRowBytes, src, ok);
    }
  }
}

// Shared-memory matrix descriptor for the 128-byte swizzle from `lo`, a tile's shared-memory
// address / 16 (the start-address field), and the leading byte offset (MN-major operands: the
// distance between 64-element column blocks; unused K-major); the high word is constant (stride
// byte offset 1024 between groups of 8 rows, the swizzle mode). Kernels keep their allocation's
// base address / 16 and add tile offsets / 16 to it, so that a descriptor costs one add. A k16
// step adds 32 bytes to the start K-major (inside the swizzle row) and kUnit16 MN-major.
__device__ __forceinline__ uint64_t descriptor(uint32_t lo, uint32_t lbo) {
  return (static_cast<uint64_t>((1024 >> 4) | (1u << 30)) << 32) | (lo + ((lbo >> 4) << 16));
}
constexpr uint32_t lo16(uint32_t bytes) { return bytes >> 4; }  // a byte offset in descriptor units

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed groups are still running.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Shared-memory writes of this thread (st.shared, cp.async) made visible to wgmma's async proxy.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Shared-memory barriers (mbarrier) between the forward's loading and computing warpgroups: a
// phase completes when `count` arrivals have come; a waiter names the parity of the phase it waits
// for (the i-th completion of a barrier has parity i % 2).
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile(
      "{\n"
      ".reg .b64 state;\n"
      "mbarrier.arrive.shared::cta.b64 state, [%0];\n"
      "}\n" ::"r"(smem_addr(bar))
      : "memory");
}
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
// Named barrier `id` (1..15; 0 is __syncthreads') of `threads` threads: sync waits for them all,
// arrive counts this thread without waiting.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// named_sync that also tells whether `mine` holds in every one of the threads.
__device__ __forceinline__ bool named_all(int id, int threads, bool mine) {
  int all;
  asm volatile(
      "{\n"
      ".reg .pred in, out;\n"
      "setp.ne.b32 in, %1, 0;\n"
      "bar.red.and.pred out, %2, %3, in;\n"
      "selp.b32 %0, 1, 0, out;\n"
      "}\n"
      : "=r"(all)
      : "r"(static_cast<int>(mine)), "r"(id), "r"(threads)
      : "memory");
  return all != 0;
}
// Registers that an in-flight wgmma reads or writes: the compiler may not touch or move them here.
template <int N>
__device__ __forceinline__ void pin(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void pin(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

// D (64 x 64, fp32) = A B + (scale_d ? D : 0) with A and B read from shared memory through descriptors; TA / TB pick
// MN-major (1) or K-major (0) operands.
template <int TA, int TB>
__device__ __forceinline__ void wgmma_ss(float (&d)[32], uint64_t a, uint64_t b, int scale_d) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %35, %36;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(scale_d), "n"(TA), "n"(TB));
}

// The 64 accumulator operands of an m64n128 wgmma, in order (asm output list).
#define GLM_WGMMA_D64(d)                                                                                      \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),  \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), \
      "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), \
      "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
      "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// D (64 x 128, fp32) = A B + (scale_d ? D : 0) with A (64 x 16 bf16) in registers, laid out as mma.sync's A fragment
// per warp, and B read from shared memory (TB as above).
template <int TB>
__device__ __forceinline__ void wgmma_rs_m64n128(float (&d)[64], const uint32_t (&a)[4], uint64_t b, int scale_d) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
      "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, "
      "%67}, %68, p, 1, 1, %70;\n"
      "}\n"
      : GLM_WGMMA_D64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d), "n"(TB));
}

// D (64 x 128, fp32) = A B + (scale_d ? D : 0) with A and B read from shared memory through descriptors; TA / TB pick
// MN-major (1) or K-major (0) operands.
template <int TA, int TB>
__device__ __forceinline__ void wgmma_ss(float (&d)[64], uint64_t a, uint64_t b, int scale_d) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
      "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, "
      "%67, %68;\n"
      "}\n"
      : GLM_WGMMA_D64(d)
      : "l"(a), "l"(b), "r"(scale_d), "n"(TA), "n"(TB));
}

// Scores-like products over the 128 dims, both operands K-major: D (64 x N) = A B^T with A 64 rows
// of an [ARows][kD] tile starting at descriptor address a_lo, and B a whole [N][kD] tile at b_lo;
// one commit group.
template <int N, int ARows>
__device__ __forceinline__ void gemm_nt_dims(float (&d)[N / 2], uint32_t a_lo, uint32_t b_lo) {
#pragma unroll
  for (int kt = 0; kt < kD / 16; ++kt) {
    const uint32_t off = (kt & 3) * 32, kblk = kt >> 2;  // 64-column block kblk, 16 columns at off bytes
    wgmma_ss<0, 0>(d, descriptor(a_lo + lo16(kblk * ARows * kRowBytes + off), 16),
                   descriptor(b_lo + lo16(kblk * N * kRowBytes + off), 16), kt > 0);
  }
  wgmma_commit();
}

#endif  // GLM_FLASH_WGMMA

// QuadDq: dQ by 16-byte vector atomics (4 floats per thread and instruction), else paired ones.
// Gathered: a context-parallel share's queries against its gathered row (FlashRows); dK and dV are
// accumulated per row position, dQ per query of the share.
template <bool QuadDq, bool Gathered>
__global__ void __launch_bounds__(kThreads, 1)
    flash_backward_wgmma_kernel(float* dk_acc, float* dv_acc, float* dq_acc, const int2* query_ranges,
                                const float* delta, const bf16* dout, const float* lse, FlashRows rows,
                                const int32_t* doc_start, int64_t heads, int64_t kv_heads, float scale,
                                int head_chunk) {
#ifdef GLM_FLASH_WGMMA
  extern __shared__ unsigned char smem_raw[];
  unsigned char* Ks = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  unsigned char* Vs = Ks + tile_bytes(kKeys);
  unsigned char* Qbuf = Vs + tile_bytes(kKeys);                                // [kStages] x [kRows][kD]
  unsigned char* dObuf = Qbuf + kStages * tile_bytes(kRows);                   // [kStages] x [kRows][kD]
  unsigned char* dSt = dObuf + kStages * tile_bytes(kRows);                    // dS^T [kKeys][kRows]
  float* lse_buf = reinterpret_cast<float*>(dSt + kKeys * kRows * 2);          // [kStages][kRows]
  float* delta_buf = lse_buf + kStages * kRows;                                // [kStages][kRows]
  int32_t* doc_buf = reinterpret_cast<int32_t*>(delta_buf + kStages * kRows);  // [kStages][kRows]
  int32_t* at_buf = doc_buf + kStages * kRows;  // [kStages][kRows] row positions when Gathered

  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int grp = lane >> 2, quad = lane & 3;
  const int key_row = wg * 64 + warp * 16 + grp;  // this thread's key rows in the block: key_row, key_row + 8
  const int wg_thread = threadIdx.x & 127;
  // Blocks in order: heads in chunks of head_chunk, in each chunk the first key tiles (the most
  // query tiles) first, a chunk's heads side by side. Only the chunk's heads' dQ accumulators are
  // then being added to, a working set that stays in L2 (4 MiB per head at seq 8192).
  const int64_t n = rows.n_q, key_tiles = (rows.n_kv + kKeys - 1) / kKeys, chunk_blocks = head_chunk * key_tiles;
  const int64_t chunk = blockIdx.x / chunk_blocks, in_chunk = blockIdx.x % chunk_blocks;
  const int64_t chunk_heads = min(static_cast<int64_t>(head_chunk), heads - chunk * head_chunk);
  const int64_t h = chunk * head_chunk + in_chunk % chunk_heads, k0 = in_chunk / chunk_heads * kKeys;
  const int64_t dq_tiles = wgmma_dq_rows(n) / kRows;
  // Descriptor addresses (shared address / 16) of the tiles; Q and dO add the stage's offset.
  const uint32_t k_lo = smem_addr(Ks) >> 4, v_lo = k_lo + lo16(tile_bytes(kKeys));
  const uint32_t q_lo0 = v_lo + lo16(tile_bytes(kKeys)), do_lo0 = q_lo0 + lo16(kStages * tile_bytes(kRows));
  const uint32_t dst_lo = do_lo0 + lo16(kStages * tile_bytes(kRows));
  // This thread's dS^T elements (key rows key_row and key_row + 8, query columns 8 j + 2 quad ..):
  // swizzled byte offsets ds_row + ((j ^ key_row % 8) << 4) and 1024 more.
  const uint32_t ds_row = key_row * kRowBytes + quad * 4, ds_swz = (key_row & 7) << 4;
  const int64_t g = h / (heads / kv_heads);
  const int k_valid = static_cast<int>(min(static_cast<int64_t>(kKeys), rows.n_kv - k0));
  const int2 range = query_ranges[k0 / kKeys];
  int q_begin = range.x;  // query indices fit int32 (launch_backward checks)
  const int q_end = range.y;
  if (q_begin >= q_end) return;  // the whole block: no query of this call sees these keys
  // From a whole dQ tile (a share's first queries here may start inside one): the queries before
  // q_begin sit before every key of the block, so their P and dS are masked to zeros.
  q_begin = q_begin / kRows * kRows;
  const float scale_log2 = scale * kLog2e;
  // The block's query tiles, walked from q0 on and around. Gathered, the blocks of a share's middle
  // chunks all see the same queries (those of its last chunk): started at the same tile, they would
  // add to the same dQ tiles at the same moments, so each starts two tiles after the block of the
  // keys before it, as whole-row blocks do by their causal starts.
  const int q_tiles = (q_end - q_begin + kRows - 1) / kRows;
  int q0 = q_begin + (Gathered ? static_cast<int>(k0 / kKeys * 2 % q_tiles) * kRows : 0);
  auto after = [&](int q) { return q + kRows < q_end ? q + kRows : q_begin; };

  // Q, dO and the row statistics of the query tile at q0 into stage s, as one commit group.
  auto load_queries = [&](int s, int64_t q0) {
    const int valid = static_cast<int>(min(static_cast<int64_t>(kRows), q_end - q0));
    async_tile<kRows>(Qbuf + s * tile_bytes(kRows), rows.q + q0 * rows.q_stride + h * kD, rows.q_stride, valid);
    async_tile<kRows>(dObuf + s * tile_bytes(kRows), dout + q0 * heads * kD + h * kD, heads * kD, valid);
    for (int r = threadIdx.x; r < kRows; r += kThreads) {
      const bool in = r < valid;
      const int64_t t = in ? q0 + r : 0;
      cp_async4(lse_buf + s * kRows + r, lse + t * heads + h, in);
      cp_async4(delta_buf + s * kRows + r, delta + t * heads + h, in);
      cp_async4(doc_buf + s * kRows + r, doc_start + t, in);
      if constexpr (Gathered) cp_async4(at_buf + s * kRows + r, rows.pos + t, in);
    }
    cp_async_commit();
  };
  async_key_tile<kKeys, Gathered>(Ks, rows, rows.k + g * kD, k0, k_valid);
  async_key_tile<kKeys, Gathered>(Vs, rows, rows.v + g * kD, k0, k_valid);
  load_queries(0, q0);

  float dk[64], dv[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) dk[i] = dv[i] = 0.0f;
  uint32_t sa[4][4] = {};  // dS^T, the A operand of dK: kept until the next tile's first wait

  // This tile's dQ into its accumulator block, from the registers.
  auto add_dq = [&](float* block, const float(&dq)[32]) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float* at = block + (j * 128 + wg_thread) * 4;
      if constexpr (QuadDq) {
        add4(at, dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
      } else {
        add2(at, dq[4 * j], dq[4 * j + 1]);
        add2(at + 2, dq[4 * j + 2], dq[4 * j + 3]);
      }
    }
  };
  // K, V and the first query tile landed and made visible to wgmma (each later tile at the end of
  // the one before it, before that tile's dQ atomics: see the top of the file).
  cp_async_wait_all();
  fence_async_shared();
  int stage = 0;
  for (int left = q_tiles; left > 0; --left, q0 = after(q0), stage = stage == kStages - 1 ? 0 : stage + 1) {
    const int q_valid = min(kRows, q_end - q0);
    const float* q_lse = lse_buf + stage * kRows;
    const float* q_delta = delta_buf + stage * kRows;
    const int32_t* q_doc = doc_buf + stage * kRows;
    const int32_t* q_at = at_buf + stage * kRows;
    // This tile in shared memory (every thread's copies fenced); every wgmma but the previous tile's
    // dK has completed, so the stage loaded next (two tiles ago) and dS^T are free.
    __syncthreads();
    if (left > 1) load_queries(stage == kStages - 1 ? 0 : stage + 1, after(q0));
    const int64_t first_at = Gathered ? q_at[0] : q0;
    const bool masked = first_at < k0 + kKeys || q_valid < kRows || k_valid < kKeys || q_doc[q_valid - 1] > k0;

    // S^T = K Q^T and dP^T = V dO^T for this warpgroup's 64 keys x the 64 queries (k = 128 dims).
    float st[32], dpt[32];  // no initial values: the first k step does not read them (scale_d 0)
    wgmma_fence();
    const uint32_t q_lo = q_lo0 + stage * lo16(tile_bytes(kRows)), do_lo = do_lo0 + stage * lo16(tile_bytes(kRows));
    gemm_nt_dims<kRows, kKeys>(st, k_lo + wg * lo16(64 * kRowBytes), q_lo);
    gemm_nt_dims<kRows, kKeys>(dpt, v_lo + wg * lo16(64 * kRowBytes), do_lo);

    // P^T while dP^T is still computing; dV += P^T dO issued as soon as P^T exists, dS^T computed
    // while it runs. Accumulator element 4 j + e is key key_row + 8 (e >> 1), query 8 j + 2 quad +
    // (e & 1); packed to bf16, P^T and dS^T are the A operands (16 keys x 16 queries per warp and
    // k16 step) of dV and dK. dO and Q are read MN-major: 128 dims = two column blocks a tile apart.
    wgmma_wait<1>();  // the previous tile's dK and this S^T done
    pin(st);
    pin(dk);
    pin(sa);
    uint32_t pa[4][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 lse2 = *reinterpret_cast<const float2*>(q_lse + j * 8 + quad * 2);
      const float neg_lse[2] = {-lse2.x * kLog2e, -lse2.y * kLog2e};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qc = j * 8 + quad * 2 + (e & 1), kr = key_row + (e >> 1) * 8;
        float pv = fast_exp2(fmaf(st[4 * j + e], scale_log2, neg_lse[e & 1]));
        if (masked) {
          const int64_t key = k0 + kr, q = Gathered ? q_at[qc] : q0 + qc;
          if (!(qc < q_valid && kr < k_valid && key <= q && key >= q_doc[qc])) pv = 0.0f;
        }
        st[4 * j + e] = pv;
      }
      pa[j >> 1][(j & 1) * 2] = pack_bf16(st[4 * j], st[4 * j + 1]);
      pa[j >> 1][(j & 1) * 2 + 1] = pack_bf16(st[4 * j + 2], st[4 * j + 3]);
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kRows / 16; ++kk)
      wgmma_rs_m64n128<1>(dv, pa[kk], descriptor(do_lo + kk * lo16(kUnit16), kRows * kRowBytes), 1);
    wgmma_commit();
    wgmma_wait<1>();  // dP^T done; dV may still run
    pin(dpt);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 delta2 = *reinterpret_cast<const float2*>(q_delta + j * 8 + quad * 2);
      const float dl[2] = {delta2.x, delta2.y};
      float ds[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) ds[e] = st[4 * j + e] * (dpt[4 * j + e] - dl[e & 1]) * scale;
      sa[j >> 1][(j & 1) * 2] = pack_bf16(ds[0], ds[1]);
      sa[j >> 1][(j & 1) * 2 + 1] = pack_bf16(ds[2], ds[3]);
      unsigned char* at = dSt + ds_row + ((j << 4) ^ ds_swz);  // = swizzled(kKeys, key_row, 8 j + 2 quad)
      *reinterpret_cast<uint32_t*>(at) = sa[j >> 1][(j & 1) * 2];
      *reinterpret_cast<uint32_t*>(at + 8 * kRowBytes) = sa[j >> 1][(j & 1) * 2 + 1];
    }
    fence_async_shared();
    __syncthreads();  // dS^T of both warpgroups in shared memory

    // dQ = dS K for the 64 queries x this warpgroup's 64 dims (k = the 128 keys; dS^T and K read
    // MN-major), committed before dK += dS^T Q so that its accumulation overlaps dK.
    float dq[32];  // first k step: scale_d 0
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk)
      wgmma_ss<1, 1>(dq, descriptor(dst_lo + kk * lo16(kUnit16), kKeys * kRowBytes),
                     descriptor(k_lo + wg * lo16(kKeys * kRowBytes) + kk * lo16(kUnit16), kKeys * kRowBytes), kk > 0);
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < kRows / 16; ++kk)
      wgmma_rs_m64n128<1>(dk, sa[kk], descriptor(q_lo + kk * lo16(kUnit16), kRows * kRowBytes), 1);
    wgmma_commit();
    wgmma_wait<1>();  // dV and dQ done; dK may still run (into the next tile)
    pin(dq);
    pin(dv);
    pin(pa);
    cp_async_wait_all();  // the next tile (see the top of the file)
    fence_async_shared();
    // Rows past q_valid hold zeros (their P and dS are masked), so whole tiles are added.
    add_dq(dq_acc + ((h * dq_tiles + q0 / kRows) * 2 + wg) * kDqBlock, dq);
  }
  wgmma_wait<0>();  // the last dK
  pin(dk);
  pin(sa);
  // This head's dK and dV into the KV group's fp32 accumulators (by row position).
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int key = key_row + hf * 8;
    if (key >= k_valid) continue;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      const int64_t at = ((k0 + key) * kv_heads + g) * kD + j * 8 + quad * 2;
      add2(dk_acc + at, dk[4 * j + 2 * hf], dk[4 * j + 2 * hf + 1]);
      add2(dv_acc + at, dv[4 * j + 2 * hf], dv[4 * j + 2 * hf + 1]);
    }
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // device code without sm_90a features: fail loudly rather than return nothing
#endif
}

// Forward: one block per (128 queries, head), warp-specialized: warpgroup 0 loads, warpgroups 1 and
// 2 compute, queries 64 (w - 1).. each. The loaders copy Q once and the key and value tiles of 128
// rows (two buffers each) by cp.async; each loading thread waits for its own copies, fences them
// for wgmma and arrives on the tile's "full" barrier, and the computing warps arrive on its "empty"
// barrier once the wgmma reading it has completed. The loads thus run beside the products with no
// block-wide barrier. Gathered, the loaders copy each key tile's row indices into a ring two tiles
// ahead of the loads that use them, and copy a tile whose rows are one run of consecutive rows (a
// share's chunks are) as a whole-row one is; a loaders' barrier makes the indices visible to all.
// A computing warpgroup's S = Q K^T (both from shared memory) lands in registers, the online softmax
// runs there, and P (bf16, the accumulator layout is the A operand's) multiplies V from shared
// memory into the output accumulators; S of the next tile is issued before O += P V of this one, so
// that its softmax runs while P V is on the tensor cores. The two warpgroups take turns issuing
// their products (named barriers), so that one's softmax runs while the other's products do.
// Gathered: a context-parallel share's queries against its gathered row (FlashRows).
constexpr int kFwdRows = 128, kFwdKeys = 128;
constexpr int kLoaders = 128;                             // warpgroup 0
constexpr int kFwdThreads = kLoaders + 2 * 128;           // two computing warpgroups
// setmaxnreg moves registers between the warpgroups within what the block was given at launch
// (168 a thread: 65,536 over 384 threads, in steps of 8); asking for more would wait forever.
constexpr int kLoaderRegisters = 56, kComputeRegisters = 224;
static_assert(kLoaders * kLoaderRegisters + 2 * 128 * kComputeRegisters <= kFwdThreads * (65536 / kFwdThreads / 8 * 8));
struct ForwardBarriers {
  uint64_t q_full, k_full[2], v_full[2], k_empty[2], v_empty[2];
};
constexpr int kIndexRing = 4;  // Gathered: tiles of row indices in shared memory
constexpr size_t forward_smem_bytes() {
  return tile_bytes(kFwdRows) + 4 * tile_bytes(kFwdKeys) + sizeof(ForwardBarriers) +
         kIndexRing * kFwdKeys * sizeof(int32_t) + 1024;
}

template <bool Gathered>
__global__ void __launch_bounds__(kFwdThreads, 1)
    flash_forward_wgmma_kernel(bf16* out, float* lse, FlashRows rows, const int32_t* doc_start, int64_t heads,
                               int64_t kv_heads, float scale_log2) {
#ifdef GLM_FLASH_WGMMA
  extern __shared__ unsigned char smem_raw[];
  unsigned char* Qs = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  unsigned char* Kbuf = Qs + tile_bytes(kFwdRows);        // [2] x [kFwdKeys][kD]
  unsigned char* Vbuf = Kbuf + 2 * tile_bytes(kFwdKeys);  // [2] x [kFwdKeys][kD]
  auto* bars = reinterpret_cast<ForwardBarriers*>(Vbuf + 2 * tile_bytes(kFwdKeys));
  constexpr int kComputeWarps = 8;
  constexpr int kTurnBarrier = 1;  // named barriers kTurnBarrier + w - 1: computing warpgroup w's turn to issue
  const int wg = threadIdx.x >> 7;
  const int64_t h = blockIdx.x;
  const int64_t q0 = static_cast<int64_t>(gridDim.y - 1 - blockIdx.y) * kFwdRows;  // heavy tiles first
  const int64_t n = rows.n_q, g = h / (heads / kv_heads);
  const int q_valid = static_cast<int>(min(static_cast<int64_t>(kFwdRows), n - q0));
  // Keys from the first row's document start (tile-aligned) to the last row's position; tiles that
  // end before the first row's position and start at or after the block's latest document start
  // need no mask.
  const int first_at = query_position<Gathered>(rows, q0);
  const int k_first = doc_start[q0] / kFwdKeys * kFwdKeys;
  const int k_end = query_position<Gathered>(rows, q0 + q_valid - 1) + 1;
  const int doc_max = doc_start[q0 + q_valid - 1];
  const int tiles = (k_end - k_first + kFwdKeys - 1) / kFwdKeys;
  if (threadIdx.x == 0) {
    mbarrier_init(&bars->q_full, kLoaders);
    for (int s = 0; s < 2; ++s) {
      mbarrier_init(&bars->k_full[s], kLoaders);
      mbarrier_init(&bars->v_full[s], kLoaders);
      mbarrier_init(&bars->k_empty[s], kComputeWarps);
      mbarrier_init(&bars->v_empty[s], kComputeWarps);
    }
  }
  __syncthreads();  // the only block-wide barrier

  if (wg == 0) {
    // Loaders: the i-th use of a buffer (tile 2 i + b) waits for the i-th completion of its empty
    // barrier before overwriting it. This thread's copies of a tile landed (cp.async.wait_group),
    // fenced for wgmma, then its arrival: the full barrier completes when every loader's has come.
    // Tile t's row indices travel with the copies of K(t - 1) (tile 0's with Q).
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kLoaderRegisters));
    const int tid = static_cast<int>(threadIdx.x);
    const bool indexed = Gathered && rows.kv_row != nullptr;
    auto* ring = reinterpret_cast<int32_t*>(bars + 1);  // [kIndexRing][kFwdKeys]
    auto fetch_indices = [&](int t) {
      if (!indexed || t >= tiles) return;
      const int k0 = k_first + t * kFwdKeys;
      const bool in = k0 + tid < k_end;
      cp_async4(ring + (t % kIndexRing) * kFwdKeys + tid, rows.kv_row + (in ? k0 + tid : 0), in);
    };
    // Tile t's indices landed in this thread (its group waited for): the loaders' barrier makes them
    // visible to every loader, a second one says whether they are one run.
    auto one_run = [&](int t) {
      if (!indexed || t >= tiles) return false;
      constexpr int kLoaderBarrier = 3;
      named_sync(kLoaderBarrier, kLoaders);
      const int32_t* slot = ring + (t % kIndexRing) * kFwdKeys;
      return named_all(kLoaderBarrier, kLoaders, k_first + t * kFwdKeys + tid >= k_end || slot[tid] == slot[0] + tid);
    };
    auto load = [&](unsigned char* buf, const bf16* base, int t, bool run) {
      const int k0 = k_first + t * kFwdKeys;
      async_key_tile<kFwdKeys, Gathered, kLoaders>(buf + (t & 1) * tile_bytes(kFwdKeys), rows, base, k0,
                                                   min(kFwdKeys, k_end - k0), tid, ring + (t % kIndexRing) * kFwdKeys,
                                                   run);
    };
    auto landed = [&](uint64_t* full) {
      fence_async_shared();
      mbarrier_arrive(full);
    };
    const bf16* k_base = rows.k + g * kD;
    const bf16* v_base = rows.v + g * kD;
    async_tile<kFwdRows, kLoaders>(Qs, rows.q + q0 * rows.q_stride + h * kD, rows.q_stride, q_valid, tid);
    fetch_indices(0);
    cp_async_commit();
    if (indexed) cp_async_wait<0>();
    bool run = one_run(0);  // whether tile t's rows are one run, for its K and then its V
    load(Kbuf, k_base, 0, run);
    fetch_indices(1);
    cp_async_commit();
    cp_async_wait<1>();
    landed(&bars->q_full);
    for (int t = 0; t < tiles; ++t) {  // in flight here: K(t) and the indices of t + 1
      if (t >= 2) mbarrier_wait(&bars->v_empty[t & 1], ((t >> 1) - 1) & 1);
      load(Vbuf, v_base, t, run);
      cp_async_commit();
      cp_async_wait<1>();
      landed(&bars->k_full[t & 1]);
      if (t + 1 < tiles) {
        run = one_run(t + 1);
        if (t + 1 >= 2) mbarrier_wait(&bars->k_empty[(t + 1) & 1], (((t + 1) >> 1) - 1) & 1);
        load(Kbuf, k_base, t + 1, run);
        fetch_indices(t + 2);
        cp_async_commit();
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      landed(&bars->v_full[t & 1]);
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kComputeRegisters));
  const int cw = wg - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int grp = lane >> 2, quad = lane & 3;
  const int row0 = cw * 64 + warp * 16 + grp;  // this thread's rows relative to q0: row0, row0 + 8
  // Turns: warpgroup cw issues after `my_turn` completes and then hands the turn to the other;
  // warpgroup 1 starts by handing it to warpgroup 0.
  const int my_turn = kTurnBarrier + cw, other_turn = kTurnBarrier + 1 - cw;
  if (cw == 1) named_arrive(other_turn, 256);
  // A buffer's wgmma have completed in this warp: one arrival of the warp on its empty barrier.
  auto release = [&](uint64_t* empty) {
    if (lane == 0) mbarrier_arrive(empty);
  };
  // This thread's rows' document starts and row positions (q0 + the row unless Gathered).
  int doc[2], at[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const bool in = row0 + hf * 8 < q_valid;
    doc[hf] = in ? doc_start[q0 + row0 + hf * 8] : INT_MAX;
    at[hf] = in ? query_position<Gathered>(rows, q0 + row0 + hf * 8) : -1;
  }
  // S = Q K^T for tile t: 64 queries x 128 keys (k = 128 dims, both K-major), one group.
  const uint32_t q_lo = smem_addr(Qs) >> 4, kbuf_lo = q_lo + lo16(tile_bytes(kFwdRows));
  const uint32_t vbuf_lo = kbuf_lo + lo16(2 * tile_bytes(kFwdKeys));
  auto issue_scores = [&](float(&sc)[64], int t) {
    gemm_nt_dims<kFwdKeys, kFwdRows>(sc, q_lo + cw * lo16(64 * kRowBytes),
                                     kbuf_lo + (t & 1) * lo16(tile_bytes(kFwdKeys)));
  };
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  // Masks and the online softmax of tile t in the log2 domain (p = 2^(s * scale * log2(e) - m)):
  // sc becomes P, corr the factor for the output rows. Accumulator element 4 j + e is row
  // row0 + 8 (e >> 1), key k0 + 8 j + 2 quad + (e & 1).
  auto softmax = [&](float(&sc)[64], int t, float(&corr)[2]) {
    const int k0 = k_first + t * kFwdKeys, k_valid = min(kFwdKeys, k_end - k0);
    if (k0 + kFwdKeys > first_at || k0 < doc_max) {
#pragma unroll
      for (int j = 0; j < kFwdKeys / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = j * 8 + quad * 2 + (e & 1);
          if (!(c < k_valid && k0 + c <= at[e >> 1] && k0 + c >= doc[e >> 1])) sc[4 * j + e] = -INFINITY;
        }
    }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < kFwdKeys / 8; ++j) mx = fmaxf(mx, fmaxf(sc[4 * j + 2 * hf], sc[4 * j + 2 * hf + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_run[hf], mx * scale_log2);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing visible yet
      corr[hf] = fast_exp2(m_run[hf] - m_use);
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kFwdKeys / 8; ++j) {
        const float p0 = fast_exp2(fmaf(sc[4 * j + 2 * hf], scale_log2, -m_use));
        const float p1 = fast_exp2(fmaf(sc[4 * j + 2 * hf + 1], scale_log2, -m_use));
        sc[4 * j + 2 * hf] = p0;
        sc[4 * j + 2 * hf + 1] = p1;
        sum += p0 + p1;
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      l_run[hf] = l_run[hf] * corr[hf] + sum;
      m_run[hf] = m_new;
    }
  };
  // P (bf16) as the A operand of O += P V, 16 keys per k step.
  uint32_t pa[kFwdKeys / 16][4];
  auto pack = [&](const float(&sc)[64]) {
#pragma unroll
    for (int kk = 0; kk < kFwdKeys / 16; ++kk) {
      pa[kk][0] = pack_bf16(sc[8 * kk], sc[8 * kk + 1]);
      pa[kk][1] = pack_bf16(sc[8 * kk + 2], sc[8 * kk + 3]);
      pa[kk][2] = pack_bf16(sc[8 * kk + 4], sc[8 * kk + 5]);
      pa[kk][3] = pack_bf16(sc[8 * kk + 6], sc[8 * kk + 7]);
    }
  };
  float o[64], sc[64], corr[2];  // sc: no initial values, the first k step does not read them
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  // O += P V for tile t (V read MN-major: 128 dims = two column blocks a tile apart), one group.
  auto issue_pv = [&](int t) {
    const uint32_t v_lo = vbuf_lo + (t & 1) * lo16(tile_bytes(kFwdKeys));
#pragma unroll
    for (int kk = 0; kk < kFwdKeys / 16; ++kk)
      wgmma_rs_m64n128<1>(o, pa[kk], descriptor(v_lo + kk * lo16(kUnit16), kFwdKeys * kRowBytes), 1);
    wgmma_commit();
  };
  mbarrier_wait(&bars->q_full, 0);
  mbarrier_wait(&bars->k_full[0], 0);
  named_sync(my_turn, 256);
  wgmma_fence();
  issue_scores(sc, 0);
  named_arrive(other_turn, 256);
  wgmma_wait<0>();
  pin(sc);
  release(&bars->k_empty[0]);
  softmax(sc, 0, corr);  // o is still zero: nothing to rescale
  pack(sc);
  // Tile t: S of tile t + 1 is issued before O += P V of tile t, so that its softmax runs while
  // P V is on the tensor cores (the last tile, without a successor, after the loop).
  for (int t = 0; t + 1 < tiles; ++t) {
    mbarrier_wait(&bars->k_full[(t + 1) & 1], ((t + 1) >> 1) & 1);
    mbarrier_wait(&bars->v_full[t & 1], (t >> 1) & 1);
    named_sync(my_turn, 256);
    wgmma_fence();
    issue_scores(sc, t + 1);
    issue_pv(t);
    named_arrive(other_turn, 256);
    wgmma_wait<1>();
    pin(sc);
    release(&bars->k_empty[(t + 1) & 1]);
    softmax(sc, t + 1, corr);
    wgmma_wait<0>();
    pin(o);
    pin(pa);
    release(&bars->v_empty[t & 1]);
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      o[4 * j] *= corr[0];
      o[4 * j + 1] *= corr[0];
      o[4 * j + 2] *= corr[1];
      o[4 * j + 3] *= corr[1];
    }
    pack(sc);
  }
  mbarrier_wait(&bars->v_full[(tiles - 1) & 1], ((tiles - 1) >> 1) & 1);
  named_sync(my_turn, 256);
  wgmma_fence();
  issue_pv(tiles - 1);
  named_arrive(other_turn, 256);
  wgmma_wait<0>();
  pin(o);
  pin(pa);
  // Warpgroup 1 handed the turn once more than warpgroup 0 took it: taken here, so that no named
  // barrier is left part-way at exit.
  if (cw == 0) named_sync(my_turn, 256);
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int64_t r = q0 + row0 + hf * 8;
    if (r >= n) continue;
    const float l = l_run[hf], inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j)
      *reinterpret_cast<uint32_t*>(out + r * heads * kD + h * kD + j * 8 + quad * 2) =
          pack_bf16(o[4 * j + 2 * hf] * inv, o[4 * j + 2 * hf + 1] * inv);
    if (quad == 0) lse[r * heads + h] = (m_run[hf] + __log2f(l)) / kLog2e;
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // device code without sm_90a features: fail loudly rather than return nothing
#endif
}

// Key block b's queries [x, y) (queries_seeing; x == y: none), for every head's block b; the
// searches run here once instead of at the start of each of the heads' blocks, whose first loads
// would wait for them.
template <bool Gathered>
__global__ void query_ranges_kernel(int2* ranges, FlashRows rows, const int32_t* doc_start) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= (rows.n_kv + kKeys - 1) / kKeys) return;
  const int64_t k0 = b * kKeys, k_last = min(k0 + kKeys, rows.n_kv) - 1;
  int64_t begin = 0, end = 0;
  queries_seeing<Gathered>(rows, doc_start, k0, k_last, begin, end);
  ranges[b] = make_int2(static_cast<int>(begin), static_cast<int>(end));
}

template <bool QuadDq, bool Gathered>
cudaError_t launch_backward(float* dk_acc, float* dv_acc, float* dq_acc, int32_t* query_ranges, const float* delta,
                            const bf16* dout, const float* lse, const FlashRows& rows, const int32_t* doc_start,
                            int64_t heads, int64_t kv_heads, int chosen_chunk, cudaStream_t stream) {
  constexpr size_t smem = backward_smem_bytes<Gathered>();
  auto* kernel = flash_backward_wgmma_kernel<QuadDq, Gathered>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  const int head_chunk = static_cast<int>(std::min<int64_t>(std::max(chosen_chunk, 1), heads));
  const int64_t key_blocks = (rows.n_kv + kKeys - 1) / kKeys, blocks = heads * key_blocks;
  if (blocks > INT_MAX || rows.n_q > INT_MAX) return cudaErrorInvalidConfiguration;
  auto* ranges = reinterpret_cast<int2*>(query_ranges);
  query_ranges_kernel<Gathered><<<static_cast<unsigned int>((key_blocks + 255) / 256), 256, 0, stream>>>(
      ranges, rows, doc_start);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  kernel<<<static_cast<unsigned int>(blocks), kThreads, smem, stream>>>(
      dk_acc, dv_acc, dq_acc, ranges, delta, dout, lse, rows, doc_start, heads, kv_heads,
      1.0f / sqrtf(static_cast<float>(kD)), head_chunk);
  return cudaGetLastError();
}

template <bool Gathered>
cudaError_t launch_forward(bf16* out, float* lse, const FlashRows& rows, const int32_t* doc_start, int64_t heads,
                           int64_t kv_heads, cudaStream_t stream) {
  constexpr size_t smem = forward_smem_bytes();
  auto* kernel = flash_forward_wgmma_kernel<Gathered>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  dim3 grid(static_cast<unsigned int>(heads), static_cast<unsigned int>((rows.n_q + kFwdRows - 1) / kFwdRows));
  kernel<<<grid, kFwdThreads, smem, stream>>>(out, lse, rows, doc_start, heads, kv_heads,
                                           kLog2e / sqrtf(static_cast<float>(kD)));
  return cudaGetLastError();
}

}  // namespace

size_t flash_wgmma_shared_bytes() { return std::max(backward_smem_bytes<true>(), forward_smem_bytes()); }

bool flash_wgmma_available(int64_t head_dim) {
#ifdef GLM_SM90A_BUILT
  if (head_dim != kD) return false;
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) return false;
  return major == 9 && minor == 0;
#else
  return false;
#endif
}

// dQ by paired atomics where asked or where dq_acc is not 16-byte aligned.
cudaError_t flash_backward_wgmma(float* dk_acc, float* dv_acc, float* dq_acc, int32_t* query_ranges,
                                 const float* delta, const bf16* dout, const float* lse, const FlashRows& rows,
                                 bool gathered, const int32_t* doc_start, int64_t heads, int64_t kv_heads,
                                 int head_chunk, bool dq_vector_atomics, cudaStream_t stream) {
  if (reinterpret_cast<uintptr_t>(query_ranges) % 8 != 0) return cudaErrorInvalidValue;
  const bool quad = dq_vector_atomics && reinterpret_cast<uintptr_t>(dq_acc) % 16 == 0;
  auto launch = [&](auto quad_dq, auto gathered_rows) {
    return launch_backward<decltype(quad_dq)::value, decltype(gathered_rows)::value>(
        dk_acc, dv_acc, dq_acc, query_ranges, delta, dout, lse, rows, doc_start, heads, kv_heads, head_chunk, stream);
  };
  using Yes = std::true_type;
  using No = std::false_type;
  if (gathered) return quad ? launch(Yes{}, Yes{}) : launch(No{}, Yes{});
  return quad ? launch(Yes{}, No{}) : launch(No{}, No{});
}

cudaError_t flash_forward_wgmma(bf16* out, float* lse, const FlashRows& rows, bool gathered,
                                const int32_t* doc_start, int64_t heads, int64_t kv_heads, cudaStream_t stream) {
  return gathered ? launch_forward<true>(out, lse, rows, doc_start, heads, kv_heads, stream)
                  : launch_forward<false>(out, lse, rows, doc_start, heads, kv_heads, stream);
}

}  // namespace glm::cuda
