// A fixed set of worker threads for data-parallel loops on the host (the offloaded optimizer):
// run(chunks, fn) calls fn(c) once for every c in [0, chunks), the caller's thread working too,
// and returns when all are done. Which thread runs which chunk varies; what a chunk computes must
// not depend on it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace glm {

class ThreadPool {
 public:
  // threads in all, the caller's included (1: everything runs on the caller's thread); the
  // workers run on `cpus` where given (their memory near those cores), anywhere otherwise.
  explicit ThreadPool(int threads, const std::vector<int>& cpus = {});
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }
  // One run at a time (from one caller thread).
  void run(int64_t chunks, const std::function<void(int64_t)>& fn);

 private:
  void work();
  void drain();

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t chunks_ = 0, next_ = 0, finished_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace glm
