// The residual stream of a micro-batch: each layer's input, which its backward reads again, and the
// last layer's output. Kept on the device, or with --offload_activations in pinned host memory
// between the forward and the backward of its layer, the device holding a ring of kSlots tensors:
// forward copies each input down while the next layers run, and backward brings each back one layer
// ahead of its use, so that the copies overlap compute in both directions.
#pragma once

#include <memory>
#include <vector>

#include "base/status.h"
#include "model/backend.h"

namespace glm {

class ResidualStash {
 public:
  // Device tensors in the ring: the layer being computed, the one before (its input's copy down
  // still running, or its copy up arriving) and one more for the copies' slack.
  static constexpr int64_t kSlots = 3;
  // Tensors on the device and in host memory for `count` residual tensors (the planner's numbers).
  static int64_t device_tensors(int64_t count, bool offload) { return offload && count > kSlots ? kSlots : count; }
  static int64_t host_tensors(int64_t count, bool offload) { return count - device_tensors(count, offload); }

  // count tensors of numel elements of dtype; with offload, host copies (pinned) of those the ring
  // overwrites. device_bytes() and host_bytes() say what was allocated.
  static Result<std::unique_ptr<ResidualStash>> create(Backend& backend, int64_t count, int64_t numel, DType dtype,
                                                       bool offload);
  // A forward without backward: two device tensors, tensor j in slot j % 2 (a layer reads its input
  // and writes its output); begin() refuses keep.
  static Result<std::unique_ptr<ResidualStash>> create_forward_only(Backend& backend, int64_t numel, DType dtype);
  static constexpr int64_t kForwardOnlySlots = 2;
  int64_t device_bytes() const { return device_bytes_; }
  int64_t host_bytes() const { return host_bytes_; }
  bool offloaded() const { return !host_.empty(); }

  // Tensor j's device storage (numel elements); it holds tensor j from will_write(j) or need(j) on
  // until the ring gives the slot to another.
  Tensor at(int64_t j) const;

  // Forward of a micro-batch whose tensors use their first `used` elements; keep: a backward will
  // read them (else nothing is copied). Finishes the previous micro-batch's copies.
  Status begin(int64_t used, bool keep);
  // Before the work that writes tensor j is enqueued: its slot's earlier tensor has reached the host.
  Status will_write(int64_t j);
  // After it: tensor j is final; its copy down starts where the ring will overwrite it.
  Status written(int64_t j);
  // Backward: tensor j's copy up starts, after the work enqueued so far (the slot's tensor, which
  // must be done with, is dropped); nothing when it is still on the device.
  Status prefetch(int64_t j);
  // Before the work that reads tensor j is enqueued: it is on the device (that work waits for its
  // copy up).
  Status need(int64_t j);

 private:
  ResidualStash(Backend& backend, bool offload, bool forward_only = false)
      : backend_(backend), offload_(offload), forward_only_(forward_only) {}
  int64_t slot(int64_t j) const { return offload_ ? j % kSlots : forward_only_ ? j % kForwardOnlySlots : j; }
  // `count` device tensors of numel elements, none holding a tensor yet.
  Status allocate_device(int64_t count, int64_t numel, DType dtype);
  Status finish_copies();

  Backend& backend_;
  bool offload_;
  bool forward_only_;
  std::vector<Buffer> device_;  // the ring (or every tensor)
  std::vector<Buffer> host_;    // tensor j's copy when the ring overwrites it
  std::vector<int64_t> holds_;  // the tensor in each device slot, -1 for none
  std::vector<std::unique_ptr<AsyncCopy>> down_, up_;  // per tensor, this micro-batch's
  int64_t used_ = 0;
  bool keep_ = false;
  int64_t device_bytes_ = 0, host_bytes_ = 0;
};

}  // namespace glm
