// Dense bf16 peaks (see gpu_peak.h).
#include "model/gpu_peak.h"

#include <cstdio>

namespace glm {

namespace {

// Datasheet dense bf16 tensor TFLOP/s with fp32 accumulation, the more specific name first.
struct Known {
  const char* name;
  double tflops;
};
constexpr Known kKnown[] = {
    {"H200", 989.4},        {"H100 PCIe", 756.0},  {"H100 NVL", 835.0}, {"H100", 989.4},   {"H800 PCIe", 756.0},
    {"H800", 989.4},        {"GH200", 989.4},      {"A100", 312.0},     {"A800", 312.0},   {"A30", 165.0},
    {"A40", 149.7},         {"A10G", 70.0},        {"A10", 125.0},      {"L40S", 362.1},   {"L40", 181.0},
    {"L20", 119.5},         {"L4", 121.0},         {"RTX 6000 Ada", 364.2}, {"RTX 5000 Ada", 261.0},
    {"RTX 4500 Ada", 158.4}, {"RTX 4000 Ada", 106.9}, {"RTX A6000", 154.8}, {"RTX A5000", 111.1},
    {"RTX A4000", 76.7},    {"RTX 4090", 165.2},   {"RTX 4080", 97.5},  {"RTX 3090 Ti", 80.0},
    {"RTX 3090", 71.0},     {"RTX 3080", 59.5},
};

// Dense bf16 FLOPs per clock per multiprocessor, fp32 accumulation: Hopper 4096, A100 2048, the
// other Ampere and Ada parts 1024 (GeForce accumulates fp32 at half that; the table has them).
int flops_per_clock(int major, int minor) {
  if (major == 9) return 4096;
  if (major == 8 && minor == 0) return 2048;
  if (major == 8) return 1024;
  return 0;
}

}  // namespace

PeakFlops gpu_bf16_peak(const std::string& name, int major, int minor, int multiprocessors, int clock_khz) {
  char text[200];
  for (const Known& k : kKnown) {
    if (name.find(k.name) == std::string::npos) continue;
    std::snprintf(text, sizeof(text), "the %s datasheet's %.1f TFLOP/s", k.name, k.tflops);
    return {k.tflops * 1e12, text};
  }
  const int rate = flops_per_clock(major, minor);
  if (rate == 0 || multiprocessors <= 0 || clock_khz <= 0) return {};
  const double flops = static_cast<double>(multiprocessors) * clock_khz * 1e3 * rate;
  std::snprintf(text, sizeof(text), "estimated: %d SMs x %.2f GHz x %d FLOP a clock = %.1f TFLOP/s", multiprocessors,
                clock_khz / 1e6, rate, flops / 1e12);
  return {flops, text};
}

}  // namespace glm
