// Exit-on-failure checks for the plain CUDA benchmark programs (bench_gemm, gemm_sustained): the
// failing call and its error, then exit status 1.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK_CUDA(call)                                                      \
  do {                                                                        \
    cudaError_t e_ = (call);                                                  \
    if (e_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)
#define CHECK_LT(call)                                                                    \
  do {                                                                                    \
    cublasStatus_t s_ = (call);                                                           \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                    \
      std::fprintf(stderr, "%s failed: cuBLAS status %d\n", #call, static_cast<int>(s_)); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)
