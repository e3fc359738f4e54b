// Workers wait for a generation change, then take chunks from a shared counter under the lock:
// chunks are large (tens of thousands of elements), so the lock is not what limits the rate.
#include "base/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>

namespace glm {

ThreadPool::ThreadPool(int threads, const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  const bool pin = CPU_COUNT(&set) > 0;
  for (int i = 1; i < std::max(threads, 1); ++i)
    workers_.emplace_back([this, set, pin] {
      if (pin) pthread_setaffinity_np(pthread_self(), sizeof(set), &set);  // best effort: else anywhere
      work();
    });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (next_ < chunks_) {
    const int64_t c = next_++;
    const auto* fn = fn_;
    lock.unlock();
    (*fn)(c);
    lock.lock();
    if (++finished_ == chunks_) done_.notify_all();
  }
}

void ThreadPool::work() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    drain();
  }
}

void ThreadPool::run(int64_t chunks, const std::function<void(int64_t)>& fn) {
  if (chunks <= 0) return;
  if (workers_.empty() || chunks == 1) {
    for (int64_t c = 0; c < chunks; ++c) fn(c);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fn_ = &fn;
    chunks_ = chunks;
    next_ = 0;
    finished_ = 0;
    ++generation_;
  }
  wake_.notify_all();
  drain();
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return finished_ == chunks_; });
  fn_ = nullptr;
}

}  // namespace glm
