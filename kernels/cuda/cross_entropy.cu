// One block per row: the online max and sum of exponentials (and the argmax), then the gradient.
#include <climits>

#include "kernels/cuda/cross_entropy.cuh"
#include "kernels/cuda/vec.cuh"

namespace glm::cuda {
namespace {

// Minimum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ int block_min_int(int v) {
  __shared__ int partial[32];
  __shared__ int total;
  for (int offset = 16; offset > 0; offset >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, offset));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int w = lane < static_cast<int>(blockDim.x >> 5) ? partial[lane] : INT_MAX;
    for (int offset = 16; offset > 0; offset >>= 1) w = min(w, __shfl_xor_sync(0xffffffffu, w, offset));
    if (lane == 0) total = w;
  }
  __syncthreads();
  const int result = total;
  __syncthreads();
  return result;
}

// Running (max, sum of exp(x - max)) pairs merged across threads: the online softmax statistics.
struct MaxSum {
  float m, s;
};
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};
  return {m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
}
__device__ __forceinline__ void add_value(MaxSum& a, float x) {
  if (x == -INFINITY) return;  // exp(-inf - -inf) would be NaN
  if (x > a.m) {
    a.s = a.s * __expf(a.m - x) + 1.0f;
    a.m = x;
  } else {
    a.s += __expf(x - a.m);
  }
}
__device__ __forceinline__ MaxSum block_max_sum(MaxSum v) {
  __shared__ MaxSum partial[32];
  __shared__ MaxSum total;
  for (int offset = 16; offset > 0; offset >>= 1) {
    MaxSum o{__shfl_xor_sync(0xffffffffu, v.m, offset), __shfl_xor_sync(0xffffffffu, v.s, offset)};
    v = merge(v, o);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    MaxSum w = lane < static_cast<int>(blockDim.x >> 5) ? partial[lane] : MaxSum{-INFINITY, 0.0f};
    for (int offset = 16; offset > 0; offset >>= 1) {
      MaxSum o{__shfl_xor_sync(0xffffffffu, w.m, offset), __shfl_xor_sync(0xffffffffu, w.s, offset)};
      w = merge(w, o);
    }
    if (lane == 0) total = w;
  }
  __syncthreads();
  const MaxSum result = total;
  __syncthreads();
  return result;
}

// Two passes over the row: the online max and sum of exponentials (with the first argmax), then
// the gradient. The logits are bf16 (the lm_head GEMM rounds its fp32 sums once, as PyTorch's bf16
// matmul does) and the gradient may overwrite them in place: each thread rewrites exactly the
// elements it reads in the second pass, and the target's logit is read before the block's first
// barrier, ahead of any write. Rows are read as 16-byte vectors of 8 when vocab is a multiple of 8
// (every row then 16-byte aligned), element by element otherwise.
template <bool Vec>
__global__ void cross_entropy_kernel(float* losses, int32_t* correct, bf16* dlogits, const bf16* logits,
                                     const int32_t* targets, int64_t vocab, float grad_scale) {
  const int64_t r = blockIdx.x;
  const int32_t target = targets[r];
  const bf16* z = logits + r * vocab;
  bf16* dz = dlogits != nullptr ? dlogits + r * vocab : nullptr;
  if (target < 0) {
    if (threadIdx.x == 0) {
      losses[r] = 0.0f;
      if (correct != nullptr) correct[r] = 0;
    }
    if (dz != nullptr)
      for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) dz[v] = __float2bfloat16(0.0f);
    return;
  }
  const float target_logit = threadIdx.x == 0 ? __bfloat162float(z[target]) : 0.0f;
  MaxSum ms{-INFINITY, 0.0f};
  float best = -INFINITY;
  int first_max = INT_MAX;  // vocab < 2^31: the lowest index holding the maximum
  auto see = [&](float x, int64_t v) {
    add_value(ms, x);
    if (x > best || (x == best && v < first_max)) {
      best = x;
      first_max = static_cast<int>(v);
    }
  };
  if constexpr (Vec) {
    const uint4* z8 = reinterpret_cast<const uint4*>(z);
    for (int64_t i = threadIdx.x; i < vocab / 8; i += blockDim.x) {
      float x[8];
      unpack_bf16x8(z8[i], x);
#pragma unroll
      for (int k = 0; k < 8; ++k) see(x[k], 8 * i + k);
    }
  } else {
    for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) see(__bfloat162float(z[v]), v);
  }
  const MaxSum row = block_max_sum(ms);  // its barriers: every read of the first pass is done
  if (correct != nullptr) {              // uniform across the block: every thread joins the reductions
    const float mx = block_max(best);
    first_max = block_min_int(best == mx ? first_max : INT_MAX);
    if (threadIdx.x == 0) correct[r] = first_max == target ? 1 : 0;
  }
  const float lse = row.m + __logf(row.s);
  if (threadIdx.x == 0) losses[r] = lse - target_logit;
  if (dz == nullptr) return;
  auto grad = [&](float x, int64_t v) { return (__expf(x - lse) - (v == target ? 1.0f : 0.0f)) * grad_scale; };
  if constexpr (Vec) {
    const uint4* z8 = reinterpret_cast<const uint4*>(z);
    for (int64_t i = threadIdx.x; i < vocab / 8; i += blockDim.x) {
      float x[8];
      unpack_bf16x8(z8[i], x);
#pragma unroll
      for (int k = 0; k < 8; ++k) x[k] = grad(x[k], 8 * i + k);
      reinterpret_cast<uint4*>(dz)[i] = pack_bf16x8(x);
    }
  } else {
    for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) dz[v] = __float2bfloat16(grad(__bfloat162float(z[v]), v));
  }
}

// One block per row: each thread's first maximum, then the block's (the lowest index of the maximum).
__global__ void argmax_rows_kernel(int32_t* ids, const float* values, int64_t cols) {
  const float* row = values + static_cast<int64_t>(blockIdx.x) * cols;
  float best = -INFINITY;
  int first = INT_MAX;
  // kUnroll loads in flight before the first comparison; each thread still meets its columns in order.
  constexpr int kUnroll = 8;
  const int64_t step = blockDim.x;
  for (int64_t v0 = threadIdx.x; v0 < cols; v0 += kUnroll * step) {
    float x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) x[u] = v0 + u * step < cols ? row[v0 + u * step] : -INFINITY;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = v0 + u * step;
      if (v < cols && (x[u] > best || first == INT_MAX)) {  // a row of -inf (or NaN) still names its first column
        best = x[u];
        first = static_cast<int>(v);
      }
    }
  }
  const float mx = block_max(best);
  first = block_min_int(best == mx ? first : INT_MAX);
  if (threadIdx.x == 0) ids[blockIdx.x] = first == INT_MAX ? 0 : first;
}

// One block per row: the online softmax statistics, then k passes, each taking the largest value
// after the previous pick in (value descending, column ascending) order.
__global__ void top_k_rows_kernel(int32_t* ids, float* top, float* stats, const float* values, int64_t cols, int k) {
  const int64_t r = blockIdx.x;
  const float* row = values + r * cols;
  MaxSum ms{-INFINITY, 0.0f};
  for (int64_t v = threadIdx.x; v < cols; v += blockDim.x) add_value(ms, row[v]);
  const MaxSum all = block_max_sum(ms);
  if (threadIdx.x == 0) {
    stats[2 * r] = all.m;
    stats[2 * r + 1] = logf(all.s);
  }
  float previous = INFINITY;
  int previous_col = -1;
  for (int j = 0; j < k; ++j) {
    float best = -INFINITY;
    int col = INT_MAX;
    for (int v = threadIdx.x; v < cols; v += blockDim.x) {
      const float x = row[v];
      const bool after = x < previous || (x == previous && v > previous_col);
      if (after && (col == INT_MAX || x > best)) {  // each thread meets its columns in ascending order
        best = x;
        col = v;
      }
    }
    const float mx = block_max(best);
    col = block_min_int(best == mx ? col : INT_MAX);
    if (threadIdx.x == 0) {
      ids[r * k + j] = col == INT_MAX ? -1 : col;
      top[r * k + j] = col == INT_MAX ? -INFINITY : row[col];  // the value itself: fmaxf may pick -0 for +0
    }
    previous = col == INT_MAX ? -INFINITY : mx;
    previous_col = col;
  }
}

}  // namespace

cudaError_t cross_entropy(float* losses, int32_t* correct, bf16* dlogits, const bf16* logits, const int32_t* targets,
                          int64_t rows, int64_t vocab, float grad_scale, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  // 16-byte vectors need 16-byte aligned rows: vocab a multiple of 8 and both bases aligned.
  const bool aligned = reinterpret_cast<uintptr_t>(logits) % 16 == 0 && reinterpret_cast<uintptr_t>(dlogits) % 16 == 0;
  if (vocab % 8 == 0 && aligned)
    cross_entropy_kernel<true><<<static_cast<unsigned int>(rows), 512, 0, stream>>>(losses, correct, dlogits, logits,
                                                                                    targets, vocab, grad_scale);
  else
    cross_entropy_kernel<false><<<static_cast<unsigned int>(rows), 512, 0, stream>>>(losses, correct, dlogits, logits,
                                                                                     targets, vocab, grad_scale);
  return cudaGetLastError();
}

cudaError_t argmax_rows(int32_t* ids, const float* values, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (rows > 0x7fffffff || cols < 1 || cols > INT_MAX) return cudaErrorInvalidValue;
  argmax_rows_kernel<<<static_cast<unsigned>(rows), 1024, 0, stream>>>(ids, values, cols);
  return cudaGetLastError();
}

cudaError_t top_k_rows(int32_t* ids, float* top, float* stats, const float* values, int64_t rows, int64_t cols,
                       int64_t k, cudaStream_t stream) {
  if (rows == 0 || k == 0) return cudaSuccess;
  if (rows > 0x7fffffff || cols < 1 || cols > INT_MAX || k < 0 || k > 4096) return cudaErrorInvalidValue;
  top_k_rows_kernel<<<static_cast<unsigned>(rows), 1024, 0, stream>>>(ids, top, stats, values, cols,
                                                                      static_cast<int>(k));
  return cudaGetLastError();
}

}  // namespace glm::cuda
