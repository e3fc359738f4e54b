// Data-parallel training loop (ZeRO stage 0 semantics: everything replicated, gradients all-reduced).
#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <filesystem>

#include "data/sharded_loader.h"
#include "model/glm4_model.h"
#include "train/adamw.h"
#include "train/lr_schedule.h"
#include "train/metrics_logger.h"

namespace glm {
namespace {

// Every rank holds every parameter and gradient.
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

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

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

struct DeviceBatch {
  Buffer tokens, targets, positions, doc_start;
};

}  // namespace

int64_t total_training_steps(const TrainConfig& c, int64_t dataset_size, int world_size) {
  if (c.max_steps > 0) return c.max_steps;
  const double global = static_cast<double>(c.per_device_train_batch_size * world_size * c.gradient_accumulation_steps);
  return std::max<int64_t>(
      1, static_cast<int64_t>(std::ceil(c.num_train_epochs * static_cast<double>(dataset_size) / global)));
}

Status initialize_parameters(const ModelConfig& config, uint64_t seed, Backend& backend, Tensor params) {
  ParamLayout layout(config);
  GLM_RETURN_IF_ERROR(backend.zero(params));
  int64_t largest = 0;
  for (const auto& e : layout.entries()) largest = std::max(largest, e.numel);
  GLM_ASSIGN_OR_RETURN(Buffer staging, backend.allocate(largest, DType::f64));
  std::vector<double> host(static_cast<size_t>(largest));
  for (const auto& e : layout.entries()) {
    SplitMix64 rng(seed ^ fnv1a(e.name));
    for (int64_t i = 0; i < e.numel; ++i) {
      switch (e.kind) {
        case ParamKind::norm:
          host[i] = 1.0;
          break;
        case ParamKind::bias:
          host[i] = 0.0;
          break;
        default:
          host[i] = config.initializer_range * rng.normal();
          break;
      }
    }
    Tensor s = staging.slice(0, e.numel);
    GLM_RETURN_IF_ERROR(backend.upload(s, host.data()));
    GLM_RETURN_IF_ERROR(backend.convert(params.slice(e.offset, e.numel), s));
  }
  return Status::ok();
}

Result<TrainSummary> train(const TrainConfig& config, const Dataset& dataset, Communicator& comm, Backend& backend) {
  using clock = std::chrono::steady_clock;
  const auto start_time = clock::now();
  const int world = comm.size(), rank = comm.rank();
  const int64_t total_steps = total_training_steps(config, static_cast<int64_t>(dataset.samples.size()), world);
  const int64_t max_tokens = config.per_device_train_batch_size * config.max_length;

  GLM_ASSIGN_OR_RETURN(auto model, Glm4Model::create(config.model, backend, max_tokens));
  const ParamLayout& layout = model->layout();
  const DType dtype = backend.compute_dtype();
  GLM_ASSIGN_OR_RETURN(Buffer params, backend.allocate(layout.total_numel(), dtype));
  GLM_ASSIGN_OR_RETURN(Buffer grads, backend.allocate(layout.total_numel(), dtype));
  GLM_RETURN_IF_ERROR(initialize_parameters(config.model, config.seed, backend, params.tensor()));
  ReplicatedParameters provider(layout, params.tensor(), grads.tensor());

  AdamWOptions adam{config.adam_beta1, config.adam_beta2, config.adam_epsilon, config.weight_decay};
  GLM_ASSIGN_OR_RETURN(AdamWOptimizer optimizer, AdamWOptimizer::create(backend, layout, params.tensor(), 0, adam));
  GLM_ASSIGN_OR_RETURN(LrSchedulerType schedule_type, parse_lr_scheduler_type(config.lr_scheduler_type));
  LrSchedule schedule{schedule_type, config.learning_rate,
                      resolve_warmup_steps(config.warmup_steps, config.warmup_ratio, total_steps), total_steps};

  DeviceBatch dev;
  for (Buffer* b : {&dev.tokens, &dev.targets, &dev.positions, &dev.doc_start}) {
    GLM_ASSIGN_OR_RETURN(*b, backend.allocate(max_tokens, DType::i32));
  }
  std::vector<double> losses_host(static_cast<size_t>(max_tokens));
  std::vector<float> losses_f32(static_cast<size_t>(max_tokens));

  const bool lead = rank == 0 && config.log_to_console;
  GLM_ASSIGN_OR_RETURN(MetricsLogger logger, MetricsLogger::open(rank == 0 ? config.output_dir : "", lead));
  ShardedLoader loader(dataset, config.seed, rank, world, config.per_device_train_batch_size,
                       config.gradient_accumulation_steps);
  const auto& rep = dataset.report;
  logger.print(concat("glm_hpc: ", backend.name(), " backend, world size ", world, ", model ", layout.parameter_count(),
                      " parameters (", config.model.num_hidden_layers, " layers, hidden ", config.model.hidden_size,
                      ")"));
  logger.print(concat("glm_hpc: dataset ", rep.kept, " samples (", rep.deleted_too_long, " of ", rep.read,
                      " deleted: longer than max_length ", config.max_length, "), ", rep.tokens, " tokens, ",
                      rep.target_tokens, " trained"));
  logger.print(concat("glm_hpc: global batch ", loader.global_batch_size(),
                      " samples = ", config.per_device_train_batch_size, " per device x ", world, " ranks x ",
                      config.gradient_accumulation_steps, " accumulation; ", total_steps, " steps, warmup ",
                      schedule.warmup_steps));

  TrainSummary summary;
  auto interval_start = clock::now();
  int64_t interval_tokens = 0;
  std::vector<HostMicroBatch> micro(static_cast<size_t>(config.gradient_accumulation_steps));
  for (int64_t step = 0; step < total_steps; ++step) {
    // Loss normalisation needs the global target count of the whole window before any backward.
    int64_t counts[2] = {0, 0};  // targets, tokens
    for (int64_t m = 0; m < config.gradient_accumulation_steps; ++m) {
      micro[static_cast<size_t>(m)] = loader.micro_batch(step, m);
      counts[0] += micro[static_cast<size_t>(m)].target_count;
      counts[1] += micro[static_cast<size_t>(m)].size();
    }
    GLM_RETURN_IF_ERROR(comm.all_reduce(counts, counts, 2, CommType::i64, ReduceOp::sum));
    const double grad_scale = counts[0] > 0 ? 1.0 / static_cast<double>(counts[0]) : 0.0;

    GLM_RETURN_IF_ERROR(backend.zero(grads.tensor()));
    double loss_sum = 0;
    for (const HostMicroBatch& hb : micro) {
      const int64_t n = hb.size();
      MicroBatch b{dev.tokens.slice(0, n), dev.targets.slice(0, n), dev.positions.slice(0, n),
                   dev.doc_start.slice(0, n), n};
      GLM_RETURN_IF_ERROR(backend.upload(b.tokens, hb.tokens.data()));
      GLM_RETURN_IF_ERROR(backend.upload(b.targets, hb.targets.data()));
      GLM_RETURN_IF_ERROR(backend.upload(b.positions, hb.positions.data()));
      GLM_RETURN_IF_ERROR(backend.upload(b.doc_start, hb.doc_start.data()));
      GLM_RETURN_IF_ERROR(model->forward_backward(b, grad_scale, provider));
      Tensor losses = model->losses().slice(0, n);
      if (losses.dtype == DType::f64) {
        GLM_RETURN_IF_ERROR(backend.download(losses_host.data(), losses));
        for (int64_t t = 0; t < n; ++t) loss_sum += losses_host[static_cast<size_t>(t)];
      } else {
        GLM_RETURN_IF_ERROR(backend.download(losses_f32.data(), losses));
        for (int64_t t = 0; t < n; ++t) loss_sum += losses_f32[static_cast<size_t>(t)];
      }
    }
    if (world > 1) {
      GLM_RETURN_IF_ERROR(comm.all_reduce(grads.tensor().data, grads.tensor().data, static_cast<size_t>(grads.numel()),
                                          comm_type(dtype), ReduceOp::sum));
    }
    GLM_RETURN_IF_ERROR(comm.all_reduce(&loss_sum, &loss_sum, 1, CommType::f64, ReduceOp::sum));
    const double loss = counts[0] > 0 ? loss_sum / static_cast<double>(counts[0]) : 0.0;
    GLM_ASSIGN_OR_RETURN(double sq, backend.sum_squares(grads.tensor()));
    const double grad_norm = std::sqrt(sq);
    if (!std::isfinite(loss) || !std::isfinite(grad_norm))
      return GLM_ERROR(ErrorKind::internal, "non-finite loss (", loss, ") or gradient norm (", grad_norm, ") at step ",
                       step + 1, "; lower --learning_rate or check the data");
    const double clip = config.max_grad_norm > 0 ? std::min(1.0, config.max_grad_norm / (grad_norm + 1e-6)) : 1.0;
    const double lr = schedule.at(step);
    GLM_RETURN_IF_ERROR(optimizer.step(grads.tensor(), lr, clip));
    summary.losses.push_back(loss);
    summary.grad_norms.push_back(grad_norm);
    summary.steps = step + 1;
    interval_tokens += counts[1];

    const bool last = step + 1 == total_steps;
    if (config.logging_steps > 0 && ((step + 1) % config.logging_steps == 0 || last)) {
      const auto now = clock::now();
      const double interval = std::chrono::duration<double>(now - interval_start).count();
      const double elapsed = std::chrono::duration<double>(now - start_time).count();
      StepMetrics m;
      m.step = step + 1;
      m.max_steps = total_steps;
      m.loss = loss;
      m.lr = lr;
      m.grad_norm = grad_norm;
      m.tokens = counts[1];
      m.tokens_per_second = interval > 0 ? static_cast<double>(interval_tokens) / interval : 0.0;
      m.elapsed_seconds = elapsed;
      m.eta_seconds = elapsed / static_cast<double>(step + 1) * static_cast<double>(total_steps - step - 1);
      GLM_RETURN_IF_ERROR(logger.log(m));
      interval_start = now;
      interval_tokens = 0;
    }
  }
  GLM_ASSIGN_OR_RETURN(summary.parameter_checksum, backend.sum_squares(params.tensor()));
  return summary;
}

}  // namespace glm
