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

// Deferred AdamW over rows of a table (Backend::adamw_rows): the per-step scalars of steps
// floor + 1 .. floor + kMaxHistory, passed by value (read through the constant bank).
constexpr int kMaxAdamWHistory = 64;
struct AdamWHistory {
  float beta1, beta2, eps, weight_decay;
  float lr[kMaxAdamWHistory], bias_correction1[kMaxAdamWHistory], bias_correction2_sqrt[kMaxAdamWHistory],
      grad_scale[kMaxAdamWHistory];
};

// Row rows[i] (i < count; row i when rows is null) of width elements gets the steps
// max(row_step[row], floor) + 1 .. until, each with adamw's arithmetic per element and a zero
// gradient, the last one reading grad's row when `gradient`; listed rows' row_step becomes until
// (rows null: row_step is left alone). master or master_lo (split) as in adamw / adamw_split.
cudaError_t adamw_rows(bf16* param, float* master, int16_t* master_lo, const bf16* grad, float* exp_avg,
                       float* exp_avg_sq, const int32_t* rows, int64_t count, int64_t width, int32_t* row_step,
                       int64_t floor, int64_t until, bool gradient, const AdamWHistory& history,
                       double* grad_sq_sum, cudaStream_t stream, bool beside_other_work = false);

}  // namespace glm::cuda
