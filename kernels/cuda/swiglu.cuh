// SwiGLU on the fused gate|up layout: out = silu(gate) * up, and its backward.
#pragma once

#include "kernels/cuda/common.cuh"

namespace glm::cuda {

cudaError_t swiglu_forward(bf16* out, const bf16* gate_up, int64_t n, int64_t ffn, cudaStream_t stream);
cudaError_t swiglu_backward(bf16* dgate_up, const bf16* dout, const bf16* gate_up, int64_t n, int64_t ffn,
                            cudaStream_t stream);

}  // namespace glm::cuda
