// GLM_HOST_DEVICE: functions shared by the CPU reference and the CUDA kernels, compiled for both
// where nvcc sees them and as plain host functions elsewhere.
#pragma once

#ifdef __CUDACC__
#define GLM_HOST_DEVICE __host__ __device__
#else
#define GLM_HOST_DEVICE
#endif
