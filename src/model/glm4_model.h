// GLM-4 forward and backward written once against the Backend op interface (GLM4_SPEC.md section 2).
// The model does not own parameters: a ParameterProvider hands it each unit's weights and gradient
// slots, which is where ZeRO plugs in.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "model/backend.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/param_layout.h"
#include "model/recompute.h"
#include "model/residual_stash.h"

namespace glm {

class ContextAttention;
class KvCache;

// One micro-batch of n tokens in backend memory: documents packed back to back.
struct MicroBatch {
  Tensor tokens;     // i32 [n]
  Tensor targets;    // i32 [n]: token to predict at each position, -1 = no loss
  Tensor positions;  // i32 [n]: RoPE position within its document
  Tensor doc_start;  // i32 [n]: index of the first token of the document holding token t
  int64_t n = 0;
  // A context-parallel share of a row (model/context_attention.h), else empty: the row's length,
  // each token's position in the row (doc_start is in row positions then), and each row position's
  // row in the group's gathered keys and values.
  int64_t row_tokens = 0;
  Tensor row_position;  // i32 [n]
  Tensor kv_rows;       // i32 [row_tokens]
  // With a KV cache attached (model/kv_cache.h): each token's row in the cache, where its k | v go;
  // row_position, doc_start and kv_rows then place it in its sequence.
  Tensor cache_rows;  // i32 [n]
  bool decode = false;  // with cache_rows: every token is the newest of its own sequence (a decode step)
  // With cache_rows, >= 0 where kv_rows are kv_run_start, kv_run_start + 1, ... (one sequence's rows
  // as a fresh cache hands them out: its prompt's later chunks attend to them as one block).
  int64_t kv_run_start = -1;
  // The batch's index (index_micro_batch(), uploaded beside it; n_labelled < 0: none). With it the
  // lm_head and cross-entropy run over the labelled rows only; a device backend's embedding
  // backward needs token_order and token_runs.
  Tensor label_rows, label_targets;  // i32 [n_labelled]
  Tensor token_order;                // i32 [n]
  Tensor token_runs;                 // i32 [runs + 1]
  int64_t n_labelled = -1;
};

// The host's index of a micro-batch: the positions with a target (ascending) and their targets;
// the positions ordered by token, then position, and where each token's run starts in that order
// (then n): the embedding backward sums each token's rows once, in a fixed order.
struct MicroBatchIndex {
  std::vector<int32_t> label_rows, label_targets, token_order, token_runs;
};
MicroBatchIndex index_micro_batch(std::span<const int32_t> tokens, std::span<const int32_t> targets);
// The positions 0 .. n - 1 ordered by (tokens[p] as unsigned, p): a stable radix sort, linear in n,
// because it runs on the host at the start of every step while the GPU waits (a comparison sort
// of (token, position) keys costs several times more there).
std::vector<int32_t> order_by_token(std::span<const int32_t> tokens);
// i32 elements a micro-batch of up to n tokens takes with its index: tokens, targets, positions and
// document starts (4n), labelled rows and their targets (at most 2n), token order (n), runs (n + 1).
inline int64_t micro_batch_ints(int64_t n) { return 8 * n + 1; }

class ParameterProvider {
 public:
  virtual ~ParameterProvider() = default;
  // The unit's parameters laid out like ParamLayout::units()[unit], valid until release_params(unit).
  virtual Result<Tensor> acquire_params(int unit) = 0;
  virtual Status release_params(int unit) { return Status::ok(); }
  // The model will acquire `unit` next after the one it holds: a provider that gathers parameters
  // (ZeRO-3) starts now so that the transfer overlaps the current unit's compute.
  virtual Status prefetch_params(int unit) { return Status::ok(); }
  // Where the model accumulates this unit's gradient (same layout as the parameters); empty when
  // the parameters are frozen (LoRA): no parameter gradient of the unit is computed then.
  // A failure (a collective that a reused gradient buffer waited for) ends the backward.
  virtual Result<Tensor> unit_grads(int unit) = 0;
  // The unit's gradient contribution of this micro-batch is complete (bucketed reduction hooks here,
  // and in the last micro-batch of a step the optimizer may update the unit right away, beside the
  // rest of backward): after this call the model neither reads the unit's parameters nor touches
  // its gradient again until the next micro-batch.
  virtual Status grads_ready(int unit) { return Status::ok(); }
  // Part of a unit's gradient is complete early: the elements from `from` (relative to the unit's
  // first element) to the unit's end (a layer's MLP half, once its backward is done). Until
  // grads_ready(unit) the model neither reads those parameters nor touches those gradients again
  // in this micro-batch. grads_ready(unit) follows for the whole unit.
  virtual Status grads_ready_from(int unit, int64_t from) { return Status::ok(); }
  // True when no gradient slot handed out for this micro-batch holds a contribution of the current
  // optimizer step yet: the model then writes the ParamKind::weight gradients (one GEMM each, with
  // beta = 0) instead of adding to them, and the provider need not have zeroed those. Every other
  // gradient is always added to, so its slots must be zero (or hold earlier micro-batches' sums).
  virtual bool overwrite_grads() const { return false; }
};

// What Glm4Model::attach_lora allocates for micro-batches of max_tokens tokens, in compute-dtype
// elements (the memory planner counts the same). Dropout masks are never stored: backward redraws
// dropout(x) into the one scratch.
struct LoraActivationSizes {
  int64_t intermediates = 0;      // u = scale * A x kept for backward: [max_tokens, r] per adapter
  int64_t intermediate_grad = 0;  // the backward's du: [max_tokens, r], shared by every adapter
  int64_t dropout_scratch = 0;    // dropout(x): [max_tokens, widest adapter input]; 0 without dropout
  int64_t numel() const { return intermediates + intermediate_grad + dropout_scratch; }
};
LoraActivationSizes lora_activation_sizes(const LoraLayout& layout, int64_t max_tokens);

class Glm4Model {
 public:
  // Allocates every activation for micro-batches of up to max_tokens tokens, once; what is kept
  // per layer and what is shared (and recomputed in backward) follows the recompute policy.
  // layout (of config; the parameter provider's, e.g. ZeRO's sharded one) may have a persistent
  // unit, which the model acquires (and whose gradients it takes) once for the whole forward and
  // backward. Without a layout: ParamLayout(config), one shard, nothing persistent.
  // offload_activations (--offload_activations): the layers' inputs wait for their backward in
  // pinned host memory (model/residual_stash.h). forward_only (evaluation, generation): no backward
  // scratch, one layer's activations shared by every layer and two residual-stream tensors, whatever
  // the policy; a training forward is then an error.
  static Result<std::unique_ptr<Glm4Model>> create(const ModelConfig& config, ParamLayout layout, Backend& backend,
                                                   int64_t max_tokens, Recompute recompute = Recompute::none,
                                                   bool offload_activations = false, bool forward_only = false);
  static Result<std::unique_ptr<Glm4Model>> create(const ModelConfig& config, Backend& backend, int64_t max_tokens,
                                                   Recompute recompute = Recompute::none);

  const ModelConfig& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }
  int64_t max_tokens() const { return max_tokens_; }
  Recompute recompute() const { return recompute_; }
  // Bytes of every activation and backward scratch buffer allocated by create() on the backend,
  // and of the offloaded layer inputs in host memory.
  int64_t activation_bytes() const { return activation_bytes_; }
  int64_t host_activation_bytes() const { return residual_->host_bytes(); }
  // The same numbers without allocating: micro-batches of max_tokens tokens, activations of
  // activation_size bytes per element and statistics of stats_size (the memory planner).
  static int64_t planned_activation_bytes(const ModelConfig& config, int64_t max_tokens, int64_t activation_size,
                                          int64_t stats_size, Recompute recompute = Recompute::none,
                                          bool offload_activations = false, bool forward_only = false);
  static int64_t planned_host_activation_bytes(const ModelConfig& config, int64_t max_tokens, int64_t activation_size,
                                               bool offload_activations);

  // Adds trainable LoRA adapters (model/lora.h) to the layers' linears: params and grads are laid
  // out as `layout` (which must outlive the model); backward accumulates into grads. Allocates
  // lora_activation_sizes(layout, max_tokens), counted in activation_bytes().
  Status attach_lora(const LoraLayout& layout, Tensor params, Tensor grads);
  const LoraLayout* lora() const { return lora_; }
  // Context parallelism: attention of every micro-batch (a share of a row) goes through `context`,
  // which must outlive the model; null (the default) attends within the micro-batch.
  void attach_context(ContextAttention* context) { context_ = context; }
  // Generation: attention of every forward goes through `cache` (model/kv_cache.h) while attached;
  // null detaches it. Forward only.
  void attach_kv_cache(KvCache* cache) { kv_cache_ = cache; }
  int64_t lora_activation_bytes() const { return lora_activation_bytes_; }  // 0 without LoRA

  // Forward, then backward with dloss/dlogit scaled by grad_scale; gradients accumulate into the
  // provider's gradient slots. Per-token losses land in losses(). LoRA dropout (a training step's
  // only randomness) draws its masks from dropout_key (lora_dropout_key() in model/lora.h);
  // forward() and forward_logits() are evaluation: no dropout.
  Status forward_backward(const MicroBatch& batch, double grad_scale, ParameterProvider& params,
                          uint64_t dropout_key = 0);
  // Forward only (evaluation): per-token losses in losses(); with correct (i32, batch.n) non-empty
  // also 1 per token whose logits' argmax is its target (token accuracy), else 0.
  Status forward(const MicroBatch& batch, ParameterProvider& params, Tensor correct = Tensor{});
  Tensor losses() const { return losses_.tensor(); }
  // Forward to the logits [n, vocab] in compute dtype (evaluation against other implementations);
  // with `rows` (i32 [m]) only those rows' logits, [m, vocab] (what generation samples from).
  Status forward_logits(const MicroBatch& batch, ParameterProvider& params, Tensor logits, Tensor rows = Tensor{});
  // Where layer l's MLP half (post-attention norm and both MLP weights) starts in its unit when that
  // half is the unit's tail (no tensor of it moved to the persistent unit): backward then hands it
  // over with grads_ready_from() before the attention half's backward; -1 otherwise.
  int64_t mlp_tail_from(int64_t l) const;

 private:
  Glm4Model(const ModelConfig& config, ParamLayout layout, Backend& backend, int64_t max_tokens, Recompute recompute,
            bool offload_activations, bool forward_only);
  Status allocate();
  Status run(const MicroBatch& batch, bool with_grad, double grad_scale, ParameterProvider& params,
             Tensor correct = Tensor{}, uint64_t dropout_key = 0);
  // Embedding and every layer; the last layer's output is residual L. keep: a backward follows.
  Status forward_layers(const MicroBatch& batch, ParameterProvider& params, bool keep);
  Tensor residual(int64_t j, int64_t n) const { return rows(residual_->at(j), n, config_.hidden_size); }
  // The layer's forward; with to_output false it stops before the MLP's down projection (the
  // recomputation before backward, which needs everything but the layer output).
  Status layer_forward(int64_t l, const MicroBatch& b, Tensor unit_params, bool to_output = true);
  // Restores what the policy dropped from layer l's activations (backward calls it first).
  Status recompute_layer(int64_t l, const MicroBatch& b, Tensor unit_params);
  Status layer_backward(int64_t l, const MicroBatch& b, Tensor unit_params, Tensor unit_grads,
                        ParameterProvider& params);
  // The entry's parameters inside its unit's acquired tensor (or the persistent unit's).
  Tensor view(Tensor unit_params, int entry) const;
  // The entry's gradient slot; empty when the provider keeps no gradients (frozen base).
  Tensor grad_view(Tensor unit_grads, int entry) const;
  // The persistent unit (if the layout has one): acquired before the first layer, released after
  // the head; its gradients taken before the head's backward and ready after the embedding's.
  Status acquire_persistent(ParameterProvider& params);
  Status release_persistent(ParameterProvider& params);
  // An RMSNorm weight's gradient slot, or a scratch the frozen base's norm gradients land in.
  Result<Tensor> norm_grad(Tensor unit_grads, int entry);
  // out += scale * (x A^T) Bt for layer l's adapter on `target` (nothing when not targeted).
  bool adapted(int64_t l, LoraTarget target) const;
  Status adapted_linear(int64_t l, LoraTarget target, Tensor out, Tensor in, Tensor weight, Tensor bias, int64_t n,
                        int64_t in_features, int64_t out_features);
  Status residual_linear(int64_t l, LoraTarget target, Tensor out, Tensor in, Tensor weight, Tensor residual, int64_t n,
                         int64_t in_features, int64_t out_features);
  Status adapted_backward(int64_t l, LoraTarget target, Tensor din, Tensor dweight, Tensor dbias, Tensor dout,
                          Tensor in, Tensor weight, int64_t n, int64_t in_features, int64_t out_features);
  Status lora_forward(int64_t l, LoraTarget target, Tensor out, Tensor in, int64_t n);
  // The adapter's gradients from dout (the linear's output gradient) and x; din += its input gradient.
  Status lora_backward(int64_t l, LoraTarget target, Tensor din, Tensor dout, Tensor in, int64_t n);
  Tensor rows(const Buffer& buf, int64_t n, int64_t width) const { return buf.slice(0, n * width); }
  Tensor rows(const Tensor& t, int64_t n, int64_t width) const { return t.slice(0, n * width); }

  ModelConfig config_;
  ParamLayout layout_;
  Backend& backend_;
  int64_t max_tokens_;
  Recompute recompute_;
  bool offload_activations_;
  bool forward_only_;
  int64_t activation_bytes_ = 0;
  AttentionShape shape_;
  KvCache* kv_cache_ = nullptr;

  // Views of max_tokens rows; under recomputation several layers share the same storage.
  struct LayerActivations {
    Tensor ln1, rstd1, qkv, attn, lse, mid, ln2, rstd2, gate_up, act;
  };
  std::vector<Buffer> storage_;   // owns what LayerActivations views
  std::unique_ptr<ResidualStash> residual_;  // L + 1 residual-stream tensors: layer inputs and the last output
  std::vector<LayerActivations> layers_;
  Buffer final_norm_, final_rstd_, losses_;
  // The lm_head over the labelled rows only: their losses and argmax flags before they are
  // scattered back, and (head_rows_, only where d_gate_up_ is too small to lend them or does not
  // exist) their gathered hidden states and those states' gradient.
  Buffer compact_losses_, compact_correct_, head_rows_;
  Tensor head_rows(int k, int64_t m) const;
  // Backward scratch, reused by every layer.
  Buffer d_residual_, d_norm_, d_attn_, d_qkv_, d_act_, d_gate_up_;
  Buffer norm_grad_scratch_;                     // hidden_size elements, written and never read (frozen norms)
  Tensor persistent_params_, persistent_grads_;  // the persistent unit's, while a micro-batch runs
  bool overwrite_grads_ = false;                 // this backward's ParameterProvider::overwrite_grads()

  // LoRA: adapter parameters and gradients (owned by the caller), each adapter's u = scale * A x
  // kept for backward ([max_tokens, r] per adapter), and the backward's du scratch.
  const LoraLayout* lora_ = nullptr;
  ContextAttention* context_ = nullptr;
  int64_t lora_activation_bytes_ = 0;
  Tensor lora_params_, lora_grads_;
  Buffer lora_u_storage_, lora_du_;
  // LoRA dropout: the current step's micro-batch key, and dropout(x) (forward, then again in backward:
  // masks are redrawn, never stored) or the masked input gradient, for one adapter at a time.
  bool lora_dropout_active_ = false;
  uint64_t lora_dropout_key_ = 0;
  Buffer lora_dropped_;
};

}  // namespace glm
