// The GEMMs of one GLM-4-9B layer and the lm_head at seq 4096 and 8192 (forward, input gradient,
// weight gradient) through cuda::Gemm: cuBLASLt's first heuristic against the autotuned choice
// (Gemm::Autotune::all, the tuner behind --gemm_autotune in gemm.cuh), with each tuned shape's
// candidate times. A plain program: one table on stdout; benchmarks/peers/gemm_bench.py times
// PyTorch's matmuls on the same shapes.
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "benchmarks/cuda_check.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/gemm.cuh"

namespace {

using glm::cuda::bf16;

bf16* random_bf16(int64_t n, double std, uint64_t key) {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, static_cast<size_t>(n) * sizeof(bf16)));
  CHECK_CUDA(glm::cuda::fill_normal(p, /*bf16*/ 2, n, key, 0, std, nullptr));
  return static_cast<bf16*>(p);
}

struct Linear {
  const char* name;
  int64_t in, out;
};

// bias_epilogue: the forward with cuBLASLt's bias epilogue (QKV's bias).
enum class Pass { forward, bias_epilogue, input_grad, weight_grad };
const char* pass_name(Pass p) {
  switch (p) {
    case Pass::forward:
      return "fwd";
    case Pass::bias_epilogue:
      return "fwd+bias(epilogue)";
    case Pass::input_grad:
      return "dgrad";
    case Pass::weight_grad:
      return "wgrad";
  }
  return "?";
}

cublasStatus_t call(glm::cuda::Gemm& g, Pass p, const Linear& l, int64_t n, bf16* x, bf16* w, bf16* y, bf16* dy,
                    bf16* dx, bf16* dw) {
  switch (p) {
    case Pass::forward:
      return g.linear_forward(y, false, x, w, nullptr, n, l.in, l.out, nullptr);
    case Pass::bias_epilogue:
      return g.linear_forward(y, false, x, w, dw, n, l.in, l.out, nullptr);
    case Pass::input_grad:
      return g.linear_backward_input(dx, dy, w, n, l.in, l.out, false, nullptr);
    case Pass::weight_grad:
      return g.linear_backward_weight(dw, dy, x, n, l.in, l.out, true, nullptr);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

double seconds_per_call(glm::cuda::Gemm& g, Pass p, const Linear& l, int64_t n, bf16* x, bf16* w, bf16* y, bf16* dy,
                        bf16* dx, bf16* dw) {
  CHECK_LT(call(g, p, l, n, x, w, y, dy, dx, dw));  // plans (and tunes) the shape
  CHECK_LT(call(g, p, l, n, x, w, y, dy, dx, dw));
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  constexpr int kReps = 10;
  CHECK_CUDA(cudaEventRecord(a));
  for (int i = 0; i < kReps; ++i) CHECK_LT(call(g, p, l, n, x, w, y, dy, dx, dw));
  CHECK_CUDA(cudaEventRecord(b));
  CHECK_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  return ms / 1e3 / kReps;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench_gemm: no CUDA device visible; nothing measured\n");
    return 0;
  }
  const std::vector<Linear> linears = {{"query_key_value", 4096, 4608}, {"dense", 4096, 4096},
                                       {"dense_h_to_4h", 4096, 27392},  {"dense_4h_to_h", 13696, 4096},
                                       {"lm_head", 4096, 151552},       {"square 8192", 8192, 8192}};
  glm::cuda::Gemm heuristic, tuned;
  if (!heuristic.init().empty() || !tuned.init().empty()) return 1;
  heuristic.set_autotune(glm::cuda::Gemm::Autotune::off);
  tuned.set_autotune(glm::cuda::Gemm::Autotune::all);
  std::printf("%-16s %-18s %6s | %9s %9s | %7s\n", "linear", "pass", "n", "heur TF/s", "tuned TF/s", "gain");
  double total_heur = 0, total_tuned = 0;  // seconds over one layer + lm_head at each n
  for (int64_t n : {int64_t{4096}, int64_t{8192}}) {
    for (const Linear& l : linears) {
      const int64_t rows = l.name == std::string("square 8192") ? 8192 : n;
      bf16* x = random_bf16(rows * l.in, 0.5, 1);
      bf16* w = random_bf16(l.out * l.in, 0.02, 2);
      bf16* y = random_bf16(rows * l.out, 0.5, 3);
      bf16* dy = random_bf16(rows * l.out, 0.01, 4);
      bf16* dx = random_bf16(rows * l.in, 0.5, 5);
      bf16* dw = random_bf16(l.out * l.in, 0.01, 6);
      std::vector<Pass> passes = {Pass::forward, Pass::input_grad, Pass::weight_grad};
      if (l.name == std::string("query_key_value")) {
        passes.push_back(Pass::bias_epilogue);
      }
      for (Pass p : passes) {
        const double flops = 2.0 * static_cast<double>(rows) * static_cast<double>(l.in) * static_cast<double>(l.out);
        const double h = seconds_per_call(heuristic, p, l, rows, x, w, y, dy, dx, dw);
        const double t = seconds_per_call(tuned, p, l, rows, x, w, y, dy, dx, dw);
        if (rows == n && l.name != std::string("square 8192") && p != Pass::bias_epilogue) {
          total_heur += h;
          total_tuned += t;
        }
        std::printf("%-16s %-18s %6lld | %9.1f %9.1f | %+6.1f%%\n", l.name, pass_name(p), static_cast<long long>(rows),
                    flops / h / 1e12, flops / t / 1e12, 100.0 * (h / t - 1.0));
      }
      for (bf16* p : {x, w, y, dy, dx, dw}) CHECK_CUDA(cudaFree(p));
    }
  }
  std::printf("one layer + lm_head, both lengths: heuristic %.3f ms, tuned %.3f ms (%+.1f%%)\n", total_heur * 1e3,
              total_tuned * 1e3, 100.0 * (total_heur / total_tuned - 1.0));
  std::printf("\ntuning log (candidate times in us, heuristic order; * = chosen):\n");
  for (const auto& r : tuned.tune_log()) {
    std::printf("  %-40s", r.shape.c_str());
    for (size_t i = 0; i < r.seconds.size(); ++i)
      std::printf(" %s%.0f", static_cast<int>(i) == r.chosen ? "*" : "", r.seconds[i] * 1e6);
    std::printf("\n");
  }
  return 0;
}
