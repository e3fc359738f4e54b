// Element-wise kernels; 64-bit indices throughout.
#include <algorithm>

#include "base/counter_rng.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/vec.cuh"

namespace glm::cuda {
namespace {

__global__ void add_kernel(bf16* out, const bf16* a, const bf16* b, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}

template <typename D, typename S>
__device__ __forceinline__ D cast(S v);
template <>
__device__ __forceinline__ float cast<float, float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float cast<float, double>(double v) {
  return static_cast<float>(v);
}
template <>
__device__ __forceinline__ float cast<float, bf16>(bf16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ double cast<double, float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ double cast<double, double>(double v) {
  return v;
}
template <>
__device__ __forceinline__ double cast<double, bf16>(bf16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ bf16 cast<bf16, float>(float v) {
  return __float2bfloat16(v);
}
template <>
__device__ __forceinline__ bf16 cast<bf16, double>(double v) {
  return __double2bfloat16(v);
}
template <>
__device__ __forceinline__ bf16 cast<bf16, bf16>(bf16 v) {
  return v;
}

template <typename D, typename S>
__global__ void convert_kernel(D* dst, const S* src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = cast<D, S>(src[i]);
}

template <typename D, typename S>
cudaError_t launch_convert(void* dst, const void* src, int64_t n, cudaStream_t stream) {
  convert_kernel<D, S><<<grid_for(n, 256), 256, 0, stream>>>(static_cast<D*>(dst), static_cast<const S*>(src), n);
  return cudaGetLastError();
}

// bf16 <-> fp32 in 16-byte vectors of 8 elements where both pointers allow it (ZeRO packs gradient
// buckets and unpacks shards through these, so they must run near copy bandwidth, which one element
// per thread does not reach); the last n % 8 elements and misaligned views take the scalar kernel.
__global__ void bf16_to_f32_vec_kernel(float* dst, const bf16* src, int64_t vecs) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float f[8];
    unpack_bf16x8(reinterpret_cast<const uint4*>(src)[i], f);
    reinterpret_cast<float4*>(dst)[2 * i] = make_float4(f[0], f[1], f[2], f[3]);
    reinterpret_cast<float4*>(dst)[2 * i + 1] = make_float4(f[4], f[5], f[6], f[7]);
  }
}
__global__ void f32_to_bf16_vec_kernel(bf16* dst, const float* src, int64_t vecs) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 a = reinterpret_cast<const float4*>(src)[2 * i], b = reinterpret_cast<const float4*>(src)[2 * i + 1];
    const float f[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    reinterpret_cast<uint4*>(dst)[i] = pack_bf16x8(f);
  }
}

template <typename T>
__device__ __forceinline__ float squares8(const T* x, int64_t i);
template <>
__device__ __forceinline__ float squares8<bf16>(const bf16* x, int64_t i) {
  float f[8];
  unpack_bf16x8(reinterpret_cast<const uint4*>(x)[i], f);
  float acc = 0.0f;
#pragma unroll
  for (int k = 0; k < 8; ++k) acc += f[k] * f[k];
  return acc;
}
template <>
__device__ __forceinline__ float squares8<float>(const float* x, int64_t i) {
  const float4 a = reinterpret_cast<const float4*>(x)[2 * i], b = reinterpret_cast<const float4*>(x)[2 * i + 1];
  return a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
}

// Sum of squares into *result (fp64 atomics, one per block): 8 elements per 16-byte vector read
// where x is aligned, the rest (or all of a misaligned x) element by element.
template <typename T>
__global__ void sum_squares_kernel(double* result, const T* x, int64_t n, bool vectorized) {
  float acc = 0.0f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t vecs = vectorized ? n / 8 : 0;
  for (int64_t i = first; i < vecs; i += stride) acc += squares8(x, i);
  for (int64_t i = vecs * 8 + first; i < n; i += stride) {
    const float v = cast<float, T>(x[i]);
    acc += v * v;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) atomicAdd(result, static_cast<double>(acc));
}

// Column sums in two deterministic passes: each block sums a 64-column by rows_per_split-row tile
// (8 warps over rows, each lane two columns) into partial[split, column]; the second pass adds the
// splits in order to out. 64-row splits give thousands of blocks for GLM-4's bias widths.
__global__ void column_partial_kernel(float* partial, const bf16* in, int64_t rows, int64_t cols,
                                      int64_t rows_per_split) {
  const int lane = threadIdx.x & 31, group = threadIdx.x >> 5;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * 64 + lane;
  const int64_t r_begin = static_cast<int64_t>(blockIdx.y) * rows_per_split;
  const int64_t r_end = r_begin + rows_per_split < rows ? r_begin + rows_per_split : rows;
  float a0 = 0.0f, a1 = 0.0f;
  for (int64_t r = r_begin + group; r < r_end; r += 8) {
    const bf16* row = in + r * cols;
    if (c0 < cols) a0 += __bfloat162float(row[c0]);
    if (c0 + 32 < cols) a1 += __bfloat162float(row[c0 + 32]);
  }
  __shared__ float sums[8][64];
  sums[group][lane] = a0;
  sums[group][lane + 32] = a1;
  __syncthreads();
  if (threadIdx.x < 64) {
    float t = 0.0f;
    for (int g = 0; g < 8; ++g) t += sums[g][threadIdx.x];
    const int64_t c = static_cast<int64_t>(blockIdx.x) * 64 + threadIdx.x;
    if (c < cols) partial[static_cast<int64_t>(blockIdx.y) * cols + c] = t;
  }
}

__global__ void column_finish_kernel(bf16* out, const float* partial, int64_t splits, int64_t cols) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  float sum = 0.0f;
  for (int64_t s = 0; s < splits; ++s) sum += partial[s * cols + c];
  out[c] = __float2bfloat16(__bfloat162float(out[c]) + sum);
}

int64_t column_rows_per_split(int64_t rows) { return std::max<int64_t>(64, (rows + 255) / 256); }

__global__ void accumulate_kernel(bf16* dst, const float* src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = __float2bfloat16(__bfloat162float(dst[i]) + src[i]);
}

template <typename D>
__global__ void fill_kernel(D* dst, int64_t n, double value, bool normal, uint64_t key, int64_t offset) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double v = normal ? value * counter_normal(key, static_cast<uint64_t>(offset + i)) : value;
    dst[i] = cast<D, double>(v);
  }
}

cudaError_t launch_fill(void* dst, int dst_dtype, int64_t n, double value, bool normal, uint64_t key, int64_t offset,
                        cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const unsigned int grid = std::min<unsigned int>(grid_for(n, 256), 4096);
  if (dst_dtype == 0)
    fill_kernel<float><<<grid, 256, 0, stream>>>(static_cast<float*>(dst), n, value, normal, key, offset);
  else if (dst_dtype == 1)
    fill_kernel<double><<<grid, 256, 0, stream>>>(static_cast<double*>(dst), n, value, normal, key, offset);
  else if (dst_dtype == 2)
    fill_kernel<bf16><<<grid, 256, 0, stream>>>(static_cast<bf16*>(dst), n, value, normal, key, offset);
  else
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}

template <typename D>
__global__ void scale_kernel(D* x, int64_t n, float factor) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = cast<D, float>(cast<float, D>(x[i]) * factor);
}

// Range blockIdx.y: the bytes before its first 16-byte boundary and after its last one one at a
// time, the 16-byte vectors between grid-strided.
__global__ void zero_ranges_kernel(const __grid_constant__ ZeroRanges r) {
  auto* p = static_cast<unsigned char*>(r.ptr[blockIdx.y]);
  const int64_t n = r.bytes[blockIdx.y];
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t head = std::min<int64_t>(n, (16 - static_cast<int64_t>(reinterpret_cast<uintptr_t>(p) % 16)) % 16);
  const int64_t vecs = (n - head) / 16, tail = head + vecs * 16;
  if (t < head) p[t] = 0;
  auto* body = reinterpret_cast<uint4*>(p + head);
  for (int64_t i = t; i < vecs; i += stride) body[i] = make_uint4(0, 0, 0, 0);
  if (t < n - tail) p[tail + t] = 0;
}

}  // namespace

cudaError_t zero_ranges(const ZeroRanges& ranges, cudaStream_t stream) {
  if (ranges.count <= 0) return cudaSuccess;
  if (ranges.count > kZeroRanges) return cudaErrorInvalidValue;
  int64_t widest = 0;
  for (int k = 0; k < ranges.count; ++k) widest = std::max(widest, ranges.bytes[k]);
  // Enough 256-thread blocks for the widest range's vectors (at most 1024; they stride beyond).
  const auto blocks = static_cast<unsigned int>(std::clamp<int64_t>((widest / 16 + 255) / 256, 1, 1024));
  zero_ranges_kernel<<<dim3(blocks, static_cast<unsigned int>(ranges.count)), 256, 0, stream>>>(ranges);
  return cudaGetLastError();
}

cudaError_t scale(void* x, int dtype, int64_t n, double factor, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const unsigned int grid = std::min<unsigned int>(grid_for(n, 256), 4096);
  const float f = static_cast<float>(factor);
  if (dtype == 0)
    scale_kernel<float><<<grid, 256, 0, stream>>>(static_cast<float*>(x), n, f);
  else if (dtype == 2)
    scale_kernel<bf16><<<grid, 256, 0, stream>>>(static_cast<bf16*>(x), n, f);
  else
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t fill(void* dst, int dst_dtype, int64_t n, double value, cudaStream_t stream) {
  return launch_fill(dst, dst_dtype, n, value, false, 0, 0, stream);
}

cudaError_t fill_normal(void* dst, int dst_dtype, int64_t n, uint64_t key, int64_t offset, double std,
                        cudaStream_t stream) {
  return launch_fill(dst, dst_dtype, n, std, true, key, offset, stream);
}

cudaError_t accumulate_into_bf16(bf16* dst, const float* src, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  accumulate_kernel<<<grid_for(n, 256), 256, 0, stream>>>(dst, src, n);
  return cudaGetLastError();
}

cudaError_t add_bf16(bf16* out, const bf16* a, const bf16* b, int64_t n, cudaStream_t stream) {
  add_kernel<<<grid_for(n, 256), 256, 0, stream>>>(out, a, b, n);
  return cudaGetLastError();
}

cudaError_t convert(void* dst, int dst_dtype, const void* src, int src_dtype, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  // 0 f32, 1 f64, 2 bf16
  if (dst_dtype == 0 && src_dtype == 0) return launch_convert<float, float>(dst, src, n, stream);
  if (dst_dtype == 0 && src_dtype == 1) return launch_convert<float, double>(dst, src, n, stream);
  if ((dst_dtype == 0 && src_dtype == 2) || (dst_dtype == 2 && src_dtype == 0)) {
    if (aligned16(dst) && aligned16(src) && n >= 8) {
      const int64_t vecs = n / 8;
      if (dst_dtype == 0)
        bf16_to_f32_vec_kernel<<<grid_for(vecs, 256), 256, 0, stream>>>(static_cast<float*>(dst),
                                                                        static_cast<const bf16*>(src), vecs);
      else
        f32_to_bf16_vec_kernel<<<grid_for(vecs, 256), 256, 0, stream>>>(static_cast<bf16*>(dst),
                                                                        static_cast<const float*>(src), vecs);
      const cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess || n % 8 == 0) return e;
      const int64_t done = vecs * 8;
      dst = static_cast<char*>(dst) + done * (dst_dtype == 0 ? 4 : 2);
      src = static_cast<const char*>(src) + done * (src_dtype == 0 ? 4 : 2);
      n -= done;
    }
    return dst_dtype == 0 ? launch_convert<float, bf16>(dst, src, n, stream) : launch_convert<bf16, float>(dst, src, n, stream);
  }
  if (dst_dtype == 1 && src_dtype == 0) return launch_convert<double, float>(dst, src, n, stream);
  if (dst_dtype == 1 && src_dtype == 1) return launch_convert<double, double>(dst, src, n, stream);
  if (dst_dtype == 1 && src_dtype == 2) return launch_convert<double, bf16>(dst, src, n, stream);
  if (dst_dtype == 2 && src_dtype == 1) return launch_convert<bf16, double>(dst, src, n, stream);
  if (dst_dtype == 2 && src_dtype == 2) return launch_convert<bf16, bf16>(dst, src, n, stream);
  return cudaErrorInvalidValue;
}

cudaError_t sum_squares_bf16(double* result, const bf16* x, int64_t n, cudaStream_t stream) {
  sum_squares_kernel<bf16><<<std::min<unsigned int>(grid_for(n / 8 + 1, 512), 1024), 512, 0, stream>>>(
      result, x, n, aligned16(x));
  return cudaGetLastError();
}

cudaError_t sum_squares_f32(double* result, const float* x, int64_t n, cudaStream_t stream) {
  sum_squares_kernel<float><<<std::min<unsigned int>(grid_for(n / 8 + 1, 512), 1024), 512, 0, stream>>>(
      result, x, n, aligned16(x));
  return cudaGetLastError();
}

int64_t column_sum_scratch(int64_t rows, int64_t cols) {
  const int64_t per = column_rows_per_split(rows);
  return ((rows + per - 1) / per) * cols;
}

cudaError_t column_sum_accumulate(bf16* out, const bf16* in, float* scratch, int64_t rows, int64_t cols,
                                  cudaStream_t stream) {
  if (cols == 0) return cudaSuccess;
  const int64_t per = column_rows_per_split(rows), splits = (rows + per - 1) / per;
  if (splits > 0) {
    const dim3 grid(static_cast<unsigned int>((cols + 63) / 64), static_cast<unsigned int>(splits));
    column_partial_kernel<<<grid, 256, 0, stream>>>(scratch, in, rows, cols, per);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  column_finish_kernel<<<grid_for(cols, 256), 256, 0, stream>>>(out, scratch, splits, cols);
  return cudaGetLastError();
}

}  // namespace glm::cuda
