// cuBLASLt calls; descriptors are built per call (cached by shape in a later revision).
#include "kernels/cuda/gemm.cuh"

namespace glm::cuda {
namespace {

// Destroys cuBLASLt descriptors on every path out of matmul().
struct LtObjects {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtObjects() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

#define GLM_LT(call)                                                    \
  do {                                                                  \
    cublasStatus_t glm_lt_status_ = (call);                             \
    if (glm_lt_status_ != CUBLAS_STATUS_SUCCESS) return glm_lt_status_; \
  } while (0)

}  // namespace

Gemm::~Gemm() {
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

std::string Gemm::init(size_t workspace_bytes) {
  if (cublasLtCreate(&handle_) != CUBLAS_STATUS_SUCCESS) return "cublasLtCreate failed";
  if (cudaMalloc(&workspace_, workspace_bytes) != cudaSuccess) return "cannot allocate the cuBLASLt workspace";
  workspace_bytes_ = workspace_bytes;
  return {};
}

cublasStatus_t Gemm::matmul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const bf16* a, int64_t lda,
                            const bf16* b, int64_t ldb, void* c, bool c_f32, int64_t ldc, float beta, const bf16* bias,
                            cudaStream_t stream) {
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  LtObjects o;
  GLM_LT(cublasLtMatmulDescCreate(&o.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  GLM_LT(cublasLtMatmulDescSetAttribute(o.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  GLM_LT(cublasLtMatmulDescSetAttribute(o.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bias_type = CUDA_R_16BF;
    GLM_LT(cublasLtMatmulDescSetAttribute(o.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    GLM_LT(cublasLtMatmulDescSetAttribute(o.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    GLM_LT(cublasLtMatmulDescSetAttribute(o.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
  }
  // Stored shapes (before op): A is m x k or k x m, B is k x n or n x k.
  GLM_LT(cublasLtMatrixLayoutCreate(&o.a, CUDA_R_16BF, trans_a ? k : m, trans_a ? m : k, lda));
  GLM_LT(cublasLtMatrixLayoutCreate(&o.b, CUDA_R_16BF, trans_b ? n : k, trans_b ? k : n, ldb));
  GLM_LT(cublasLtMatrixLayoutCreate(&o.c, c_f32 ? CUDA_R_32F : CUDA_R_16BF, m, n, ldc));
  GLM_LT(cublasLtMatmulPreferenceCreate(&o.pref));
  GLM_LT(cublasLtMatmulPreferenceSetAttribute(o.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                              sizeof(workspace_bytes_)));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  GLM_LT(cublasLtMatmulAlgoGetHeuristic(handle_, o.op, o.a, o.b, o.c, o.c, o.pref, 1, &heuristic, &found));
  if (found == 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  const float alpha = 1.0f;
  return cublasLtMatmul(handle_, o.op, &alpha, a, o.a, b, o.b, &beta, c, o.c, c, o.c, &heuristic.algo, workspace_,
                        workspace_bytes_, stream);
}

cublasStatus_t Gemm::linear_forward(void* out, bool out_f32, const bf16* in, const bf16* weight, const bf16* bias,
                                    int64_t n, int64_t in_features, int64_t out_features, cudaStream_t stream) {
  // Column-major: out^T [O, n] = W [I, O]^T x in^T [I, n].
  return matmul(true, false, out_features, n, in_features, weight, in_features, in, in_features, out, out_f32,
                out_features, 0.0f, bias, stream);
}

cublasStatus_t Gemm::linear_backward_input(bf16* din, const bf16* dout, const bf16* weight, int64_t n,
                                           int64_t in_features, int64_t out_features, bool accumulate,
                                           cudaStream_t stream) {
  // din^T [I, n] = W [I, O] x dout^T [O, n].
  return matmul(false, false, in_features, n, out_features, weight, in_features, dout, out_features, din, false,
                in_features, accumulate ? 1.0f : 0.0f, nullptr, stream);
}

cublasStatus_t Gemm::linear_backward_weight(bf16* dweight, const bf16* dout, const bf16* in, int64_t n,
                                            int64_t in_features, int64_t out_features, cudaStream_t stream) {
  // dW^T [I, O] += in^T [I, n] x dout [n, O].
  return matmul(false, true, in_features, out_features, n, in, in_features, dout, out_features, dweight, false,
                in_features, 1.0f, nullptr, stream);
}

}  // namespace glm::cuda
