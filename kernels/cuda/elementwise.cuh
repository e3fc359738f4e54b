// Element-wise kernels over flat buffers: add, dtype conversion, sum of squares, zero-copy helpers.
#pragma once

#include "kernels/cuda/common.cuh"

namespace glm::cuda {

cudaError_t add_bf16(bf16* out, const bf16* a, const bf16* b, int64_t n, cudaStream_t stream);
// x[i] *= factor in place (fp32 arithmetic); dtype code 0 f32 or 2 bf16.
cudaError_t scale(void* x, int dtype, int64_t n, double factor, cudaStream_t stream);
// dtype codes follow glm::DType: 0 f32, 1 f64, 2 bf16.
cudaError_t convert(void* dst, int dst_dtype, const void* src, int src_dtype, int64_t n, cudaStream_t stream);
// result[0] += sum of squares (fp64 accumulation); result is device memory.
cudaError_t sum_squares_bf16(double* result, const bf16* x, int64_t n, cudaStream_t stream);
cudaError_t sum_squares_f32(double* result, const float* x, int64_t n, cudaStream_t stream);
// dst[i] = value, or std * counter_normal(key, offset + i), in dtype code dst_dtype.
cudaError_t fill(void* dst, int dst_dtype, int64_t n, double value, cudaStream_t stream);
cudaError_t fill_normal(void* dst, int dst_dtype, int64_t n, uint64_t key, int64_t offset, double std,
                        cudaStream_t stream);
// Byte ranges set to zero in one launch: the many small added-to parts of a step's gradients (norm
// weights and biases, 37 of them at GLM-4's 12 layers), where one memset each would leave the GPU
// waiting for the host's launches. At most kZeroRanges ranges per call.
constexpr int kZeroRanges = 64;
struct ZeroRanges {
  int count = 0;
  void* ptr[kZeroRanges];
  int64_t bytes[kZeroRanges];
};
cudaError_t zero_ranges(const ZeroRanges& ranges, cudaStream_t stream);
// dst[i] += src[i] (fp32 partial sums into a bf16 gradient).
cudaError_t accumulate_into_bf16(bf16* dst, const float* src, int64_t n, cudaStream_t stream);
// out[c] += sum over rows of in[r, c] (bf16 in, fp32 accumulation, bf16 out): bias gradients.
// scratch holds column_sum_scratch(rows, cols) floats; the sums are deterministic.
int64_t column_sum_scratch(int64_t rows, int64_t cols);
cudaError_t column_sum_accumulate(bf16* out, const bf16* in, float* scratch, int64_t rows, int64_t cols,
                                  cudaStream_t stream);


}  // namespace glm::cuda
