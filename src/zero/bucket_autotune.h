// --reduce_bucket_size auto: the bucket size where the gradient collective's bus bandwidth reaches
// 90% of its plateau (nccl-tests' busbw), measured at start with the run's own communicator, or
// read from a bench_comm JSON file (--comm_profile).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/backend.h"
#include "mpi/communicator.h"

namespace glm {

struct BandwidthPoint {
  int64_t bytes = 0;  // the full (unsharded) buffer
  double time_us = 0;
  double busbw = 0;   // GB/s (1e9 bytes/s)
};

struct BucketChoice {
  int64_t elements = 0;  // the chosen --reduce_bucket_size
  std::string explanation;
};

constexpr double kKneeFraction = 0.9;

// The smallest size whose busbw reaches fraction x the curve's best busbw (the plateau); curve
// sorted by bytes, non-empty. Returns its index.
size_t bandwidth_knee(const std::vector<BandwidthPoint>& curve, double fraction = kKneeFraction);

// "all_reduce" for ZeRO stage 0, else "reduce_scatter": what the gradient buckets use.
const char* gradient_collective(int zero_stage);

// Times the gradient collective in `reduce` dtype at sizes min_bytes, 4 x min_bytes, ... up to
// max_bytes on `data` (device or host buffers from `backend`), a few iterations each, the slowest
// rank's time; `scalars` carries the timings. Every rank calls it.
Result<std::vector<BandwidthPoint>> measure_bandwidth_curve(Communicator& data, Communicator& scalars,
                                                            Backend& backend, int zero_stage, DType reduce,
                                                            int64_t min_bytes, int64_t max_bytes);

// The rows of a bench_comm --json file for the gradient collective and dtype.
Result<std::vector<BandwidthPoint>> read_bandwidth_curve(const std::string& path, int zero_stage, DType reduce);

// The knee of the curve as a bucket size in elements, with a one-paragraph explanation.
BucketChoice choose_reduce_bucket_size(const std::vector<BandwidthPoint>& curve, int zero_stage, DType reduce,
                                       const std::string& source);

}  // namespace glm
