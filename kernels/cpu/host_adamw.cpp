// The loops are written for the compiler's vectoriser (restrict pointers, no branches but the
// NaN/infinity selects, sqrt without errno); on x86-64 GCC also builds an AVX2/FMA version that
// the loader picks where the CPU has it. Both versions compute the same bits: IEEE operations,
// and no contraction beyond the explicit std::fma (this file is compiled with -ffp-contract=off).
#include "kernels/cpu/host_adamw.h"

#include <algorithm>
#include <vector>

#include "base/bf16.h"
#include "kernels/cpu/adamw_element.h"
#include "kernels/master_split.h"

namespace glm::cpu {
namespace {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define GLM_HOST_ADAMW_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define GLM_HOST_ADAMW_CLONES
#endif

inline uint16_t split_high_bits(float x) {
  uint16_t hi;
  int16_t lo;
  split_master(x, hi, lo);
  return hi;
}

GLM_HOST_ADAMW_CLONES
void widen(float* __restrict out, const uint16_t* __restrict in, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_bits_to_float(in[i]);
}

GLM_HOST_ADAMW_CLONES
double squares(const float* __restrict g, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(g[i]) * g[i];
  return s;
}

GLM_HOST_ADAMW_CLONES
void update_reference(float* __restrict master, float* __restrict m, float* __restrict v, const float* __restrict g,
                      int64_t n, const AdamWConstants<float>& c) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) adamw_element(master[i], g[i], m[i], v[i], c);
}

GLM_HOST_ADAMW_CLONES
void update_fused(float* __restrict master, float* __restrict m, float* __restrict v, const float* __restrict g,
                  int64_t n, const FusedAdamWConstants& c) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) fused_adamw_element(master[i], g[i], m[i], v[i], c);
}

GLM_HOST_ADAMW_CLONES
void narrow(uint16_t* __restrict out, const float* __restrict in, int64_t n, Bf16Rounding r) {
  if (r == Bf16Rounding::split_high) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = split_high_bits(in[i]);
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = float_to_bf16_bits(in[i]);
  }
}

}  // namespace

void widen_bf16(float* out, const uint16_t* in, int64_t n) { widen(out, in, n); }
void narrow_to_bf16(uint16_t* out, const float* in, int64_t n, Bf16Rounding rounding) { narrow(out, in, n, rounding); }

double host_adamw(ThreadPool& pool, const HostAdamWArrays& a, int64_t n, const AdamWStep& step, AdamWRounding rounding,
                  Bf16Rounding bf16, bool sum_squares) {
  const int64_t chunks = (n + kHostAdamWChunk - 1) / kHostAdamWChunk;
  std::vector<double> sums(static_cast<size_t>(chunks), 0.0);
  const AdamWConstants<float> reference(step);
  const FusedAdamWConstants fused(step);
  pool.run(chunks, [&](int64_t c) {
    const int64_t begin = c * kHostAdamWChunk, count = std::min(kHostAdamWChunk, n - begin);
    // A bf16 gradient is widened into a per-thread buffer that stays in cache.
    thread_local std::vector<float> widened;
    const float* g = a.grad_f32 != nullptr ? a.grad_f32 + begin : nullptr;
    if (g == nullptr) {
      widened.resize(static_cast<size_t>(kHostAdamWChunk));
      widen(widened.data(), a.grad_bf16 + begin, count);
      g = widened.data();
    }
    if (sum_squares) sums[static_cast<size_t>(c)] = squares(g, count);
    float* master = a.master + begin;
    if (rounding == AdamWRounding::reference)
      update_reference(master, a.exp_avg + begin, a.exp_avg_sq + begin, g, count, reference);
    else
      update_fused(master, a.exp_avg + begin, a.exp_avg_sq + begin, g, count, fused);
    if (a.param_f32 != nullptr) std::copy(master, master + count, a.param_f32 + begin);
    if (a.param_bf16 != nullptr) narrow(a.param_bf16 + begin, master, count, bf16);
  });
  double total = 0;
  for (const double s : sums) total += s;
  return total;
}

}  // namespace glm::cpu
