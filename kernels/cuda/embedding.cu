// One block per token row.
#include "kernels/cuda/embedding.cuh"

namespace glm::cuda {
namespace {

__global__ void embedding_forward_kernel(bf16* out, const bf16* table, const int32_t* tokens, int64_t hidden) {
  const int64_t t = blockIdx.x;
  const bf16* row = table + static_cast<int64_t>(tokens[t]) * hidden;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) out[t * hidden + j] = row[j];
}

__global__ void embedding_backward_kernel(bf16* dtable, const bf16* dout, const int32_t* tokens, int64_t hidden) {
  const int64_t t = blockIdx.x;
  bf16* row = dtable + static_cast<int64_t>(tokens[t]) * hidden;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) atomicAdd(row + j, dout[t * hidden + j]);
}

}  // namespace

cudaError_t embedding_forward(bf16* out, const bf16* table, const int32_t* tokens, int64_t n, int64_t hidden,
                              cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  embedding_forward_kernel<<<static_cast<unsigned int>(n), 256, 0, stream>>>(out, table, tokens, hidden);
  return cudaGetLastError();
}

cudaError_t embedding_backward(bf16* dtable, const bf16* dout, const int32_t* tokens, int64_t n, int64_t hidden,
                               cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  embedding_backward_kernel<<<static_cast<unsigned int>(n), 256, 0, stream>>>(dtable, dout, tokens, hidden);
  return cudaGetLastError();
}

}  // namespace glm::cuda
