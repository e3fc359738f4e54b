// RMSNorm with 16-byte vectors where the hidden size allows (a multiple of 8, aligned rows), a
// scalar path elsewhere (the tiny configs' odd sizes). Forward: one block per row, each thread keeps
// its vectors of the row in registers, so the row is read once. Backward: a persistent grid in
// which each thread owns fixed columns across the rows its block visits, accumulating the weight
// gradient in registers; each block writes one fp32 partial row, and a second kernel sums the
// partials in a fixed order (deterministic, no atomics).
#include <algorithm>

#include "kernels/cuda/rmsnorm.cuh"
#include "kernels/cuda/vec.cuh"

namespace glm::cuda {
namespace {

constexpr int kScalarThreads = 256;
constexpr int kForwardVecsPerThread = 4;  // 64 bytes of x per thread in flight; 128 threads at hidden 4096
constexpr int kBackwardMaxThreads = 512;
constexpr int kBackwardMaxVecsPerThread = 4;  // vectorised backward up to hidden 512 x 8 x 4 = 16384

// Sums kCount values over the block at once (one pair of barriers); every thread gets the sums.
template <int kCount>
__device__ __forceinline__ void block_sum_n(float (&v)[kCount]) {
  __shared__ float partial[kCount][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = static_cast<int>(blockDim.x >> 5);
#pragma unroll
  for (int i = 0; i < kCount; ++i) {
    v[i] = warp_sum(v[i]);
    if (lane == 0) partial[i][warp] = v[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kCount; ++i) v[i] = warp_sum(lane < warps ? partial[i][lane] : 0.0f);
  __syncthreads();  // partial may be reused by the next call
}

// ---- forward ----

__global__ void rmsnorm_forward_scalar_kernel(bf16* out, float* rstd, const bf16* in, const bf16* weight, int64_t n,
                                              int64_t hidden, float eps) {
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const bf16* x = in + row * hidden;
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
      const float v = __bfloat162float(x[j]);
      ss += v * v;
    }
    ss = block_sum(ss);
    const float r = rsqrtf(ss / static_cast<float>(hidden) + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x)
      out[row * hidden + j] = __float2bfloat16(__bfloat162float(weight[j]) * (__bfloat162float(x[j]) * r));
  }
}

// Thread k-th vector: threadIdx.x + k * blockDim.x, k < kVecs; vecs = hidden / 8.
template <int kVecs>
__global__ void __launch_bounds__(1024) rmsnorm_forward_vec_kernel(bf16* out, float* rstd, const bf16* in,
                                                                    const bf16* weight, int64_t n, int vecs,
                                                                    float eps) {
  const uint4* w4 = reinterpret_cast<const uint4*>(weight);
  const float inv_hidden = 1.0f / static_cast<float>(vecs * kBf16PerVec);
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const uint4* x4 = reinterpret_cast<const uint4*>(in) + row * vecs;
    uint4* y4 = reinterpret_cast<uint4*>(out) + row * vecs;
    uint4 xv[kVecs], wv[kVecs];
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int v = static_cast<int>(threadIdx.x + k * blockDim.x);
      if (v < vecs) {
        xv[k] = x4[v];
        wv[k] = w4[v];
      }
    }
    float ss[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      if (static_cast<int>(threadIdx.x + k * blockDim.x) < vecs) {
        float f[8];
        unpack_bf16x8(xv[k], f);
#pragma unroll
        for (int e = 0; e < 8; ++e) ss[0] += f[e] * f[e];
      }
    }
    block_sum_n<1>(ss);
    const float r = rsqrtf(ss[0] * inv_hidden + eps);
    if (threadIdx.x == 0) rstd[row] = r;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int v = static_cast<int>(threadIdx.x + k * blockDim.x);
      if (v < vecs) {
        float f[8], g[8];
        unpack_bf16x8(xv[k], f);
        unpack_bf16x8(wv[k], g);
#pragma unroll
        for (int e = 0; e < 8; ++e) f[e] = g[e] * (f[e] * r);
        y4[v] = pack_bf16x8(f);
      }
    }
  }
}

// ---- backward ----

// Each block visits rows blockIdx.x, + gridDim.x, ...; thread j owns columns j, j + blockDim.x, ...
// and accumulates their weight gradient straight into the block's partial row (which only it
// touches), so no atomics are needed on this path either.
__global__ void rmsnorm_backward_scalar_kernel(bf16* din, float* partials, const bf16* dout, const bf16* in,
                                               const bf16* weight, const float* rstd, int64_t n, int64_t hidden) {
  float* acc = partials + static_cast<int64_t>(blockIdx.x) * hidden;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) acc[j] = 0.0f;
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const bf16* x = in + row * hidden;
    const bf16* g = dout + row * hidden;
    const float r = rstd[row];
    float dot = 0.0f;
    for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x)
      dot += __bfloat162float(g[j]) * __bfloat162float(weight[j]) * __bfloat162float(x[j]);
    dot = block_sum(dot);
    const float c = dot / static_cast<float>(hidden) * r * r * r;
    for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
      const float xv = __bfloat162float(x[j]), gv = __bfloat162float(g[j]);
      const float dx = r * gv * __bfloat162float(weight[j]) - xv * c;
      din[row * hidden + j] = __float2bfloat16(__bfloat162float(din[row * hidden + j]) + dx);
      acc[j] += gv * xv * r;
    }
  }
}

// kRows rows per iteration (rows b, b + G, ..., b + (kRows-1) G, then the next kRows G) so that
// kRows x kVecs x 3 vectors (x, dout, din) are in flight per thread before the one reduction.
template <int kVecs, int kRows>
__global__ void __launch_bounds__(kBackwardMaxThreads, kVecs == 1 ? 2 : 1) rmsnorm_backward_vec_kernel(
    bf16* din, float* partials, const bf16* dout, const bf16* in, const bf16* weight, const float* rstd, int64_t n,
    int vecs) {
  const float inv_hidden = 1.0f / static_cast<float>(vecs * kBf16PerVec);
  const uint4* w4 = reinterpret_cast<const uint4*>(weight);
  uint4 wv[kVecs];  // kept packed: unpacking is two integer ops, registers are the scarce part
  float acc[kVecs][8];
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int v = static_cast<int>(threadIdx.x + k * blockDim.x);
    wv[k] = v < vecs ? w4[v] : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[k][e] = 0.0f;
  }
  const int64_t grid = gridDim.x;
  for (int64_t row0 = blockIdx.x; row0 < n; row0 += kRows * grid) {
    // din is loaded with x and dout when registers allow (hidden <= 8192), else after the reduction.
    constexpr bool kPreloadDin = kVecs <= 2;
    uint4 xv[kRows][kVecs], gv[kRows][kVecs], dv[kRows][kPreloadDin ? kVecs : 1];
    float r[kRows], dot[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int64_t row = row0 + i * grid;
      r[i] = row < n ? rstd[row] : 0.0f;
      dot[i] = 0.0f;
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        const int v = static_cast<int>(threadIdx.x + k * blockDim.x);
        if (row < n && v < vecs) {
          const int64_t off = row * vecs + v;
          xv[i][k] = reinterpret_cast<const uint4*>(in)[off];
          gv[i][k] = reinterpret_cast<const uint4*>(dout)[off];
          if constexpr (kPreloadDin) dv[i][k] = reinterpret_cast<const uint4*>(din)[off];
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        if (row0 + i * grid < n && static_cast<int>(threadIdx.x + k * blockDim.x) < vecs) {
          float x[8], g[8], w[8];
          unpack_bf16x8(xv[i][k], x);
          unpack_bf16x8(gv[i][k], g);
          unpack_bf16x8(wv[k], w);
#pragma unroll
          for (int e = 0; e < 8; ++e) dot[i] += g[e] * w[e] * x[e];
        }
      }
    }
    block_sum_n<kRows>(dot);
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int64_t row = row0 + i * grid;
      const float c = dot[i] * inv_hidden * r[i] * r[i] * r[i];
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        const int v = static_cast<int>(threadIdx.x + k * blockDim.x);
        if (row < n && v < vecs) {
          float x[8], g[8], d[8], w[8];
          unpack_bf16x8(xv[i][k], x);
          unpack_bf16x8(gv[i][k], g);
          if constexpr (kPreloadDin)
            unpack_bf16x8(dv[i][k], d);
          else
            unpack_bf16x8(reinterpret_cast<const uint4*>(din)[row * vecs + v], d);
          unpack_bf16x8(wv[k], w);
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            d[e] += r[i] * g[e] * w[e] - x[e] * c;
            acc[k][e] += g[e] * x[e] * r[i];
          }
          reinterpret_cast<uint4*>(din)[row * vecs + v] = pack_bf16x8(d);
        }
      }
    }
  }
  float4* out = reinterpret_cast<float4*>(partials + static_cast<int64_t>(blockIdx.x) * vecs * kBf16PerVec);
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int v = static_cast<int>(threadIdx.x + k * blockDim.x);
    if (v < vecs) {
      out[2 * v] = make_float4(acc[k][0], acc[k][1], acc[k][2], acc[k][3]);
      out[2 * v + 1] = make_float4(acc[k][4], acc[k][5], acc[k][6], acc[k][7]);
    }
  }
}

// dweight[c] += sum over b < blocks of partials[b, c], always in the same order: 32 columns per
// block, 32 threads down each column (strided over b), then a fixed-order sum of the 32.
constexpr int kReduceColumns = 32, kReduceLanes = 32;
__global__ void __launch_bounds__(kReduceColumns* kReduceLanes)
    dweight_reduce_kernel(bf16* dweight, const float* partials, int blocks, int64_t hidden) {
  __shared__ float sums[kReduceLanes][kReduceColumns + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kReduceColumns + threadIdx.x;
  float s = 0.0f;
  if (c < hidden)
    for (int b = threadIdx.y; b < blocks; b += kReduceLanes) s += partials[static_cast<int64_t>(b) * hidden + c];
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < hidden) {
    float total = 0.0f;
    for (int i = 0; i < kReduceLanes; ++i) total += sums[i][threadIdx.x];
    dweight[c] = __float2bfloat16(__bfloat162float(dweight[c]) + total);
  }
}

// Which path a shape takes, and the launch geometry of the backward.
struct BackwardPlan {
  bool vectorised = false;
  int threads = kScalarThreads, vecs_per_thread = 0, rows_per_iteration = 1;
  int blocks = 0;
};

bool vector_path(const void* a, const void* b, const void* c, const void* d, int64_t hidden) {
  return hidden % kBf16PerVec == 0 && aligned16(a) && aligned16(b) && aligned16(c) && aligned16(d);
}

template <int kVecs, int kRows>
cudaError_t backward_blocks_per_sm(int threads, int* blocks) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, rmsnorm_backward_vec_kernel<kVecs, kRows>, threads, 0);
}

cudaError_t plan_backward(int64_t n, int64_t hidden, bool vectorised, BackwardPlan* plan) {
  plan->vectorised = false;
  int per_sm = 0;
  const int64_t vecs = hidden / kBf16PerVec;
  if (vectorised && vecs <= int64_t{kBackwardMaxThreads} * kBackwardMaxVecsPerThread) {
    plan->vectorised = true;
    plan->threads = static_cast<int>(std::min<int64_t>(kBackwardMaxThreads, (vecs + 31) / 32 * 32));
    plan->vecs_per_thread = static_cast<int>((vecs + plan->threads - 1) / plan->threads);
    if (plan->vecs_per_thread == 3) plan->vecs_per_thread = 4;
    plan->rows_per_iteration = plan->vecs_per_thread == 1 ? 2 : 1;
    cudaError_t err = cudaSuccess;
    switch (plan->vecs_per_thread) {
      case 1: err = backward_blocks_per_sm<1, 2>(plan->threads, &per_sm); break;
      case 2: err = backward_blocks_per_sm<2, 1>(plan->threads, &per_sm); break;
      default: err = backward_blocks_per_sm<4, 1>(plan->threads, &per_sm); break;
    }
    if (err != cudaSuccess) return err;
  } else {
    plan->threads = kScalarThreads;
    const cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, rmsnorm_backward_scalar_kernel,
                                                                          kScalarThreads, 0);
    if (err != cudaSuccess) return err;
  }
  int sms = 0;
  const cudaError_t err = multiprocessor_count(&sms);
  if (err != cudaSuccess) return err;
  // One resident wave: more blocks would only add partial rows to write and reduce.
  plan->blocks = static_cast<int>(std::min<int64_t>(n, int64_t{std::max(per_sm, 1)} * sms));
  return cudaSuccess;
}

}  // namespace

cudaError_t rmsnorm_forward(bf16* out, float* rstd, const bf16* in, const bf16* weight, int64_t n, int64_t hidden,
                            float eps, cudaStream_t stream) {
  if (n == 0 || hidden == 0) return cudaSuccess;
  const unsigned int grid = static_cast<unsigned int>(std::min<int64_t>(n, 0x7fffffff));
  const int64_t vecs = hidden / kBf16PerVec;
  if (vector_path(out, in, weight, weight, hidden)) {
    // Enough threads for kForwardVecsPerThread vectors each (128 at hidden 4096: 16 rows per SM).
    int64_t threads = (vecs + kForwardVecsPerThread - 1) / kForwardVecsPerThread;
    threads = std::max<int64_t>(32, (threads + 31) / 32 * 32);
    if (threads <= 1024) {  // hidden <= 32768; wider rows take the scalar path
      rmsnorm_forward_vec_kernel<kForwardVecsPerThread><<<grid, static_cast<unsigned int>(threads), 0, stream>>>(
          out, rstd, in, weight, n, static_cast<int>(vecs), eps);
      return cudaGetLastError();
    }
  }
  rmsnorm_forward_scalar_kernel<<<grid, kScalarThreads, 0, stream>>>(out, rstd, in, weight, n, hidden, eps);
  return cudaGetLastError();
}

cudaError_t rmsnorm_backward_scratch(int64_t n, int64_t hidden, int64_t* floats) {
  *floats = 0;
  if (n == 0 || hidden == 0) return cudaSuccess;
  BackwardPlan plan;
  // The scalar plan is never larger than the vectorised one would be at the same occupancy; size
  // for whichever path the pointers will allow by taking the larger of the two.
  cudaError_t err = plan_backward(n, hidden, true, &plan);
  if (err != cudaSuccess) return err;
  int64_t blocks = plan.blocks;
  err = plan_backward(n, hidden, false, &plan);
  if (err != cudaSuccess) return err;
  blocks = std::max<int64_t>(blocks, plan.blocks);
  *floats = blocks * hidden;
  return cudaSuccess;
}

cudaError_t rmsnorm_backward(bf16* din, bf16* dweight, float* scratch, const bf16* dout, const bf16* in,
                             const bf16* weight, const float* rstd, int64_t n, int64_t hidden, cudaStream_t stream) {
  if (n == 0 || hidden == 0) return cudaSuccess;
  BackwardPlan plan;
  cudaError_t err = plan_backward(n, hidden, vector_path(din, dout, in, weight, hidden), &plan);
  if (err != cudaSuccess) return err;
  const int vecs = static_cast<int>(hidden / kBf16PerVec);
  if (!plan.vectorised) {
    rmsnorm_backward_scalar_kernel<<<plan.blocks, plan.threads, 0, stream>>>(din, scratch, dout, in, weight, rstd, n,
                                                                              hidden);
  } else if (plan.vecs_per_thread == 1) {
    rmsnorm_backward_vec_kernel<1, 2><<<plan.blocks, plan.threads, 0, stream>>>(din, scratch, dout, in, weight, rstd,
                                                                                n, vecs);
  } else if (plan.vecs_per_thread == 2) {
    rmsnorm_backward_vec_kernel<2, 1><<<plan.blocks, plan.threads, 0, stream>>>(din, scratch, dout, in, weight, rstd,
                                                                                n, vecs);
  } else {
    rmsnorm_backward_vec_kernel<4, 1><<<plan.blocks, plan.threads, 0, stream>>>(din, scratch, dout, in, weight, rstd,
                                                                                n, vecs);
  }
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const dim3 reduce_threads(kReduceColumns, kReduceLanes);
  const unsigned int reduce_grid = static_cast<unsigned int>((hidden + kReduceColumns - 1) / kReduceColumns);
  dweight_reduce_kernel<<<reduce_grid, reduce_threads, 0, stream>>>(dweight, scratch, plan.blocks, hidden);
  return cudaGetLastError();
}

}  // namespace glm::cuda
