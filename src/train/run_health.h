// The ranks behind a log line: every rank's busy time over the logging interval (its steps less the
// time it waited on collectives), its GPU's health (model/gpu_health.h) and its model FLOPs, gathered
// at each logging step in one collective; the slowest rank against the median, and a straggler named when it stays slower than the
// median by more than kStragglerRatio (kCpuStragglerRatio on the CPU backend).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/backend.h"
#include "model/gpu_health.h"
#include "mpi/communicator.h"

namespace glm {

// What one logging step learns about the ranks (rank 0's copy is complete).
struct RanksReport {
  std::vector<GpuHealth> gpus;       // by rank; empty where no rank reads NVML
  std::vector<double> busy_seconds;  // by rank: mean busy time a step over the interval
  int slowest_rank = -1;
  double slowest_seconds = 0, median_seconds = 0;
  double flops = 0;  // the interval's model FLOPs, summed over the ranks
  std::string straggler;  // the warning, the logging step a straggler is (re)named; else empty
};

class RunHealth {
 public:
  static constexpr double kStragglerRatio = 1.10;  // busy time over the median's, at ...
  static constexpr int kStragglerIntervals = 3;    // ... this many logging steps in a row
  // The ratio on the CPU backend, whose ranks share their host's cores with each other and with
  // whatever else runs there: the scheduler alone moves a rank's busy time by 20-40% on a small
  // machine, which is not a slow rank.
  static constexpr double kCpuStragglerRatio = 1.50;

  // gpu_health: read this rank's GPU through NVML at each logging step (where it can).
  RunHealth(const Backend& backend, bool gpu_health);
  // Rank 0's start-up line: where the health numbers come from, or why there are none.
  const std::string& source() const { return source_; }
  // One step of this rank: its wall time from fetching the batch to the step's end, and of it the
  // time spent waiting on collectives that compute did not hide.
  void add_step(double wall_seconds, double exposed_comm_seconds);
  // Collective over comm (every rank, at the same logging steps): the interval's report, with this
  // rank's model FLOPs of the interval summed into it; the interval starts again. host_names are
  // gathered at the first call.
  Result<RanksReport> gather(Communicator& comm, double flops);

 private:
  std::unique_ptr<GpuHealthMonitor> monitor_;
  std::string source_;
  double straggler_ratio_ = kStragglerRatio;
  double busy_ = 0;
  int64_t steps_ = 0;
  std::vector<std::string> hosts_;
  int streak_rank_ = -1, streak_ = 0;
};

}  // namespace glm
