// Dropout on bf16 activations and gradients (LoRA's adapter input): the keep mask comes from
// base/counter_rng.h, so it is bit for bit the CPU reference's (kernels/cpu/cpu_ops.h dropout).
#pragma once

#include "kernels/cuda/common.cuh"

namespace glm::cuda {

// out[i] = in[i] * keep_i / (1 - p), or out[i] += that when accumulate (the backward: the same mask
// on the gradient), with keep_i = counter_keep(key, offset + i, dropout_threshold(p)); fp32
// arithmetic, one bf16 rounding per output. 64-bit indices; out may alias in.
cudaError_t dropout(bf16* out, const bf16* in, int64_t n, double p, uint64_t key, int64_t offset, bool accumulate,
                    cudaStream_t stream);

}  // namespace glm::cuda
