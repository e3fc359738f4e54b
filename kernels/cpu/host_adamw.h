// AdamW on the host over fp32 master weights and moments (the offloaded optimizer): chunks of
// kHostAdamWChunk elements spread over a thread pool, vectorised, in either backend's rounding
// (kernels/cpu/adamw_element.h), gradients read and the working copy written in f32 or bf16.
#pragma once

#include <cstdint>

#include "base/thread_pool.h"
#include "kernels/cpu/cpu_ops.h"

namespace glm::cpu {

enum class AdamWRounding {
  reference,  // cpu::adamw's: the CPU backend's own
  fused,      // the CUDA kernel's (three fused multiply-adds)
};

// How the working copy rounds the master to bf16: to nearest even (a whole fp32 master on the
// device), or ties away from zero (the high half of a split master, kernels/master_split.h).
enum class Bf16Rounding { nearest_even, split_high };

struct HostAdamWArrays {
  float* master = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  const float* grad_f32 = nullptr;  // one of the two gradients
  const uint16_t* grad_bf16 = nullptr;
  float* param_f32 = nullptr;  // the working copy: at most one; both null writes none
  uint16_t* param_bf16 = nullptr;
};

// The conversions the host update reads gradients and writes working copies with, vectorised; for
// the offloaded optimizer's other copies between its master and the parameters.
void widen_bf16(float* out, const uint16_t* in, int64_t n);
void narrow_to_bf16(uint16_t* out, const float* in, int64_t n, Bf16Rounding rounding);

// Elements per chunk: what one thread updates at a time, and the unit the gradient's sum of squares
// is added up in (per chunk in double, then the chunks in order), so the sum does not depend on
// the number of threads.
constexpr int64_t kHostAdamWChunk = int64_t{1} << 16;

// Updates n elements; returns the sum of squares of the gradient as stored (before the step's
// grad_scale) when sum_squares, else 0.
double host_adamw(ThreadPool& pool, const HostAdamWArrays& a, int64_t n, const AdamWStep& step, AdamWRounding rounding,
                  Bf16Rounding bf16, bool sum_squares);

}  // namespace glm::cpu
