// The op profiler's bookkeeping, report and trace writer.
#include "model/cuda_profiler.h"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace glm {

OpProfiler::OpProfiler(bool enabled, std::string trace_path) : enabled_(enabled), trace_path_(std::move(trace_path)) {}

OpProfiler::~OpProfiler() {
  report();
  for (auto& e : free_) cudaEventDestroy(e);
  for (auto& e : {first_, last_})
    if (e != nullptr) cudaEventDestroy(e);
  for (auto& [stream, idle] : idle_)
    if (idle.last_stop != nullptr) cudaEventDestroy(idle.last_stop);
}

// Drops everything measured so far (the trainer calls it after the first step).
void OpProfiler::reset() {
  if (!enabled_) return;
  resolve();
  totals_.clear();
  for (auto& [stream, idle] : idle_)
    if (idle.last_stop != nullptr) free_.push_back(idle.last_stop);
  idle_.clear();
  intervals_.clear();
  intervals_cut_ = false;
  for (cudaEvent_t* e : {&first_, &last_})
    if (*e != nullptr) {
      cudaEventDestroy(*e);
      *e = nullptr;
    }
}

// Prints the table once (the backend calls it before destroying its stream).
void OpProfiler::report() {
  if (!enabled_ || reported_) return;
  reported_ = true;
  resolve();
  double total = 0;
  for (const auto& [name, t] : totals_) total += t.seconds;
  float span_ms = 0;
  if (first_ != nullptr && last_ != nullptr) (void)cudaEventElapsedTime(&span_ms, first_, last_);
  std::vector<std::pair<std::string, Total>> rows(totals_.begin(), totals_.end());
  std::sort(rows.begin(), rows.end(), [](const auto& x, const auto& y) { return x.second.seconds > y.second.seconds; });
  std::fprintf(stderr, "profile: %.3f s of device time in ops over %.3f s from the first op to the last\n", total,
               span_ms / 1e3);
  for (const auto& [name, t] : rows)
    std::fprintf(stderr, "  %-24s %10.3f ms %6.1f%% %8lld calls\n", name.c_str(), t.seconds * 1e3,
                 total > 0 ? 100.0 * t.seconds / total : 0.0, static_cast<long long>(t.calls));
  // Where no stream ran an op at all: the union of every op's interval against the span.
  std::sort(intervals_.begin(), intervals_.end(), [](const auto& x, const auto& y) { return x.start < y.start; });
  double covered_until = intervals_.empty() ? 0.0 : intervals_.front().start, idle_ms = 0;
  std::map<std::string, double> idle_before;
  for (const Interval& i : intervals_) {
    if (i.start > covered_until) {
      idle_ms += i.start - covered_until;
      if (i.start - covered_until > 0.05) idle_before[i.name] += i.start - covered_until;
    }
    covered_until = std::max(covered_until, i.stop);
  }
  std::fprintf(stderr, "  no stream busy: %.3f ms of the span%s; gaps over 50 us by the op that ended them:\n", idle_ms,
               intervals_cut_ ? " (of its first minute only)" : "");
  for (const auto& [name, ms] : idle_before) std::fprintf(stderr, "    %-30s %10.3f ms\n", name.c_str(), ms);
  std::vector<const Idle*> streams;
  for (const auto& [stream, idle] : idle_) streams.push_back(&idle);
  std::sort(streams.begin(), streams.end(), [](const Idle* x, const Idle* y) { return x->order < y->order; });
  for (const Idle* idle : streams) {
    std::fprintf(stderr,
                 "  %s stream idle between its ops: %.3f ms in %lld gaps, %lld of them over 50 us, the largest "
                 "%.3f ms\n",
                 idle->order == 0 ? "main" : "side", idle->seconds * 1e3, static_cast<long long>(idle->gaps),
                 static_cast<long long>(idle->long_gaps), idle->largest * 1e3);
    for (const auto& [name, seconds] : idle->long_before)
      std::fprintf(stderr, "    long gaps before %-24s %10.3f ms\n", name.c_str(), seconds * 1e3);
  }
  write_trace();
}

// --profile_trace FILE: the ops of the profiled steps' first minute as a Chrome trace
// (chrome://tracing, Perfetto), one track per stream.
void OpProfiler::write_trace() const {
  if (trace_path_.empty()) return;
  const char* path = trace_path_.c_str();
  std::FILE* f = std::fopen(path, "w");
  if (f == nullptr) {
    std::fprintf(stderr, "--profile_trace: cannot write '%s'\n", path);
    return;
  }
  std::fprintf(f, "{\"traceEvents\":[");
  for (size_t i = 0; i < intervals_.size(); ++i) {
    const Interval& v = intervals_[i];
    std::fprintf(f, "%s\n{\"name\":\"%s\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}",
                 i == 0 ? "" : ",", v.name, v.stream, v.start * 1e3, (v.stop - v.start) * 1e3);
  }
  std::fprintf(f, "\n]}\n");
  if (std::fclose(f) != 0) std::fprintf(stderr, "--profile_trace: error writing '%s'\n", path);
}

cudaEvent_t OpProfiler::event() {
  if (!free_.empty()) {
    cudaEvent_t e = free_.back();
    free_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  cudaEventCreate(&e);
  return e;
}

void OpProfiler::resolve() {
  for (const Record& r : pending_) {
    float ms = 0;
    if (cudaEventSynchronize(r.stop) == cudaSuccess && cudaEventElapsedTime(&ms, r.start, r.stop) == cudaSuccess) {
      Total& t = totals_[r.name];
      t.seconds += ms / 1e3;
      t.calls += 1;
    }
    auto [at, added] = idle_.try_emplace(r.stream);
    Idle& idle = at->second;
    if (added) idle.order = static_cast<int>(idle_.size()) - 1;
    // The ops of the first kIntervalMs after the first profiled one (float milliseconds from it
    // resolve 4 us there; about 380 steps of the 12-layer benchmark, 13 MiB) for the whole GPU's
    // idle time and the trace; the per-stream totals go on.
    float from_first = 0, to_first = 0;
    if (cudaEventElapsedTime(&from_first, first_, r.start) == cudaSuccess && from_first < kIntervalMs &&
        cudaEventElapsedTime(&to_first, first_, r.stop) == cudaSuccess)
      intervals_.push_back({from_first, to_first, r.name, idle.order});
    else
      intervals_cut_ = true;
    float gap_ms = 0;
    if (idle.last_stop != nullptr && cudaEventElapsedTime(&gap_ms, idle.last_stop, r.start) == cudaSuccess &&
        gap_ms > 0) {
      idle.seconds += gap_ms / 1e3;
      idle.largest = std::max(idle.largest, static_cast<double>(gap_ms) / 1e3);
      idle.gaps += 1;
      if (gap_ms > 0.05f) {
        idle.long_gaps += 1;
        idle.long_before[r.name] += gap_ms / 1e3;
      }
    }
    if (idle.last_stop != nullptr) free_.push_back(idle.last_stop);
    idle.last_stop = r.stop;
    free_.push_back(r.start);
  }
  pending_.clear();
}

}  // namespace glm
