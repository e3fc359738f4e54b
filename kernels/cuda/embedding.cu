// Embedding lookup (a row gather, 16-byte copies where rows allow), the deterministic fp32-summing
// backward, and row moves of any element size (the lm_head's labelled rows).
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/vec.cuh"

namespace glm::cuda {
namespace {

__global__ void embedding_forward_kernel(bf16* out, const bf16* table, const int32_t* tokens, int64_t hidden) {
  const int64_t t = blockIdx.x;
  const bf16* row = table + static_cast<int64_t>(tokens[t]) * hidden;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) out[t * hidden + j] = row[j];
}

// 16-byte copies of each row where hidden is a multiple of 8 and both buffers are aligned.
__global__ void embedding_forward_vec_kernel(uint4* out, const uint4* table, const int32_t* tokens, int64_t vecs) {
  const int64_t t = blockIdx.x;
  const uint4* row = table + static_cast<int64_t>(tokens[t]) * vecs;
  for (int64_t j = threadIdx.x; j < vecs; j += blockDim.x) out[t * vecs + j] = row[j];
}

// Block (r, c): the run of one token (blockIdx.x) over one slice of columns (blockIdx.y), so that a
// token filling much of the batch is summed by many blocks at once. Each thread sums its column
// over the run's positions in order.
__global__ void embedding_backward_kernel(bf16* dtable, const bf16* dout, const int32_t* tokens,
                                          const int32_t* order, const int32_t* runs, int64_t hidden) {
  const int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (j >= hidden) return;
  const int32_t begin = runs[blockIdx.x], end = runs[blockIdx.x + 1];
  bf16* row = dtable + static_cast<int64_t>(tokens[order[begin]]) * hidden;
  float acc = 0.0f;
  for (int32_t k = begin; k < end; ++k) acc += __bfloat162float(dout[static_cast<int64_t>(order[k]) * hidden + j]);
  row[j] = __float2bfloat16(__bfloat162float(row[j]) + acc);
}

// The same with 8 columns a thread in 16-byte vectors; positions four at a time (their loads in
// flight together), added in order.
__global__ void embedding_backward_vec_kernel(uint4* dtable, const uint4* dout, const int32_t* tokens,
                                              const int32_t* order, const int32_t* runs, int64_t vecs) {
  const int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (j >= vecs) return;
  const int32_t begin = runs[blockIdx.x], end = runs[blockIdx.x + 1];
  uint4* row = dtable + static_cast<int64_t>(tokens[order[begin]]) * vecs;
  float acc[8] = {}, x[8];
  int32_t k = begin;
  for (; k + 4 <= end; k += 4) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = dout[static_cast<int64_t>(order[k + u]) * vecs + j];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      unpack_bf16x8(v[u], x);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] += x[i];
    }
  }
  for (; k < end; ++k) {
    unpack_bf16x8(dout[static_cast<int64_t>(order[k]) * vecs + j], x);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] += x[i];
  }
  unpack_bf16x8(row[j], x);
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] += x[i];
  row[j] = pack_bf16x8(acc);
}

template <typename Unit>
__global__ void move_rows_kernel(Unit* dst, const Unit* src, const int32_t* rows, int64_t units, bool gather) {
  const int64_t i = blockIdx.x, r = rows[i];
  Unit* d = dst + (gather ? i : r) * units;
  if (src == nullptr) {  // a scatter of zeros
    for (int64_t j = threadIdx.x; j < units; j += blockDim.x) d[j] = Unit{};
    return;
  }
  const Unit* s = src + (gather ? r : i) * units;
  for (int64_t j = threadIdx.x; j < units; j += blockDim.x) d[j] = s[j];
}

template <typename Unit>
cudaError_t launch_move(void* dst, const void* src, const int32_t* rows, int64_t count, int64_t row_bytes,
                        bool gather, cudaStream_t stream) {
  const int64_t units = row_bytes / static_cast<int64_t>(sizeof(Unit));
  const int threads = units >= 128 ? 128 : 32;
  // One block per row: counts stay far below the grid's 2^31 - 1 limit (rows are tokens).
  move_rows_kernel<Unit><<<static_cast<unsigned int>(count), threads, 0, stream>>>(
      static_cast<Unit*>(dst), static_cast<const Unit*>(src), rows, units, gather);
  return cudaGetLastError();
}

bool aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0; }

}  // namespace

cudaError_t embedding_forward(bf16* out, const bf16* table, const int32_t* tokens, int64_t n, int64_t hidden,
                              cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (hidden % kBf16PerVec == 0 && aligned16(out) && aligned16(table)) {
    embedding_forward_vec_kernel<<<static_cast<unsigned int>(n), 128, 0, stream>>>(
        reinterpret_cast<uint4*>(out), reinterpret_cast<const uint4*>(table), tokens, hidden / kBf16PerVec);
    return cudaGetLastError();
  }
  embedding_forward_kernel<<<static_cast<unsigned int>(n), 256, 0, stream>>>(out, table, tokens, hidden);
  return cudaGetLastError();
}

cudaError_t embedding_backward(bf16* dtable, const bf16* dout, const int32_t* tokens, const int32_t* token_order,
                               const int32_t* token_runs, int64_t runs, int64_t hidden, cudaStream_t stream) {
  if (runs == 0) return cudaSuccess;
  const bool vec = hidden % kBf16PerVec == 0 && aligned16(dtable) && aligned16(dout);
  const int64_t columns = vec ? hidden / kBf16PerVec : hidden;
  const int threads = vec ? 64 : 256;
  const dim3 grid(static_cast<unsigned int>(runs), static_cast<unsigned int>((columns + threads - 1) / threads));
  if (vec) {
    embedding_backward_vec_kernel<<<grid, threads, 0, stream>>>(reinterpret_cast<uint4*>(dtable),
                                                                 reinterpret_cast<const uint4*>(dout), tokens,
                                                                 token_order, token_runs, columns);
  } else {
    embedding_backward_kernel<<<grid, threads, 0, stream>>>(dtable, dout, tokens, token_order, token_runs, columns);
  }
  return cudaGetLastError();
}

cudaError_t move_rows(void* dst, const void* src, const int32_t* rows, int64_t count, int64_t row_bytes, bool gather,
                      cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  // The widest unit that divides the row and both buffers' alignment.
  for (const int64_t unit : {16, 8, 4, 2}) {
    if (row_bytes % unit != 0 || !aligned(dst, unit) || !aligned(src, unit)) continue;
    switch (unit) {
      case 16: return launch_move<uint4>(dst, src, rows, count, row_bytes, gather, stream);
      case 8: return launch_move<uint2>(dst, src, rows, count, row_bytes, gather, stream);
      case 4: return launch_move<uint32_t>(dst, src, rows, count, row_bytes, gather, stream);
      default: return launch_move<uint16_t>(dst, src, rows, count, row_bytes, gather, stream);
    }
  }
  return launch_move<uint8_t>(dst, src, rows, count, row_bytes, gather, stream);
}

}  // namespace glm::cuda
