// A GPU's utilisation, power, temperature and clocks, read through NVML (the driver's
// libnvidia-ml.so.1, loaded at run time: a build or a machine without it reports nothing, and the
// binary still starts on a machine without a GPU driver).
#pragma once

#include <memory>
#include <string>

namespace glm {

// One reading; -1 where NVML could not say.
struct GpuHealth {
  double utilization = -1;         // % of the last sample period a kernel ran (nvidia-smi's GPU-Util)
  double memory_utilization = -1;  // % of it the memory was read or written
  double power_watts = -1;
  double temperature_c = -1;
  double sm_clock_mhz = -1;
  double memory_clock_mhz = -1;
  bool valid() const { return utilization >= 0 || power_watts >= 0; }
};

class GpuHealthMonitor {
 public:
  // The GPU of a PCI bus id ("0000:1B:00.0", cudaDeviceGetPCIBusId's form); null with `why` set
  // when NVML is missing or does not know the GPU.
  static std::unique_ptr<GpuHealthMonitor> open(const std::string& pci_bus_id, std::string* why);
  virtual ~GpuHealthMonitor() = default;
  virtual GpuHealth sample() = 0;
};

}  // namespace glm
