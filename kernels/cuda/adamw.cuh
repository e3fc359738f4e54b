// Fused AdamW over flat buffers: fp32 master weights (whole, or split beside the bf16 working
// copy) and moments, bf16 gradients and working copy.
#pragma once

#include "kernels/cuda/common.cuh"

namespace glm::cuda {

struct AdamWArgs {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
  float bias_correction1, bias_correction2_sqrt;  // 1 - beta1^t, sqrt(1 - beta2^t)
};

// master, exp_avg, exp_avg_sq updated in place; param (may be null) gets the bf16 copy.
// grad_sq_sum (may be null) gets the sum of squares of grad (before args.grad_scale) added.
// beside_other_work: the update runs on a side stream next to compute (the optimizer inside
// backward), so the summing grid is short-lived blocks (at most 8 items per thread) that hand
// SMs back as they finish, instead of one resident wave that would hold every SM to the end.
cudaError_t adamw(bf16* param, float* master, const bf16* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                  const AdamWArgs& args, double* grad_sq_sum, cudaStream_t stream, bool beside_other_work = false);

// The same update with the master split (kernels/master_split.h): param holds its high halves (the
// bf16 working copy), master_lo its low halves; 26 bytes an element instead of 28.
cudaError_t adamw_split(bf16* param, int16_t* master_lo, const bf16* grad, float* exp_avg, float* exp_avg_sq,
                        int64_t n, const AdamWArgs& args, double* grad_sq_sum, cudaStream_t stream,
                        bool beside_other_work = false);

}  // namespace glm::cuda
