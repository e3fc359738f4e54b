// Decode attention over a paged KV cache (see decode_attention.cuh).
//
// Block (split, KV head g and tile of up to 16 of its query heads, query i) on the tensor cores: the
// tile's queries are the 16 rows of the m16n8k16 MMA's A operand (GQA: one read of a key serves
// every query head of the tile), its four warps take chunks of 16 keys in turn (chunk warp, warp +
// 4, ... of the split), copied by cp.async into stages of the warp's own shared memory (two up to
// head_dim 128: the next chunk in flight while one is multiplied; one at 256, within the 99 KiB a
// block of Ada may use). S = Q K^T from ldmatrix fragments, the online softmax in registers (a
// row's four lanes reduce by shuffles), P as the A operand of O += P V with V through
// ldmatrix.trans, all as in the prefill's flash kernels. The warps meet in shared memory at the end;
// with one split the block writes the output, otherwise the split's record for the merge kernel, or,
// as one of a cluster of the query's splits (CLUSTER), its part in its own shared memory: after a
// cluster barrier each block merges every splits-th head of the tile from all the parts, and a
// second barrier keeps the parts alive until every block has read them.
#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/decode_attention.cuh"
#include "kernels/cuda/tensor_core.cuh"

namespace glm::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kChunk = 16;                     // keys a warp multiplies at a time: the MMA's k of P V
constexpr int kTileHeads = 16;                 // query heads a block: the MMA's m
constexpr int kMinSplitKeys = kWarps * kChunk;  // a chunk for every warp
constexpr int kMaxGroup = 32;
constexpr int kMaxHeadDim = 256;
constexpr float kLn2 = 0.6931471805599453f;

// bf16 of a row in shared memory: D + 8 (one 16-byte unit more), so that ldmatrix's eight rows of
// 16 bytes fall in different banks.
__host__ __device__ constexpr int padded(int dim) { return dim + 8; }

// Stages of 16 keys and 16 values a warp.
template <int D>
constexpr int stages() {
  return D <= 128 ? 2 : 1;
}
constexpr int kOutRow = 8;  // floats after each row of a warp's output in shared memory
// Shared memory of a block of head dimension D (d padded up to 64, 128 or 256): the queries, then
// each warp's stages. The warps' fp32 outputs take the stages' place at the end.
template <int D>
constexpr size_t shared_bytes() {
  return sizeof(bf16) * static_cast<size_t>(padded(D)) * (kTileHeads + kWarps * stages<D>() * 2 * kChunk);
}
template <int D>
constexpr bool outputs_fit() {
  return sizeof(float) * kWarps * kTileHeads * (D + kOutRow) <=
         sizeof(bf16) * static_cast<size_t>(padded(D)) * kWarps * stages<D>() * 2 * kChunk;
}

// Query i's keys [first, last] over `splits` splits of whole chunks (at most one a kMinSplitKeys
// keys; the rest stay empty): this split's [begin, end).
__device__ __forceinline__ void split_range(int64_t first, int64_t last, int splits, int split, int64_t& begin,
                                            int64_t& end) {
  const int64_t length = last - first + 1;
  const int64_t active = min(static_cast<int64_t>(splits), (length + kMinSplitKeys - 1) / kMinSplitKeys);
  const int64_t per_split = ((length + active - 1) / active + kChunk - 1) / kChunk * kChunk;
  begin = min(last + 1, first + split * per_split);
  end = min(last + 1, begin + per_split);
}

// Stage `stage` of a warp's shared memory `stages`: 16 keys, then 16 values.
template <int D>
__device__ __forceinline__ bf16* stage_keys(bf16* stages, int stage) {
  return stages + 2 * stage * kChunk * padded(D);
}
template <int D>
__device__ __forceinline__ bf16* stage_values(bf16* stages, int stage) {
  return stages + (2 * stage + 1) * kChunk * padded(D);
}

// The warp's copies of 16 keys from `start` (rows past `end` and dimensions past d filled with zeros)
// into stage `stage`, one commit group (empty when start >= end).
template <int D>
__device__ __forceinline__ void load_chunk(bf16* stages, int stage, const bf16* kv, const int32_t* kv_row,
                                           int64_t start, int64_t end, int64_t kv_width, int64_t k_off,
                                           int64_t v_off, int d, int lane) {
  if (start < end) {
    const int64_t mine = start + (lane & (kChunk - 1));
    const int32_t my_row = mine < end ? __ldg(kv_row + mine) : 0;
    constexpr int kVectors = D / 8, kPerLane = kChunk * kVectors / 32;
#pragma unroll
    for (int u = 0; u < kPerLane; ++u) {
      const int e = lane + 32 * u, t = e / kVectors, col = (e % kVectors) * 8;
      const int32_t row = __shfl_sync(0xffffffffu, my_row, t);
      const bool valid = start + t < end && col < d;
      const bf16* src = kv + static_cast<int64_t>(row) * kv_width + col;
      cp_async16(stage_keys<D>(stages, stage) + t * padded(D) + col, valid ? src + k_off : kv, valid);
      cp_async16(stage_values<D>(stages, stage) + t * padded(D) + col, valid ? src + v_off : kv, valid);
    }
  }
  cp_async_commit();
}

// The cluster's merge (CLUSTER): block `rank` of `splits` takes heads rank, rank + splits, ... of the
// tile, four dimensions a thread: every split's max, exp-sum and four outputs of the head from the
// splits' shared memory (all loads in flight), then out = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M)
// l_s in natural-log units, as the merge kernel.
template <int D>
__device__ __forceinline__ void merge_cluster(bf16* out, float* lse, float* part, float* part_m, float* part_l,
                                              int64_t i, int heads, int head0, int rows, int d, int splits) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every split's part is written
  const int rank = static_cast<int>(cluster.block_rank());
  const int mine = rank < rows ? (rows - rank + splits - 1) / splits : 0, vectors = d / 4;
  for (int e = threadIdx.x; e < mine * vectors; e += kThreads) {
    const int r = rank + splits * (e / vectors), c = 4 * (e % vectors);
    float m_split[kDecodeClusterSplits], l_split[kDecodeClusterSplits];
    float4 o_split[kDecodeClusterSplits];
#pragma unroll
    for (int s = 0; s < kDecodeClusterSplits; ++s) {
      if (s >= splits) break;
      m_split[s] = cluster.map_shared_rank(part_m, s)[r];
      l_split[s] = cluster.map_shared_rank(part_l, s)[r];
      o_split[s] = *reinterpret_cast<const float4*>(cluster.map_shared_rank(part, s) + r * (D + kOutRow) + c);
    }
    float m = -INFINITY;
#pragma unroll
    for (int s = 0; s < kDecodeClusterSplits; ++s)
      if (s < splits) m = fmaxf(m, m_split[s]);
    float l = 0.0f, o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int s = 0; s < kDecodeClusterSplits; ++s) {
      if (s >= splits || m_split[s] == -INFINITY) continue;  // an empty split: no keys, weight 0
      const float weight = __expf(m_split[s] - m);
      l = fmaf(weight, l_split[s], l);
      o[0] = fmaf(weight, o_split[s].x, o[0]);
      o[1] = fmaf(weight, o_split[s].y, o[1]);
      o[2] = fmaf(weight, o_split[s].z, o[2]);
      o[3] = fmaf(weight, o_split[s].w, o[3]);
    }
    const float inv = 1.0f / l;
    __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(out + (i * heads + head0 + r) * d + c);
    dst[0] = __floats2bfloat162_rn(o[0] * inv, o[1] * inv);
    dst[1] = __floats2bfloat162_rn(o[2] * inv, o[3] * inv);
    if (c == 0) lse[i * heads + head0 + r] = m + logf(l);
  }
  cluster.sync();  // the other blocks are done with this block's part
#else
  __trap();  // launched only where decode_attention_clusters_available()
#endif
}

template <int D, bool CLUSTER>
__global__ void __launch_bounds__(kThreads)
    decode_kernel(bf16* out, float* lse, float* partial, const bf16* qkv, const bf16* kv, const int32_t* kv_row,
                  const int32_t* position, const int32_t* doc_start, int heads, int kv_heads, int d, int splits,
                  float scale_log2) {
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  bf16* q_s = reinterpret_cast<bf16*>(smem_bytes);  // [16][padded(D)]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g8 = lane >> 2, q4 = lane & 3;
  const int group = heads / kv_heads, tiles = (group + kTileHeads - 1) / kTileHeads;
  const int g = blockIdx.y / tiles, h0 = (blockIdx.y % tiles) * kTileHeads;
  const int rows = min(kTileHeads, group - h0), head0 = g * group + h0;
  const int64_t i = blockIdx.z, record = d + 2;
  int64_t begin = 0, end = 0;
  split_range(doc_start[i], position[i], splits, blockIdx.x, begin, end);
  float* rec = splits > 1 && !CLUSTER ? partial + ((i * splits + blockIdx.x) * heads + head0) * record : nullptr;
  if (begin >= end && !CLUSTER) {  // an empty split: its max alone (-inf) tells the merge to skip it
                                   // (in a cluster it runs on: no chunks, and its part says the same)
    for (int r = threadIdx.x; r < rows; r += kThreads) rec[r * record + d] = -INFINITY;
    return;
  }
  const int64_t qkv_width = static_cast<int64_t>(heads + 2 * kv_heads) * d, kv_width = 2LL * kv_heads * d;
  {  // the tile's queries; rows past the group's heads and dimensions past d are zeros
    const bf16* q = qkv + i * qkv_width + static_cast<int64_t>(head0) * d;
    constexpr int kVectors = D / 8;
    for (int e = threadIdx.x; e < kTileHeads * kVectors; e += kThreads) {
      const int r = e / kVectors, col = (e % kVectors) * 8;
      const bool valid = r < rows && col < d;
      cp_async16(q_s + r * padded(D) + col, valid ? q + r * d + col : q, valid);
    }
    cp_async_commit();
  }
  static_assert(outputs_fit<D>(), "the warps' outputs fit where their stages were");
  constexpr int kStages = stages<D>();
  bf16* stages = q_s + kTileHeads * padded(D) + warp * kStages * 2 * kChunk * padded(D);  // this warp's
  const int64_t k_off = static_cast<int64_t>(g) * d, v_off = static_cast<int64_t>(kv_heads + g) * d;
  const int64_t chunks = (end - begin + kChunk - 1) / kChunk;
  const int count = chunks > warp ? static_cast<int>((chunks - warp + kWarps - 1) / kWarps) : 0;
  auto chunk_start = [&](int j) { return begin + (static_cast<int64_t>(j) * kWarps + warp) * kChunk; };
#pragma unroll
  for (int j = 0; j < kStages; ++j)
    load_chunk<D>(stages, j, kv, kv_row, count > j ? chunk_start(j) : end, end, kv_width, k_off, v_off, d, lane);
  cp_async_wait<kStages - 1>();  // the queries and the first chunk
  __syncthreads();               // every thread's share of the queries

  // Lane (g8, q4) holds rows g8 and g8 + 8 of S and O: m and l of each, O's columns 8 t + 2 q4 (+1).
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float acc[D / 8][4];
#pragma unroll
  for (int t = 0; t < D / 8; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[t][e] = 0.0f;
  for (int j = 0; j < count; ++j) {
    const int stage = j % kStages;
    if (j > 0) cp_async_wait<kStages - 1>();
    __syncwarp();
    const bf16* k_s = stage_keys<D>(stages, stage);
    const bf16* v_s = stage_values<D>(stages, stage);
    float s[2][4] = {};  // keys 0-7 and 8-15 of the chunk
#pragma unroll
    for (int kt = 0; kt < D / 16; ++kt) {
      uint32_t a[4], b[4];
      ldsm_x4(a, a_frag(q_s, padded(D), 0, kt * 16, lane));
      ldsm_x4(b, b_frag_nk(k_s, padded(D), 0, kt * 16, lane));
      mma_bf16(s[0], a, b[0], b[1]);
      mma_bf16(s[1], a, b[2], b[3]);
    }
    const int64_t key0 = chunk_start(j) + 2 * q4;
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {  // row g8 + 8 r: elements 2 r, 2 r + 1 of each key tile
      float mx = m[r];
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[t][2 * r + e];
          x = key0 + 8 * t + e < end ? x * scale_log2 : -INFINITY;
          mx = fmaxf(mx, x);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));  // finite: every chunk has a key
      corr[r] = fast_exp2(m[r] - mx);                       // 0 for the first chunk (m -inf)
      m[r] = mx;
      float sum = 0.0f;
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[t][2 * r + e];
          x = fast_exp2(x - mx);
          sum += x;
        }
      l[r] = l[r] * corr[r] + sum;  // this lane's columns; the row's four lanes add up at the end
    }
#pragma unroll
    for (int t = 0; t < D / 8; ++t) {
      acc[t][0] *= corr[0];
      acc[t][1] *= corr[0];
      acc[t][2] *= corr[1];
      acc[t][3] *= corr[1];
    }
    const uint32_t p[4] = {pack_bf16(s[0][0], s[0][1]), pack_bf16(s[0][2], s[0][3]), pack_bf16(s[1][0], s[1][1]),
                           pack_bf16(s[1][2], s[1][3])};
#pragma unroll
    for (int dt = 0; dt < D / 16; ++dt) {
      uint32_t b[4];
      ldsm_x4_t(b, b_frag_kn(v_s, padded(D), 0, dt * 16, lane));
      mma_bf16(acc[2 * dt], p, b[0], b[1]);
      mma_bf16(acc[2 * dt + 1], p, b[2], b[3]);
    }
    __syncwarp();  // every lane is done with the stage before it is refilled
    load_chunk<D>(stages, stage, kv, kv_row, j + kStages < count ? chunk_start(j + kStages) : end, end, kv_width,
                  k_off, v_off, d, lane);
  }
  cp_async_wait_all();
  // The warps meet: each its m, l (its rows' four lanes added) and O in shared memory.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  __syncthreads();  // the stages are free
  float* o_s = reinterpret_cast<float*>(q_s + kTileHeads * padded(D));  // [kWarps][16][D + kOutRow]
  __shared__ float m_s[kWarps][kTileHeads], l_s[kWarps][kTileHeads];
  {
    float* o = o_s + warp * kTileHeads * (D + kOutRow);
#pragma unroll
    for (int t = 0; t < D / 8; ++t)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        *reinterpret_cast<float2*>(o + (g8 + 8 * r) * (D + kOutRow) + 8 * t + 2 * q4) =
            make_float2(acc[t][2 * r], acc[t][2 * r + 1]);
    if (q4 == 0)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        m_s[warp][g8 + 8 * r] = m[r];
        l_s[warp][g8 + 8 * r] = l[r];
      }
  }
  __syncthreads();
  __shared__ float part_m[kTileHeads], part_l[kTileHeads];  // CLUSTER: the part's max and exp-sum
  for (int e = threadIdx.x; e < rows * (d / 2); e += kThreads) {
    const int r = e / (d / 2), col = 2 * (e % (d / 2));
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, m_s[w][r]);
    float sum = 0.0f, o0 = 0.0f, o1 = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float weight = m_s[w][r] == -INFINITY ? 0.0f : fast_exp2(m_s[w][r] - mx);  // a warp without keys: 0
      const float2 o = *reinterpret_cast<const float2*>(o_s + (w * kTileHeads + r) * (D + kOutRow) + col);
      sum += weight * l_s[w][r];
      o0 += weight * o.x;
      o1 += weight * o.y;
    }
    if (CLUSTER) {  // the part over warp 0's output: each element read and written by this thread alone
      *reinterpret_cast<float2*>(o_s + r * (D + kOutRow) + col) = make_float2(o0, o1);
      if (col == 0) {
        part_m[r] = mx * kLn2;
        part_l[r] = sum;
      }
    } else if (splits == 1) {
      const float inv = 1.0f / sum;
      *reinterpret_cast<__nv_bfloat162*>(out + (i * heads + head0 + r) * d + col) =
          __floats2bfloat162_rn(o0 * inv, o1 * inv);
      if (col == 0) lse[i * heads + head0 + r] = (mx + log2f(sum)) * kLn2;
    } else {  // the merge's record, in natural-log units
      *reinterpret_cast<float2*>(rec + r * record + col) = make_float2(o0, o1);
      if (col == 0) {
        rec[r * record + d] = mx * kLn2;
        rec[r * record + d + 1] = sum;
      }
    }
  }
  if constexpr (CLUSTER) merge_cluster<D>(out, lse, o_s, part_m, part_l, i, heads, head0, rows, d, splits);
}

// Block (i, kMergeHeads heads): warp w merges head kMergeHeads blockIdx.y + w of query i,
// out = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s: the lanes take the splits' maxima and sums
// (a split a lane, warp reductions), then two dimensions each of the output, over the splits.
constexpr int kMergeHeads = 4;
__global__ void __launch_bounds__(kMergeHeads * 32)
    decode_merge_kernel(bf16* out, float* lse, const float* partial, int heads, int d, int splits) {
  __shared__ float weight_s[kMergeHeads][kDecodeMaxSplits];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int64_t i = blockIdx.x;
  const int h = blockIdx.y * kMergeHeads + w;
  if (h >= heads) return;  // no block barrier below: each warp works alone
  const int64_t record = d + 2, split_stride = static_cast<int64_t>(heads) * record;
  const float* base = partial + (i * splits * heads + h) * record;
  constexpr int kPerLane = kDecodeMaxSplits / 32;
  float m_split[kPerLane], l_split[kPerLane];
  float m = -INFINITY;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int s = lane + 32 * k;
    m_split[k] = s < splits ? base[s * split_stride + d] : -INFINITY;
    l_split[k] = s < splits && m_split[k] != -INFINITY ? base[s * split_stride + d + 1] : 0.0f;
    m = fmaxf(m, m_split[k]);
  }
  m = warp_max(m);
  float l = 0.0f;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int s = lane + 32 * k;
    const float weight = m_split[k] == -INFINITY ? 0.0f : __expf(m_split[k] - m);  // empty splits: 0
    l += weight * l_split[k];
    if (s < splits) weight_s[w][s] = weight;
  }
  l = warp_sum(l);
  __syncwarp();
  const float inv = 1.0f / l;
  for (int c = 2 * lane; c < d; c += 64) {
    float o0 = 0.0f, o1 = 0.0f;
#pragma unroll 4
    for (int s = 0; s < splits; ++s) {
      const float weight = weight_s[w][s];
      if (weight == 0.0f) continue;  // an empty split wrote only its max
      const float2 p = *reinterpret_cast<const float2*>(base + s * split_stride + c);
      o0 = fmaf(weight, p.x, o0);
      o1 = fmaf(weight, p.y, o1);
    }
    *reinterpret_cast<__nv_bfloat162*>(out + (i * heads + h) * d + c) = __floats2bfloat162_rn(o0 * inv, o1 * inv);
  }
  if (lane == 0) lse[i * heads + h] = m + logf(l);
}

template <int D>
cudaError_t launch(bf16* out, float* lse, float* scratch, const bf16* qkv, const bf16* kv, const int32_t* kv_row,
                   const int32_t* position, const int32_t* doc_start, int64_t n, int splits, int heads, int kv_heads,
                   int d, bool cluster, cudaStream_t stream) {
  constexpr size_t smem = shared_bytes<D>();
  auto* kernel = cluster ? decode_kernel<D, true> : decode_kernel<D, false>;
  if (smem > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  const int tiles = (heads / kv_heads + kTileHeads - 1) / kTileHeads;
  cudaLaunchConfig_t config{};
  config.gridDim =
      dim3(static_cast<unsigned>(splits), static_cast<unsigned>(kv_heads * tiles), static_cast<unsigned>(n));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned>(splits);
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = cluster ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, out, lse, scratch, qkv, kv, kv_row, position, doc_start, heads, kv_heads,
                            d, splits, 1.4426950408889634f / std::sqrt(static_cast<float>(d)));
}

}  // namespace

bool decode_attention_supported(int64_t heads, int64_t kv_heads, int64_t head_dim) {
  return kv_heads > 0 && heads % kv_heads == 0 && heads / kv_heads <= kMaxGroup && head_dim > 0 &&
         head_dim % 8 == 0 && head_dim <= kMaxHeadDim;
}

bool decode_attention_clusters_available() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess || major < 9)
    return false;
  cudaFuncAttributes attributes{};
  return cudaFuncGetAttributes(&attributes, decode_kernel<128, true>) == cudaSuccess && attributes.ptxVersion >= 90;
}

int decode_attention_splits(int64_t n, int64_t n_kv, int64_t heads, int64_t kv_heads, int multiprocessors,
                            bool clusters) {
  const int64_t mean = n > 0 ? (n_kv + n - 1) / n : n_kv;
  const int64_t tiles = kv_heads > 0 ? (heads / kv_heads + kTileHeads - 1) / kTileHeads : 1;
  const int64_t blocks = std::max<int64_t>(1, n * kv_heads * tiles);
  const int64_t wanted = (2LL * std::max(multiprocessors, 1) + blocks - 1) / blocks;  // two blocks an SM
  const int64_t splits = std::min(wanted, (mean + kMinSplitKeys - 1) / kMinSplitKeys);
  const int64_t limited =
      clusters && splits <= 2 * kDecodeClusterSplits ? std::min<int64_t>(splits, kDecodeClusterSplits) : splits;
  return static_cast<int>(std::clamp<int64_t>(limited, 1, kDecodeMaxSplits));
}

cudaError_t decode_attention(bf16* out, float* lse, float* scratch, const bf16* qkv, const bf16* kv,
                             const int32_t* kv_row, const int32_t* position, const int32_t* doc_start, int64_t n,
                             int splits, int64_t heads, int64_t kv_heads, int64_t head_dim, bool clusters,
                             cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (!decode_attention_supported(heads, kv_heads, head_dim) || n > 65535 || splits < 1 || splits > kDecodeMaxSplits)
    return cudaErrorInvalidValue;
  const int h = static_cast<int>(heads), kvh = static_cast<int>(kv_heads), d = static_cast<int>(head_dim);
  const bool cluster = clusters && splits > 1 && splits <= kDecodeClusterSplits;
  auto* padded_launch = d <= 64 ? launch<64> : d <= 128 ? launch<128> : launch<256>;
  const cudaError_t e =
      padded_launch(out, lse, scratch, qkv, kv, kv_row, position, doc_start, n, splits, h, kvh, d, cluster, stream);
  if (e != cudaSuccess || splits == 1 || cluster) return e;
  const unsigned head_blocks = static_cast<unsigned>((heads + kMergeHeads - 1) / kMergeHeads);
  decode_merge_kernel<<<dim3(static_cast<unsigned>(n), head_blocks), kMergeHeads * 32, 0, stream>>>(
      out, lse, scratch, h, d, splits);
  return cudaGetLastError();
}

}  // namespace glm::cuda
