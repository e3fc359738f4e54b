// CPU reference ops at the tiny configuration's shapes: the CPU backend's speed, in FLOP/s.
#include <benchmark/benchmark.h>

#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace {

std::vector<float> filled(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
  return v;
}

void BM_LinearForward(benchmark::State& state) {
  const int64_t n = state.range(0), in = state.range(1), out = state.range(2);
  auto x = filled(n * in), w = filled(out * in), y = filled(n * out);
  for (auto _ : state) {
    glm::cpu::linear_forward(y.data(), x.data(), w.data(), static_cast<const float*>(nullptr), n, in, out);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * n * in * out, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_LinearForward)->Args({512, 128, 256})->Args({512, 256, 128})->Args({512, 128, 272});

void BM_LinearBackward(benchmark::State& state) {
  const int64_t n = state.range(0), in = state.range(1), out = state.range(2);
  auto x = filled(n * in), w = filled(out * in), dy = filled(n * out), dx = filled(n * in), dw = filled(out * in);
  for (auto _ : state) {
    glm::cpu::linear_backward(dx.data(), dw.data(), static_cast<float*>(nullptr), dy.data(), x.data(), w.data(), n, in,
                              out, false);
    benchmark::DoNotOptimize(dw.data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(4.0 * n * in * out, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_LinearBackward)->Args({512, 128, 256});

void BM_AttentionForward(benchmark::State& state) {
  const int64_t n = state.range(0);
  glm::cpu::AttentionShape shape{4, 2, 32};
  auto qkv = filled(n * shape.qkv_width()), out = filled(n * 128), lse = filled(n * 4);
  std::vector<int32_t> doc(static_cast<size_t>(n), 0);
  for (auto _ : state) {
    glm::cpu::attention_forward(out.data(), lse.data(), qkv.data(), doc.data(), n, shape);
    benchmark::DoNotOptimize(out.data());
  }
  // Causal: about half of the 4 * n^2 * heads * head_dim score and value FLOPs.
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * n * n * shape.heads * shape.head_dim, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AttentionForward)->Arg(256)->Arg(512);

}  // namespace
