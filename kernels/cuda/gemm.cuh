// Row-major bf16 GEMMs of the linear layers through cuBLASLt (fp32 accumulation).
#pragma once

#include <cublasLt.h>

#include <string>

#include "kernels/cuda/common.cuh"

namespace glm::cuda {

class Gemm {
 public:
  Gemm() = default;
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;
  // Creates the handle and a workspace; returns a message on failure, empty on success.
  std::string init(size_t workspace_bytes = 32u << 20);

  // out[n, O] = in[n, I] W[O, I]^T (+ bias[O]); out is bf16, or fp32 when out_f32.
  cublasStatus_t linear_forward(void* out, bool out_f32, const bf16* in, const bf16* weight, const bf16* bias,
                                int64_t n, int64_t in_features, int64_t out_features, cudaStream_t stream);
  // din[n, I] = dout[n, O] W[O, I] (+ din when accumulate).
  cublasStatus_t linear_backward_input(bf16* din, const bf16* dout, const bf16* weight, int64_t n, int64_t in_features,
                                       int64_t out_features, bool accumulate, cudaStream_t stream);
  // dweight[O, I] += dout[n, O]^T in[n, I].
  cublasStatus_t linear_backward_weight(bf16* dweight, const bf16* dout, const bf16* in, int64_t n, int64_t in_features,
                                        int64_t out_features, cudaStream_t stream);

 private:
  // Column-major C[m, n] = op(A) op(B) + beta C, all leading dimensions given.
  cublasStatus_t matmul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const bf16* a, int64_t lda,
                        const bf16* b, int64_t ldb, void* c, bool c_f32, int64_t ldc, float beta, const bf16* bias,
                        cudaStream_t stream);
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

}  // namespace glm::cuda
