// Grid-stride over n x ffn outputs.
#include "kernels/cuda/swiglu.cuh"

namespace glm::cuda {
namespace {

__global__ void swiglu_forward_kernel(bf16* out, const bf16* gate_up, int64_t n, int64_t ffn) {
  const int64_t total = n * ffn;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / ffn, j = i % ffn;
    const float g = __bfloat162float(gate_up[t * 2 * ffn + j]), u = __bfloat162float(gate_up[t * 2 * ffn + ffn + j]);
    out[i] = __float2bfloat16(g / (1.0f + __expf(-g)) * u);
  }
}

__global__ void swiglu_backward_kernel(bf16* dgate_up, const bf16* dout, const bf16* gate_up, int64_t n, int64_t ffn) {
  const int64_t total = n * ffn;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / ffn, j = i % ffn;
    const float g = __bfloat162float(gate_up[t * 2 * ffn + j]), u = __bfloat162float(gate_up[t * 2 * ffn + ffn + j]);
    const float d = __bfloat162float(dout[i]);
    const float s = 1.0f / (1.0f + __expf(-g));
    dgate_up[t * 2 * ffn + j] = __float2bfloat16(d * u * s * (1.0f + g * (1.0f - s)));
    dgate_up[t * 2 * ffn + ffn + j] = __float2bfloat16(d * g * s);
  }
}

}  // namespace

cudaError_t swiglu_forward(bf16* out, const bf16* gate_up, int64_t n, int64_t ffn, cudaStream_t stream) {
  if (n * ffn == 0) return cudaSuccess;
  swiglu_forward_kernel<<<grid_for(n * ffn, 256), 256, 0, stream>>>(out, gate_up, n, ffn);
  return cudaGetLastError();
}

cudaError_t swiglu_backward(bf16* dgate_up, const bf16* dout, const bf16* gate_up, int64_t n, int64_t ffn,
                            cudaStream_t stream) {
  if (n * ffn == 0) return cudaSuccess;
  swiglu_backward_kernel<<<grid_for(n * ffn, 256), 256, 0, stream>>>(dgate_up, dout, gate_up, n, ffn);
  return cudaGetLastError();
}

}  // namespace glm::cuda
