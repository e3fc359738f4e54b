// Residual stream tensors on the device or in a device ring over pinned host memory (see
// residual_stash.h).
#include "model/residual_stash.h"

namespace glm {

Result<std::unique_ptr<ResidualStash>> ResidualStash::create(Backend& backend, int64_t count, int64_t numel,
                                                             DType dtype, bool offload) {
  if (count <= 0 || numel <= 0) return GLM_INTERNAL_ERROR("a residual stash of ", count, " x ", numel, " elements");
  std::unique_ptr<ResidualStash> s(new ResidualStash(backend, offload && count > kSlots));
  GLM_RETURN_IF_ERROR(s->allocate_device(device_tensors(count, s->offload_), numel, dtype));
  s->host_.resize(static_cast<size_t>(host_tensors(count, s->offload_)));
  for (Buffer& b : s->host_) {
    GLM_ASSIGN_OR_RETURN(b, backend.allocate_host(numel, dtype, /*pinned=*/true));
    s->host_bytes_ += static_cast<int64_t>(b.tensor().bytes());
  }
  s->down_.resize(static_cast<size_t>(count));
  s->up_.resize(static_cast<size_t>(count));
  return s;
}

Result<std::unique_ptr<ResidualStash>> ResidualStash::create_forward_only(Backend& backend, int64_t numel,
                                                                          DType dtype) {
  if (numel <= 0) return GLM_INTERNAL_ERROR("a residual stash of ", numel, " elements");
  std::unique_ptr<ResidualStash> s(new ResidualStash(backend, /*offload=*/false, /*forward_only=*/true));
  GLM_RETURN_IF_ERROR(s->allocate_device(kForwardOnlySlots, numel, dtype));
  return s;
}

Status ResidualStash::allocate_device(int64_t count, int64_t numel, DType dtype) {
  device_.resize(static_cast<size_t>(count));
  for (Buffer& b : device_) {
    GLM_ASSIGN_OR_RETURN(b, backend_.allocate(numel, dtype));
    device_bytes_ += static_cast<int64_t>(b.tensor().bytes());
  }
  holds_.assign(device_.size(), -1);
  return Status::ok();
}

Tensor ResidualStash::at(int64_t j) const { return device_[static_cast<size_t>(slot(j))].tensor(); }

Status ResidualStash::finish_copies() {
  Status first = Status::ok();
  for (auto* copies : {&down_, &up_})
    for (auto& c : *copies) {
      if (c == nullptr) continue;
      Status st = c->finish();
      if (first.is_ok() && !st.is_ok()) first = std::move(st);
      c.reset();
    }
  return first;
}

Status ResidualStash::begin(int64_t used, bool keep) {
  GLM_RETURN_IF_ERROR(finish_copies());
  if (used <= 0 || used > device_.front().numel())
    return GLM_INTERNAL_ERROR("a micro-batch of ", used, " residual elements for tensors of ", device_.front().numel());
  if (keep && forward_only_) return GLM_INTERNAL_ERROR("a backward's residual stream kept by a forward-only stash");
  used_ = used;
  keep_ = keep;
  holds_.assign(device_.size(), -1);
  return Status::ok();
}

Status ResidualStash::will_write(int64_t j) {
  int64_t& held = holds_[static_cast<size_t>(slot(j))];
  if (offload_ && keep_ && held >= 0 && held != j) {
    const auto& saved = down_[static_cast<size_t>(held)];
    if (saved == nullptr) return GLM_INTERNAL_ERROR("residual ", held, " overwritten before its copy to the host");
    GLM_RETURN_IF_ERROR(backend_.wait_for(*saved));
  }
  held = j;
  return Status::ok();
}

Status ResidualStash::written(int64_t j) {
  if (!offload_ || !keep_ || j >= static_cast<int64_t>(host_.size())) return Status::ok();
  GLM_ASSIGN_OR_RETURN(down_[static_cast<size_t>(j)],
                       backend_.start_download(host_[static_cast<size_t>(j)].tensor().data, at(j).slice(0, used_)));
  return Status::ok();
}

Status ResidualStash::prefetch(int64_t j) {
  int64_t& held = holds_[static_cast<size_t>(slot(j))];
  if (held == j) return Status::ok();
  if (!offload_ || j >= static_cast<int64_t>(host_.size()) || down_[static_cast<size_t>(j)] == nullptr)
    return GLM_INTERNAL_ERROR("residual ", j, " is neither on the device nor saved on the host");
  GLM_ASSIGN_OR_RETURN(up_[static_cast<size_t>(j)],
                       backend_.start_upload(at(j).slice(0, used_), host_[static_cast<size_t>(j)].tensor().data));
  held = j;
  return Status::ok();
}

Status ResidualStash::need(int64_t j) {
  GLM_RETURN_IF_ERROR(prefetch(j));
  if (static_cast<size_t>(j) >= up_.size()) return Status::ok();  // never on the host
  const auto& arriving = up_[static_cast<size_t>(j)];
  return arriving != nullptr ? backend_.wait_for(*arriving) : Status::ok();
}

}  // namespace glm
