// One optimizer step over ZeRO stages 0-3 (the protocol of zero/zero_engine.h): forward and backward of
// the micro-batches, the gradient reduction, clipping and the AdamW update.
#include "train/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "kernels/master_split.h"
#include "model/param_init.h"

namespace glm {

Result<std::unique_ptr<TrainingEngine>> TrainingEngine::create(const EngineConfig& ec, Backend& backend,
                                                               Communicator& comm, Communicator* data_comm) {
  const ModelConfig& config = ec.model;
  const int64_t max_tokens = ec.max_tokens;
  const std::optional<AdamWOptions>& adam = ec.adam;
  const int zero_stage = ec.zero_stage;
  const ZeroOptions& zero_options = ec.zero;
  const LoraConfig* lora = ec.lora ? &*ec.lora : nullptr;
  std::unique_ptr<TrainingEngine> e(new TrainingEngine(backend, comm));
  e->max_grad_norm_ = ec.max_grad_norm;
  e->optimizer_in_backward_ = ec.optimizer_in_backward;
  e->norm_before_update_ = ec.norm_before_update;
  e->gradient_fault_ = ec.gradient_fault;
  e->gradient_faults_left_ = ec.gradient_fault.at > 0 ? ec.gradient_fault.times : 0;
  e->data_comm_ = data_comm != nullptr ? data_comm : &comm;
  e->grad_reduce_dtype_ = effective_reduce_dtype(zero_options, backend.compute_dtype(), comm.size());
  if (lora != nullptr) GLM_RETURN_IF_ERROR(lora->validate());
  if (ec.forward_only && adam) return GLM_INTERNAL_ERROR("a forward-only engine with an optimizer");
  // A share of a row holds 2 chunks of a row padded to a multiple of 2C.
  const int cp = ec.context_parallel_size;
  if (cp < 1 || comm.size() % cp != 0)
    return GLM_USER_ERROR("--context_parallel_size ", cp, " must divide the ", comm.size(), " ranks");
  const int64_t local_tokens = context_share_tokens(max_tokens, cp);
  // Named in an out-of-memory error, phase by phase (ZeroEngine's pieces name their own).
  AllocationPurpose purpose(backend, ec.forward_only ? "the activations" : "the activations and backward scratch");
  GLM_ASSIGN_OR_RETURN(
      e->model_, Glm4Model::create(config, zero_param_layout(config, comm.size(), zero_stage, zero_options), backend,
                                   local_tokens, ec.recompute, ec.offload_activations, ec.forward_only));
  if (cp > 1) {
    e->split_ = ContextSplit{cp, comm.rank() % cp};
    // From the communicator of the tensor collectives (NCCL's device buffers under CUDA).
    GLM_ASSIGN_OR_RETURN(e->context_comm_, e->data_comm_->split(comm.rank() / cp, comm.rank() % cp));
    const AttentionShape shape{config.num_attention_heads, config.num_key_value_heads, config.head_dim};
    backend.set_allocation_purpose("context parallelism's gathered keys and values");
    GLM_ASSIGN_OR_RETURN(e->context_, ContextAttention::create(backend, *e->context_comm_, shape, local_tokens));
    GLM_ASSIGN_OR_RETURN(e->kv_rows_, backend.allocate(int64_t{cp} * local_tokens, DType::i32));
    e->model_->attach_context(e->context_.get());
  }
  GLM_ASSIGN_OR_RETURN(e->zero_, ZeroEngine::create(e->model_->layout(), backend, comm, zero_stage, data_comm,
                                                    zero_options, /*frozen=*/lora != nullptr || ec.forward_only));
  // tokens, targets, positions, doc_start, label_rows, label_targets, token_order, token_runs, and
  // a context-parallel share's row positions.
  backend.set_allocation_purpose("the micro-batch");
  GLM_ASSIGN_OR_RETURN(e->batch_ints_, backend.allocate(micro_batch_ints(local_tokens) + local_tokens, DType::i32));
  GLM_ASSIGN_OR_RETURN(e->correct_, backend.allocate(local_tokens, DType::i32));
  GLM_ASSIGN_OR_RETURN(e->grad_sq_sum_, backend.allocate(1, DType::f64));
  if (lora != nullptr) {
    e->lora_layout_ = std::make_unique<LoraLayout>(config, *lora);
    const int64_t n = e->lora_layout_->total_numel();
    backend.set_allocation_purpose("the LoRA adapters, their gradients and optimizer state");
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
  backend.set_allocation_purpose("the optimizer state");
  if (adam) GLM_RETURN_IF_ERROR(e->create_optimizers(ec));
  return e;
}

// One optimizer per unit over what this rank owns (offloaded to the host with ec.offload), and the
// embedding's deferred rows where they apply.
Status TrainingEngine::create_optimizers(const EngineConfig& ec) {
  const ModelConfig& config = ec.model;
  const int zero_stage = ec.zero_stage;
  const AdamWOptions& adam = *ec.adam;
  if (ec.zero.offload_grads && !ec.offload.optimizer)
    return GLM_INTERNAL_ERROR("gradients in host memory without the offloaded optimizer that reads them there");
  if (ec.zero.offload_params && !ec.offload.optimizer)
    return GLM_USER_ERROR("--offload_param cpu needs --offload_optimizer cpu (the host then updates the parameters "
                          "it holds; DeepSpeed's offload_param is used with it)");
  if (ec.offload.optimizer) {
    if (zero_stage == 0)
      return GLM_USER_ERROR("--offload_optimizer cpu needs --zero_stage 1, 2 or 3 (as DeepSpeed's offload does): "
                            "each rank's host then holds only its shard of the optimizer state");
    GLM_ASSIGN_OR_RETURN(offload_, OptimizerOffload::create(backend_, ec.offload));
  }
  const int units = static_cast<int>(layout().units().size());
  for (int u = 0; u < units; ++u) {
    GLM_ASSIGN_OR_RETURN(AdamWOptimizer opt,
                         AdamWOptimizer::create(backend_, layout(), zero_->owned_params(u),
                                                zero_->owned_offset(u), adam, offload_.get(), zero_->params_on_host(u),
                                                zero_->grads_on_host()));
    if (ec.offload.delayed_update) GLM_RETURN_IF_ERROR(opt.prepare_delayed());
    optimizers_.push_back(std::move(opt));
  }
  has_optimizer_ = true;
  // Deferred embedding rows at stage 0 (every rank holds and updates the whole table; the rows a
  // step's gradient can reach are the tokens of every rank's batches), the table at the start of
  // its own unit.
  const int history = std::clamp(ec.defer_embedding_rows, 0, AdamWRows::kMaxHistory);
  const ParamEntry& table = layout().entry(layout().embedding());
  const int unit = layout().embedding_unit();
  const ParamUnit& table_unit = layout().units()[static_cast<size_t>(unit)];
  if (history > 0 && zero_stage == 0 && table.unit == unit && table.offset == table_unit.offset &&
      table_unit.entries.size() == 1) {
    GLM_RETURN_IF_ERROR(
        optimizers_[static_cast<size_t>(unit)].defer_rows(config.vocab_size, config.hidden_size, history));
    deferred_unit_ = unit;
    GLM_ASSIGN_OR_RETURN(step_rows_, backend_.allocate(config.vocab_size, DType::i32));
    row_seen_.assign(static_cast<size_t>(config.vocab_size), 0);
  }
  return Status::ok();
}

Status TrainingEngine::settle_optimizer() {
  for (auto& opt : optimizers_) GLM_RETURN_IF_ERROR(opt.settle());
  if (!delayed_update()) return Status::ok();
  // The pending delayed update lands before anything reads or writes the parameters or the state.
  GLM_RETURN_IF_ERROR(finish_delayed());
  bool pending = false;
  for (const auto& opt : optimizers_) pending = pending || opt.delayed_pending();
  if (!pending) return Status::ok();
  return zero_->params_written(static_cast<int>(optimizers_.size()),
                               [&](int u) { return optimizers_[static_cast<size_t>(u)].land_delayed(); });
}

Status TrainingEngine::finish_delayed() {
  if (!delayed_job_.valid()) return Status::ok();
  return delayed_job_.get();
}

// The last step's host update lands (its units' gathers follow, as after any update), then this
// step's gradients go to the host and its update starts on a thread of its own, to land after the
// next step's backward.
Status TrainingEngine::apply_delayed_update(ZeroStep& zero_step) {
  GLM_RETURN_IF_ERROR(finish_delayed());
  GLM_RETURN_IF_ERROR(
      zero_step.update_units([&](int u) { return optimizers_[static_cast<size_t>(u)].land_delayed(); }));
  GLM_RETURN_IF_ERROR(zero_step.finish_update());
  for (size_t u = 0; u < optimizers_.size(); ++u)
    GLM_RETURN_IF_ERROR(optimizers_[u].start_delayed(zero_->owned_grads(static_cast<int>(u)), update_.lr, update_.clip));
  delayed_job_ = std::async(std::launch::async, [this]() -> Status {
    for (auto& opt : optimizers_) GLM_RETURN_IF_ERROR(opt.run_delayed());
    return Status::ok();
  });
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
    // The distinct tokens, ascending, from a linear sort of the step's tokens: it runs on the host
    // while the GPU waits, and a pass over GLM-4's whole vocabulary would cost more.
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
  const CommType type = comm_type_of(wire.dtype);
  GLM_RETURN_IF_ERROR(
      data.start_all_reduce(wire.data, wire.data, static_cast<size_t>(wire.numel), type, ReduceOp::sum)->wait());
  if (wire.data != g.data) GLM_RETURN_IF_ERROR(backend_.convert(g, wire));
  return Status::ok();
}

TrainingEngine::OptimizerShard TrainingEngine::optimizer_shard(int unit) const {
  const AdamWOptimizer& opt = optimizers_[static_cast<size_t>(unit)];
  return {opt.master(), opt.exp_avg(), opt.exp_avg_sq(),
          zero_->owned_offset(unit) - layout().units()[static_cast<size_t>(unit)].offset,
          opt.split() ? opt.params() : Tensor{}, opt.offloaded()};
}

// Split masters move as their two halves (bf16 and i16 bits), joined or split on the host: exact,
// and no device memory beyond what the run planned.
namespace {
Tensor state_of(const TrainingEngine::OptimizerShard& s, int d) {
  return d == 0 ? s.master : d == 1 ? s.exp_avg : s.exp_avg_sq;
}
}  // namespace

Status OptimizerStateTransfer::zero_moments(const TrainingEngine::OptimizerShard& s) {
  for (const Tensor& t : {s.exp_avg, s.exp_avg_sq}) {
    if (!s.host) {
      GLM_RETURN_IF_ERROR(backend_.zero(t));
    } else if (!t.empty()) {
      std::memset(t.data, 0, t.bytes());
    }
  }
  return Status::ok();
}

Status OptimizerStateTransfer::download(const TrainingEngine::OptimizerShard& s, int d, int64_t offset,
                                      std::span<float> dst) {
  const int64_t n = static_cast<int64_t>(dst.size());
  const Tensor t = state_of(s, d).slice(offset, n);
  if (s.host) {
    std::memcpy(dst.data(), t.data, t.bytes());
    return Status::ok();
  }
  if (d != 0 || s.master.dtype != DType::i16) return backend_.download(dst.data(), t);
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

Status OptimizerStateTransfer::upload(const TrainingEngine::OptimizerShard& s, int d, int64_t offset,
                                    std::span<const float> src) {
  const int64_t n = static_cast<int64_t>(src.size());
  const Tensor t = state_of(s, d).slice(offset, n);
  if (s.host) {
    std::memcpy(t.data, src.data(), t.bytes());
    return Status::ok();
  }
  if (d != 0 || s.master.dtype != DType::i16) return backend_.upload(t, src.data());
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
    double s = 0;
    GLM_RETURN_IF_ERROR(zero_->read_stored(u, [&](Tensor stored) -> Status {
      GLM_ASSIGN_OR_RETURN(s, backend_.sum_squares(stored));
      return Status::ok();
    }));
    sum += s;
  }
  if (zero_->stage() > 0) GLM_RETURN_IF_ERROR(comm_.all_reduce(&sum, &sum, 1, CommType::f64, ReduceOp::sum));
  return sum;
}

Status TrainingEngine::optimizer_restored(int64_t steps) {
  for (auto& opt : lora_optimizer_) GLM_RETURN_IF_ERROR(opt.restored(steps));
  GLM_RETURN_IF_ERROR(zero_->params_written(static_cast<int>(optimizers_.size()), [&](int u) {
    return optimizers_[static_cast<size_t>(u)].restored(steps);
  }));
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
  GLM_RETURN_IF_ERROR(finish_delayed());  // what lands next is overwritten: nothing may be pending
  for (auto& opt : optimizers_)
    if (opt.delayed_pending()) return GLM_INTERNAL_ERROR("parameters written with a delayed update pending");
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

int64_t TrainingEngine::host_optimizer_bytes() const {
  if (!offload_) return 0;
  int64_t b = offload_->staging_bytes();
  for (const auto& opt : optimizers_) b += opt.host_state_bytes();
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
      {&ix.token_order, &b.token_order}, {&ix.token_runs, &b.token_runs}, {&hb.row_position, &b.row_position}};
  if (context_ != nullptr) {
    if (hb.row_tokens != n * split_.size || hb.row_position.size() != hb.tokens.size() ||
        static_cast<int64_t>(hb.kv_rows.size()) != hb.row_tokens)
      return GLM_INTERNAL_ERROR("context-parallel share of ", n, " tokens of a ", hb.row_tokens, "-token row");
    b.row_tokens = hb.row_tokens;
    b.kv_rows = kv_rows_.slice(0, hb.row_tokens);
    GLM_RETURN_IF_ERROR(backend_.upload(b.kv_rows, hb.kv_rows.data()));
  }
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

namespace {
Status non_finite(const StepResult& r, int64_t step, const char* when) {
  return GLM_ERROR(ErrorKind::internal, "non-finite loss (", r.loss, ") or gradient norm (", r.grad_norm,
                   ") at optimizer step ", step, when, "; lower --learning_rate or check the data");
}
constexpr const char* kAfterUpdate =
    " (after its update: nothing of it is saved; without clipping the norm comes with the update, so "
    "--skip_nonfinite_steps cannot skip the step: --max_grad_norm > 0 or a spike check computes it first)";
}  // namespace

Result<StepResult> TrainingEngine::step(std::span<const HostMicroBatch> rows, double lr, const StepFilter& filter) {
  // Under context parallelism every rank of a group got the same rows and keeps its share of each.
  std::vector<HostMicroBatch> shares;
  if (split_.size > 1)
    for (const HostMicroBatch& row : rows) shares.push_back(split_.share(row));
  const std::span<const HostMicroBatch> micro = split_.size > 1 ? std::span<const HostMicroBatch>(shares) : rows;
  if (!has_optimizer_) return GLM_INTERNAL_ERROR("step() on an engine created without an optimizer");
  // Side work a failed step left behind finishes before this step zeroes what it reads.
  GLM_RETURN_IF_ERROR(backend_.join_side());
  const int64_t this_step = steps_taken() + 1;  // updates inside backward advance steps_taken() early
  StepResult r;
  using clock = std::chrono::steady_clock;
  auto since = [](clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); };
  // The blocking scalar all-reduces count as exposed communication: a rank that waits there for a
  // slower one shows it (train/run_health.h's busy time leaves waits out).
  const auto step_start = clock::now();
  GLM_RETURN_IF_ERROR(count_window(micro, r));
  double scalar_seconds = since(step_start);
  begin_update(lr);
  // With deferred rows the table's gradient is zero but in the rows the last step's backward added
  // to (its tokens, still in step_rows_): the engine zeroes those rows instead of the whole table.
  const bool table_rows_only = deferred_unit_ >= 0 && dirty_table_rows_ >= 0;
  StepSchedule schedule;
  schedule.micro_batches = static_cast<int>(micro.size());
  schedule.caller_zeroed_unit = table_rows_only ? deferred_unit_ : -1;
  if (update_.in_backward)
    schedule.on_grads_final = [this](int u, int64_t from) {
      return backend_.on_side([this, u, from] { return update_unit(u, from); });
    };
  GLM_ASSIGN_OR_RETURN(ZeroStep zero_step, zero_->begin_step(std::move(schedule)));
  GLM_RETURN_IF_ERROR(zero_step_gradients(micro, table_rows_only));
  const double grad_scale = r.targets > 0 ? 1.0 / static_cast<double>(r.targets) : 0.0;
  GLM_ASSIGN_OR_RETURN(double loss_sum, run_micro_batches(micro, zero_step, grad_scale));
  GLM_RETURN_IF_ERROR(zero_step.finish_backward());
  double lora_seconds = 0;  // the adapters' all-reduce: nothing overlaps it
  if (lora_layout_) {
    const auto t0 = clock::now();
    GLM_RETURN_IF_ERROR(reduce_lora_gradients());
    lora_seconds = since(t0);
  }
  const auto loss_start = clock::now();
  GLM_RETURN_IF_ERROR(comm_.all_reduce(&loss_sum, &loss_sum, 1, CommType::f64, ReduceOp::sum));
  scalar_seconds += since(loss_start);
  r.loss = r.targets > 0 ? loss_sum / static_cast<double>(r.targets) : 0.0;
  GLM_RETURN_IF_ERROR(inject_gradient_fault(this_step));
  GLM_RETURN_IF_ERROR(check_and_clip(zero_step, r, this_step, filter));
  if (!r.skipped.empty()) {
    GLM_RETURN_IF_ERROR(skip_update(zero_step));
  } else {
    GLM_RETURN_IF_ERROR(update_.delayed ? apply_delayed_update(zero_step) : apply_update(zero_step));
  }
  if (!update_.norm_pass && r.skipped.empty()) GLM_RETURN_IF_ERROR(fused_grad_norm(zero_step, r, this_step));
  GLM_ASSIGN_OR_RETURN(const StepStats stats, zero_step.finish());
  r.step_seconds = since(step_start);
  r.exposed_comm_seconds = lora_seconds + scalar_seconds + stats.exposed_comm_seconds();
  r.updated_in_backward = update_.in_backward;
  return r;
}

// Loss normalisation needs the global target count of the whole window before any backward.
Status TrainingEngine::count_window(std::span<const HostMicroBatch> micro, StepResult& r) {
  int64_t counts[2] = {0, 0};  // targets, tokens
  for (const auto& m : micro) {
    counts[0] += m.target_count;
    counts[1] += m.size();
  }
  GLM_RETURN_IF_ERROR(comm_.all_reduce(counts, counts, 2, CommType::i64, ReduceOp::sum));
  r.targets = counts[0];
  r.tokens = counts[1];
  return Status::ok();
}

// Clipping needs the norm before the update: a pass of its own over the gradients. Without
// clipping the update sums it on the way, and where a unit's gradient is final as soon as backward
// finished it (one rank, stage 0), the unit is updated right there, on the backend's side queue
// beside the rest of backward (the last unit, the embedding, after it); a layer's MLP half is
// updated as soon as its own backward is done, beside the layer's attention backward, so that
// little of the first layer's update is left when backward ends.
void TrainingEngine::begin_update(double lr) {
  update_.lr = lr;
  update_.clip = 1.0;
  update_.clipping = max_grad_norm_ > 0;
  update_.delayed = delays_step(steps_taken() + 1);
  update_.norm_pass = update_.clipping || update_.delayed || norm_before_update_;
  update_.in_backward =
      !update_.norm_pass && optimizer_in_backward_ && !lora_layout_ && zero_->grads_final_in_backward();
  update_.fused_sq = update_.norm_pass ? Tensor{} : grad_sq_sum_.tensor();
  update_.updated.assign(optimizers_.size(), 0);
  update_.tail_from.assign(optimizers_.size(), -1);
}

// What ZeRO's begin_step() leaves to the engine: the deferred table rows, the adapters' gradients,
// the deferred rows' catch-up and the fused norm's accumulator.
Status TrainingEngine::zero_step_gradients(std::span<const HostMicroBatch> micro, bool table_rows_only) {
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
  if (!update_.norm_pass) GLM_RETURN_IF_ERROR(backend_.zero(update_.fused_sq));
  return Status::ok();
}

Result<double> TrainingEngine::run_micro_batches(std::span<const HostMicroBatch> micro, ZeroStep& zero_step,
                                                 double grad_scale) {
  double loss_sum = 0;
  for (size_t i = 0; i < micro.size(); ++i) {
    GLM_RETURN_IF_ERROR(zero_step.begin_micro_batch(static_cast<int>(i)));
    GLM_ASSIGN_OR_RETURN(MicroBatch b, upload(micro[i]));
    // Keyed on the global step (restored on resume), not a counter of this process.
    const uint64_t dropout_key = lora_dropout_key(lora_seed_, steps_taken(), static_cast<int64_t>(i), comm_.rank());
    GLM_RETURN_IF_ERROR(model_->forward_backward(b, grad_scale, *zero_, dropout_key));
    GLM_ASSIGN_OR_RETURN(double s, local_loss_sum(b.n));
    loss_sum += s;
  }
  return loss_sum;
}

// The in-backward updates finished; with clipping the norm and the clip factor, else the loss
// checked (the norm is summed by the update).
Status TrainingEngine::check_and_clip(ZeroStep& zero_step, StepResult& r, int64_t this_step,
                                     const StepFilter& filter) {
  if (update_.in_backward) {
    GLM_RETURN_IF_ERROR(backend_.join_side());
    for (size_t u = 0; u < update_.updated.size(); ++u)
      if (!update_.updated[u]) return GLM_INTERNAL_ERROR("unit ", u, " was not updated in backward");
  }
  if (!update_.norm_pass) {
    if (std::isfinite(r.loss)) return Status::ok();
    // The loss is global and known before an update after backward: such a step can be skipped.
    if (!update_.in_backward && filter) {
      r.grad_norm = std::nan("");
      r.skipped = filter(r.loss, r.grad_norm);
      if (!r.skipped.empty()) return Status::ok();
    }
    return non_finite(r, this_step, update_.in_backward ? kAfterUpdate : "");
  }
  GLM_ASSIGN_OR_RETURN(double sq, zero_step.grad_norm_squared());
  if (lora_layout_) {
    GLM_ASSIGN_OR_RETURN(const double lora_sq, backend_.sum_squares(lora_grads_.tensor()));
    sq += lora_sq;
  }
  r.grad_norm = std::sqrt(sq);
  if (filter) {
    // Every rank skips if any does (at ZeRO stage 0 each rank's norm is its own replica's).
    r.skipped = filter(r.loss, r.grad_norm);
    const bool finite = std::isfinite(r.loss) && std::isfinite(r.grad_norm);
    int32_t skip[2] = {!r.skipped.empty() && !finite, !r.skipped.empty() && finite};  // non-finite, spike
    GLM_RETURN_IF_ERROR(comm_.all_reduce(skip, skip, 2, CommType::i32, ReduceOp::max));
    if (skip[0] != 0 || skip[1] != 0) {
      if (r.skipped.empty())
        r.skipped = concat(skip[0] != 0 ? "a non-finite" : "a spiking", " gradient norm on another rank (this rank's, ",
                           r.grad_norm, ", passed: the ranks' replicas of the gradient differ)");
      return Status::ok();
    }
  }
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) return non_finite(r, this_step, "");
  // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1.
  if (update_.clipping) update_.clip = std::min(1.0, max_grad_norm_ / (r.grad_norm + 1e-6));
  return Status::ok();
}

// A skipped step: nothing of its gradient is applied (a delayed update of the step before still
// lands), and every unit's collectives run as after an update, over the unchanged parameters.
Status TrainingEngine::skip_update(ZeroStep& zero_step) {
  if (update_.delayed) GLM_RETURN_IF_ERROR(finish_delayed());
  GLM_RETURN_IF_ERROR(zero_step.update_units([&](int u) -> Status {
    return update_.delayed ? optimizers_[static_cast<size_t>(u)].land_delayed() : Status::ok();
  }));
  return zero_step.finish_update();
}

Status TrainingEngine::inject_gradient_fault(int64_t this_step) {
  if (gradient_faults_left_ <= 0 || this_step < gradient_fault_.at || comm_.rank() != gradient_fault_.rank)
    return Status::ok();
  --gradient_faults_left_;
  // Not the deferred embedding table: its rows outside the step's tokens are never zeroed.
  const int unit = deferred_unit_ == 0 ? 1 : 0;
  Tensor g = lora_layout_ ? lora_grads_.tensor() : zero_->owned_grads(unit);
  if (g.numel < 1) return GLM_INTERNAL_ERROR("gradient fault: rank ", comm_.rank(), " owns no gradient of unit ", unit);
  g = g.slice(0, 1);
  const double nan = std::nan("");
  const float nan_f = std::nanf("");
  const uint16_t nan_bf16 = 0x7fc0;
  switch (g.dtype) {
    case DType::f64: return backend_.upload(g, &nan);
    case DType::f32: return backend_.upload(g, &nan_f);
    case DType::bf16: return backend_.upload(g, &nan_bf16);
    default: return GLM_INTERNAL_ERROR("gradient fault: gradients of dtype ", dtype_name(g.dtype));
  }
}

// Each unit's parameter all-gather (stages 1-2) starts as soon as its update is enqueued.
Status TrainingEngine::apply_update(ZeroStep& zero_step) {
  GLM_RETURN_IF_ERROR(zero_step.update_units([&](int u) -> Status {
    if (update_.in_backward) return Status::ok();
    return optimizers_[static_cast<size_t>(u)].step(zero_->owned_grads(u), update_.lr, update_.clip, update_.fused_sq);
  }));
  for (auto& opt : lora_optimizer_)
    GLM_RETURN_IF_ERROR(opt.step(lora_grads_.tensor(), update_.lr, update_.clip, update_.fused_sq));
  return zero_step.finish_update();
}

// Without clipping: the norm the update summed, global.
Status TrainingEngine::fused_grad_norm(ZeroStep& zero_step, StepResult& r, int64_t this_step) {
  double local = 0;
  GLM_RETURN_IF_ERROR(backend_.download(&local, update_.fused_sq));
  // Adapters are replicated (their sum is global already); a frozen base adds nothing.
  double sq = local;
  if (!lora_layout_) {
    GLM_ASSIGN_OR_RETURN(sq, zero_step.global_grad_norm_squared(local));
  }
  r.grad_norm = std::sqrt(sq);
  if (!std::isfinite(r.grad_norm)) return non_finite(r, this_step, kAfterUpdate);
  return Status::ok();
}

// One unit's update inside backward (ZeroEngine's on_grads_final, on the backend's side queue):
// from > 0 updates the unit's tail (a layer's MLP half) early, the rest when the whole unit is final.
Status TrainingEngine::update_unit(int u, int64_t from) {
  const auto i = static_cast<size_t>(u);
  if (update_.updated[i]) return GLM_INTERNAL_ERROR("unit ", u, " updated twice in one step");
  AdamWOptimizer& opt = optimizers_[i];
  const Tensor grads = zero_->owned_grads(u);
  if (from > 0) {
    if (update_.tail_from[i] >= 0 || opt.deferred()) return Status::ok();  // ZeroEngine checked `from`
    update_.tail_from[i] = from;
    return opt.step_part(grads, update_.lr, 1.0, update_.fused_sq, from, grads.numel, /*first=*/true);
  }
  update_.updated[i] = 1;
  if (update_.tail_from[i] >= 0)
    return opt.step_part(grads, update_.lr, 1.0, update_.fused_sq, 0, update_.tail_from[i], /*first=*/false);
  return opt.step(grads, update_.lr, 1.0, update_.fused_sq);
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
  const HostMicroBatch batch = split_.share(hb.size() > 0 ? hb : idle);
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

Status TrainingEngine::logits(const HostMicroBatch& hb, std::vector<float>& out, bool last_row_only) {
  if (split_.size > 1) return GLM_USER_ERROR("logits of a whole row need --context_parallel_size 1");
  GLM_RETURN_IF_ERROR(settle_optimizer());
  GLM_ASSIGN_OR_RETURN(MicroBatch b, upload(hb));
  const int64_t numel = b.n * config().vocab_size;
  if (logits_.numel() < numel) {
    GLM_ASSIGN_OR_RETURN(logits_, backend_.allocate(numel, backend_.compute_dtype()));
  }
  Tensor all = logits_.slice(0, numel);
  GLM_RETURN_IF_ERROR(model_->forward_logits(b, *zero_, all));
  const int64_t vocab = config().vocab_size;
  return download_f32(last_row_only ? all.slice(numel - vocab, vocab) : all, out);
}

Status TrainingEngine::download_f32(Tensor values, std::vector<float>& out) {
  out.resize(static_cast<size_t>(values.numel));
  if (values.dtype == DType::f32) return backend_.download(out.data(), values);
  GLM_ASSIGN_OR_RETURN(Buffer staging, backend_.allocate(values.numel, DType::f32));
  GLM_RETURN_IF_ERROR(backend_.convert(staging.tensor(), values));
  return backend_.download(out.data(), staging.tensor());
}

Result<std::unique_ptr<KvCache>> TrainingEngine::create_kv_cache(int64_t capacity, int64_t max_new) {
  if (split_.size > 1) return GLM_USER_ERROR("generation needs --context_parallel_size 1");
  return KvCache::create(backend_, config(), capacity, std::min(max_new, model_->max_tokens()));
}

Status TrainingEngine::cached_logits(const HostDecodeBatch& hb, KvCache& cache, std::vector<float>& out) {
  GLM_ASSIGN_OR_RETURN(const Tensor logits, cached_forward(hb, cache));
  return download_f32(logits, out);
}

Status TrainingEngine::cached_argmax(const HostDecodeBatch& hb, KvCache& cache, std::vector<int32_t>& ids) {
  GLM_ASSIGN_OR_RETURN(const Tensor logits, cached_forward(hb, cache));
  const int64_t rows = static_cast<int64_t>(hb.logit_rows.size());
  // The ids go where the batch's tokens were uploaded (read by the forward, which is enqueued before).
  Tensor out = decode_ints_.tensor().slice(0, rows);
  GLM_RETURN_IF_ERROR(backend_.argmax_rows(out, logits, rows, config().vocab_size));
  ids.resize(static_cast<size_t>(rows));
  return backend_.download(ids.data(), out);
}

Status TrainingEngine::cached_top_k(const HostDecodeBatch& hb, KvCache& cache, int64_t k, std::vector<float>& stats,
                                    std::vector<float>& top, std::vector<int32_t>& ids) {
  GLM_ASSIGN_OR_RETURN(const Tensor logits, cached_forward(hb, cache));
  const int64_t rows = static_cast<int64_t>(hb.logit_rows.size());
  if (decode_top_.numel() < rows * (k + 2) || decode_top_ids_.numel() < rows * k) {
    decode_top_ = Buffer();
    decode_top_ids_ = Buffer();
    GLM_ASSIGN_OR_RETURN(decode_top_, backend_.allocate(rows * (k + 2), DType::f32));
    GLM_ASSIGN_OR_RETURN(decode_top_ids_, backend_.allocate(rows * k, DType::i32));
  }
  const Tensor values = decode_top_.slice(0, rows * k), statistics = decode_top_.slice(rows * k, 2 * rows);
  const Tensor columns = decode_top_ids_.slice(0, rows * k);
  GLM_RETURN_IF_ERROR(backend_.top_k_rows(columns, values, statistics, logits, rows, config().vocab_size, k));
  GLM_RETURN_IF_ERROR(download_f32(values, top));
  GLM_RETURN_IF_ERROR(download_f32(statistics, stats));
  ids.resize(static_cast<size_t>(rows * k));
  return backend_.download(ids.data(), columns);
}

Result<Tensor> TrainingEngine::cached_forward(const HostDecodeBatch& hb, KvCache& cache) {
  GLM_RETURN_IF_ERROR(settle_optimizer());
  const int64_t n = hb.size(), m = static_cast<int64_t>(hb.logit_rows.size());
  const int64_t row_tokens = static_cast<int64_t>(hb.kv_rows.size());
  if (n < 1 || m < 1 || n > cache.max_new())
    return GLM_INTERNAL_ERROR("decode batch of ", n, " tokens (at most ", cache.max_new(), ") and ", m, " logit rows");
  // One upload: tokens, positions, row positions, document starts, cache rows, wanted rows, kv rows.
  std::vector<int32_t> ints;
  ints.reserve(static_cast<size_t>(5 * n + m + row_tokens));
  for (const auto* v : {&hb.tokens, &hb.positions, &hb.row_position, &hb.doc_start, &hb.cache_rows, &hb.logit_rows,
                        &hb.kv_rows}) {
    if (v != &hb.logit_rows && v != &hb.kv_rows && static_cast<int64_t>(v->size()) != n)
      return GLM_INTERNAL_ERROR("decode batch arrays of unequal length");
    ints.insert(ints.end(), v->begin(), v->end());
  }
  const int64_t total = static_cast<int64_t>(ints.size());
  if (decode_ints_.numel() < total) {
    backend_.clear_graphs();  // they read the old buffer
    const int64_t grown = std::max<int64_t>(total, 2 * decode_ints_.numel());
    decode_ints_ = Buffer();
    GLM_ASSIGN_OR_RETURN(decode_ints_, backend_.allocate(grown, DType::i32));
  }
  Tensor all = decode_ints_.tensor();
  GLM_RETURN_IF_ERROR(backend_.upload(all.slice(0, total), ints.data()));
  MicroBatch b;
  b.n = n;
  b.tokens = all.slice(0, n);
  b.positions = all.slice(n, n);
  b.row_position = all.slice(2 * n, n);
  b.doc_start = all.slice(3 * n, n);
  b.cache_rows = all.slice(4 * n, n);
  b.row_tokens = row_tokens;
  b.kv_rows = all.slice(5 * n + m, row_tokens);
  b.decode = std::adjacent_find(hb.doc_start.begin(), hb.doc_start.end(),
                                [](int32_t a, int32_t c) { return c <= a; }) == hb.doc_start.end();
  // Decode steps keep their kernel: no host pass over their rows.
  auto breaks_run = [](int32_t a, int32_t c) { return c != a + 1; };
  if (!b.decode && row_tokens > 0 &&
      std::adjacent_find(hb.kv_rows.begin(), hb.kv_rows.end(), breaks_run) == hb.kv_rows.end())
    b.kv_run_start = hb.kv_rows.front();
  // fp32 logits straight from the head's GEMM: nothing to convert, no staging to allocate a step.
  const int64_t numel = m * config().vocab_size;
  if (decode_logits_.numel() < numel) {
    backend_.clear_graphs();
    decode_logits_ = Buffer();
    GLM_ASSIGN_OR_RETURN(decode_logits_, backend_.allocate(numel, DType::f32));
  }
  const Tensor logits = decode_logits_.slice(0, numel);
  auto forward = [&]() -> Status {
    model_->attach_kv_cache(&cache);
    const Status s = model_->forward_logits(b, *zero_, logits, all.slice(5 * n, m));
    model_->attach_kv_cache(nullptr);
    return s;
  };
  // A decode step of n sequences is the same ops on the same buffers as the last one of n with the
  // same launch shapes (only the uploaded ints differ): a graph replays it (Backend::run_graph). Its
  // key: the cache, the launch shapes the lengths choose, n.
  if (b.decode && m == n) {
    const auto shape = static_cast<uint64_t>(backend_.decode_launch_shape(n, row_tokens, cache.shape()));
    GLM_RETURN_IF_ERROR(backend_.run_graph((cache.id() << 40) | (shape << 24) | static_cast<uint64_t>(n), forward));
  } else {
    GLM_RETURN_IF_ERROR(forward());
  }
  return logits;
}

}  // namespace glm
