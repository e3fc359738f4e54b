// A GPU's dense bf16 tensor-core peak (fp32 accumulation, no sparsity), the denominator of MFU:
// the vendor's datasheet figure for the GPUs glm_hpc targets, found by the device name; for others
// an estimate from the multiprocessor count, the boost clock and the architecture's rate per
// multiprocessor (what the datasheet figures are made of). `source` says which.
#pragma once

#include <string>

namespace glm {

struct PeakFlops {
  double flops = 0;    // per second; 0: unknown (no MFU)
  std::string source;  // "NVIDIA H200 datasheet: 989 TFLOP/s", "estimated: 132 SMs x 1.98 GHz x ..."
};

// name: cudaDeviceProp::name; major.minor its compute capability; clock_khz the boost clock.
PeakFlops gpu_bf16_peak(const std::string& name, int major, int minor, int multiprocessors, int clock_khz);

}  // namespace glm
