// cuBLASLt's candidates for each GEMM of the 12-layer benchmark step (GLM-4-9B shapes, seq 4096),
// each timed under sustained load: the GPU is kept busy for the whole survey, so it runs at the
// clock its power cap allows, as it does inside a training step, rather than at the boost clock of
// a short burst (which ranks the candidates differently). Prints each candidate's rate and its
// configuration (tile, stages, cluster, split-K), with the first heuristic timed again at the end
// of each shape to show the drift. A plain program: usage `gemm_sustained [seconds per candidate]
// [candidates]`.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "benchmarks/cuda_check.h"
#include "kernels/cuda/elementwise.cuh"

namespace {

using glm::cuda::bf16;

// Column-major D[m, n] = op(A) op(B) (+ C), as kernels/cuda/gemm.cu issues them.
struct Shape {
  std::string name;
  bool ta, tb;
  int64_t m, n, k;
  bool accumulate;  // beta = 1 with C = D (the residual epilogue, an accumulated gradient)
  int sm_target;    // 0: every SM; backward's GEMMs leave 12 SMs to the optimizer beside them
  int per_step;     // calls in one step of the 12-layer benchmark
};

uint32_t config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  uint32_t v = 0;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS) return 0;
  return v;
}

double seconds_per_call(cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la,
                        cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, const cublasLtMatmulAlgo_t& algo,
                        const bf16* a, const bf16* b, bf16* c, float beta, void* ws, size_t ws_bytes, double seconds) {
  const float alpha = 1.0f;
  auto once = [&] {
    return cublasLtMatmul(h, op, &alpha, a, la, b, lb, &beta, c, lc, c, lc, &algo, ws, ws_bytes, nullptr);
  };
  if (once() != CUBLAS_STATUS_SUCCESS) return -1;
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  // Calls in batches of 8 until the batch's clock passes the time asked for.
  int64_t calls = 0;
  float ms = 0;
  CHECK_CUDA(cudaEventRecord(start));
  while (ms < seconds * 1e3) {
    for (int i = 0; i < 8; ++i) CHECK_LT(once());
    calls += 8;
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return ms / 1e3 / static_cast<double>(calls);
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("gemm_sustained: no CUDA device visible; nothing measured\n");
    return 0;
  }
  const double seconds = argc > 1 ? std::atof(argv[1]) : 0.25;
  const int wanted = argc > 2 ? std::atoi(argv[2]) : 12;
  const int64_t T = 4096, H = 4096, QKV = 4608, F = 13696, V = 151552;
  // linear_forward: (T, N) m = out, n = tokens, k = in; backward input (N, N) m = in, n = tokens,
  // k = out; backward weight (N, T) m = in, n = out, k = tokens.
  const std::vector<Shape> shapes = {
      {"qkv fwd", true, false, QKV, T, H, false, 0, 12},
      {"dense fwd +residual", true, false, H, T, H, true, 0, 12},
      {"h_to_4h fwd", true, false, 2 * F, T, H, false, 0, 12},
      {"4h_to_h fwd +residual", true, false, H, T, F, true, 0, 12},
      {"lm_head fwd", true, false, V, T, H, false, 0, 1},
      {"qkv dgrad (120 SMs)", false, false, H, T, QKV, false, 120, 12},
      {"dense dgrad (120 SMs)", false, false, H, T, H, false, 120, 12},
      {"h_to_4h dgrad (120 SMs)", false, false, H, T, 2 * F, false, 120, 12},
      {"4h_to_h dgrad (120 SMs)", false, false, F, T, H, false, 120, 12},
      {"lm_head dgrad (120 SMs)", false, false, H, T, V, false, 120, 1},
      {"qkv wgrad (120 SMs)", false, true, H, QKV, T, false, 120, 12},
      {"dense wgrad (120 SMs)", false, true, H, H, T, false, 120, 12},
      {"h_to_4h wgrad (120 SMs)", false, true, H, 2 * F, T, false, 120, 12},
      {"4h_to_h wgrad (120 SMs)", false, true, F, H, T, false, 120, 12},
      {"lm_head wgrad (120 SMs)", false, true, H, V, T, false, 120, 1},
  };
  cublasLtHandle_t handle;
  CHECK_LT(cublasLtCreate(&handle));
  const size_t ws_bytes = 32u << 20;
  void* ws = nullptr;
  CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
  const int64_t most = V * H;  // every operand fits in lm_head-sized buffers
  bf16 *a = nullptr, *b = nullptr, *c = nullptr;
  for (bf16** p : {&a, &b, &c}) CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(p), most * sizeof(bf16)));
  CHECK_CUDA(glm::cuda::fill_normal(a, 2, most, 11, 0, 0.02, nullptr));  // weight-like
  CHECK_CUDA(glm::cuda::fill_normal(b, 2, most, 12, 0, 1.0, nullptr));   // activation-like
  CHECK_CUDA(glm::cuda::fill_normal(c, 2, most, 13, 0, 0.5, nullptr));
  std::printf("%-26s %4s | %8s %8s | %5s %5s %5s %6s %6s %5s | %s\n", "gemm", "cand", "TFLOP/s", "vs #0", "algo",
              "tile", "stage", "clust", "splitk", "swz", "");
  double total_first = 0, total_best = 0;
  for (const Shape& s : shapes) {
    cublasLtMatmulDesc_t op;
    CHECK_LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = s.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CHECK_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CHECK_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (s.sm_target > 0)
      CHECK_LT(
          cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &s.sm_target, sizeof(s.sm_target)));
    cublasLtMatrixLayout_t la, lb, lc;
    CHECK_LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.ta ? s.k : s.m, s.ta ? s.m : s.k, s.ta ? s.k : s.m));
    CHECK_LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.tb ? s.n : s.k, s.tb ? s.k : s.n, s.tb ? s.n : s.k));
    CHECK_LT(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, s.m, s.n, s.m));
    cublasLtMatmulPreference_t pref;
    CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
    CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                  sizeof(ws_bytes)));
    std::vector<cublasLtMatmulHeuristicResult_t> found(static_cast<size_t>(wanted));
    int count = 0;
    CHECK_LT(cublasLtMatmulAlgoGetHeuristic(handle, op, la, lb, lc, lc, pref, wanted, found.data(), &count));
    const double flops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
    const float beta = s.accumulate ? 1.0f : 0.0f;
    double first = 0, best = 0;
    for (int i = 0; i <= count; ++i) {
      const int j = i == count ? 0 : i;  // the first heuristic again, last: the drift over the shape
      if (found[static_cast<size_t>(j)].state != CUBLAS_STATUS_SUCCESS) continue;
      const cublasLtMatmulAlgo_t& algo = found[static_cast<size_t>(j)].algo;
      const double t = seconds_per_call(handle, op, la, lb, lc, algo, a, b, c, beta, ws, ws_bytes, seconds);
      if (t <= 0) continue;
      if (i == 0) first = t;
      if (i < count && (best == 0 || t < best)) best = t;
      std::printf("%-26s %3d%s | %8.1f %+7.1f%% | %5u %5u %5u %6u %6u %5u |\n", i == 0 ? s.name.c_str() : "", j,
                  i == count ? "'" : " ", flops / t / 1e12, 100.0 * (first / t - 1.0),
                  config(algo, CUBLASLT_ALGO_CONFIG_ID), config(algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                  config(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID), config(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID),
                  config(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM), config(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING));
    }
    total_first += first * s.per_step;
    total_best += best * s.per_step;
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatmulDescDestroy(op);
  }
  std::printf("a 12-layer step's GEMMs, sustained: first heuristic %.3f ms, best candidate %.3f ms (%+.1f%%)\n",
              total_first * 1e3, total_best * 1e3, 100.0 * (total_first / total_best - 1.0));
  for (bf16* p : {a, b, c}) CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaFree(ws));
  cublasLtDestroy(handle);
  return 0;
}
