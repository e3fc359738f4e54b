// One optimizer step, replicated data parallelism (ZeRO stage 0): every rank holds everything.
#include "train/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>

#include "kernels/master_split.h"
#include "model/param_init.h"

namespace glm {

Result<std::unique_ptr<TrainingEngine>> TrainingEngine::create(const ModelConfig& config, Backend& backend,
                                                               Communicator& comm, int64_t max_tokens,
                                                               std::optional<AdamWOptions> adam, double max_grad_norm,
                                                               int zero_stage, Recompute recompute,
                                                               Communicator* data_comm, const ZeroOptions& zero_options,
                                                               const LoraConfig* lora) {
  std::unique_ptr<TrainingEngine> e(new TrainingEngine(backend, comm));
  e->max_grad_norm_ = max_grad_norm;
  if (const char* env = std::getenv("GLM_OPTIMIZER_IN_BACKWARD"); env != nullptr) {
    e->optimizer_in_backward_ = std::string(env) != "0";
  }
  e->data_comm_ = data_comm != nullptr ? data_comm : &comm;
  e->grad_reduce_dtype_ = effective_reduce_dtype(zero_options, backend.compute_dtype(), comm.size());
  if (lora != nullptr) GLM_RETURN_IF_ERROR(lora->validate());
  GLM_ASSIGN_OR_RETURN(e->model_, Glm4Model::create(config, backend, max_tokens, comm.size(), recompute,
                                                    persistence_policy(zero_options, zero_stage)));
  GLM_ASSIGN_OR_RETURN(e->zero_, ZeroParameters::create(e->model_->layout(), backend, comm, zero_stage, data_comm,
                                                        zero_options, /*frozen=*/lora != nullptr));
  // tokens, targets, positions, doc_start, label_rows, label_targets, token_order, token_runs.
  GLM_ASSIGN_OR_RETURN(e->batch_ints_, backend.allocate(micro_batch_ints(max_tokens), DType::i32));
  GLM_ASSIGN_OR_RETURN(e->correct_, backend.allocate(max_tokens, DType::i32));
  GLM_ASSIGN_OR_RETURN(e->grad_sq_sum_, backend.allocate(1, DType::f64));
  if (lora != nullptr) {
    e->lora_layout_ = std::make_unique<LoraLayout>(config, *lora);
    const int64_t n = e->lora_layout_->total_numel();
    GLM_ASSIGN_OR_RETURN(e->lora_params_, backend.allocate(n, backend.compute_dtype()));
    GLM_ASSIGN_OR_RETURN(e->lora_grads_, backend.allocate(n, backend.compute_dtype()));
    if (e->grad_reduce_dtype_ != backend.compute_dtype() && comm.size() > 1) {
      GLM_ASSIGN_OR_RETURN(e->lora_reduce_, backend.allocate(n, e->grad_reduce_dtype_));
    }
    GLM_RETURN_IF_ERROR(e->model_->attach_lora(*e->lora_layout_, e->lora_params_.tensor(), e->lora_grads_.tensor()));
    if (adam) {
      GLM_ASSIGN_OR_RETURN(AdamWOptimizer opt,
                           AdamWOptimizer::create_uniform(backend, e->lora_params_.tensor(), *adam, /*decay=*/true));
      e->lora_optimizer_.push_back(std::move(opt));
      e->has_optimizer_ = true;
    }
    return e;
  }
  if (adam) {
    const int units = static_cast<int>(e->layout().units().size());
    for (int u = 0; u < units; ++u) {
      GLM_ASSIGN_OR_RETURN(AdamWOptimizer opt, AdamWOptimizer::create(backend, e->layout(), e->zero_->owned_params(u),
                                                                      e->zero_->owned_offset(u), *adam));
      e->optimizers_.push_back(std::move(opt));
    }
    e->has_optimizer_ = true;
    // Deferred embedding rows at stage 0 (every rank holds and updates the whole table; the rows a
    // step's gradient can reach are the tokens of every rank's batches), the table at the start of
    // its own unit.
    const int history = deferred_rows_history_from_env();
    const ParamEntry& table = e->layout().entry(e->layout().embedding());
    const int unit = e->layout().embedding_unit();
    const ParamUnit& table_unit = e->layout().units()[static_cast<size_t>(unit)];
    if (history > 0 && zero_stage == 0 && table.unit == unit && table.offset == table_unit.offset &&
        table_unit.entries.size() == 1) {
      GLM_RETURN_IF_ERROR(
          e->optimizers_[static_cast<size_t>(unit)].defer_rows(config.vocab_size, config.hidden_size, history));
      e->deferred_unit_ = unit;
      GLM_ASSIGN_OR_RETURN(e->step_rows_, backend.allocate(config.vocab_size, DType::i32));
      e->row_seen_.assign(static_cast<size_t>(config.vocab_size), 0);
    }
  }
  return e;
}

Status TrainingEngine::settle_optimizer() {
  for (auto& opt : optimizers_) GLM_RETURN_IF_ERROR(opt.settle());
  return Status::ok();
}

bool TrainingEngine::optimizer_settled() const {
  for (const auto& opt : optimizers_)
    if (!opt.settled()) return false;
  return true;
}

Result<int64_t> TrainingEngine::upload_token_rows(std::span<const HostMicroBatch> batches) {
  const int64_t vocab = config().vocab_size;
  for (const HostMicroBatch& b : batches)
    for (const int32_t t : b.tokens)
      if (t < 0 || t >= vocab) return GLM_INTERNAL_ERROR("token ", t, " outside the vocabulary of ", vocab);
  rows_host_.clear();
  if (comm_.size() == 1) {
    // The distinct tokens, ascending, from a linear sort of the step's tokens (a pass over a byte
    // per word of the vocabulary took ~85 us at GLM-4's, host time the GPU waits for).
    step_tokens_.clear();
    for (const HostMicroBatch& b : batches) step_tokens_.insert(step_tokens_.end(), b.tokens.begin(), b.tokens.end());
    const std::vector<int32_t> order = order_by_token(step_tokens_);
    for (size_t i = 0; i < order.size(); ++i) {
      const int32_t t = step_tokens_[static_cast<size_t>(order[i])];
      if (rows_host_.empty() || rows_host_.back() != t) rows_host_.push_back(t);
    }
  } else {
    // The gradient all-reduced over the ranks reaches the rows of every rank's tokens (a byte each).
    for (const HostMicroBatch& b : batches)
      for (const int32_t t : b.tokens) row_seen_[static_cast<size_t>(t)] = 1;
    GLM_RETURN_IF_ERROR(
        comm_.all_reduce(row_seen_.data(), row_seen_.data(), row_seen_.size(), CommType::u8, ReduceOp::max));
    for (size_t t = 0; t < row_seen_.size(); ++t)
      if (row_seen_[t] != 0) rows_host_.push_back(static_cast<int32_t>(t));
    std::fill(row_seen_.begin(), row_seen_.end(), uint8_t{0});
  }
  const int64_t n = static_cast<int64_t>(rows_host_.size());
  if (n > 0) GLM_RETURN_IF_ERROR(backend_.upload(step_rows_.slice(0, n), rows_host_.data()));
  return n;
}

Status TrainingEngine::initialize_parameters(uint64_t seed) {
  GLM_RETURN_IF_ERROR(zero_->fill_stored([&](Tensor dst, int64_t begin) {
    return initialize_parameter_range(layout(), config(), seed, backend_, dst, begin);
  }));
  return parameters_updated();
}

int64_t TrainingEngine::steps_taken() const {
  if (!lora_optimizer_.empty()) return lora_optimizer_.front().steps_taken();
  return optimizers_.empty() ? 0 : optimizers_.front().steps_taken();
}

Status TrainingEngine::initialize_lora(uint64_t seed) {
  if (!lora_layout_) return GLM_INTERNAL_ERROR("initialize_lora on an engine without LoRA");
  lora_seed_ = seed;
  return set_lora_adapters(initial_lora_values(*lora_layout_, seed));
}

Status TrainingEngine::set_lora_adapters(std::span<const float> values) {
  if (!lora_layout_) return GLM_INTERNAL_ERROR("set_lora_adapters on an engine without LoRA");
  if (static_cast<int64_t>(values.size()) != lora_params_.numel())
    return GLM_INTERNAL_ERROR("set_lora_adapters: ", values.size(), " values for ", lora_params_.numel());
  GLM_ASSIGN_OR_RETURN(Buffer staging, backend_.allocate(lora_params_.numel(), DType::f32));
  GLM_RETURN_IF_ERROR(backend_.upload(staging.tensor(), values.data()));
  GLM_RETURN_IF_ERROR(backend_.convert(lora_params_.tensor(), staging.tensor()));
  for (auto& opt : lora_optimizer_) GLM_RETURN_IF_ERROR(opt.reset_master());
  return backend_.synchronize();
}

Result<std::vector<float>> TrainingEngine::download_f32(Tensor t) {
  std::vector<float> out(static_cast<size_t>(t.numel));
  GLM_ASSIGN_OR_RETURN(Buffer staging, backend_.allocate(t.numel, DType::f32));
  GLM_RETURN_IF_ERROR(backend_.convert(staging.tensor(), t));
  GLM_RETURN_IF_ERROR(backend_.download(out.data(), staging.tensor()));
  return out;
}

Result<std::vector<float>> TrainingEngine::lora_adapters() {
  if (!lora_layout_) return GLM_INTERNAL_ERROR("lora_adapters on an engine without LoRA");
  // The fp32 master where there is one: exactly what the optimizer holds.
  return download_f32(lora_optimizer_.empty() ? lora_params_.tensor() : lora_optimizer_.front().master());
}

Result<std::vector<float>> TrainingEngine::parameters() {
  if (zero_->stage() == 3) return GLM_INTERNAL_ERROR("parameters(): ZeRO-3 stores shards only");
  GLM_RETURN_IF_ERROR(settle_optimizer());
  std::vector<float> out(static_cast<size_t>(layout().total_numel()));
  for (size_t u = 0; u < layout().units().size(); ++u) {
    GLM_ASSIGN_OR_RETURN(Tensor t, zero_->acquire_params(static_cast<int>(u)));
    GLM_ASSIGN_OR_RETURN(std::vector<float> v, download_f32(t));
    std::copy(v.begin(), v.end(), out.begin() + layout().units()[u].offset);
  }
  return out;
}

Result<std::vector<float>> TrainingEngine::lora_gradients() {
  if (!lora_layout_) return GLM_INTERNAL_ERROR("lora_gradients on an engine without LoRA");
  return download_f32(lora_grads_.tensor());
}

// Adapters are replicated: one all-reduce of their whole gradient (about 21M elements for
// GLM-4-9B at rank 8 on every linear), in --grad_reduce_dtype.
Status TrainingEngine::reduce_lora_gradients() {
  if (comm_.size() == 1) return Status::ok();
  Communicator& data = *data_comm_;
  Tensor g = lora_grads_.tensor(), wire = lora_reduce_.numel() > 0 ? lora_reduce_.tensor() : g;
  if (wire.data != g.data) GLM_RETURN_IF_ERROR(backend_.convert(wire, g));
  if (!data.device_buffers()) GLM_RETURN_IF_ERROR(backend_.synchronize());
  const CommType type =
      wire.dtype == DType::f64 ? CommType::f64 : (wire.dtype == DType::bf16 ? CommType::bf16 : CommType::f32);
  GLM_RETURN_IF_ERROR(
      data.start_all_reduce(wire.data, wire.data, static_cast<size_t>(wire.numel), type, ReduceOp::sum)->wait());
  if (wire.data != g.data) GLM_RETURN_IF_ERROR(backend_.convert(g, wire));
  return Status::ok();
}

TrainingEngine::OptimizerShard TrainingEngine::optimizer_shard(int unit) const {
  const AdamWOptimizer& opt = optimizers_[static_cast<size_t>(unit)];
  return {opt.master(), opt.exp_avg(), opt.exp_avg_sq(),
          zero_->owned_offset(unit) - layout().units()[static_cast<size_t>(unit)].offset,
          opt.split() ? opt.params() : Tensor{}};
}

// Split masters move as their two halves (bf16 and i16 bits), joined or split on the host: exact,
// and no device memory beyond what the run planned.
Status MasterTransfer::download(const TrainingEngine::OptimizerShard& s, int64_t offset, std::span<float> dst) {
  const int64_t n = static_cast<int64_t>(dst.size());
  if (s.master.dtype != DType::i16) return backend_.download(dst.data(), s.master.slice(offset, n));
  for (int64_t at = 0; at < n; at += kChunkElements) {
    const int64_t k = std::min(kChunkElements, n - at);
    hi_.resize(static_cast<size_t>(k));
    lo_.resize(static_cast<size_t>(k));
    GLM_RETURN_IF_ERROR(backend_.download(hi_.data(), s.params.slice(offset + at, k)));
    GLM_RETURN_IF_ERROR(backend_.download(lo_.data(), s.master.slice(offset + at, k)));
    for (int64_t i = 0; i < k; ++i)
      dst[static_cast<size_t>(at + i)] = join_master(hi_[static_cast<size_t>(i)], lo_[static_cast<size_t>(i)]);
  }
  return Status::ok();
}

Status MasterTransfer::upload(const TrainingEngine::OptimizerShard& s, int64_t offset, std::span<const float> src) {
  const int64_t n = static_cast<int64_t>(src.size());
  if (s.master.dtype != DType::i16) return backend_.upload(s.master.slice(offset, n), src.data());
  for (int64_t at = 0; at < n; at += kChunkElements) {
    const int64_t k = std::min(kChunkElements, n - at);
    hi_.resize(static_cast<size_t>(k));
    lo_.resize(static_cast<size_t>(k));
    for (int64_t i = 0; i < k; ++i)
      split_master(src[static_cast<size_t>(at + i)], hi_[static_cast<size_t>(i)], lo_[static_cast<size_t>(i)]);
    GLM_RETURN_IF_ERROR(backend_.upload(s.params.slice(offset + at, k), hi_.data()));
    GLM_RETURN_IF_ERROR(backend_.upload(s.master.slice(offset + at, k), lo_.data()));
  }
  return Status::ok();
}

TrainingEngine::OptimizerShard TrainingEngine::lora_optimizer_state() const {
  if (lora_optimizer_.empty()) return {};
  const AdamWOptimizer& opt = lora_optimizer_.front();
  return {opt.master(), opt.exp_avg(), opt.exp_avg_sq(), 0, Tensor{}};
}

Result<double> TrainingEngine::base_checksum() {
  GLM_RETURN_IF_ERROR(settle_optimizer());
  // This rank's shards sit inside the previous step's in-place all-gathers (stages 1-2).
  GLM_RETURN_IF_ERROR(zero_->settle_gathers());
  double sum = 0;
  const int units = static_cast<int>(layout().units().size());
  for (int u = 0; u < units; ++u) {
    if (zero_->owned_params(u).numel == 0) continue;  // a unit whose tensors are all persistent
    GLM_ASSIGN_OR_RETURN(double s, backend_.sum_squares(zero_->owned_params(u)));
    sum += s;
  }
  if (zero_->stage() > 0) GLM_RETURN_IF_ERROR(comm_.all_reduce(&sum, &sum, 1, CommType::f64, ReduceOp::sum));
  return sum;
}

Status TrainingEngine::optimizer_restored(int64_t steps) {
  for (auto& opt : lora_optimizer_) GLM_RETURN_IF_ERROR(opt.restored(steps));
  for (size_t u = 0; u < optimizers_.size(); ++u) {
    GLM_RETURN_IF_ERROR(optimizers_[u].restored(steps));
    GLM_RETURN_IF_ERROR(zero_->unit_updated(static_cast<int>(u)));
  }
  GLM_RETURN_IF_ERROR(zero_->after_update());
  zero_->take_exposed_comm_seconds();
  return backend_.synchronize();
}

Status TrainingEngine::set_parameter(int entry, std::span<const float> values) {
  const ParamEntry& e = layout().entry(entry);
  if (static_cast<int64_t>(values.size()) != e.numel)
    return GLM_INTERNAL_ERROR("set_parameter(", e.name, "): ", values.size(), " values for ", e.numel, " elements");
  GLM_RETURN_IF_ERROR(settle_optimizer());  // deferred steps land before the new values, not on them
  return zero_->set_range(e.offset, values);
}

Status TrainingEngine::parameters_updated() {
  for (auto& opt : optimizers_) GLM_RETURN_IF_ERROR(opt.reset_master());
  return Status::ok();
}

Result<double> TrainingEngine::parameter_checksum() {
  GLM_ASSIGN_OR_RETURN(double sum, base_checksum());
  if (lora_layout_) {  // replicated: the same on every rank
    GLM_ASSIGN_OR_RETURN(double s, backend_.sum_squares(lora_params_.tensor()));
    sum += s;
  }
  return sum;
}

int64_t TrainingEngine::optimizer_bytes() const {
  int64_t b = 0;
  for (const auto& opt : optimizers_) b += opt.state_bytes();
  for (const auto& opt : lora_optimizer_) b += opt.state_bytes();
  return b;
}

LoraMemory TrainingEngine::lora_memory() const {
  LoraMemory m;
  m.parameter_bytes = static_cast<int64_t>(lora_params_.tensor().bytes());
  m.gradient_bytes = static_cast<int64_t>(lora_grads_.tensor().bytes());
  m.buffer_bytes = static_cast<int64_t>(lora_reduce_.tensor().bytes());
  for (const auto& opt : lora_optimizer_) m.optimizer_bytes += opt.state_bytes();
  m.activation_bytes = model_->lora_activation_bytes();
  return m;
}

Result<MicroBatch> TrainingEngine::upload(const HostMicroBatch& hb) {
  const int64_t n = hb.size();
  if (n <= 0 || n > model_->max_tokens())
    return GLM_INTERNAL_ERROR("micro-batch of ", n, " tokens outside (0, ", model_->max_tokens(), "]");
  if (hb.targets.size() != hb.tokens.size() || hb.positions.size() != hb.tokens.size() ||
      hb.doc_start.size() != hb.tokens.size())
    return GLM_INTERNAL_ERROR("micro-batch of ", n, " tokens with ", hb.targets.size(), " targets, ",
                              hb.positions.size(), " positions and ", hb.doc_start.size(), " document starts");
  // Everything the device needs, index included, in one upload.
  const MicroBatchIndex ix = index_micro_batch(hb.tokens, hb.targets);
  MicroBatch b;
  b.n = n;
  const std::pair<const std::vector<int32_t>*, Tensor*> parts[] = {
      {&hb.tokens, &b.tokens},           {&hb.targets, &b.targets},       {&hb.positions, &b.positions},
      {&hb.doc_start, &b.doc_start},     {&ix.label_rows, &b.label_rows}, {&ix.label_targets, &b.label_targets},
      {&ix.token_order, &b.token_order}, {&ix.token_runs, &b.token_runs}};
  staging_.clear();
  int64_t at = 0;
  for (const auto& [host, device] : parts) {
    staging_.insert(staging_.end(), host->begin(), host->end());
    *device = batch_ints_.slice(at, static_cast<int64_t>(host->size()));
    at += static_cast<int64_t>(host->size());
  }
  GLM_RETURN_IF_ERROR(backend_.upload(batch_ints_.slice(0, at), staging_.data()));
  b.n_labelled = static_cast<int64_t>(ix.label_rows.size());
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
  if (!has_optimizer_) return GLM_INTERNAL_ERROR("step() on an engine created without an optimizer");
  // Side work a failed step left behind finishes before this step zeroes what it reads.
  GLM_RETURN_IF_ERROR(backend_.join_side());
  const int64_t this_step = steps_taken() + 1;  // updates inside backward advance steps_taken() early
  // Loss normalisation needs the global target count of the whole window before any backward.
  int64_t counts[2] = {0, 0};  // targets, tokens
  for (const auto& m : micro) {
    counts[0] += m.target_count;
    counts[1] += m.size();
  }
  GLM_RETURN_IF_ERROR(comm_.all_reduce(counts, counts, 2, CommType::i64, ReduceOp::sum));
  const double grad_scale = counts[0] > 0 ? 1.0 / static_cast<double>(counts[0]) : 0.0;

  using clock = std::chrono::steady_clock;
  const auto step_start = clock::now();
  double blocking = 0;  // seconds in collectives that nothing overlaps
  auto timed = [&](const auto& fn) -> Status {
    const auto t0 = clock::now();
    Status st = fn();
    blocking += std::chrono::duration<double>(clock::now() - t0).count();
    return st;
  };
  // With deferred rows the table's gradient is zero but in the rows the last step's backward added
  // to (its tokens, still in step_rows_): those rows are zeroed, a few MiB, instead of the whole
  // table (1.2 GiB at GLM-4's 151,552 x 4,096, 0.3 ms a step on an H200).
  const bool table_rows_only = deferred_unit_ >= 0 && dirty_table_rows_ >= 0;
  if (deferred_unit_ >= 0) zero_->set_zeroed_by_caller(deferred_unit_, table_rows_only);
  GLM_RETURN_IF_ERROR(zero_->zero_grads());
  if (table_rows_only && dirty_table_rows_ > 0)
    GLM_RETURN_IF_ERROR(
        backend_.zero_rows(zero_->owned_grads(deferred_unit_).slice(0, config().vocab_size * config().hidden_size),
                           step_rows_.tensor(), dirty_table_rows_, config().hidden_size));
  if (lora_layout_) GLM_RETURN_IF_ERROR(backend_.zero(lora_grads_.tensor()));
  if (deferred_unit_ >= 0) {
    dirty_table_rows_ = -1;  // unknown until this step's rows are in step_rows_
    // The rows this step reads get their deferred steps first; its update is theirs alone.
    GLM_ASSIGN_OR_RETURN(const int64_t rows, upload_token_rows(micro));
    dirty_table_rows_ = rows;  // the only rows this step's backward adds to
    AdamWOptimizer& opt = optimizers_[static_cast<size_t>(deferred_unit_)];
    GLM_RETURN_IF_ERROR(opt.catch_up(step_rows_.tensor(), rows));
    opt.set_step_rows(step_rows_.tensor(), rows);
  }
  // Clipping needs the norm before the update: a pass of its own over the gradients. Without
  // clipping the update sums it on the way, and where a unit's gradient is final as soon as
  // backward finished it (one rank, stage 0), the unit is updated right there, on the backend's
  // side queue beside the rest of backward (the last unit, the embedding, after it); a layer's MLP
  // half is updated as soon as its own backward is done, beside the layer's attention backward, so
  // that little of the first layer's update is left when backward ends.
  const bool clipping = max_grad_norm_ > 0;
  const bool in_backward = !clipping && optimizer_in_backward_ && !lora_layout_ && zero_->grads_final_in_backward();
  Tensor fused_sq;
  if (!clipping) {
    fused_sq = grad_sq_sum_.tensor();
    GLM_RETURN_IF_ERROR(backend_.zero(fused_sq));
  }
  std::vector<char> updated(optimizers_.size(), 0);
  // Where a unit's update began early, with its tail from there (a layer's MLP half); -1: not yet.
  std::vector<int64_t> tail_from(optimizers_.size(), -1);
  auto update = [&](int u, int64_t from) -> Status {
    const auto i = static_cast<size_t>(u);
    if (updated[i]) return GLM_INTERNAL_ERROR("unit ", u, " updated twice in one step");
    AdamWOptimizer& opt = optimizers_[i];
    const Tensor grads = zero_->owned_grads(u);
    if (from > 0) {  // the tail first, the rest when the whole unit is final
      if (tail_from[i] >= 0 || opt.deferred()) return Status::ok();  // ZeroParameters checked `from`
      tail_from[i] = from;
      return opt.step_part(grads, lr, 1.0, fused_sq, from, grads.numel, /*first=*/true);
    }
    updated[i] = 1;
    if (tail_from[i] >= 0) return opt.step_part(grads, lr, 1.0, fused_sq, 0, tail_from[i], /*first=*/false);
    return opt.step(grads, lr, 1.0, fused_sq);
  };
  if (in_backward)
    zero_->set_on_grads_final([&](int u, int64_t from) { return backend_.on_side([&] { return update(u, from); }); });
  struct ClearHook {
    ZeroParameters& z;
    ~ClearHook() { z.set_on_grads_final({}); }
  } clear_hook{*zero_};
  double loss_sum = 0;
  for (size_t i = 0; i < micro.size(); ++i) {
    const HostMicroBatch& hb = micro[i];
    zero_->set_first_micro_batch(i == 0);
    zero_->set_last_micro_batch(i + 1 == micro.size());
    GLM_ASSIGN_OR_RETURN(MicroBatch b, upload(hb));
    // Keyed on the global step (restored on resume), not a counter of this process.
    const uint64_t dropout_key = lora_dropout_key(lora_seed_, steps_taken(), static_cast<int64_t>(i), comm_.rank());
    GLM_RETURN_IF_ERROR(model_->forward_backward(b, grad_scale, *zero_, dropout_key));
    GLM_ASSIGN_OR_RETURN(double s, local_loss_sum(b.n));
    loss_sum += s;
  }
  // Waits for overlapped buckets during backward are exposed too; those inside finish_backward
  // are part of its timed total.
  const double backward_waits = zero_->take_exposed_comm_seconds();
  GLM_RETURN_IF_ERROR(timed([&] { return zero_->finish_backward(); }));
  zero_->take_exposed_comm_seconds();
  if (lora_layout_) GLM_RETURN_IF_ERROR(timed([&] { return reduce_lora_gradients(); }));
  GLM_RETURN_IF_ERROR(comm_.all_reduce(&loss_sum, &loss_sum, 1, CommType::f64, ReduceOp::sum));
  StepResult r;
  r.loss = counts[0] > 0 ? loss_sum / static_cast<double>(counts[0]) : 0.0;
  r.targets = counts[0];
  r.tokens = counts[1];
  auto non_finite = [&](const char* when) {
    return GLM_ERROR(ErrorKind::internal, "non-finite loss (", r.loss, ") or gradient norm (", r.grad_norm,
                     ") at optimizer step ", this_step, when, "; lower --learning_rate or check the data");
  };
  if (in_backward) {
    GLM_RETURN_IF_ERROR(backend_.join_side());
    for (size_t u = 0; u < updated.size(); ++u)
      if (!updated[u]) return GLM_INTERNAL_ERROR("unit ", u, " was not updated in backward");
  }
  double clip = 1.0;
  if (clipping) {
    GLM_ASSIGN_OR_RETURN(double sq, zero_->grad_norm_squared());
    if (lora_layout_) {
      GLM_ASSIGN_OR_RETURN(const double lora_sq, backend_.sum_squares(lora_grads_.tensor()));
      sq += lora_sq;
    }
    r.grad_norm = std::sqrt(sq);
    if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) return non_finite("");
    // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1.
    clip = std::min(1.0, max_grad_norm_ / (r.grad_norm + 1e-6));
  } else if (!std::isfinite(r.loss)) {
    return non_finite(in_backward ? " (after its update: nothing of it is saved)" : "");
  }
  // Each unit's parameter all-gather (stages 1-2) starts as soon as its update is enqueued.
  for (size_t u = 0; u < optimizers_.size(); ++u) {
    if (!in_backward) {
      GLM_RETURN_IF_ERROR(optimizers_[u].step(zero_->owned_grads(static_cast<int>(u)), lr, clip, fused_sq));
    }
    GLM_RETURN_IF_ERROR(zero_->unit_updated(static_cast<int>(u)));
  }
  for (auto& opt : lora_optimizer_) GLM_RETURN_IF_ERROR(opt.step(lora_grads_.tensor(), lr, clip, fused_sq));
  GLM_RETURN_IF_ERROR(timed([&] { return zero_->after_update(); }));
  zero_->take_exposed_comm_seconds();  // inside the timed total already
  if (!clipping) {
    double local = 0;
    GLM_RETURN_IF_ERROR(backend_.download(&local, fused_sq));
    // Adapters are replicated (their sum is global already); a frozen base adds nothing.
    double sq = local;
    if (!lora_layout_) {
      GLM_ASSIGN_OR_RETURN(sq, zero_->global_grad_norm_squared(local));
    }
    r.grad_norm = std::sqrt(sq);
    if (!std::isfinite(r.grad_norm)) return non_finite(" (after its update: nothing of it is saved)");
  }
  GLM_ASSIGN_OR_RETURN(const double device_waits, zero_->take_device_exposed_comm_seconds());
  r.step_seconds = std::chrono::duration<double>(clock::now() - step_start).count();
  r.exposed_comm_seconds = blocking + backward_waits + device_waits;
  r.updated_in_backward = in_backward;
  return r;
}

Result<EvalResult> TrainingEngine::evaluate(const HostMicroBatch& hb) {
  EvalResult r;
  // A rank without samples still runs a forward (one token, no target): at ZeRO-3 the forward's
  // parameter gathers are collectives that every rank must join.
  HostMicroBatch idle;
  idle.tokens = {0};
  idle.targets = {-1};
  idle.positions = {0};
  idle.doc_start = {0};
  const HostMicroBatch& batch = hb.size() > 0 ? hb : idle;
  GLM_RETURN_IF_ERROR(settle_optimizer());
  GLM_ASSIGN_OR_RETURN(MicroBatch b, upload(batch));
  Tensor correct = correct_.slice(0, b.n);
  GLM_RETURN_IF_ERROR(model_->forward(b, *zero_, correct));
  GLM_ASSIGN_OR_RETURN(r.loss_sum, local_loss_sum(b.n));
  std::vector<int32_t> flags(static_cast<size_t>(b.n));
  GLM_RETURN_IF_ERROR(backend_.download(flags.data(), correct));
  int64_t counts[2] = {batch.target_count, 0};  // targets, argmax-correct targets
  for (int32_t f : flags) counts[1] += f;
  GLM_RETURN_IF_ERROR(comm_.all_reduce(&r.loss_sum, &r.loss_sum, 1, CommType::f64, ReduceOp::sum));
  GLM_RETURN_IF_ERROR(comm_.all_reduce(counts, counts, 2, CommType::i64, ReduceOp::sum));
  r.targets = counts[0];
  r.correct = counts[1];
  return r;
}

Status TrainingEngine::logits(const HostMicroBatch& hb, std::vector<float>& out) {
  GLM_RETURN_IF_ERROR(settle_optimizer());
  GLM_ASSIGN_OR_RETURN(MicroBatch b, upload(hb));
  const int64_t numel = b.n * config().vocab_size;
  if (logits_.numel() < numel) {
    GLM_ASSIGN_OR_RETURN(logits_, backend_.allocate(numel, backend_.compute_dtype()));
  }
  Tensor l = logits_.slice(0, numel);
  GLM_RETURN_IF_ERROR(model_->forward_logits(b, *zero_, l));
  out.resize(static_cast<size_t>(numel));
  if (l.dtype == DType::f32) return backend_.download(out.data(), l);
  GLM_ASSIGN_OR_RETURN(Buffer staging, backend_.allocate(numel, DType::f32));
  GLM_RETURN_IF_ERROR(backend_.convert(staging.tensor(), l));
  return backend_.download(out.data(), staging.tensor());
}

}  // namespace glm
