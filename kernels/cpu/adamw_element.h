// One AdamW element update in the two roundings the backends use: the CPU reference's (each
// operation rounded alone, in T) and the CUDA kernel's (fp32 with three fused multiply-adds,
// kernels/cuda/adamw.cu). The reference backend and the host optimizer of an offloaded run share
// these, so that offloading changes no bit.
#pragma once

#include <cmath>

#include "kernels/cpu/cpu_ops.h"

namespace glm::cpu {

// One step's constants in T, from the step's doubles (adamw and adamw_rows derive them alike).
template <typename T>
struct AdamWConstants {
  explicit AdamWConstants(const AdamWStep& step) {
    const double bc1 = 1.0 - std::pow(step.beta1, static_cast<double>(step.step));
    const double bc2 = 1.0 - std::pow(step.beta2, static_cast<double>(step.step));
    decay = static_cast<T>(1.0 - step.lr * step.weight_decay);
    step_size = static_cast<T>(step.lr / bc1);
    bc2_sqrt = static_cast<T>(std::sqrt(bc2));
    b1 = static_cast<T>(step.beta1);
    b2 = static_cast<T>(step.beta2);
    eps = static_cast<T>(step.eps);
    scale = static_cast<T>(step.grad_scale);
  }
  T decay, step_size, bc2_sqrt, b1, b2, eps, scale;
};

template <typename T>
inline void adamw_element(T& param, T grad, T& exp_avg, T& exp_avg_sq, const AdamWConstants<T>& c) {
  const T g = grad * c.scale;
  exp_avg = c.b1 * exp_avg + (T(1) - c.b1) * g;
  exp_avg_sq = c.b2 * exp_avg_sq + (T(1) - c.b2) * g * g;
  const T denom = std::sqrt(exp_avg_sq) / c.bc2_sqrt + c.eps;
  param = param * c.decay - c.step_size * exp_avg / denom;
}

// The CUDA kernel's scalars: the step's doubles rounded to float, then combined in float.
struct FusedAdamWConstants {
  explicit FusedAdamWConstants(const AdamWStep& step) {
    const float lr = static_cast<float>(step.lr), wd = static_cast<float>(step.weight_decay);
    const float bc1 = static_cast<float>(1.0 - std::pow(step.beta1, static_cast<double>(step.step)));
    bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(step.beta2, static_cast<double>(step.step))));
    b1 = static_cast<float>(step.beta1);
    b2 = static_cast<float>(step.beta2);
    one_minus_b1 = 1.0f - b1;
    one_minus_b2 = 1.0f - b2;
    eps = static_cast<float>(step.eps);
    scale = static_cast<float>(step.grad_scale);
    step_size = lr / bc1;
    decay = 1.0f - lr * wd;
  }
  float decay, step_size, bc2_sqrt, b1, b2, one_minus_b1, one_minus_b2, eps, scale;
};

// Built with -ffp-contract=off where it is compiled: only the std::fma calls fuse.
inline void fused_adamw_element(float& master, float grad, float& exp_avg, float& exp_avg_sq,
                                const FusedAdamWConstants& c) {
  const float g = grad * c.scale;
  exp_avg = std::fma(c.b1, exp_avg, c.one_minus_b1 * g);
  exp_avg_sq = std::fma(c.b2, exp_avg_sq, (c.one_minus_b2 * g) * g);
  const float denom = std::sqrt(exp_avg_sq) / c.bc2_sqrt + c.eps;
  master = std::fma(master, c.decay, -((c.step_size * exp_avg) / denom));
}

}  // namespace glm::cpu
