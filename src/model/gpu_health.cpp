// NVML through dlopen: the few entry points of its stable C API that the step line reports.
#include "model/gpu_health.h"

#include <dlfcn.h>

#include <mutex>

#include "base/status.h"

namespace glm {
namespace {

// NVML's C API (nvml.h; the CUDA toolkit ships the header only with its nvml-dev package, so the
// types are spelled here): handles are opaque pointers, results an int, 0 success.
using NvmlReturn = int;
using NvmlDevice = struct NvmlDeviceOpaque*;
struct NvmlUtilization {
  unsigned int gpu;
  unsigned int memory;
};
constexpr int kNvmlTemperatureGpu = 0;  // NVML_TEMPERATURE_GPU
constexpr int kNvmlClockSm = 1;         // NVML_CLOCK_SM
constexpr int kNvmlClockMem = 2;        // NVML_CLOCK_MEM

struct Nvml {
  NvmlReturn (*init)() = nullptr;
  const char* (*error_string)(NvmlReturn) = nullptr;
  NvmlReturn (*by_pci_bus_id)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*utilization)(NvmlDevice, NvmlUtilization*) = nullptr;
  NvmlReturn (*power)(NvmlDevice, unsigned int*) = nullptr;  // milliwatts
  NvmlReturn (*temperature)(NvmlDevice, int, unsigned int*) = nullptr;
  NvmlReturn (*clock)(NvmlDevice, int, unsigned int*) = nullptr;
  std::string failure;  // empty once loaded and initialised
};

template <typename F>
bool bind(void* lib, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  return fn != nullptr;
}

// Loaded and initialised once per process; never unloaded (NVML's threads outlive a dlclose).
const Nvml& nvml() {
  static Nvml n;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      n.failure = "the NVIDIA driver's libnvidia-ml.so.1 was not found";
      return;
    }
    if (!bind(lib, "nvmlInit_v2", n.init) || !bind(lib, "nvmlErrorString", n.error_string) ||
        !bind(lib, "nvmlDeviceGetHandleByPciBusId_v2", n.by_pci_bus_id) ||
        !bind(lib, "nvmlDeviceGetUtilizationRates", n.utilization) ||
        !bind(lib, "nvmlDeviceGetPowerUsage", n.power) || !bind(lib, "nvmlDeviceGetTemperature", n.temperature) ||
        !bind(lib, "nvmlDeviceGetClockInfo", n.clock)) {
      n.failure = "libnvidia-ml.so.1 lacks an NVML function the health line reads";
      return;
    }
    if (const NvmlReturn r = n.init(); r != 0) n.failure = concat("nvmlInit failed: ", n.error_string(r));
  });
  return n;
}

class NvmlMonitor final : public GpuHealthMonitor {
 public:
  explicit NvmlMonitor(NvmlDevice device) : device_(device) {}
  GpuHealth sample() override {
    const Nvml& n = nvml();
    GpuHealth h;
    NvmlUtilization u{};
    if (n.utilization(device_, &u) == 0) {
      h.utilization = u.gpu;
      h.memory_utilization = u.memory;
    }
    unsigned int v = 0;
    if (n.power(device_, &v) == 0) h.power_watts = v / 1000.0;
    if (n.temperature(device_, kNvmlTemperatureGpu, &v) == 0) h.temperature_c = v;
    if (n.clock(device_, kNvmlClockSm, &v) == 0) h.sm_clock_mhz = v;
    if (n.clock(device_, kNvmlClockMem, &v) == 0) h.memory_clock_mhz = v;
    return h;
  }

 private:
  NvmlDevice device_;
};

}  // namespace

std::unique_ptr<GpuHealthMonitor> GpuHealthMonitor::open(const std::string& pci_bus_id, std::string* why) {
  if (pci_bus_id.empty()) {
    *why = "no GPU";
    return nullptr;
  }
  const Nvml& n = nvml();
  if (!n.failure.empty()) {
    *why = n.failure;
    return nullptr;
  }
  NvmlDevice device = nullptr;
  if (const NvmlReturn r = n.by_pci_bus_id(pci_bus_id.c_str(), &device); r != 0) {
    *why = concat("NVML does not know the GPU at PCI ", pci_bus_id, ": ", n.error_string(r));
    return nullptr;
  }
  return std::make_unique<NvmlMonitor>(device);
}

}  // namespace glm
