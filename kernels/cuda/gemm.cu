// cuBLASLt calls with per-shape cached descriptors and (optionally) autotuned algorithms.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>

#include "kernels/cuda/gemm.cuh"

namespace glm::cuda {
namespace {

#define GLM_LT(call)                                                    \
  do {                                                                  \
    cublasStatus_t glm_lt_status_ = (call);                             \
    if (glm_lt_status_ != CUBLAS_STATUS_SUCCESS) return glm_lt_status_; \
  } while (0)

#define GLM_LT_CUDA(call)                                             \
  do {                                                                \
    if ((call) != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED; \
  } while (0)

// Events and an optional copy of C that live only while one shape is tuned. C is copied back
// from saved_c on every way out (the trials added to it), before the copy is freed.
struct TuneScratch {
  cudaEvent_t start = nullptr, stop = nullptr;
  void* saved_c = nullptr;
  void* c = nullptr;
  size_t c_bytes = 0;
  cudaStream_t stream = nullptr;
  ~TuneScratch() {
    if (saved_c) {
      if (cudaMemcpyAsync(c, saved_c, c_bytes, cudaMemcpyDeviceToDevice, stream) != cudaSuccess ||
          cudaStreamSynchronize(stream) != cudaSuccess)
        std::fprintf(stderr, "glm_hpc: GEMM tuning could not restore an accumulated output\n");
      cudaFree(saved_c);
    }
    if (stop) cudaEventDestroy(stop);
    if (start) cudaEventDestroy(start);
  }
};

}  // namespace

size_t Gemm::KeyHash::operator()(const Key& k) const {
  size_t h = static_cast<size_t>(k.trans_a) | static_cast<size_t>(k.trans_b) << 1 | static_cast<size_t>(k.c_f32) << 2 |
             static_cast<size_t>(k.accumulate) << 3 | static_cast<size_t>(k.bias) << 4;
  for (int64_t v : {k.m, k.n, k.k, k.lda, k.ldb, k.ldc, static_cast<int64_t>(k.sm_target)})
    h = h * 1000003u ^ std::hash<int64_t>{}(v);
  return h;
}

void Gemm::destroy(Plan& plan) {
  if (plan.c) cublasLtMatrixLayoutDestroy(plan.c);
  if (plan.b) cublasLtMatrixLayoutDestroy(plan.b);
  if (plan.a) cublasLtMatrixLayoutDestroy(plan.a);
  if (plan.op) cublasLtMatmulDescDestroy(plan.op);
  plan = Plan{};
}

Gemm::~Gemm() {
  for (auto& [key, plan] : plans_) destroy(plan);
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

std::string Gemm::init(size_t workspace_bytes) {
  if (cublasLtCreate(&handle_) != CUBLAS_STATUS_SUCCESS) return "cublasLtCreate failed";
  if (cudaMalloc(&workspace_, workspace_bytes) != cudaSuccess) return "cannot allocate the cuBLASLt workspace";
  workspace_bytes_ = workspace_bytes;
  return {};
}

cublasStatus_t Gemm::make_plan(const Key& key, Plan& plan) {
  GLM_LT(cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  GLM_LT(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  GLM_LT(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (key.sm_target > 0) {
    const int32_t sms = key.sm_target;
    GLM_LT(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sms, sizeof(sms)));
  }
  if (key.bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bias_type = CUDA_R_16BF;
    GLM_LT(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    GLM_LT(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
  }
  // Stored shapes (before op): A is m x k or k x m, B is k x n or n x k.
  GLM_LT(cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_16BF, key.trans_a ? key.k : key.m, key.trans_a ? key.m : key.k,
                                    key.lda));
  GLM_LT(cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_16BF, key.trans_b ? key.n : key.k, key.trans_b ? key.k : key.n,
                                    key.ldb));
  GLM_LT(cublasLtMatrixLayoutCreate(&plan.c, key.c_f32 ? CUDA_R_32F : CUDA_R_16BF, key.m, key.n, key.ldc));
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t Gemm::run(const Plan& plan, const cublasLtMatmulAlgo_t& algo, const bf16* a, const bf16* b, void* c,
                         const void* c_in, float beta, cudaStream_t stream) {
  const float alpha = 1.0f;
  return cublasLtMatmul(handle_, plan.op, &alpha, a, plan.a, b, plan.b, &beta, c_in, plan.c, c, plan.c, &algo,
                        workspace_, workspace_bytes_, stream);
}

cublasStatus_t Gemm::choose_algo(const Key& key, Plan& plan, const bf16* a, const bf16* b, void* c, const void* c_in,
                                 float beta, cudaStream_t stream) {
  const double flops = 2.0 * static_cast<double>(key.m) * static_cast<double>(key.n) * static_cast<double>(key.k);
  const bool tune = autotune_ == Autotune::all || (autotune_ == Autotune::large && flops >= kTuneMinFlops);
  cublasLtMatmulPreference_t pref = nullptr;
  GLM_LT(cublasLtMatmulPreferenceCreate(&pref));
  cublasLtMatmulHeuristicResult_t found_algos[kTuneCandidates] = {};
  int found = 0;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &workspace_bytes_, sizeof(workspace_bytes_));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(handle_, plan.op, plan.a, plan.b, plan.c, plan.c, pref,
                                        tune ? kTuneCandidates : 1, found_algos, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  GLM_LT(st);
  if (found == 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  plan.algo = found_algos[0].algo;
  if (!tune || found == 1) return CUBLAS_STATUS_SUCCESS;

  TuneScratch scratch;
  const size_t c_bytes = static_cast<size_t>(key.ldc) * static_cast<size_t>(key.n) * (key.c_f32 ? 4 : 2);
  const bool c_is_d = c_in == c;  // trials then overwrite what they read
  if (key.accumulate && c_is_d) {
    // Without room for a copy of C, keep the heuristic rather than disturb the accumulation.
    if (cudaMalloc(&scratch.saved_c, c_bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return CUBLAS_STATUS_SUCCESS;
    }
    scratch.c = c;
    scratch.c_bytes = c_bytes;
    scratch.stream = stream;
    GLM_LT_CUDA(cudaMemcpyAsync(scratch.saved_c, c, c_bytes, cudaMemcpyDeviceToDevice, stream));
  }
  GLM_LT_CUDA(cudaEventCreate(&scratch.start));
  GLM_LT_CUDA(cudaEventCreate(&scratch.stop));
  TuneRecord record;
  std::ostringstream shape;
  shape << (key.trans_a ? 'T' : 'N') << (key.trans_b ? 'T' : 'N') << ' ' << key.m << 'x' << key.n << 'x' << key.k
        << (key.c_f32 ? " f32-out" : "") << (key.accumulate ? " +C" : "") << (key.bias ? " +bias" : "");
  if (key.sm_target > 0) shape << " on " << key.sm_target << " SMs";
  record.shape = shape.str();
  // Seconds per call of `reps` calls in a row (the stream is synchronised around them).
  auto timed = [&](const cublasLtMatmulAlgo_t& algo, int reps, double& seconds) -> cublasStatus_t {
    GLM_LT_CUDA(cudaEventRecord(scratch.start, stream));
    for (int r = 0; r < reps; ++r) GLM_LT(run(plan, algo, a, b, c, c_in, beta, stream));
    GLM_LT_CUDA(cudaEventRecord(scratch.stop, stream));
    GLM_LT_CUDA(cudaEventSynchronize(scratch.stop));
    float ms = 0;
    GLM_LT_CUDA(cudaEventElapsedTime(&ms, scratch.start, scratch.stop));
    seconds = ms / 1e3 / reps;
    return CUBLAS_STATUS_SUCCESS;
  };
  // A candidate's time under load: one call (which must succeed, and gives the count), then as
  // many back to back as fill the window (at least 3). Negative: the candidate failed.
  auto under_load = [&](int i) -> double {
    double once = -1, seconds = -1;
    if (found_algos[i].state != CUBLAS_STATUS_SUCCESS || timed(found_algos[i].algo, 1, once) != CUBLAS_STATUS_SUCCESS)
      return -1;
    const int reps = static_cast<int>(std::clamp(kTuneWindowSeconds / std::max(once, 1e-7), 3.0, 1000.0));
    if (timed(found_algos[i].algo, reps, seconds) != CUBLAS_STATUS_SUCCESS) return -1;
    return seconds;
  };
  // Alone on the GPU (work on other streams, an optimizer beside backward, would time with them),
  // each candidate twice, in order and then in reverse, and the mean of both: the clock drifts
  // as the GPU heats.
  GLM_LT_CUDA(cudaDeviceSynchronize());
  record.seconds.assign(static_cast<size_t>(found), -1.0);
  std::vector<double> forward(static_cast<size_t>(found), -1.0);
  for (int i = 0; i < found; ++i) forward[static_cast<size_t>(i)] = under_load(i);
  for (int i = found - 1; i >= 0; --i) {
    const double again = forward[static_cast<size_t>(i)] > 0 ? under_load(i) : -1;
    if (again > 0) record.seconds[static_cast<size_t>(i)] = 0.5 * (forward[static_cast<size_t>(i)] + again);
  }
  (void)cudaGetLastError();  // a failed candidate leaves nothing the next call should see
  double best = record.seconds[0];
  record.chosen = 0;  // the first heuristic unless another beats it by the margin
  for (int i = 1; i < found; ++i) {
    const double t = record.seconds[static_cast<size_t>(i)];
    if (t <= 0) continue;
    if (best <= 0 || t < best * (record.chosen == 0 ? 1.0 - kTuneMargin : 1.0)) {
      best = t;
      record.chosen = i;
    }
  }
  // Nothing timed twice leaves chosen at 0: the first heuristic (the call reports it if it fails).
  plan.algo = found_algos[record.chosen].algo;
  tune_log_.push_back(std::move(record));
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t Gemm::matmul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const bf16* a, int64_t lda,
                            const bf16* b, int64_t ldb, void* c, bool c_f32, int64_t ldc, float beta, const bf16* bias,
                            cudaStream_t stream, const void* c_in) {
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  if (c_in == nullptr) c_in = c;
  const Key key{trans_a, trans_b, c_f32, beta != 0.0f, bias != nullptr, m, n, k, lda, ldb, ldc, sm_target_};
  auto it = plans_.find(key);
  const bool fresh = it == plans_.end();
  if (fresh) {
    Plan plan;
    cublasStatus_t st = make_plan(key, plan);
    if (st == CUBLAS_STATUS_SUCCESS && bias != nullptr)
      st = cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
    if (st == CUBLAS_STATUS_SUCCESS) st = choose_algo(key, plan, a, b, c, c_in, beta, stream);
    if (st != CUBLAS_STATUS_SUCCESS) {
      destroy(plan);
      return st;
    }
    it = plans_.emplace(key, plan).first;
  }
  Plan& plan = it->second;
  if (bias != nullptr)
    GLM_LT(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  return run(plan, plan.algo, a, b, c, c_in, beta, stream);
}

cublasStatus_t Gemm::linear_forward(void* out, bool out_f32, const bf16* in, const bf16* weight, const bf16* bias,
                                    int64_t n, int64_t in_features, int64_t out_features, cudaStream_t stream,
                                    const void* addend) {
  // Column-major: out^T [O, n] = W [I, O]^T x in^T [I, n] (+ addend^T).
  return matmul(true, false, out_features, n, in_features, weight, in_features, in, in_features, out, out_f32,
                out_features, addend != nullptr ? 1.0f : 0.0f, bias, stream, addend);
}

cublasStatus_t Gemm::linear_backward_input(bf16* din, const bf16* dout, const bf16* weight, int64_t n,
                                           int64_t in_features, int64_t out_features, bool accumulate,
                                           cudaStream_t stream) {
  // din^T [I, n] = W [I, O] x dout^T [O, n].
  return matmul(false, false, in_features, n, out_features, weight, in_features, dout, out_features, din, false,
                in_features, accumulate ? 1.0f : 0.0f, nullptr, stream);
}

cublasStatus_t Gemm::linear_backward_weight(bf16* dweight, const bf16* dout, const bf16* in, int64_t n,
                                            int64_t in_features, int64_t out_features, bool accumulate,
                                            cudaStream_t stream) {
  // dW^T [I, O] (+)= in^T [I, n] x dout [n, O]; beta = 0 does not read dW.
  return matmul(false, true, in_features, out_features, n, in, in_features, dout, out_features, dweight, false,
                in_features, accumulate ? 1.0f : 0.0f, nullptr, stream);
}

}  // namespace glm::cuda
