// The CUDA backend's op profiler (--profile, --profile_trace): device time per op from CUDA events,
// idle time per stream and for the whole GPU, and a Chrome trace.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace glm {

// --profile: every op's device time, from CUDA events around it on the backend's stream, summed
// per op name and printed to stderr when the backend is destroyed, with the time each stream and
// the whole GPU sat idle between ops (event pairs are resolved in batches of 32,768 ops, about 30
// steps of the 12-layer benchmark, each a synchronisation, so the cost is two event records per
// op). Off by default: no events are recorded.
class OpProfiler {
  struct Record {
    const char* name = nullptr;
    cudaStream_t stream = nullptr;
    cudaEvent_t start = nullptr, stop = nullptr;
  };
  struct Total {
    double seconds = 0;
    int64_t calls = 0;
  };
  // Where a stream sat between one op's end and its next op's start: waiting for the host to
  // enqueue (a synchronisation, host work between steps) or for another stream.
  struct Idle {
    int order = 0;  // 0: the first stream seen (the main one: the first op is the embedding's)
    cudaEvent_t last_stop = nullptr;
    double seconds = 0, largest = 0;
    int64_t gaps = 0, long_gaps = 0;            // over 50 us
    std::map<std::string, double> long_before;  // the long gaps' seconds by the op that ended them
  };

 public:
  OpProfiler(bool enabled, std::string trace_path);
  bool enabled() const { return enabled_; }
  ~OpProfiler();
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;
  // Drops everything measured so far (the trainer calls it after the first step).
  void reset();
  // Prints the table once (the backend calls it before destroying its stream).
  void report();
  // Records the start of `name` on stream; the scope records its end.
  class Scope {
   public:
    Scope(OpProfiler* p, const char* name, cudaStream_t stream) : p_(p), stream_(stream) {
      if (!p_->enabled_) return;
      rec_.name = name;
      rec_.stream = stream;
      rec_.start = p_->event();
      cudaEventRecord(rec_.start, stream_);
      if (p_->first_ == nullptr) {
        cudaEventCreate(&p_->first_);
        cudaEventRecord(p_->first_, stream_);
      }
    }
    ~Scope() {
      if (!p_->enabled_ || rec_.start == nullptr) return;
      rec_.stop = p_->event();
      cudaEventRecord(rec_.stop, stream_);
      if (p_->last_ == nullptr) cudaEventCreate(&p_->last_);
      cudaEventRecord(p_->last_, stream_);
      p_->pending_.push_back(rec_);
      if (p_->pending_.size() >= (1u << 15)) p_->resolve();
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    OpProfiler* p_;
    cudaStream_t stream_;
    Record rec_;
  };

 private:
  // --profile_trace FILE: the ops of the profiled steps' first minute as a Chrome trace
  // (chrome://tracing, Perfetto), one track per stream.
  void write_trace() const;
  cudaEvent_t event();
  void resolve();
  bool enabled_ = false, reported_ = false;
  std::string trace_path_;  // empty: no trace
  std::vector<Record> pending_;
  std::vector<cudaEvent_t> free_;
  std::map<std::string, Total> totals_;
  std::map<cudaStream_t, Idle> idle_;
  struct Interval {
    double start, stop;  // ms from first_
    const char* name;
    int stream;  // Idle::order
  };
  static constexpr float kIntervalMs = 60e3f;
  bool intervals_cut_ = false;  // ops after kIntervalMs were left out of intervals_
  std::vector<Interval> intervals_;
  cudaEvent_t first_ = nullptr, last_ = nullptr;
};

}  // namespace glm
