// Row-major bf16 GEMMs of the linear layers through cuBLASLt (fp32 accumulation).
//
// Every distinct call shape (transposes, m, n, k, leading dimensions, output type, bias, whether C
// is accumulated) gets its cuBLASLt descriptors built once and cached with the algorithm to run:
// cuBLASLt's first heuristic.
//
// set_autotune(Autotune::large) (the backend's --gemm_autotune large) tunes large shapes (at
// least kTuneMinFlops) instead, Autotune::all every shape: the first time such a shape is seen, up to
// kTuneCandidates of cuBLASLt's heuristic candidates are timed on the call's own operands and the
// fastest is kept when it beats the first heuristic by more than kTuneMargin (C is saved and
// restored around the trials when the call accumulates into it). The trials run alone on the GPU
// (after a device synchronisation), each candidate back to back for at least kTuneWindowSeconds,
// twice (in order, then in reverse, against the drift), so that they are compared at the clock
// the GPU's power cap allows under sustained load, as inside a training step: there the first
// heuristic is not the fastest candidate for some of GLM-4-9B's step GEMMs
// (benchmarks/gemm_sustained.cpp), while short bursts at the boost clock rank them within noise.
// It stays off by default: its end-to-end gain is within run-to-run noise (benchmarks/RESULTS.md),
// a timing-driven choice can differ between runs (and with it the last bits of a large GEMM), and
// the tuning costs a few seconds at the start of a 9B-shaped run.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/common.cuh"

namespace glm::cuda {

class Gemm {
 public:
  static constexpr int kTuneCandidates = 8;
  static constexpr double kTuneMargin = 0.03;
  static constexpr double kTuneMinFlops = 1e10;
  static constexpr double kTuneWindowSeconds = 0.02;
  enum class Autotune { off, large, all };

  Gemm() = default;
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;
  // Creates the handle and a workspace; returns a message on failure, empty on success.
  std::string init(size_t workspace_bytes = 32u << 20);
  void set_autotune(Autotune mode) { autotune_ = mode; }
  // GEMMs planned from now on target this many SMs (cuBLASLt's SM_COUNT_TARGET: the rest are left
  // to work on another stream); 0 targets all of them. Plans are cached per target.
  void set_sm_target(int sms) { sm_target_ = sms; }
  int sm_target() const { return sm_target_; }
  Autotune autotune() const { return autotune_; }

  // out[n, O] = in[n, I] W[O, I]^T (+ bias[O]) (+ addend[n, O]); out is bf16, or fp32 when out_f32.
  // addend (same type and shape as out, may be out itself) is read in the GEMM's epilogue.
  cublasStatus_t linear_forward(void* out, bool out_f32, const bf16* in, const bf16* weight, const bf16* bias,
                                int64_t n, int64_t in_features, int64_t out_features, cudaStream_t stream,
                                const void* addend = nullptr);
  // din[n, I] = dout[n, O] W[O, I] (+ din when accumulate).
  cublasStatus_t linear_backward_input(bf16* din, const bf16* dout, const bf16* weight, int64_t n, int64_t in_features,
                                       int64_t out_features, bool accumulate, cudaStream_t stream);
  // dweight[O, I] += dout[n, O]^T in[n, I] (= when !accumulate).
  cublasStatus_t linear_backward_weight(bf16* dweight, const bf16* dout, const bf16* in, int64_t n, int64_t in_features,
                                        int64_t out_features, bool accumulate, cudaStream_t stream);

  // What tuning found for one shape (benchmarks print these).
  struct TuneRecord {
    std::string shape;            // "T N m x n x k ..." as matmul() sees it
    std::vector<double> seconds;  // per candidate, heuristic order (negative: the candidate failed)
    int chosen = 0;
  };
  const std::vector<TuneRecord>& tune_log() const { return tune_log_; }

 private:
  struct Key {
    bool trans_a, trans_b, c_f32, accumulate, bias;
    int64_t m, n, k, lda, ldb, ldc;
    int sm_target;
    bool operator==(const Key& o) const {
      return trans_a == o.trans_a && trans_b == o.trans_b && c_f32 == o.c_f32 && accumulate == o.accumulate &&
             bias == o.bias && m == o.m && n == o.n && k == o.k && lda == o.lda && ldb == o.ldb && ldc == o.ldc &&
             sm_target == o.sm_target;
    }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  // Column-major D[m, n] = op(A) op(B) + beta C, all leading dimensions given; C is c_in when
  // given (same layout as D), else D itself.
  cublasStatus_t matmul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const bf16* a, int64_t lda,
                        const bf16* b, int64_t ldb, void* c, bool c_f32, int64_t ldc, float beta, const bf16* bias,
                        cudaStream_t stream, const void* c_in = nullptr);
  cublasStatus_t make_plan(const Key& key, Plan& plan);
  cublasStatus_t choose_algo(const Key& key, Plan& plan, const bf16* a, const bf16* b, void* c, const void* c_in,
                             float beta, cudaStream_t stream);
  cublasStatus_t run(const Plan& plan, const cublasLtMatmulAlgo_t& algo, const bf16* a, const bf16* b, void* c,
                     const void* c_in, float beta, cudaStream_t stream);
  static void destroy(Plan& plan);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  Autotune autotune_ = Autotune::off;
  int sm_target_ = 0;
  std::unordered_map<Key, Plan, KeyHash> plans_;
  std::vector<TuneRecord> tune_log_;
};

}  // namespace glm::cuda
