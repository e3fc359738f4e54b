// One block per token row; the forward copies 16-byte vectors where the row allows.
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

__global__ void embedding_backward_kernel(bf16* dtable, const bf16* dout, const int32_t* tokens, int64_t hidden) {
  const int64_t t = blockIdx.x;
  bf16* row = dtable + static_cast<int64_t>(tokens[t]) * hidden;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) atomicAdd(row + j, dout[t * hidden + j]);
}

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

cudaError_t embedding_backward(bf16* dtable, const bf16* dout, const int32_t* tokens, int64_t n, int64_t hidden,
                               cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  embedding_backward_kernel<<<static_cast<unsigned int>(n), 256, 0, stream>>>(dtable, dout, tokens, hidden);
  return cudaGetLastError();
}

}  // namespace glm::cuda
