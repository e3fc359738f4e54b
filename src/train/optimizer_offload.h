// The optimizer offloaded to the host (--offload_optimizer cpu, DeepSpeed's offload_optimizer):
// each rank's fp32 master weights and Adam moments live in host memory (page-locked unless
// --offload_pin_memory false) and host threads update them with the backend's own rounding
// (kernels/cpu/host_adamw.h), so an offloaded run computes the same bits as one that is not. The
// state is allocated on, and the threads run on, the NUMA node nearest the GPU (Backend::host_numa_node).
// Gradients come to the host and the updated working copy goes back through two staging slots of
// OffloadConfig::staging_elements each way: the next chunk's gradient comes over and the last
// chunk's parameters go back while the host updates the current one.
#pragma once

#include <memory>

#include "base/numa.h"
#include "base/thread_pool.h"
#include "model/backend.h"

namespace glm {

struct OffloadConfig {
  bool optimizer = false;   // --offload_optimizer cpu
  bool pin_memory = true;   // --offload_pin_memory
  int threads = 1;          // host threads of this rank's updates (--offload_threads, resolved)
  int64_t staging_elements = int64_t{1} << 22;  // per staging slot and direction (tests make it small)
  // --offload_delayed_update (ZeRO-Offload's one-step delayed parameter update): a step's host
  // update runs beside the next step's forward and backward, which see the parameters from before
  // it; its result lands after that backward (or before anything reads the parameters).
  bool delayed_update = false;
  int64_t delayed_update_after = 0;  // optimizer steps updated at once before the delay begins
};

class OptimizerOffload {
 public:
  static constexpr int kStagingSlots = 2;

  static Result<std::unique_ptr<OptimizerOffload>> create(Backend& backend, const OffloadConfig& config);

  Backend& backend() { return backend_; }
  ThreadPool& pool() { return pool_; }
  int64_t staging_elements() const { return config_.staging_elements; }
  // Host f32 memory for state, zeroed.
  Result<Buffer> allocate_state(int64_t numel) { return backend_.allocate_host(numel, DType::f32, config_.pin_memory); }
  // Host memory of another dtype (the delayed update's gradient and working copy).
  Result<Buffer> allocate_host(int64_t numel, DType dtype) {
    return backend_.allocate_host(numel, dtype, config_.pin_memory);
  }
  bool delayed_update() const { return config_.delayed_update; }
  // Whether optimizer step `step` (1-based) is a delayed one.
  bool delays_step(int64_t step) const { return config_.delayed_update && step > config_.delayed_update_after; }
  // Host memory of the staging buffers.
  int64_t staging_bytes() const {
    int64_t b = 0;
    for (int i = 0; i < kStagingSlots; ++i) b += static_cast<int64_t>(grads_[i].tensor().bytes() + params_[i].tensor().bytes());
    return b;
  }

  // master[i] = params[i] widened to f32 (host master from the working copy, in backend memory or,
  // where params_on_host, host memory).
  Status read_params(float* master, Tensor params, bool params_on_host);
  // params[i] = master[i] in the working copy's dtype, rounded as bf16 says.
  Status write_params(Tensor params, const float* master, cpu::Bf16Rounding bf16, bool params_on_host);
  // The staging slots (host, the backend's compute dtype).
  Tensor grad_staging(int slot) const { return grads_[slot].tensor(); }
  Tensor param_staging(int slot) const { return params_[slot].tensor(); }

 private:
  OptimizerOffload(Backend& backend, const OffloadConfig& config)
      : backend_(backend), config_(config), pool_(config.threads, numa_node_cpus(backend.host_numa_node())) {}

  Backend& backend_;
  OffloadConfig config_;
  ThreadPool pool_;
  Buffer grads_[kStagingSlots], params_[kStagingSlots];
};

}  // namespace glm
