// Dropout kernels: one 16-byte vector of 8 bf16 per thread and iteration where the pointers allow,
// element by element for the rest. Memory-bound: one splitmix64 hash per element.
#include <algorithm>

#include "base/counter_rng.h"
#include "kernels/cuda/dropout.cuh"
#include "kernels/cuda/vec.cuh"

namespace glm::cuda {
namespace {

constexpr int kThreads = 256;
constexpr unsigned int kMaxBlocks = 4096;  // grid-stride beyond that

template <bool kAccumulate>
__global__ void dropout_vec_kernel(bf16* out, const bf16* in, int64_t vecs, uint64_t key, uint64_t offset,
                                   uint64_t threshold, float scale) {
  const uint4* src = reinterpret_cast<const uint4*>(in);
  uint4* dst = reinterpret_cast<uint4*>(out);
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < vecs;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float x[kBf16PerVec], y[kBf16PerVec];
    unpack_bf16x8(src[v], x);
    if constexpr (kAccumulate) unpack_bf16x8(dst[v], y);
    const uint64_t first = offset + static_cast<uint64_t>(v) * kBf16PerVec;
#pragma unroll
    for (int j = 0; j < kBf16PerVec; ++j) {
      const float d = counter_keep(key, first + j, threshold) ? __fmul_rn(x[j], scale) : 0.0f;
      if constexpr (kAccumulate) {
        y[j] += d;
      } else {
        y[j] = d;
      }
    }
    dst[v] = pack_bf16x8(y);
  }
}

template <bool kAccumulate>
__global__ void dropout_kernel(bf16* out, const bf16* in, int64_t n, uint64_t key, uint64_t offset, uint64_t threshold,
                               float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float d = counter_keep(key, offset + static_cast<uint64_t>(i), threshold)
                        ? __fmul_rn(__bfloat162float(in[i]), scale)
                        : 0.0f;
    if constexpr (kAccumulate) {
      out[i] = __float2bfloat16(__bfloat162float(out[i]) + d);
    } else {
      out[i] = __float2bfloat16(d);
    }
  }
}

template <bool kAccumulate>
cudaError_t launch(bf16* out, const bf16* in, int64_t n, uint64_t key, uint64_t offset, uint64_t threshold, float scale,
                   cudaStream_t stream) {
  // The vector body needs both pointers 16-byte aligned; the last n % 8 elements go one by one.
  const int64_t vecs = aligned16(out) && aligned16(in) ? n / kBf16PerVec : 0;
  if (vecs > 0) {
    dropout_vec_kernel<kAccumulate><<<std::min(grid_for(vecs, kThreads), kMaxBlocks), kThreads, 0, stream>>>(
        out, in, vecs, key, offset, threshold, scale);
  }
  const int64_t done = vecs * kBf16PerVec, rest = n - done;
  if (rest > 0) {
    dropout_kernel<kAccumulate><<<std::min(grid_for(rest, kThreads), kMaxBlocks), kThreads, 0, stream>>>(
        out + done, in + done, rest, key, offset + static_cast<uint64_t>(done), threshold, scale);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t dropout(bf16* out, const bf16* in, int64_t n, double p, uint64_t key, int64_t offset, bool accumulate,
                    cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (!(p >= 0.0 && p < 1.0) || offset < 0) return cudaErrorInvalidValue;
  const uint64_t threshold = dropout_threshold(p);
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  const uint64_t first = static_cast<uint64_t>(offset);
  return accumulate ? launch<true>(out, in, n, key, first, threshold, scale, stream)
                    : launch<false>(out, in, n, key, first, threshold, scale, stream);
}

}  // namespace glm::cuda
