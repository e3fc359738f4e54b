// Runs a function when a scope ends, however it ends (return, error, exception), unless released:
// temporary files are removed on every path that does not commit them.
#pragma once

#include <utility>

namespace glm {

template <typename F>
class ScopeExit {
 public:
  explicit ScopeExit(F f) : f_(std::move(f)) {}
  ~ScopeExit() {
    if (armed_) f_();
  }
  ScopeExit(const ScopeExit&) = delete;
  ScopeExit& operator=(const ScopeExit&) = delete;
  // The scope succeeded: f does not run.
  void release() { armed_ = false; }

 private:
  F f_;
  bool armed_ = true;
};

}  // namespace glm
