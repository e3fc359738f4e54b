// Gathering the ranks' busy times and GPU health at a logging step; the straggler rule.
#include "train/run_health.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>

namespace glm {
namespace {

constexpr int kFields = 8;  // busy seconds a step, GpuHealth's six numbers, the interval's model FLOPs
constexpr size_t kHostBytes = 64;

std::array<double, kFields> pack(double busy, const GpuHealth& h, double flops) {
  return {busy, h.utilization, h.memory_utilization, h.power_watts, h.temperature_c, h.sm_clock_mhz,
          h.memory_clock_mhz, flops};
}

GpuHealth unpack(const double* v) {
  GpuHealth h;
  h.utilization = v[1];
  h.memory_utilization = v[2];
  h.power_watts = v[3];
  h.temperature_c = v[4];
  h.sm_clock_mhz = v[5];
  h.memory_clock_mhz = v[6];
  return h;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

RunHealth::RunHealth(const Backend& backend, bool gpu_health) {
  if (backend.name() != "cuda") straggler_ratio_ = kCpuStragglerRatio;
  if (!gpu_health) {
    source_ = "GPU health off (--log_gpu_health false)";
    return;
  }
  std::string why;
  monitor_ = GpuHealthMonitor::open(backend.pci_bus_id(), &why);
  source_ = monitor_ ? "GPU utilisation, power, temperature and clocks through NVML, every rank at each log line"
                     : "no GPU health in the log: " + why;
}

void RunHealth::add_step(double wall_seconds, double exposed_comm_seconds) {
  busy_ += std::max(wall_seconds - exposed_comm_seconds, 0.0);
  ++steps_;
}

Result<RanksReport> RunHealth::gather(Communicator& comm, double flops) {
  const int world = comm.size();
  if (hosts_.empty()) {
    char mine[kHostBytes] = {};
    ::gethostname(mine, kHostBytes - 1);
    std::vector<char> all(kHostBytes * static_cast<size_t>(world));
    GLM_RETURN_IF_ERROR(comm.all_gather(mine, all.data(), kHostBytes, CommType::u8));
    for (int r = 0; r < world; ++r) hosts_.emplace_back(all.data() + kHostBytes * r, strnlen(all.data() + kHostBytes * r, kHostBytes));
  }
  const GpuHealth here = monitor_ ? monitor_->sample() : GpuHealth{};
  const auto mine = pack(steps_ > 0 ? busy_ / static_cast<double>(steps_) : 0.0, here, flops);
  busy_ = 0;
  steps_ = 0;
  std::vector<double> all(static_cast<size_t>(kFields * world));
  GLM_RETURN_IF_ERROR(comm.all_gather(mine.data(), all.data(), kFields, CommType::f64));
  RanksReport report;
  bool any_gpu = false;
  for (int r = 0; r < world; ++r) {
    const double* v = all.data() + static_cast<size_t>(kFields * r);
    report.busy_seconds.push_back(v[0]);
    report.gpus.push_back(unpack(v));
    report.flops += v[7];
    any_gpu = any_gpu || report.gpus.back().valid();
  }
  if (!any_gpu) report.gpus.clear();
  report.slowest_rank = static_cast<int>(std::max_element(report.busy_seconds.begin(), report.busy_seconds.end()) -
                                         report.busy_seconds.begin());
  report.slowest_seconds = report.busy_seconds[static_cast<size_t>(report.slowest_rank)];
  report.median_seconds = median_of(report.busy_seconds);
  // A rank stays the slowest by more than the ratio: named once per streak, at its length.
  const bool slow =
      world > 1 && report.median_seconds > 0 && report.slowest_seconds > straggler_ratio_ * report.median_seconds;
  streak_ = slow && report.slowest_rank == streak_rank_ ? streak_ + 1 : (slow ? 1 : 0);
  streak_rank_ = slow ? report.slowest_rank : -1;
  if (streak_ == kStragglerIntervals)
    report.straggler = concat(
        "rank ", report.slowest_rank, " (", hosts_[static_cast<size_t>(report.slowest_rank)],
        ") is a straggler: over the last ", kStragglerIntervals, " log intervals its steps kept it busy ",
        static_cast<int>(100.0 * (report.slowest_seconds / report.median_seconds - 1.0) + 0.5),
        "% longer than the median rank's (", report.slowest_seconds, " s against ", report.median_seconds,
        " s a step, waits on collectives excluded); the others wait for it at every collective");
  return report;
}

}  // namespace glm
