// One optimizer step, replicated data parallelism (ZeRO stage 0): every rank holds everything.
#include "train/engine.h"

#include <cmath>

#include "train/trainer.h"

namespace glm {
namespace {

class ReplicatedParameters final : public ParameterProvider {
 public:
  ReplicatedParameters(const ParamLayout& layout, Tensor params, Tensor grads)
      : layout_(layout), params_(params), grads_(grads) {}
  Result<Tensor> acquire_params(int unit) override { return slice(params_, unit); }
  Tensor unit_grads(int unit) override { return slice(grads_, unit); }

 private:
  Tensor slice(Tensor t, int unit) const {
    const ParamUnit& u = layout_.units()[static_cast<size_t>(unit)];
    return t.slice(u.offset, u.numel);
  }
  const ParamLayout& layout_;
  Tensor params_, grads_;
};

CommType comm_type(DType d) {
  switch (d) {
    case DType::f64:
      return CommType::f64;
    case DType::bf16:
      return CommType::bf16;
    case DType::i32:
      return CommType::i32;
    case DType::f32:
      break;
  }
  return CommType::f32;
}

}  // namespace

Result<std::unique_ptr<TrainingEngine>> TrainingEngine::create(const ModelConfig& config, Backend& backend,
                                                               Communicator& comm, int64_t max_tokens,
                                                               std::optional<AdamWOptions> adam, double max_grad_norm) {
  std::unique_ptr<TrainingEngine> e(new TrainingEngine(backend, comm));
  e->max_grad_norm_ = max_grad_norm;
  GLM_ASSIGN_OR_RETURN(e->model_, Glm4Model::create(config, backend, max_tokens));
  const int64_t total = e->model_->layout().total_numel();
  GLM_ASSIGN_OR_RETURN(e->params_, backend.allocate(total, backend.compute_dtype()));
  GLM_ASSIGN_OR_RETURN(e->grads_, backend.allocate(total, backend.compute_dtype()));
  for (Buffer* b : {&e->tokens_, &e->targets_, &e->positions_, &e->doc_start_}) {
    GLM_ASSIGN_OR_RETURN(*b, backend.allocate(max_tokens, DType::i32));
  }
  e->provider_ = std::make_unique<ReplicatedParameters>(e->model_->layout(), e->params_.tensor(), e->grads_.tensor());
  if (adam) {
    GLM_ASSIGN_OR_RETURN(AdamWOptimizer opt,
                         AdamWOptimizer::create(backend, e->model_->layout(), e->params_.tensor(), 0, *adam));
    e->optimizer_ = std::make_unique<AdamWOptimizer>(std::move(opt));
  }
  return e;
}

Status TrainingEngine::initialize_parameters(uint64_t seed) {
  GLM_RETURN_IF_ERROR(glm::initialize_parameters(config(), seed, backend_, params_.tensor()));
  return parameters_updated();
}

Status TrainingEngine::set_parameter(int entry, std::span<const float> values) {
  const ParamEntry& e = layout().entry(entry);
  if (static_cast<int64_t>(values.size()) != e.numel)
    return GLM_INTERNAL_ERROR("set_parameter(", e.name, "): ", values.size(), " values for ", e.numel, " elements");
  GLM_ASSIGN_OR_RETURN(Buffer staging, backend_.allocate(e.numel, DType::f32));
  GLM_RETURN_IF_ERROR(backend_.upload(staging.tensor(), values.data()));
  return backend_.convert(params_.slice(e.offset, e.numel), staging.tensor());
}

Status TrainingEngine::parameters_updated() { return optimizer_ ? optimizer_->reset_master() : Status::ok(); }

Result<MicroBatch> TrainingEngine::upload(const HostMicroBatch& hb) {
  const int64_t n = hb.size();
  if (n <= 0 || n > model_->max_tokens())
    return GLM_INTERNAL_ERROR("micro-batch of ", n, " tokens outside (0, ", model_->max_tokens(), "]");
  MicroBatch b{tokens_.slice(0, n), targets_.slice(0, n), positions_.slice(0, n), doc_start_.slice(0, n), n};
  GLM_RETURN_IF_ERROR(backend_.upload(b.tokens, hb.tokens.data()));
  GLM_RETURN_IF_ERROR(backend_.upload(b.targets, hb.targets.data()));
  GLM_RETURN_IF_ERROR(backend_.upload(b.positions, hb.positions.data()));
  GLM_RETURN_IF_ERROR(backend_.upload(b.doc_start, hb.doc_start.data()));
  return b;
}

Result<double> TrainingEngine::local_loss_sum(int64_t n) {
  // Per-token losses are few (one micro-batch); summing them on the host in double is exact enough.
  Tensor losses = model_->losses().slice(0, n);
  std::vector<double> as_double(static_cast<size_t>(n));
  if (losses.dtype == DType::f64) {
    GLM_RETURN_IF_ERROR(backend_.download(as_double.data(), losses));
  } else {
    std::vector<float> f(static_cast<size_t>(n));
    GLM_RETURN_IF_ERROR(backend_.download(f.data(), losses));
    for (int64_t t = 0; t < n; ++t) as_double[static_cast<size_t>(t)] = f[static_cast<size_t>(t)];
  }
  double sum = 0;
  for (double v : as_double) sum += v;
  return sum;
}

Result<StepResult> TrainingEngine::step(std::span<const HostMicroBatch> micro, double lr) {
  if (!optimizer_) return GLM_INTERNAL_ERROR("step() on an engine created without an optimizer");
  // Loss normalisation needs the global target count of the whole window before any backward.
  int64_t counts[2] = {0, 0};  // targets, tokens
  for (const auto& m : micro) {
    counts[0] += m.target_count;
    counts[1] += m.size();
  }
  GLM_RETURN_IF_ERROR(comm_.all_reduce(counts, counts, 2, CommType::i64, ReduceOp::sum));
  const double grad_scale = counts[0] > 0 ? 1.0 / static_cast<double>(counts[0]) : 0.0;

  GLM_RETURN_IF_ERROR(backend_.zero(grads_.tensor()));
  double loss_sum = 0;
  for (const HostMicroBatch& hb : micro) {
    GLM_ASSIGN_OR_RETURN(MicroBatch b, upload(hb));
    GLM_RETURN_IF_ERROR(model_->forward_backward(b, grad_scale, *provider_));
    GLM_ASSIGN_OR_RETURN(double s, local_loss_sum(b.n));
    loss_sum += s;
  }
  if (comm_.size() > 1) {
    GLM_RETURN_IF_ERROR(comm_.all_reduce(grads_.tensor().data, grads_.tensor().data,
                                         static_cast<size_t>(grads_.numel()), comm_type(grads_.tensor().dtype),
                                         ReduceOp::sum));
  }
  GLM_RETURN_IF_ERROR(comm_.all_reduce(&loss_sum, &loss_sum, 1, CommType::f64, ReduceOp::sum));
  StepResult r;
  r.loss = counts[0] > 0 ? loss_sum / static_cast<double>(counts[0]) : 0.0;
  r.targets = counts[0];
  r.tokens = counts[1];
  GLM_ASSIGN_OR_RETURN(double sq, backend_.sum_squares(grads_.tensor()));
  r.grad_norm = std::sqrt(sq);
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm))
    return GLM_ERROR(ErrorKind::internal, "non-finite loss (", r.loss, ") or gradient norm (", r.grad_norm,
                     ") at optimizer step ", optimizer_->steps_taken() + 1,
                     "; lower --learning_rate or check the data");
  // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1.
  const double clip = max_grad_norm_ > 0 ? std::min(1.0, max_grad_norm_ / (r.grad_norm + 1e-6)) : 1.0;
  GLM_RETURN_IF_ERROR(optimizer_->step(grads_.tensor(), lr, clip));
  return r;
}

Result<EvalResult> TrainingEngine::evaluate(const HostMicroBatch& hb) {
  EvalResult r;
  if (hb.size() > 0) {
    GLM_ASSIGN_OR_RETURN(MicroBatch b, upload(hb));
    GLM_RETURN_IF_ERROR(model_->forward(b, *provider_));
    GLM_ASSIGN_OR_RETURN(r.loss_sum, local_loss_sum(b.n));
    r.targets = hb.target_count;
  }
  GLM_RETURN_IF_ERROR(comm_.all_reduce(&r.loss_sum, &r.loss_sum, 1, CommType::f64, ReduceOp::sum));
  GLM_RETURN_IF_ERROR(comm_.all_reduce(&r.targets, &r.targets, 1, CommType::i64, ReduceOp::sum));
  return r;
}

Status TrainingEngine::logits(const HostMicroBatch& hb, std::vector<float>& out) {
  GLM_ASSIGN_OR_RETURN(MicroBatch b, upload(hb));
  const int64_t numel = b.n * config().vocab_size;
  if (logits_.numel() < numel) {
    GLM_ASSIGN_OR_RETURN(logits_, backend_.allocate(numel, backend_.compute_dtype()));
  }
  Tensor l = logits_.slice(0, numel);
  GLM_RETURN_IF_ERROR(model_->forward_logits(b, *provider_, l));
  out.resize(static_cast<size_t>(numel));
  if (l.dtype == DType::f32) return backend_.download(out.data(), l);
  GLM_ASSIGN_OR_RETURN(Buffer staging, backend_.allocate(numel, DType::f32));
  GLM_RETURN_IF_ERROR(backend_.convert(staging.tensor(), l));
  return backend_.download(out.data(), staging.tensor());
}

}  // namespace glm
