// Decode attention over a paged KV cache (see decode_attention.cuh).
#include <cmath>

#include "kernels/cuda/decode_attention.cuh"
#include "kernels/cuda/vec.cuh"

namespace glm::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kTileKeys = 32;      // one key per lane
constexpr int kMinSplitKeys = 32;  // one tile: a decode step's few queries still fill the GPU
constexpr int kMaxGroup = 32;
constexpr int kMaxHeadDim = 256;
constexpr int kMaxWarpHeads = kMaxGroup / kWarps;  // query heads a warp owns
constexpr int kMaxLaneChunks = kMaxHeadDim / 128;  // 4-dimension chunks of the output a lane owns per head
// bf16 rows of the key and value tiles in shared memory: d + 8 elements (one 16-byte unit more),
// so that the lanes reading 16 bytes of 32 different keys hit different banks.
__host__ __device__ constexpr int tile_row(int d) { return d + 8; }

// Shared memory of one block: the group's queries (fp32, scaled) and a tile of keys and of values
// (bf16).
size_t shared_bytes(int group, int d) {
  return sizeof(float) * static_cast<size_t>(group) * d + 2 * sizeof(bf16) * kTileKeys * tile_row(d);
}

// Block (split, g, i)'s keys and its output: query i's keys over the splits it needs
// (kMinSplitKeys or more each; the rest stay empty), [begin, end) this split's, out the group's
// records of this split in partial ([n, splits, heads, d + 2]). An empty split writes its max alone
// (-inf), which tells the merge to skip it, and returns false.
__device__ __forceinline__ bool split_keys(float* partial, const int32_t* position, const int32_t* doc_start,
                                           int heads, int group, int d, int splits, int64_t& begin, int64_t& end,
                                           float*& out) {
  const int split = blockIdx.x, g = blockIdx.y;
  const int64_t i = blockIdx.z;
  const int64_t first = doc_start[i], last = position[i], length = last - first + 1;
  const int64_t active = min(static_cast<int64_t>(splits), (length + kMinSplitKeys - 1) / kMinSplitKeys);
  const int64_t per_split = (length + active - 1) / active;
  begin = min(last + 1, first + split * per_split);
  end = min(last + 1, begin + per_split);
  out = partial + ((i * splits + split) * heads + static_cast<int64_t>(g) * group) * (d + 2);
  if (begin < end) return true;
  for (int h = threadIdx.x; h < group; h += blockDim.x) out[h * (d + 2) + d] = -INFINITY;
  return false;
}

// Block (split, g, i): query i's heads of KV group g against the split's share of its keys.
// partial: [n, splits, heads, d + 2] = the unnormalised output, then the max and the exp-sum.
// The block's loads go out together (the query, then a tile's key and value rows, each load's row
// index read by the thread itself: no barrier between the index and the row); warp w then owns query
// heads w, w + 4, ... of the group, a lane a key for the scores and the softmax (running max and sum
// in registers, warp reductions), then 4 dimensions of each head's output, the keys' weights taken
// from their lanes by shuffles.
__global__ void __launch_bounds__(kThreads)
    decode_partial_kernel(float* partial, const bf16* qkv, const bf16* kv, const int32_t* kv_row,
                          const int32_t* position, const int32_t* doc_start, int heads, int kv_heads, int d, int splits,
                          float scale) {
  extern __shared__ float smem[];
  const int g = blockIdx.y;
  const int64_t i = blockIdx.z;
  const int group = heads / kv_heads, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int row = tile_row(d), vectors = d / 8;
  float* q_s = smem;                                     // [group][d]
  bf16* k_s = reinterpret_cast<bf16*>(q_s + group * d);  // [kTileKeys][row]
  bf16* v_s = k_s + kTileKeys * row;                     // [kTileKeys][row]
  int64_t begin = 0, end = 0;
  float* out = nullptr;
  if (!split_keys(partial, position, doc_start, heads, group, d, splits, begin, end, out)) return;
  const int64_t qkv_width = static_cast<int64_t>(heads + 2 * kv_heads) * d, kv_width = 2LL * kv_heads * d;
  {  // the group's queries, 8 dimensions a load
    const bf16* q = qkv + i * qkv_width + static_cast<int64_t>(g) * group * d;
    constexpr int kMax = kMaxGroup * kMaxHeadDim / 8 / kThreads;
    uint4 bits[kMax];
#pragma unroll
    for (int u = 0; u < kMax; ++u) {
      const int e = tid + u * kThreads;
      if (e < group * vectors) bits[u] = __ldg(reinterpret_cast<const uint4*>(q) + e);
    }
#pragma unroll
    for (int u = 0; u < kMax; ++u) {
      const int e = tid + u * kThreads;
      if (e >= group * vectors) break;
      float f[8];
      unpack_bf16x8(bits[u], f);
#pragma unroll
      for (int k = 0; k < 8; ++k) q_s[e * 8 + k] = f[k] * scale;
    }
  }
  const int warp_heads = (group - warp + kWarps - 1) / kWarps;  // heads warp, warp + kWarps, ...
  float m_run[kMaxWarpHeads], l_run[kMaxWarpHeads], acc[kMaxWarpHeads][kMaxLaneChunks][4];
#pragma unroll
  for (int a = 0; a < kMaxWarpHeads; ++a) {
    m_run[a] = -INFINITY;
    l_run[a] = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxLaneChunks; ++j)
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[a][j][k] = 0.0f;
  }
  for (int64_t k0 = begin; k0 < end; k0 += kTileKeys) {
    const int keys = static_cast<int>(min(static_cast<int64_t>(kTileKeys), end - k0));
    __syncthreads();  // the previous tile's keys and values are no longer read
    {                 // the tile's keys and values, 8 bf16 a load, every load in flight before the first store
      constexpr int kMax = kTileKeys * kMaxHeadDim / 8 / kThreads;
      uint4 kb[kMax], vb[kMax];
#pragma unroll
      for (int u = 0; u < kMax; ++u) {
        const int e = tid + u * kThreads;
        if (e < keys * vectors) {
          const int t = e / vectors, c = (e - t * vectors) * 8;
          const bf16* src =
              kv + static_cast<int64_t>(__ldg(kv_row + k0 + t)) * kv_width + static_cast<int64_t>(g) * d + c;
          kb[u] = __ldg(reinterpret_cast<const uint4*>(src));
          vb[u] = __ldg(reinterpret_cast<const uint4*>(src + static_cast<int64_t>(kv_heads) * d));
        }
      }
#pragma unroll
      for (int u = 0; u < kMax; ++u) {
        const int e = tid + u * kThreads;
        if (e >= keys * vectors) break;
        const int t = e / vectors, c = (e - t * vectors) * 8;
        *reinterpret_cast<uint4*>(k_s + t * row + c) = kb[u];
        *reinterpret_cast<uint4*>(v_s + t * row + c) = vb[u];
      }
    }
    __syncthreads();
    // Scores: lane = key, for each of the warp's heads; keys past the tile's end are masked.
    float p[kMaxWarpHeads];
#pragma unroll
    for (int a = 0; a < kMaxWarpHeads; ++a) p[a] = 0.0f;
    for (int c8 = 0; c8 < vectors; ++c8) {
      float kf[8];
      unpack_bf16x8(*reinterpret_cast<const uint4*>(k_s + lane * row + c8 * 8), kf);
#pragma unroll
      for (int a = 0; a < kMaxWarpHeads; ++a) {
        if (a >= warp_heads) break;
        const float4* q4 = reinterpret_cast<const float4*>(q_s + (warp + a * kWarps) * d + c8 * 8);
        const float4 x = q4[0], y = q4[1];
        p[a] = fmaf(x.x, kf[0], fmaf(x.y, kf[1], fmaf(x.z, kf[2], fmaf(x.w, kf[3], p[a]))));
        p[a] = fmaf(y.x, kf[4], fmaf(y.y, kf[5], fmaf(y.z, kf[6], fmaf(y.w, kf[7], p[a]))));
      }
    }
    // Online softmax of each head over the tile's keys (one a lane); p becomes the key's weight.
    float corr[kMaxWarpHeads];
#pragma unroll
    for (int a = 0; a < kMaxWarpHeads; ++a) {
      if (a >= warp_heads) break;
      const float s = lane < keys ? p[a] : -INFINITY;
      const float m_new = fmaxf(m_run[a], warp_max(s));  // finite: every tile has a key
      corr[a] = __expf(m_run[a] - m_new);                // 0 for the first tile (m_run -inf)
      p[a] = lane < keys ? __expf(s - m_new) : 0.0f;
      l_run[a] = l_run[a] * corr[a] + warp_sum(p[a]);
      m_run[a] = m_new;
    }
    // Output: lane owns dimensions 4 lane + 128 j of each head; acc = acc corr + sum_t p_t v_t.
#pragma unroll
    for (int a = 0; a < kMaxWarpHeads; ++a) {
      if (a >= warp_heads) break;
#pragma unroll
      for (int j = 0; j < kMaxLaneChunks; ++j)
#pragma unroll
        for (int k = 0; k < 4; ++k) acc[a][j][k] *= corr[a];
    }
    for (int t = 0; t < keys; ++t) {
      float w[kMaxWarpHeads];
#pragma unroll
      for (int a = 0; a < kMaxWarpHeads; ++a) w[a] = a < warp_heads ? __shfl_sync(0xffffffffu, p[a], t) : 0.0f;
#pragma unroll
      for (int j = 0; j < kMaxLaneChunks; ++j) {
        const int c = 4 * lane + 128 * j;
        if (c >= d) break;
        const uint2 bits = *reinterpret_cast<const uint2*>(v_s + t * row + c);
        const float2 v01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits.x));
        const float2 v23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits.y));
#pragma unroll
        for (int a = 0; a < kMaxWarpHeads; ++a) {
          if (a >= warp_heads) break;
          acc[a][j][0] = fmaf(w[a], v01.x, acc[a][j][0]);
          acc[a][j][1] = fmaf(w[a], v01.y, acc[a][j][1]);
          acc[a][j][2] = fmaf(w[a], v23.x, acc[a][j][2]);
          acc[a][j][3] = fmaf(w[a], v23.y, acc[a][j][3]);
        }
      }
    }
  }
#pragma unroll
  for (int a = 0; a < kMaxWarpHeads; ++a) {
    if (a >= warp_heads) break;
    float* o = out + (warp + a * kWarps) * (d + 2);
#pragma unroll
    for (int j = 0; j < kMaxLaneChunks; ++j) {
      const int c = 4 * lane + 128 * j;
      if (c >= d) break;
      *reinterpret_cast<float2*>(o + c) = make_float2(acc[a][j][0], acc[a][j][1]);
      *reinterpret_cast<float2*>(o + c + 2) = make_float2(acc[a][j][2], acc[a][j][3]);
    }
    if (lane == 0) {
      o[d] = m_run[a];
      o[d + 1] = l_run[a];
    }
  }
}

constexpr int kKeyPad = 4;  // floats after each key row: lanes reading float4s of 8 keys hit distinct banks

// One sequence (n = 1: a grid of a few dozen blocks, where each block's latency is the step's):
// the contract of decode_partial_kernel, with a thread per (head, key) pair for the scores and per
// output element for the values, everything through shared memory in fp32. Of the two kernels it is
// the faster for one sequence and the slower for batches (benchmarks/RESULTS.md).
// Shared memory of one block: the group's queries (fp32), a tile of keys (fp32, rows padded so that
// lanes reading the same four dimensions of different keys hit different banks), the tile's values
// (fp32) and scores, and each head's running max, sum and rescaling factor.
size_t single_shared_bytes(int group, int d) {
  return sizeof(float) * (static_cast<size_t>(group) * d + static_cast<size_t>(kTileKeys) * (d + kKeyPad) +
                          static_cast<size_t>(kTileKeys) * d + static_cast<size_t>(group) * kTileKeys + 3 * group);
}

// Block (split, g, i): query i's heads of KV group g against the split's share of its keys.
// partial: [n, splits, heads, d + 2] = the unnormalised output, then the max and the exp-sum.
__global__ void __launch_bounds__(kThreads)
    decode_partial_single_kernel(float* partial, const bf16* qkv, const bf16* kv, const int32_t* kv_row,
                                 const int32_t* position, const int32_t* doc_start, int heads, int kv_heads, int d,
                                 int splits, float scale) {
  extern __shared__ float smem[];
  const int g = blockIdx.y;
  const int64_t i = blockIdx.z;
  const int group = heads / kv_heads, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float* q_s = smem;                             // [group][d]
  float* k_s = q_s + group * d;                  // [kTileKeys][d + kKeyPad]
  float* v_s = k_s + kTileKeys * (d + kKeyPad);  // [kTileKeys][d]
  float* p_s = v_s + kTileKeys * d;              // [group][kTileKeys]
  float* m_s = p_s + group * kTileKeys;          // [group]
  float* l_s = m_s + group;                      // [group]
  float* c_s = l_s + group;                      // [group]: this tile's rescaling of the running sums
  int64_t begin = 0, end = 0;
  float* out = nullptr;
  if (!split_keys(partial, position, doc_start, heads, group, d, splits, begin, end, out)) return;
  const int64_t qkv_width = static_cast<int64_t>(heads + 2 * kv_heads) * d, kv_width = 2LL * kv_heads * d;
  for (int e = tid; e < group * d; e += kThreads)
    q_s[e] = __bfloat162float(qkv[i * qkv_width + static_cast<int64_t>(g) * group * d + e]) * scale;
  for (int h = tid; h < group; h += kThreads) {
    m_s[h] = -INFINITY;
    l_s[h] = 0.0f;
  }
  // Each thread's output elements: (head, dimension) pairs tid, tid + kThreads, ...
  constexpr int kMaxOwned = kMaxGroup * kMaxHeadDim / kThreads;
  float acc[kMaxOwned];
  const int owned = (group * d + kThreads - 1) / kThreads;
#pragma unroll
  for (int k = 0; k < kMaxOwned; ++k) acc[k] = 0.0f;
  __syncthreads();
  for (int64_t k0 = begin; k0 < end; k0 += kTileKeys) {
    const int keys = static_cast<int>(min(static_cast<int64_t>(kTileKeys), end - k0));
    // Keys and values of the tile: 8 bf16 (16 bytes) a load.
    const int vectors = d / 8;
    for (int e = tid; e < keys * vectors; e += kThreads) {
      const int t = e / vectors, c = (e % vectors) * 8;
      const bf16* row = kv + static_cast<int64_t>(kv_row[k0 + t]) * kv_width + static_cast<int64_t>(g) * d + c;
      const uint4 kbits = *reinterpret_cast<const uint4*>(row);
      const uint4 vbits = *reinterpret_cast<const uint4*>(row + static_cast<int64_t>(kv_heads) * d);
      const bf16* kh = reinterpret_cast<const bf16*>(&kbits);
      const bf16* vh = reinterpret_cast<const bf16*>(&vbits);
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        k_s[t * (d + kKeyPad) + c + u] = __bfloat162float(kh[u]);
        v_s[t * d + c + u] = __bfloat162float(vh[u]);
      }
    }
    __syncthreads();
    // Scores of every (head, key) pair; keys past the tile's end are masked.
    for (int e = tid; e < group * kTileKeys; e += kThreads) {
      const int h = e / kTileKeys, t = e % kTileKeys;
      float s = -INFINITY;
      if (t < keys) {
        const float4* q4 = reinterpret_cast<const float4*>(q_s + h * d);
        const float4* k4 = reinterpret_cast<const float4*>(k_s + t * (d + kKeyPad));
        float s0 = 0.0f, s1 = 0.0f;
        for (int c = 0; c < d / 4; ++c) {
          const float4 a = q4[c], k = k4[c];
          s0 = fmaf(a.x, k.x, fmaf(a.y, k.y, s0));
          s1 = fmaf(a.z, k.z, fmaf(a.w, k.w, s1));
        }
        s = s0 + s1;
      }
      p_s[h * kTileKeys + t] = s;
    }
    __syncthreads();
    // Online softmax per head: a warp per head, a lane per key.
    for (int h = warp; h < group; h += kThreads / 32) {
      const float s = p_s[h * kTileKeys + lane];
      const float m_old = m_s[h], m_new = fmaxf(m_old, warp_max(s));
      const float p = s == -INFINITY ? 0.0f : __expf(s - m_new);
      p_s[h * kTileKeys + lane] = p;
      const float sum = warp_sum(p);
      if (lane == 0) {
        const float c = m_old == -INFINITY ? 0.0f : __expf(m_old - m_new);
        c_s[h] = c;
        l_s[h] = l_s[h] * c + sum;
        m_s[h] = m_new;
      }
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kMaxOwned; ++k) {
      const int e = tid + k * kThreads;
      if (k >= owned || e >= group * d) break;
      const int h = e / d, c = e % d;
      float a = acc[k] * c_s[h];
      for (int t = 0; t < keys; ++t) a = fmaf(p_s[h * kTileKeys + t], v_s[t * d + c], a);
      acc[k] = a;
    }
    __syncthreads();
  }
#pragma unroll
  for (int k = 0; k < kMaxOwned; ++k) {
    const int e = tid + k * kThreads;
    if (k >= owned || e >= group * d) break;
    out[(e / d) * (d + 2) + e % d] = acc[k];
  }
  for (int h = tid; h < group; h += kThreads) {
    out[h * (d + 2) + d] = m_s[h];
    out[h * (d + 2) + d + 1] = l_s[h];
  }
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

}  // namespace

bool decode_attention_supported(int64_t heads, int64_t kv_heads, int64_t head_dim) {
  return kv_heads > 0 && heads % kv_heads == 0 && heads / kv_heads <= kMaxGroup && head_dim % 8 == 0 &&
         head_dim <= kMaxHeadDim;
}

int decode_attention_splits(int64_t n, int64_t n_kv) {
  const int64_t mean = n > 0 ? (n_kv + n - 1) / n : n_kv;
  const int64_t splits = (mean + kMinSplitKeys - 1) / kMinSplitKeys;
  return static_cast<int>(splits < 1 ? 1 : splits > kDecodeMaxSplits ? kDecodeMaxSplits : splits);
}

cudaError_t decode_attention(bf16* out, float* lse, float* scratch, const bf16* qkv, const bf16* kv,
                             const int32_t* kv_row, const int32_t* position, const int32_t* doc_start, int64_t n,
                             int splits, int64_t heads, int64_t kv_heads, int64_t head_dim, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (!decode_attention_supported(heads, kv_heads, head_dim) || n > 65535 || splits < 1 || splits > kDecodeMaxSplits)
    return cudaErrorInvalidValue;
  const int d = static_cast<int>(head_dim);
  const int group = static_cast<int>(heads / kv_heads);
  const bool single = n == 1;
  auto* kernel = single ? decode_partial_single_kernel : decode_partial_kernel;
  const size_t smem = single ? single_shared_bytes(group, d) : shared_bytes(group, d);
  if (smem > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(kv_heads), static_cast<unsigned>(n));
  kernel<<<grid, kThreads, smem, stream>>>(scratch, qkv, kv, kv_row, position, doc_start, static_cast<int>(heads),
                                           static_cast<int>(kv_heads), d, splits,
                                           1.0f / std::sqrt(static_cast<float>(head_dim)));
  const cudaError_t launched = cudaGetLastError();
  if (launched != cudaSuccess) return launched;
  const unsigned head_blocks = static_cast<unsigned>((heads + kMergeHeads - 1) / kMergeHeads);
  decode_merge_kernel<<<dim3(static_cast<unsigned>(n), head_blocks), kMergeHeads * 32, 0, stream>>>(
      out, lse, scratch, static_cast<int>(heads), d, splits);
  return cudaGetLastError();
}

}  // namespace glm::cuda
