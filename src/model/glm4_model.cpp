// GLM-4 forward/backward over the op interface; activation buffers are allocated once in create().
#include "model/glm4_model.h"

#include <algorithm>
#include <array>
#include <utility>

#include "model/context_attention.h"
#include "model/kv_cache.h"

namespace glm {

namespace {

// One per-layer activation: its size for n tokens and whether the recompute policy lets every
// layer share one copy (backward restores it before use).
struct ActivationField {
  int64_t numel;
  bool statistics;  // stats dtype (fp32) rather than the compute dtype
  bool shared;
};

enum Field { kLn1, kRstd1, kQkv, kAttn, kLse, kMid, kLn2, kRstd2, kGateUp, kAct, kFields };

std::array<ActivationField, kFields> activation_fields(const ModelConfig& c, int64_t n, Recompute r) {
  const int64_t h = c.hidden_size, f = c.intermediate_size;
  const bool full = r == Recompute::full, cheap = full || r == Recompute::selective;
  std::array<ActivationField, kFields> a{};
  a[kLn1] = {n * h, false, cheap};
  a[kRstd1] = {n, true, full};
  a[kQkv] = {n * c.qkv_width(), false, full};
  a[kAttn] = {n * c.q_width(), false, full};
  a[kLse] = {n * c.num_attention_heads, true, full};
  a[kMid] = {n * h, false, full};
  a[kLn2] = {n * h, false, cheap};
  a[kRstd2] = {n, true, full};
  a[kGateUp] = {n * 2 * f, false, full};
  a[kAct] = {n * f, false, cheap};
  return a;
}

}  // namespace

std::vector<int32_t> order_by_token(std::span<const int32_t> tokens) {
  const size_t n = tokens.size();
  std::vector<int32_t> order(n), next(n);
  for (size_t i = 0; i < n; ++i) order[i] = static_cast<int32_t>(i);
  uint32_t largest = 0;
  for (const int32_t t : tokens) largest = std::max(largest, static_cast<uint32_t>(t));
  // Stable passes over 11-bit digits of the token (as unsigned), lowest first: positions start
  // ascending, so equal tokens keep their positions' order. As many passes as the largest needs.
  constexpr int kBits = 11;
  constexpr size_t kBuckets = size_t{1} << kBits;
  std::vector<int32_t> count(kBuckets + 1);
  for (int shift = 0; shift < 32 && (shift == 0 || (largest >> shift) != 0); shift += kBits) {
    std::fill(count.begin(), count.end(), 0);
    auto digit = [&](int32_t p) {
      return (static_cast<uint32_t>(tokens[static_cast<size_t>(p)]) >> shift) & (kBuckets - 1);
    };
    for (const int32_t p : order) ++count[digit(p) + 1];
    for (size_t b = 1; b <= kBuckets; ++b) count[b] += count[b - 1];
    for (const int32_t p : order) next[static_cast<size_t>(count[digit(p)]++)] = p;
    order.swap(next);
  }
  return order;
}

MicroBatchIndex index_micro_batch(std::span<const int32_t> tokens, std::span<const int32_t> targets) {
  MicroBatchIndex ix;
  const auto n = static_cast<int32_t>(tokens.size());
  for (int32_t t = 0; t < static_cast<int32_t>(targets.size()); ++t)
    if (targets[static_cast<size_t>(t)] >= 0) {
      ix.label_rows.push_back(t);
      ix.label_targets.push_back(targets[static_cast<size_t>(t)]);
    }
  ix.token_order = order_by_token(tokens);
  for (size_t i = 0; i < ix.token_order.size(); ++i)
    if (i == 0 || tokens[static_cast<size_t>(ix.token_order[i])] != tokens[static_cast<size_t>(ix.token_order[i - 1])])
      ix.token_runs.push_back(static_cast<int32_t>(i));
  ix.token_runs.push_back(n);
  return ix;
}

Glm4Model::Glm4Model(const ModelConfig& config, ParamLayout layout, Backend& backend, int64_t max_tokens,
                     Recompute recompute, bool offload_activations, bool forward_only)
    : config_(config),
      layout_(std::move(layout)),
      backend_(backend),
      max_tokens_(max_tokens),
      recompute_(recompute),
      offload_activations_(offload_activations),
      forward_only_(forward_only) {
  shape_.heads = config.num_attention_heads;
  shape_.kv_heads = config.num_key_value_heads;
  shape_.head_dim = config.head_dim;
}

Result<std::unique_ptr<Glm4Model>> Glm4Model::create(const ModelConfig& config, Backend& backend, int64_t max_tokens,
                                                     Recompute recompute) {
  return create(config, ParamLayout(config), backend, max_tokens, recompute);
}

Result<std::unique_ptr<Glm4Model>> Glm4Model::create(const ModelConfig& config, ParamLayout layout, Backend& backend,
                                                     int64_t max_tokens, Recompute recompute, bool offload_activations,
                                                     bool forward_only) {
  if (max_tokens <= 0) return GLM_INTERNAL_ERROR("max_tokens must be positive");
  const std::vector<int64_t> table{config.vocab_size, config.hidden_size};
  if (layout.entry(layout.embedding()).shape != table || layout.head_unit() != config.num_hidden_layers + 1)
    return GLM_INTERNAL_ERROR("a parameter layout of another model configuration");
  std::unique_ptr<Glm4Model> model(
      new Glm4Model(config, std::move(layout), backend, max_tokens, recompute, offload_activations, forward_only));
  GLM_RETURN_IF_ERROR(model->allocate());
  return model;
}

Status Glm4Model::allocate() {
  const int64_t n = max_tokens_, h = config_.hidden_size, f = config_.intermediate_size;
  const DType act = backend_.compute_dtype(), stats = backend_.stats_dtype();
  auto alloc = [&](Buffer& b, int64_t numel, DType dtype) -> Status {
    auto r = backend_.allocate(numel, dtype);
    if (!r.is_ok()) return r.status();
    b = r.take();
    activation_bytes_ += static_cast<int64_t>(b.tensor().bytes());
    return Status::ok();
  };
  if (forward_only_) {
    GLM_ASSIGN_OR_RETURN(residual_, ResidualStash::create_forward_only(backend_, n * h, act));
  } else {
    GLM_ASSIGN_OR_RETURN(
        residual_, ResidualStash::create(backend_, config_.num_hidden_layers + 1, n * h, act, offload_activations_));
  }
  activation_bytes_ += residual_->device_bytes();

  // Per-layer activations: a kept field gets storage per layer, a shared one a single copy.
  constexpr Tensor LayerActivations::*kMembers[kFields] = {
      &LayerActivations::ln1,     &LayerActivations::rstd1, &LayerActivations::qkv, &LayerActivations::attn,
      &LayerActivations::lse,     &LayerActivations::mid,   &LayerActivations::ln2, &LayerActivations::rstd2,
      &LayerActivations::gate_up, &LayerActivations::act};
  const auto fields = activation_fields(config_, n, forward_only_ ? Recompute::full : recompute_);
  layers_.assign(static_cast<size_t>(config_.num_hidden_layers), LayerActivations{});
  for (int i = 0; i < kFields; ++i) {
    for (size_t l = 0; l < layers_.size(); ++l) {
      if (fields[i].shared && l > 0) {
        layers_[l].*kMembers[i] = layers_[0].*kMembers[i];
        continue;
      }
      storage_.emplace_back();
      GLM_RETURN_IF_ERROR(alloc(storage_.back(), fields[i].numel, fields[i].statistics ? stats : act));
      layers_[l].*kMembers[i] = storage_.back().tensor();
    }
  }
  GLM_RETURN_IF_ERROR(alloc(final_norm_, n * h, act));
  GLM_RETURN_IF_ERROR(alloc(final_rstd_, n, stats));
  GLM_RETURN_IF_ERROR(alloc(losses_, n, stats));
  GLM_RETURN_IF_ERROR(alloc(compact_losses_, n, stats));
  GLM_RETURN_IF_ERROR(alloc(compact_correct_, n, DType::i32));
  if (forward_only_) return alloc(head_rows_, n * h, act);  // the head's gathered rows
  GLM_RETURN_IF_ERROR(alloc(d_residual_, n * h, act));
  GLM_RETURN_IF_ERROR(alloc(d_norm_, n * h, act));
  GLM_RETURN_IF_ERROR(alloc(d_attn_, n * config_.q_width(), act));
  GLM_RETURN_IF_ERROR(alloc(d_qkv_, n * config_.qkv_width(), act));
  GLM_RETURN_IF_ERROR(alloc(d_act_, n * f, act));
  GLM_RETURN_IF_ERROR(alloc(d_gate_up_, n * 2 * f, act));
  GLM_RETURN_IF_ERROR(alloc(norm_grad_scratch_, h, act));
  if (d_gate_up_.numel() < 2 * n * h) GLM_RETURN_IF_ERROR(alloc(head_rows_, 2 * n * h, act));
  return Status::ok();
}

Tensor Glm4Model::head_rows(int k, int64_t m) const {
  // Two [max_tokens, hidden] halves of d_gate_up_ (free at the head: only layers use it), or of
  // head_rows_ where the FFN is narrower than the hidden size or the model is forward-only (one half).
  const Buffer& buf = head_rows_.numel() > 0 ? head_rows_ : d_gate_up_;
  const int64_t h = config_.hidden_size;
  return buf.slice(static_cast<int64_t>(k) * max_tokens_ * h, m * h);
}

LoraActivationSizes lora_activation_sizes(const LoraLayout& layout, int64_t max_tokens) {
  LoraActivationSizes s;
  const int64_t entries = static_cast<int64_t>(layout.entries().size());
  s.intermediates = std::max<int64_t>(1, entries) * max_tokens * layout.rank();
  s.intermediate_grad = max_tokens * layout.rank();
  if (layout.config().dropout > 0) s.dropout_scratch = max_tokens * layout.max_in_features();
  return s;
}

Status Glm4Model::attach_lora(const LoraLayout& layout, Tensor params, Tensor grads) {
  if (lora_ != nullptr) return GLM_INTERNAL_ERROR("attach_lora called twice");
  if (params.numel != layout.total_numel() || grads.numel != layout.total_numel())
    return GLM_INTERNAL_ERROR("LoRA buffers of ", params.numel, " / ", grads.numel, " elements for a layout of ",
                              layout.total_numel());
  const LoraActivationSizes sizes = lora_activation_sizes(layout, max_tokens_);
  GLM_ASSIGN_OR_RETURN(lora_u_storage_, backend_.allocate(sizes.intermediates, backend_.compute_dtype()));
  GLM_ASSIGN_OR_RETURN(lora_du_, backend_.allocate(sizes.intermediate_grad, backend_.compute_dtype()));
  if (sizes.dropout_scratch > 0) {
    GLM_ASSIGN_OR_RETURN(lora_dropped_, backend_.allocate(sizes.dropout_scratch, backend_.compute_dtype()));
  }
  lora_activation_bytes_ = static_cast<int64_t>(lora_u_storage_.tensor().bytes() + lora_du_.tensor().bytes() +
                                                lora_dropped_.tensor().bytes());
  activation_bytes_ += lora_activation_bytes_;
  lora_ = &layout;
  lora_params_ = params;
  lora_grads_ = grads;
  return Status::ok();
}

Result<Tensor> Glm4Model::norm_grad(Tensor unit_grads, int entry) {
  Tensor g = grad_view(unit_grads, entry);
  if (!g.empty()) return g;
  // RMSNorm backward always produces the weight gradient; a frozen norm's goes to scratch.
  Tensor t = norm_grad_scratch_.slice(0, layout_.entry(entry).numel);
  GLM_RETURN_IF_ERROR(backend_.zero(t));
  return t;
}

Status Glm4Model::lora_forward(int64_t l, LoraTarget target, Tensor out, Tensor in, int64_t n) {
  if (lora_ == nullptr) return Status::ok();
  const int index = lora_->find(l, target);
  if (index < 0) return Status::ok();
  const LoraEntry& e = lora_->entries()[static_cast<size_t>(index)];
  const int64_t r = lora_->rank();
  Tensor a = lora_params_.slice(e.a_offset, r * e.in_features), bt = lora_params_.slice(e.b_offset, r * e.out_features);
  Tensor u = lora_u_storage_.slice(static_cast<int64_t>(index) * max_tokens_ * r, n * r);
  Tensor x = in;
  if (lora_dropout_active_) {  // PEFT: lora_B(lora_A(dropout(x))); the base linear saw x itself
    x = lora_dropped_.slice(0, n * e.in_features);
    GLM_RETURN_IF_ERROR(backend_.dropout(x, in, lora_->config().dropout, lora_dropout_entry_key(lora_dropout_key_, e),
                                         0, /*accumulate=*/false));
  }
  GLM_RETURN_IF_ERROR(backend_.linear_forward(u, x, a, Tensor{}, n, e.in_features, r));
  GLM_RETURN_IF_ERROR(backend_.scale(u, lora_->config().scale()));
  // out[n, out] = u[n, r] Bt[r, out]: the input-gradient GEMM of a [r, out] weight (the base GEMM adds on).
  return backend_.linear_backward(out, Tensor{}, Tensor{}, u, Tensor{}, bt, n, e.out_features, r, false, true);
}

Status Glm4Model::lora_backward(int64_t l, LoraTarget target, Tensor din, Tensor dout, Tensor in, int64_t n) {
  if (lora_ == nullptr) return Status::ok();
  const int index = lora_->find(l, target);
  if (index < 0) return Status::ok();
  const LoraEntry& e = lora_->entries()[static_cast<size_t>(index)];
  const int64_t r = lora_->rank();
  Tensor a = lora_params_.slice(e.a_offset, r * e.in_features), bt = lora_params_.slice(e.b_offset, r * e.out_features);
  Tensor ga = lora_grads_.slice(e.a_offset, r * e.in_features), gbt = lora_grads_.slice(e.b_offset, r * e.out_features);
  Tensor u = lora_u_storage_.slice(static_cast<int64_t>(index) * max_tokens_ * r, n * r);
  Tensor du = lora_du_.slice(0, n * r);
  // du = dout B = dout Bt^T; dBt += u^T dout (u already carries the scale).
  GLM_RETURN_IF_ERROR(backend_.linear_forward(du, dout, bt, Tensor{}, n, e.out_features, r));
  GLM_RETURN_IF_ERROR(
      backend_.linear_backward(Tensor{}, gbt, Tensor{}, u, dout, bt, n, e.out_features, r, false, true));
  // d(A x) = scale * du: dA += (scale du)^T x, din = (scale du) A (the base's input gradient adds on).
  GLM_RETURN_IF_ERROR(backend_.scale(du, lora_->config().scale()));
  if (!lora_dropout_active_)
    return backend_.linear_backward(din, ga, Tensor{}, du, in, a, n, e.in_features, r, false, true);
  // With dropout the adapter's input was dropout(x): dA += (scale du)^T dropout(x), redrawn into the
  // scratch from the same key; din = dropout'((scale du) A), the same mask and 1 / (1 - p).
  const double p = lora_->config().dropout;
  const uint64_t key = lora_dropout_entry_key(lora_dropout_key_, e);
  Tensor scratch = lora_dropped_.slice(0, n * e.in_features);
  GLM_RETURN_IF_ERROR(backend_.dropout(scratch, in, p, key, 0, /*accumulate=*/false));
  GLM_RETURN_IF_ERROR(
      backend_.linear_backward(Tensor{}, ga, Tensor{}, du, scratch, a, n, e.in_features, r, false, true));
  GLM_RETURN_IF_ERROR(
      backend_.linear_backward(scratch, Tensor{}, Tensor{}, du, Tensor{}, a, n, e.in_features, r, false, true));
  return backend_.dropout(din, scratch, p, key, 0, /*accumulate=*/false);
}

int64_t Glm4Model::planned_activation_bytes(const ModelConfig& c, int64_t n, int64_t act, int64_t stats,
                                            Recompute recompute, bool offload_activations, bool forward_only) {
  // Mirrors allocate(): per-layer fields (once when shared), residual stream, head, backward scratch.
  const int64_t h = c.hidden_size, f = c.intermediate_size, layers = c.num_hidden_layers;
  int64_t fields = 0;
  for (const ActivationField& a : activation_fields(c, n, forward_only ? Recompute::full : recompute))
    fields += (a.shared ? 1 : layers) * a.numel * (a.statistics ? stats : act);
  const int64_t residual = act * n * h *
                           (forward_only ? ResidualStash::kForwardOnlySlots
                                         : ResidualStash::device_tensors(layers + 1, offload_activations));
  // final_norm_, final_rstd_, losses_, compact_losses_, compact_correct_ (i32).
  const int64_t head = act * n * h + stats * n * 3 + 4 * n;
  if (forward_only) return fields + residual + head + act * n * h;                          // + head_rows_
  int64_t scratch = act * n * (h + h + c.q_width() + c.qkv_width() + f + 2 * f) + act * h;  // + norm_grad_scratch_
  if (f < h) scratch += act * 2 * n * h;  // head_rows_: d_gate_up_ cannot lend the lm_head's rows
  return fields + residual + head + scratch;
}

int64_t Glm4Model::planned_host_activation_bytes(const ModelConfig& c, int64_t n, int64_t act,
                                                 bool offload_activations) {
  return act * n * c.hidden_size * ResidualStash::host_tensors(c.num_hidden_layers + 1, offload_activations);
}

Tensor Glm4Model::view(Tensor unit_params, int entry) const {
  const ParamEntry& e = layout_.entry(entry);
  const Tensor base = e.persistent ? persistent_params_ : unit_params;
  return base.slice(e.offset - layout_.units()[static_cast<size_t>(e.unit)].offset, e.numel);
}

Tensor Glm4Model::grad_view(Tensor unit_grads, int entry) const {
  const ParamEntry& e = layout_.entry(entry);
  const Tensor base = e.persistent ? persistent_grads_ : unit_grads;
  if (base.empty()) return Tensor{};
  return base.slice(e.offset - layout_.units()[static_cast<size_t>(e.unit)].offset, e.numel);
}

Status Glm4Model::acquire_persistent(ParameterProvider& params) {
  if (layout_.persistent_unit() < 0) return Status::ok();
  GLM_ASSIGN_OR_RETURN(persistent_params_, params.acquire_params(layout_.persistent_unit()));
  return Status::ok();
}

Status Glm4Model::release_persistent(ParameterProvider& params) {
  if (layout_.persistent_unit() < 0) return Status::ok();
  persistent_params_ = Tensor{};
  return params.release_params(layout_.persistent_unit());
}

Status Glm4Model::forward_backward(const MicroBatch& batch, double grad_scale, ParameterProvider& params,
                                   uint64_t dropout_key) {
  return run(batch, true, grad_scale, params, Tensor{}, dropout_key);
}

Status Glm4Model::forward(const MicroBatch& batch, ParameterProvider& params, Tensor correct) {
  return run(batch, false, 0.0, params, correct);
}

Status Glm4Model::layer_forward(int64_t l, const MicroBatch& b, Tensor w, bool to_output) {
  const int64_t n = b.n, h = config_.hidden_size, f = config_.intermediate_size;
  const LayerEntries& e = layout_.layer(l);
  LayerActivations& a = layers_[static_cast<size_t>(l)];
  Tensor x = residual(l, n);
  Tensor ln1 = rows(a.ln1, n, h), qkv = rows(a.qkv, n, config_.qkv_width());
  Tensor attn = rows(a.attn, n, config_.q_width()), mid = rows(a.mid, n, h), ln2 = rows(a.ln2, n, h);
  Tensor gate_up = rows(a.gate_up, n, 2 * f), act = rows(a.act, n, f);
  // Generation (a KV cache, nothing kept for a backward): the norms go into the linears after them
  // where no adapter needs the normed input, the SwiGLU into the MLP's first, and RoPE with the
  // KV-cache store into the attention's.
  const bool generating = kv_cache_ != nullptr;
  RopeStore store;
  if (generating) {
    GLM_ASSIGN_OR_RETURN(store, kv_cache_->rope_store(l, b, config_.rotary_dim(), config_.rope_theta));
  }
  if (generating && !adapted(l, LoraTarget::query_key_value)) {
    GLM_RETURN_IF_ERROR(backend_.normed_linear_forward(qkv, x, view(w, e.input_norm), config_.rms_norm_eps,
                                                       view(w, e.qkv_weight), view(w, e.qkv_bias), false, n, h,
                                                       config_.qkv_width(), ln1, a.rstd1, Tensor{}, &store));
  } else {
    GLM_RETURN_IF_ERROR(
        backend_.rmsnorm_forward(ln1, a.rstd1, x, view(w, e.input_norm), n, h, config_.rms_norm_eps));
    GLM_RETURN_IF_ERROR(adapted_linear(l, LoraTarget::query_key_value, qkv, ln1, view(w, e.qkv_weight),
                                       view(w, e.qkv_bias), n, h, config_.qkv_width()));
    if (generating) GLM_RETURN_IF_ERROR(backend_.rope_store(qkv, n, store));
  }
  if (generating) {
    GLM_RETURN_IF_ERROR(kv_cache_->attend(l, attn, a.lse, qkv, b));
  } else {
    GLM_RETURN_IF_ERROR(
        backend_.rope_forward(qkv, b.positions, n, shape_, config_.rotary_dim(), config_.rope_theta));
    GLM_RETURN_IF_ERROR(context_ != nullptr ? context_->forward(attn, a.lse, qkv, b)
                                            : backend_.attention_forward(attn, a.lse, qkv, b.doc_start, n, shape_));
  }
  GLM_RETURN_IF_ERROR(residual_linear(l, LoraTarget::dense, mid, attn, view(w, e.dense), x, n, config_.q_width(), h));
  if (generating && !adapted(l, LoraTarget::dense_h_to_4h)) {
    GLM_RETURN_IF_ERROR(backend_.normed_linear_forward(act, mid, view(w, e.post_norm), config_.rms_norm_eps,
                                                       view(w, e.h_to_4h), Tensor{}, true, n, h, 2 * f, ln2, a.rstd2,
                                                       gate_up));
  } else {
    GLM_RETURN_IF_ERROR(
        backend_.rmsnorm_forward(ln2, a.rstd2, mid, view(w, e.post_norm), n, h, config_.rms_norm_eps));
    GLM_RETURN_IF_ERROR(
        adapted_linear(l, LoraTarget::dense_h_to_4h, gate_up, ln2, view(w, e.h_to_4h), Tensor{}, n, h, 2 * f));
    GLM_RETURN_IF_ERROR(backend_.swiglu_forward(act, gate_up, n, f));
  }
  if (!to_output) return Status::ok();
  Tensor out = residual(l + 1, n);
  return residual_linear(l, LoraTarget::dense_4h_to_h, out, act, view(w, e.four_h_to_h), mid, n, f, h);
}

bool Glm4Model::adapted(int64_t l, LoraTarget target) const { return lora_ != nullptr && lora_->find(l, target) >= 0; }

// out = W in (+ bias) (+ the LoRA update). With an adapter its update is written first and the base
// GEMM adds onto it in its epilogue: the only pass over `out` outside a GEMM is the rank-r write.
Status Glm4Model::adapted_linear(int64_t l, LoraTarget target, Tensor out, Tensor in, Tensor weight, Tensor bias,
                                 int64_t n, int64_t in_features, int64_t out_features) {
  if (!adapted(l, target)) return backend_.linear_forward(out, in, weight, bias, n, in_features, out_features);
  GLM_RETURN_IF_ERROR(lora_forward(l, target, out, in, n));
  return backend_.linear_forward_add(out, in, weight, bias, out, n, in_features, out_features);
}

// out = residual + W in (+ the LoRA update): the GEMM's epilogue reads the residual, or, with an
// adapter, the adapter's update with the residual added to it.
Status Glm4Model::residual_linear(int64_t l, LoraTarget target, Tensor out, Tensor in, Tensor weight, Tensor residual,
                                  int64_t n, int64_t in_features, int64_t out_features) {
  if (!adapted(l, target))
    return backend_.linear_forward_add(out, in, weight, Tensor{}, residual, n, in_features, out_features);
  GLM_RETURN_IF_ERROR(lora_forward(l, target, out, in, n));
  GLM_RETURN_IF_ERROR(backend_.add(out, out, residual, n * out_features));
  return backend_.linear_forward_add(out, in, weight, Tensor{}, out, n, in_features, out_features);
}

// din = dout W (dweight += dout^T in, dbias += column sums of dout), plus the adapter's input
// gradient: written first, the base input-gradient GEMM then adds onto it in its epilogue.
Status Glm4Model::adapted_backward(int64_t l, LoraTarget target, Tensor din, Tensor dweight, Tensor dbias, Tensor dout,
                                   Tensor in, Tensor weight, int64_t n, int64_t in_features, int64_t out_features) {
  const bool lora = adapted(l, target);
  if (lora) GLM_RETURN_IF_ERROR(lora_backward(l, target, din, dout, in, n));
  // Every base weight is a ParamKind::weight entry: written rather than added to when the provider
  // allows (the first micro-batch of a step).
  return backend_.linear_backward(din, dweight, dbias, dout, in, weight, n, in_features, out_features, lora,
                                  !overwrite_grads_);
}

Status Glm4Model::recompute_layer(int64_t l, const MicroBatch& b, Tensor w) {
  const int64_t n = b.n, h = config_.hidden_size, f = config_.intermediate_size;
  switch (recompute_) {
    case Recompute::none:
      return Status::ok();
    case Recompute::full:
      return layer_forward(l, b, w, /*to_output=*/false);
    case Recompute::selective: {
      // The element-wise producers of the GEMM inputs; the GEMMs and attention are not redone.
      const LayerEntries& e = layout_.layer(l);
      const LayerActivations& a = layers_[static_cast<size_t>(l)];
      GLM_RETURN_IF_ERROR(backend_.rmsnorm_forward(rows(a.ln1, n, h), a.rstd1,
                                                   residual(l, n), view(w, e.input_norm),
                                                   n, h, config_.rms_norm_eps));
      GLM_RETURN_IF_ERROR(backend_.rmsnorm_forward(rows(a.ln2, n, h), a.rstd2, rows(a.mid, n, h), view(w, e.post_norm),
                                                   n, h, config_.rms_norm_eps));
      return backend_.swiglu_forward(rows(a.act, n, f), rows(a.gate_up, n, 2 * f), n, f);
    }
  }
  return GLM_INTERNAL_ERROR("unknown recompute policy");
}

int64_t Glm4Model::mlp_tail_from(int64_t l) const {
  const LayerEntries& e = layout_.layer(l);
  const ParamEntry& first = layout_.entry(e.post_norm);
  if (first.unit != layout_.layer_unit(l)) return -1;
  const ParamUnit& unit = layout_.units()[static_cast<size_t>(first.unit)];
  for (int i : {e.post_norm, e.h_to_4h, e.four_h_to_h})
    if (layout_.entry(i).unit != first.unit || layout_.entry(i).offset < first.offset) return -1;
  for (int i : unit.entries)
    if (i != e.post_norm && i != e.h_to_4h && i != e.four_h_to_h && layout_.entry(i).offset >= first.offset) return -1;
  return first.offset - unit.offset;
}

// On entry d_residual_ holds dL/d(layer output); on exit dL/d(layer input).
Status Glm4Model::layer_backward(int64_t l, const MicroBatch& b, Tensor w, Tensor g, ParameterProvider& params) {
  GLM_RETURN_IF_ERROR(recompute_layer(l, b, w));
  const int64_t n = b.n, h = config_.hidden_size, f = config_.intermediate_size;
  const int64_t qkv_w = config_.qkv_width(), q_w = config_.q_width();
  const LayerEntries& e = layout_.layer(l);
  LayerActivations& a = layers_[static_cast<size_t>(l)];
  Tensor x = residual(l, n);
  Tensor dres = rows(d_residual_, n, h), dnorm = rows(d_norm_, n, h);
  Tensor dact = rows(d_act_, n, f), dgu = rows(d_gate_up_, n, 2 * f);
  Tensor dattn = rows(d_attn_, n, q_w), dqkv = rows(d_qkv_, n, qkv_w);
  // MLP branch: out = mid + W_4hh (silu(gate) * up), gate|up = W_h4h ln2(mid).
  // Every linear's LoRA backward runs with the base one (adapted_backward), before its dout is overwritten.
  GLM_RETURN_IF_ERROR(adapted_backward(l, LoraTarget::dense_4h_to_h, dact, grad_view(g, e.four_h_to_h), Tensor{}, dres,
                                       rows(a.act, n, f), view(w, e.four_h_to_h), n, f, h));
  GLM_RETURN_IF_ERROR(backend_.swiglu_backward(dgu, dact, rows(a.gate_up, n, 2 * f), n, f));
  GLM_RETURN_IF_ERROR(adapted_backward(l, LoraTarget::dense_h_to_4h, dnorm, grad_view(g, e.h_to_4h), Tensor{}, dgu,
                                       rows(a.ln2, n, h), view(w, e.h_to_4h), n, h, 2 * f));
  GLM_ASSIGN_OR_RETURN(Tensor post_norm_grad, norm_grad(g, e.post_norm));
  GLM_RETURN_IF_ERROR(
      backend_.rmsnorm_backward(dres, post_norm_grad, dnorm, rows(a.mid, n, h), view(w, e.post_norm), a.rstd2, n, h));
  // The MLP half's gradients are final: its update may start beside the attention half's backward.
  if (const int64_t from = mlp_tail_from(l); from > 0 && !g.empty())
    GLM_RETURN_IF_ERROR(params.grads_ready_from(layout_.layer_unit(l), from));
  // Attention branch: mid = x + W_dense attn(rope(W_qkv ln1(x) + b)).
  GLM_RETURN_IF_ERROR(adapted_backward(l, LoraTarget::dense, dattn, grad_view(g, e.dense), Tensor{}, dres,
                                       rows(a.attn, n, q_w), view(w, e.dense), n, q_w, h));
  GLM_RETURN_IF_ERROR(
      context_ != nullptr
          ? context_->backward(dqkv, dattn, rows(a.attn, n, q_w), a.lse, rows(a.qkv, n, qkv_w), b)
          : backend_.attention_backward(dqkv, dattn, rows(a.attn, n, q_w), a.lse, rows(a.qkv, n, qkv_w), b.doc_start,
                                        n, shape_));
  GLM_RETURN_IF_ERROR(backend_.rope_backward(dqkv, b.positions, n, shape_, config_.rotary_dim(), config_.rope_theta));
  GLM_RETURN_IF_ERROR(adapted_backward(l, LoraTarget::query_key_value, dnorm, grad_view(g, e.qkv_weight),
                                       grad_view(g, e.qkv_bias), dqkv, rows(a.ln1, n, h), view(w, e.qkv_weight), n, h,
                                       qkv_w));
  GLM_ASSIGN_OR_RETURN(Tensor input_norm_grad, norm_grad(g, e.input_norm));
  return backend_.rmsnorm_backward(dres, input_norm_grad, dnorm, x, view(w, e.input_norm), a.rstd1, n, h);
}

Status Glm4Model::forward_layers(const MicroBatch& b, ParameterProvider& params, bool keep) {
  if (b.n <= 0 || b.n > max_tokens_)
    return GLM_INTERNAL_ERROR("micro-batch of ", b.n, " tokens outside (0, ", max_tokens_, "]");
  const int64_t n = b.n, h = config_.hidden_size, layers = config_.num_hidden_layers;
  GLM_RETURN_IF_ERROR(acquire_persistent(params));
  GLM_ASSIGN_OR_RETURN(Tensor emb, params.acquire_params(layout_.embedding_unit()));
  GLM_RETURN_IF_ERROR(params.prefetch_params(layers > 0 ? layout_.layer_unit(0) : layout_.head_unit()));
  GLM_RETURN_IF_ERROR(residual_->begin(n * h, keep));
  GLM_RETURN_IF_ERROR(residual_->will_write(0));
  GLM_RETURN_IF_ERROR(backend_.embedding_forward(residual(0, n), view(emb, layout_.embedding()), b.tokens, n, h));
  GLM_RETURN_IF_ERROR(residual_->written(0));
  GLM_RETURN_IF_ERROR(params.release_params(layout_.embedding_unit()));
  for (int64_t l = 0; l < layers; ++l) {
    GLM_ASSIGN_OR_RETURN(Tensor w, params.acquire_params(layout_.layer_unit(l)));
    GLM_RETURN_IF_ERROR(params.prefetch_params(l + 1 < layers ? layout_.layer_unit(l + 1) : layout_.head_unit()));
    GLM_RETURN_IF_ERROR(residual_->will_write(l + 1));
    GLM_RETURN_IF_ERROR(layer_forward(l, b, w));
    GLM_RETURN_IF_ERROR(residual_->written(l + 1));
    GLM_RETURN_IF_ERROR(params.release_params(layout_.layer_unit(l)));
  }
  return Status::ok();
}

Status Glm4Model::forward_logits(const MicroBatch& b, ParameterProvider& params, Tensor logits, Tensor wanted) {
  lora_dropout_active_ = false;  // evaluation
  GLM_RETURN_IF_ERROR(forward_layers(b, params, /*keep=*/false));
  const int64_t n = b.n, h = config_.hidden_size, m = wanted.empty() ? n : wanted.numel;
  const int head = layout_.head_unit();
  GLM_ASSIGN_OR_RETURN(Tensor hw, params.acquire_params(head));
  Tensor last = residual(config_.num_hidden_layers, n);
  if (!wanted.empty()) {  // the wanted rows first, then the norm and lm_head over them alone
    GLM_RETURN_IF_ERROR(backend_.gather_rows(head_rows(0, m), last, wanted, m, h));
    last = head_rows(0, m);
  }
  Tensor normed = rows(final_norm_, m, h);
  GLM_RETURN_IF_ERROR(backend_.rmsnorm_forward(normed, final_rstd_.tensor(), last, view(hw, layout_.final_norm()), m,
                                               h, config_.rms_norm_eps));
  GLM_RETURN_IF_ERROR(
      backend_.linear_forward(logits, normed, view(hw, layout_.output()), Tensor{}, m, h, config_.vocab_size));
  GLM_RETURN_IF_ERROR(params.release_params(head));
  return release_persistent(params);
}

Status Glm4Model::run(const MicroBatch& b, bool with_grad, double grad_scale, ParameterProvider& params, Tensor correct,
                      uint64_t dropout_key) {
  if (with_grad && forward_only_) return GLM_INTERNAL_ERROR("a training step on a forward-only model");
  // LoRA dropout only in training steps; p = 0 takes the dropout-free path.
  lora_dropout_active_ = with_grad && lora_ != nullptr && lora_->config().dropout > 0;
  lora_dropout_key_ = dropout_key;
  GLM_RETURN_IF_ERROR(forward_layers(b, params, with_grad));
  const int64_t n = b.n, h = config_.hidden_size, layers = config_.num_hidden_layers;

  // Head: final RMSNorm, then lm_head fused with cross-entropy (and its backward when training).
  const int head = layout_.head_unit();
  GLM_ASSIGN_OR_RETURN(Tensor hw, params.acquire_params(head));
  Tensor last = residual(layers, n);
  Tensor normed = rows(final_norm_, n, h);
  GLM_RETURN_IF_ERROR(backend_.rmsnorm_forward(normed, final_rstd_.tensor(), last, view(hw, layout_.final_norm()), n, h,
                                               config_.rms_norm_eps));
  Tensor losses = losses_.slice(0, n);
  // Rows without a target (prompts, each document's last token) add nothing to the loss or to any
  // gradient: with the batch's index the lm_head and cross-entropy run over the labelled rows only,
  // gathered, and their losses, argmax flags and input gradients are scattered back.
  const bool compact = b.n_labelled >= 0 && b.n_labelled < n;
  const int64_t m = compact ? b.n_labelled : n;
  Tensor head_in = normed, head_targets = b.targets, head_losses = losses, head_correct = correct;
  if (compact) {
    head_in = head_rows(0, m);
    head_targets = b.label_targets;
    head_losses = compact_losses_.slice(0, m);
    if (!correct.empty()) head_correct = compact_correct_.slice(0, m);
    if (m > 0) GLM_RETURN_IF_ERROR(backend_.gather_rows(head_in, normed, b.label_rows, m, h));
  }
  // Zeros, then the labelled rows' values.
  auto scatter = [&](Tensor dst, Tensor src, int64_t width) -> Status {
    GLM_RETURN_IF_ERROR(backend_.zero(dst));
    return m > 0 ? backend_.scatter_rows(dst, src, b.label_rows, m, width) : Status::ok();
  };
  if (!with_grad) {
    if (m > 0)
      GLM_RETURN_IF_ERROR(backend_.lm_head_cross_entropy(head_losses, head_correct, Tensor{}, Tensor{}, head_in,
                                                         view(hw, layout_.output()), head_targets, m, h,
                                                         config_.vocab_size, 0.0, true));
    if (compact) {
      GLM_RETURN_IF_ERROR(scatter(losses, head_losses, 1));
      if (!correct.empty()) GLM_RETURN_IF_ERROR(scatter(correct, head_correct, 1));
    }
    GLM_RETURN_IF_ERROR(params.release_params(head));
    return release_persistent(params);
  }
  // Backward starts with the last layer: its gather overlaps the head's backward.
  if (layers > 0) GLM_RETURN_IF_ERROR(params.prefetch_params(layout_.layer_unit(layers - 1)));
  // Every unit's backward adds to the persistent tensors' gradients: taken once, ready at the end.
  const int persistent = layout_.persistent_unit();
  persistent_grads_ = Tensor{};
  if (persistent >= 0) {
    GLM_ASSIGN_OR_RETURN(persistent_grads_, params.unit_grads(persistent));
  }
  GLM_ASSIGN_OR_RETURN(Tensor hg, params.unit_grads(head));
  overwrite_grads_ = params.overwrite_grads();
  Tensor dres = rows(d_residual_, n, h), dnorm = rows(d_norm_, n, h);
  const bool accumulate_head = !(overwrite_grads_ && layout_.entry(layout_.output()).kind == ParamKind::weight);
  Tensor head_grad = grad_view(hg, layout_.output());
  Tensor head_dnorm = compact ? head_rows(1, m) : dnorm;
  if (m > 0) {
    GLM_RETURN_IF_ERROR(backend_.lm_head_cross_entropy(head_losses, Tensor{}, head_dnorm, head_grad, head_in,
                                                       view(hw, layout_.output()), head_targets, m, h,
                                                       config_.vocab_size, grad_scale, accumulate_head));
  } else if (!accumulate_head && !head_grad.empty()) {
    GLM_RETURN_IF_ERROR(backend_.zero(head_grad));  // no labelled row: a gradient of zeros, written
  }
  if (compact) {
    GLM_RETURN_IF_ERROR(scatter(losses, head_losses, 1));
    GLM_RETURN_IF_ERROR(scatter(dnorm, head_dnorm, h));
  }
  GLM_RETURN_IF_ERROR(backend_.zero(dres));
  GLM_ASSIGN_OR_RETURN(Tensor final_norm_grad, norm_grad(hg, layout_.final_norm()));
  GLM_RETURN_IF_ERROR(backend_.rmsnorm_backward(dres, final_norm_grad, dnorm, last, view(hw, layout_.final_norm()),
                                                final_rstd_.tensor(), n, h));
  GLM_RETURN_IF_ERROR(params.release_params(head));
  GLM_RETURN_IF_ERROR(params.grads_ready(head));

  for (int64_t l = layers - 1; l >= 0; --l) {
    const int unit = layout_.layer_unit(l);
    GLM_ASSIGN_OR_RETURN(Tensor w, params.acquire_params(unit));
    if (l > 0) GLM_RETURN_IF_ERROR(params.prefetch_params(layout_.layer_unit(l - 1)));
    GLM_ASSIGN_OR_RETURN(Tensor g, params.unit_grads(unit));
    // The layer's input on the device, and the next one's on its way (offloaded activations).
    GLM_RETURN_IF_ERROR(residual_->need(l));
    if (l > 0) GLM_RETURN_IF_ERROR(residual_->prefetch(l - 1));
    GLM_RETURN_IF_ERROR(layer_backward(l, b, w, g, params));
    GLM_RETURN_IF_ERROR(params.release_params(unit));
    GLM_RETURN_IF_ERROR(params.grads_ready(unit));
  }
  GLM_ASSIGN_OR_RETURN(Tensor embedding_grads, params.unit_grads(layout_.embedding_unit()));
  Tensor eg = grad_view(embedding_grads, layout_.embedding());
  if (!eg.empty()) {
    GLM_RETURN_IF_ERROR(backend_.embedding_backward(eg, dres, b.tokens, b.token_order, b.token_runs, n, h));
    // The padding row gets no gradient (transformers' padding_idx), whatever reads it.
    if (config_.pad_token_id >= 0) GLM_RETURN_IF_ERROR(backend_.zero(eg.slice(config_.pad_token_id * h, h)));
  }
  GLM_RETURN_IF_ERROR(params.grads_ready(layout_.embedding_unit()));
  GLM_RETURN_IF_ERROR(release_persistent(params));
  if (persistent < 0) return Status::ok();
  persistent_grads_ = Tensor{};
  return params.grads_ready(persistent);
}

}  // namespace glm
