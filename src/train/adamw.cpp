// AdamW: decay ranges come from the layout, updates run per range on the backend.
#include "train/adamw.h"

#include <cstdlib>
#include <string>

namespace glm {

bool split_master_from_env() {
  const char* env = std::getenv("GLM_SPLIT_MASTER");
  return env == nullptr || std::string(env) != "0";
}

Result<AdamWOptimizer> AdamWOptimizer::with_state(Backend& backend, Tensor params, const AdamWOptions& options) {
  AdamWOptimizer opt(backend, params, options);
  const DType odt = backend.optimizer_dtype();
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
                                              int64_t offset, const AdamWOptions& options) {
  GLM_ASSIGN_OR_RETURN(AdamWOptimizer opt, with_state(backend, params, options));
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
  GLM_ASSIGN_OR_RETURN(AdamWOptimizer opt, with_state(backend, params, whole));
  opt.ranges_.push_back({0, params.numel, decay});
  return opt;
}

Status AdamWOptimizer::step(Tensor grads, double lr, double grad_scale, Tensor grad_sq_sum) {
  ++step_;
  for (const Range& r : ranges_) {
    AdamWStep s;
    s.lr = lr;
    s.beta1 = options_.beta1;
    s.beta2 = options_.beta2;
    s.eps = options_.eps;
    s.weight_decay = r.decay ? options_.weight_decay : 0.0;
    s.grad_scale = grad_scale;
    s.step = step_;
    const int64_t n = r.end - r.begin;
    GLM_RETURN_IF_ERROR(backend_->adamw(params_.slice(r.begin, n), master_.slice(r.begin, n), grads.slice(r.begin, n),
                                        exp_avg_.slice(r.begin, n), exp_avg_sq_.slice(r.begin, n), s,
                                        grad_sq_sum));
  }
  return Status::ok();
}

Status AdamWOptimizer::reset_master() {
  if (master_.data == params_.data) return Status::ok();
  if (split()) return backend_->zero(master_);  // the master is the parameters exactly
  return backend_->convert(master_, params_);
}

Status AdamWOptimizer::restored(int64_t steps) {
  step_ = steps;
  // A split master was written through both halves (MasterTransfer): the parameters are its high ones.
  if (master_.data == params_.data || split()) return Status::ok();
  return backend_->convert(params_, master_);
}

int64_t AdamWOptimizer::state_bytes() const {
  return static_cast<int64_t>(exp_avg_.tensor().bytes() + exp_avg_sq_.tensor().bytes() +
                              (master_buffer_.numel() > 0 ? master_buffer_.tensor().bytes() : 0));
}

}  // namespace glm
