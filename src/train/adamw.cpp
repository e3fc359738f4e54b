// AdamW: decay ranges come from the layout, updates run per range on the backend.
#include "train/adamw.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace glm {

Result<AdamWOptimizer> AdamWOptimizer::with_state(Backend& backend, Tensor params, const AdamWOptions& options,
                                                  OptimizerOffload* offload, bool params_on_host, bool grads_on_host) {
  AdamWOptimizer opt(backend, params, options);
  const DType odt = backend.optimizer_dtype();
  if ((params_on_host || grads_on_host) && offload == nullptr)
    return GLM_INTERNAL_ERROR("parameters or gradients in host memory need the offloaded optimizer");
  if (offload != nullptr) {
    // A whole fp32 master on the host; the working copy rounds as the device's own update would.
    opt.offload_ = offload;
    opt.params_on_host_ = params_on_host;
    opt.grads_on_host_ = grads_on_host;
    if (options.split_master && params.dtype == DType::bf16) opt.bf16_ = cpu::Bf16Rounding::split_high;
    GLM_ASSIGN_OR_RETURN(opt.master_buffer_, offload->allocate_state(params.numel));
    GLM_ASSIGN_OR_RETURN(opt.exp_avg_, offload->allocate_state(params.numel));
    GLM_ASSIGN_OR_RETURN(opt.exp_avg_sq_, offload->allocate_state(params.numel));
    opt.master_ = opt.master_buffer_.tensor();
    GLM_RETURN_IF_ERROR(offload->read_params(opt.master_.as<float>(), params, params_on_host));
    return opt;
  }
  if (odt == params.dtype) {
    opt.master_ = params;
  } else if (options.split_master && params.dtype == DType::bf16 && odt == DType::f32) {
    // The master is the parameters exactly: low halves zero (allocate() zeroes).
    GLM_ASSIGN_OR_RETURN(opt.master_buffer_, backend.allocate(params.numel, DType::i16));
    opt.master_ = opt.master_buffer_.tensor();
  } else {
    GLM_ASSIGN_OR_RETURN(opt.master_buffer_, backend.allocate(params.numel, odt));
    opt.master_ = opt.master_buffer_.tensor();
    GLM_RETURN_IF_ERROR(backend.convert(opt.master_, params));
  }
  GLM_ASSIGN_OR_RETURN(opt.exp_avg_, backend.allocate(params.numel, odt));
  GLM_ASSIGN_OR_RETURN(opt.exp_avg_sq_, backend.allocate(params.numel, odt));
  return opt;
}

Result<AdamWOptimizer> AdamWOptimizer::create(Backend& backend, const ParamLayout& layout, Tensor params,
                                              int64_t offset, const AdamWOptions& options,
                                              OptimizerOffload* offload, bool params_on_host, bool grads_on_host) {
  GLM_ASSIGN_OR_RETURN(AdamWOptimizer opt, with_state(backend, params, options, offload, params_on_host, grads_on_host));
  // Runs of equal decay; alignment padding joins the run before it (its values stay zero).
  const int64_t end = offset + params.numel;
  for (const auto& e : layout.entries()) {
    const int64_t b = std::max(e.offset, offset) - offset;
    const int64_t en = std::min(e.offset + e.numel, end) - offset;
    if (b >= en) continue;
    if (!opt.ranges_.empty() && opt.ranges_.back().decay == e.weight_decay())
      opt.ranges_.back().end = en;
    else
      opt.ranges_.push_back({b, en, e.weight_decay()});
  }
  if (!opt.ranges_.empty()) {
    opt.ranges_.front().begin = 0;
    opt.ranges_.back().end = params.numel;
    for (size_t i = 1; i < opt.ranges_.size(); ++i) opt.ranges_[i - 1].end = opt.ranges_[i].begin;
  }
  return opt;
}

Result<AdamWOptimizer> AdamWOptimizer::create_uniform(Backend& backend, Tensor params, const AdamWOptions& options,
                                                      bool decay) {
  // Adapters are few: their master stays whole (LoRA checkpoints and lora_adapters() read it as is).
  AdamWOptions whole = options;
  whole.split_master = false;
  GLM_ASSIGN_OR_RETURN(AdamWOptimizer opt, with_state(backend, params, whole, nullptr, false, false));
  opt.ranges_.push_back({0, params.numel, decay});
  return opt;
}

AdamWStep AdamWOptimizer::step_scalars(int64_t step, double lr, double grad_scale, bool decay) const {
  AdamWStep s;
  s.lr = lr;
  s.beta1 = options_.beta1;
  s.beta2 = options_.beta2;
  s.eps = options_.eps;
  s.weight_decay = decay ? options_.weight_decay : 0.0;
  s.grad_scale = grad_scale;
  s.step = step;
  return s;
}

Status AdamWOptimizer::step(Tensor grads, double lr, double grad_scale, Tensor grad_sq_sum) {
  if (!deferred()) return step_part(grads, lr, grad_scale, grad_sq_sum, 0, params_.numel, /*first=*/true);
  ++step_;
  if (step_rows_count_ < 0) return GLM_INTERNAL_ERROR("optimizer step ", step_, " with deferred rows but no step rows");
  history_.push_back(step_scalars(step_, lr, grad_scale, ranges_.front().decay));
  Status st = apply_rows(step_rows_, step_rows_count_, /*gradient=*/true, grads, grad_sq_sum);
  step_rows_count_ = -1;
  GLM_RETURN_IF_ERROR(st);
  return step_ - floor_ >= max_history_ ? settle() : Status::ok();
}

Status AdamWOptimizer::step_part(Tensor grads, double lr, double grad_scale, Tensor grad_sq_sum, int64_t begin,
                                 int64_t end, bool first) {
  if (deferred() || begin < 0 || end > params_.numel || begin > end || (!first && step_ == 0))
    return GLM_INTERNAL_ERROR("optimizer step over [", begin, ", ", end, ") of ", params_.numel,
                              deferred() ? " elements with deferred rows" : " elements");
  if (first) ++step_;  // a failed part leaves the step half done: the engine then stops the run
  if (offloaded()) return host_step_part(grads, lr, grad_scale, grad_sq_sum, begin, end);
  for (const Range& r : ranges_) {
    const int64_t b = std::max(r.begin, begin), n = std::min(r.end, end) - b;
    if (n <= 0) continue;
    GLM_RETURN_IF_ERROR(backend_->adamw(params_.slice(b, n), master_.slice(b, n), grads.slice(b, n),
                                        exp_avg_.slice(b, n), exp_avg_sq_.slice(b, n),
                                        step_scalars(step_, lr, grad_scale, r.decay), grad_sq_sum));
  }
  return Status::ok();
}

Status AdamWOptimizer::host_step_part(Tensor grads, double lr, double grad_scale, Tensor grad_sq_sum, int64_t begin,
                                      int64_t end) {
  OptimizerOffload& o = *offload_;
  if (grads.dtype != o.grad_staging(0).dtype || params_.dtype != o.param_staging(0).dtype)
    return GLM_INTERNAL_ERROR("offloaded optimizer over ", dtype_name(grads.dtype), " gradients and ",
                              dtype_name(params_.dtype), " parameters");
  const int64_t chunk = o.staging_elements();
  const int64_t chunks = (end - begin + chunk - 1) / chunk;
  constexpr int kSlots = OptimizerOffload::kStagingSlots;
  // Chunk i uses slot i % 2 both ways: chunk i + 1's gradient comes over and chunk i - 1's
  // parameters go back while the host updates chunk i. Unfinished copies are waited for by their
  // destructors if a step fails.
  std::unique_ptr<AsyncCopy> down[kSlots], up[kSlots];
  auto fetch = [&](int64_t i) -> Status {
    if (grads_on_host_) return Status::ok();  // read where they are
    const int64_t at = begin + i * chunk;
    GLM_ASSIGN_OR_RETURN(down[i % kSlots], backend_->start_download(o.grad_staging(static_cast<int>(i % kSlots)).data,
                                                                   grads.slice(at, std::min(chunk, end - at))));
    return Status::ok();
  };
  double squares = 0;
  if (chunks > 0) GLM_RETURN_IF_ERROR(fetch(0));
  for (int64_t i = 0; i < chunks; ++i) {
    const int slot = static_cast<int>(i % kSlots);
    const int64_t at = begin + i * chunk, k = std::min(chunk, end - at);
    if (i + 1 < chunks) GLM_RETURN_IF_ERROR(fetch(i + 1));  // its slot's last reader, chunk i - 1, is done
    if (down[slot]) GLM_RETURN_IF_ERROR(down[slot]->finish());
    if (up[slot]) GLM_RETURN_IF_ERROR(up[slot]->finish());  // the parameter slot is free again
    // Parameters and gradients in host memory are read and written in place; those on the device
    // through the slot's staging.
    const Tensor staged_params = params_on_host_ ? params_.slice(at, k) : o.param_staging(slot);
    const Tensor staged_grads = grads_on_host_ ? grads.slice(at, k) : o.grad_staging(slot);
    squares += host_update(staged_grads, staged_params, at, k, lr, grad_scale, !grad_sq_sum.empty());
    if (!params_on_host_) {
      GLM_ASSIGN_OR_RETURN(up[slot], backend_->start_upload(params_.slice(at, k), staged_params.data));
    }
  }
  for (auto& u : up)
    if (u) GLM_RETURN_IF_ERROR(u->finish());
  if (grad_sq_sum.empty()) return Status::ok();
  double total = 0;
  GLM_RETURN_IF_ERROR(backend_->download(&total, grad_sq_sum));
  total += squares;
  return backend_->upload(grad_sq_sum, &total);
}

double AdamWOptimizer::host_update(Tensor grads, Tensor params, int64_t at, int64_t k, double lr, double grad_scale,
                                   bool sum_squares) {
  const bool f32 = params.dtype == DType::f32;
  double squares = 0;
  for (const Range& r : ranges_) {
    const int64_t b = std::max(r.begin, at), n = std::min(r.end, at + k) - b;
    if (n <= 0) continue;
    const int64_t s = b - at;  // in grads and params
    cpu::HostAdamWArrays a;
    a.master = master_.as<float>() + b;
    a.exp_avg = exp_avg_.tensor().as<float>() + b;
    a.exp_avg_sq = exp_avg_sq_.tensor().as<float>() + b;
    if (f32) {
      a.grad_f32 = grads.as<float>() + s;
      a.param_f32 = params.as<float>() + s;
    } else {
      a.grad_bf16 = grads.as<uint16_t>() + s;
      a.param_bf16 = params.as<uint16_t>() + s;
    }
    squares += cpu::host_adamw(offload_->pool(), a, n, step_scalars(step_, lr, grad_scale, r.decay),
                               backend_->adamw_rounding(), bf16_, sum_squares);
  }
  return squares;
}

Status AdamWOptimizer::prepare_delayed() {
  if (!offloaded() || deferred()) return GLM_INTERNAL_ERROR("a delayed update needs the offloaded optimizer");
  if (delayed_.grads.numel() > 0) return Status::ok();
  GLM_ASSIGN_OR_RETURN(delayed_.grads, offload_->allocate_host(params_.numel, params_.dtype));
  GLM_ASSIGN_OR_RETURN(delayed_.params, offload_->allocate_host(params_.numel, params_.dtype));
  return Status::ok();
}

Status AdamWOptimizer::start_delayed(Tensor grads, double lr, double grad_scale) {
  if (delayed_.started || delayed_.grads.numel() != params_.numel)
    return GLM_INTERNAL_ERROR("delayed update ", delayed_.started ? "still pending" : "not prepared");
  if (grads.numel != params_.numel || grads.dtype != delayed_.grads.tensor().dtype)
    return GLM_INTERNAL_ERROR("delayed update over ", grads.numel, " gradients for ", params_.numel, " parameters");
  if (grads_on_host_) {
    parallel_copy(delayed_.grads.tensor().data, grads.data, grads.bytes());
  } else if (params_.numel > 0) {
    GLM_RETURN_IF_ERROR(backend_->download(delayed_.grads.tensor().data, grads));
  }
  ++step_;
  delayed_.lr = lr;
  delayed_.grad_scale = grad_scale;
  delayed_.started = true;
  delayed_.ran = false;
  return Status::ok();
}

Status AdamWOptimizer::run_delayed() {
  if (!delayed_.started || delayed_.ran) return GLM_INTERNAL_ERROR("run_delayed() without a started update");
  host_update(delayed_.grads.tensor(), delayed_.params.tensor(), 0, params_.numel, delayed_.lr, delayed_.grad_scale,
              false);
  delayed_.ran = true;
  return Status::ok();
}

// In the offload's threads: a memcpy of GLM-4-9B's shards on one thread takes about a second.
void AdamWOptimizer::parallel_copy(void* dst, const void* src, size_t bytes) {
  constexpr size_t kChunk = size_t{1} << 24;
  char* to = static_cast<char*>(dst);
  const char* from = static_cast<const char*>(src);
  offload_->pool().run(static_cast<int64_t>((bytes + kChunk - 1) / kChunk), [&](int64_t c) {
    const size_t at = static_cast<size_t>(c) * kChunk;
    std::memcpy(to + at, from + at, std::min(kChunk, bytes - at));
  });
}

Status AdamWOptimizer::land_delayed() {
  if (!delayed_.started) return Status::ok();
  if (!delayed_.ran) return GLM_INTERNAL_ERROR("land_delayed() before run_delayed()");
  if (params_on_host_) {
    parallel_copy(params_.data, delayed_.params.tensor().data, params_.bytes());
  } else if (params_.numel > 0) {
    GLM_RETURN_IF_ERROR(backend_->upload(params_, delayed_.params.tensor().data));
  }
  delayed_.started = false;
  return Status::ok();
}

Status AdamWOptimizer::defer_rows(int64_t table_rows, int64_t width, int history) {
  if (table_rows <= 0 || width <= 0 || table_rows * width > params_.numel || table_rows > INT32_MAX || history < 1 ||
      history > AdamWRows::kMaxHistory || ranges_.size() != 1 || offloaded())
    return GLM_INTERNAL_ERROR("defer_rows: a table of ", table_rows, " x ", width, " in ", params_.numel,
                              " elements, history ", history);
  GLM_ASSIGN_OR_RETURN(row_step_, backend_->allocate(table_rows, DType::i32));  // zeroed: every row at floor_
  table_rows_ = table_rows;
  width_ = width;
  max_history_ = history;
  floor_ = step_;
  history_.clear();
  return Status::ok();
}

Status AdamWOptimizer::apply_rows(Tensor rows, int64_t count, bool gradient, Tensor grads, Tensor grad_sq_sum) {
  const int64_t n = table_rows_ * width_;
  AdamWRows r;
  r.rows = rows;
  r.count = count;
  r.width = width_;
  r.row_step = row_step_.tensor();
  r.floor = floor_;
  r.history = history_;
  r.until = step_;
  r.gradient = gradient;
  return backend_->adamw_rows(params_.slice(0, n), master_.slice(0, n), grads.empty() ? Tensor{} : grads.slice(0, n),
                              exp_avg_.slice(0, n), exp_avg_sq_.slice(0, n), r, grad_sq_sum);
}

Status AdamWOptimizer::catch_up(Tensor rows, int64_t count) {
  if (!deferred() || settled() || count == 0) return Status::ok();
  return apply_rows(rows, count, /*gradient=*/false, {}, {});
}

Status AdamWOptimizer::settle() {
  if (!deferred() || settled()) return Status::ok();
  GLM_RETURN_IF_ERROR(apply_rows({}, table_rows_, /*gradient=*/false, {}, {}));
  floor_ = step_;
  history_.clear();
  return Status::ok();
}

Status AdamWOptimizer::reset_master() {
  if (offloaded()) return offload_->read_params(master_.as<float>(), params_, params_on_host_);
  // The parameters were written whole: every row is current (catch up before writing, not after).
  if (deferred()) {
    floor_ = step_;
    history_.clear();
    GLM_RETURN_IF_ERROR(backend_->zero(row_step_.tensor()));
  }
  if (master_.data == params_.data) return Status::ok();
  if (split()) return backend_->zero(master_);  // the master is the parameters exactly
  return backend_->convert(master_, params_);
}

Status AdamWOptimizer::restored(int64_t steps) {
  step_ = steps;
  if (deferred()) {  // the whole state was written: every row at `steps`
    floor_ = steps;
    history_.clear();
    GLM_RETURN_IF_ERROR(backend_->zero(row_step_.tensor()));
  }
  if (offloaded()) return offload_->write_params(params_, master_.as<float>(), bf16_, params_on_host_);
  // A split master was written through both halves (OptimizerStateTransfer): the parameters are its high ones.
  if (master_.data == params_.data || split()) return Status::ok();
  return backend_->convert(params_, master_);
}

int64_t AdamWOptimizer::host_state_bytes() const {
  if (!offloaded()) return 0;
  return own_state_bytes() +
         static_cast<int64_t>(delayed_.grads.tensor().bytes() + delayed_.params.tensor().bytes());
}

int64_t AdamWOptimizer::state_bytes() const { return offloaded() ? 0 : own_state_bytes(); }

int64_t AdamWOptimizer::own_state_bytes() const {
  return static_cast<int64_t>(exp_avg_.tensor().bytes() + exp_avg_sq_.tensor().bytes() +
                              (master_buffer_.numel() > 0 ? master_buffer_.tensor().bytes() : 0));
}

}  // namespace glm
