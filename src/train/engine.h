// The training engine: model, flat parameters and gradients, optimizer and the data-parallel
// gradient reduction. One call to step() is one optimizer step over a window of micro-batches.
#pragma once

#include <cmath>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "data/context_split.h"
#include "data/sharded_loader.h"
#include "model/context_attention.h"
#include "model/glm4_model.h"
#include "model/kv_cache.h"
#include "model/lora.h"
#include "mpi/communicator.h"
#include "train/adamw.h"
#include "train/bad_steps.h"
#include "zero/zero_engine.h"

namespace glm {

struct StepResult {
  double loss = 0;                   // global mean target-token loss of the window
  double grad_norm = 0;              // global, before clipping
  int64_t tokens = 0;                // global tokens of the window
  int64_t targets = 0;               // global target tokens of the window
  double step_seconds = 0;           // this rank's wall time of the step
  double exposed_comm_seconds = 0;   // of which waiting on collectives (not hidden behind compute)
  bool updated_in_backward = false;  // the optimizer ran beside backward (see TrainingEngine::step)
  // Why the step's update was skipped (StepFilter): nothing of it was applied, the optimizer's
  // state and step count are as before it. Empty: updated.
  std::string skipped;
};

// Asked once the step's global loss and gradient norm are known and before anything is updated
// (see TrainingEngine::step): a reason to skip the update, or empty to apply it. It must answer
// alike on every rank for the same values (the engine then agrees on the answer over the ranks).
using StepFilter = std::function<std::string(double loss, double grad_norm)>;



struct EvalResult {
  double loss_sum = 0;  // global sum of target-token losses
  int64_t targets = 0;  // global target-token count
  int64_t correct = 0;  // global count of target tokens whose logits' argmax is the target
  double mean_loss() const { return targets > 0 ? loss_sum / static_cast<double>(targets) : 0.0; }
  double perplexity() const { return std::exp(mean_loss()); }
  double token_accuracy() const {
    return targets > 0 ? static_cast<double>(correct) / static_cast<double>(targets) : 0.0;
  }
};

// LoRA's device bytes on one rank (zeros without LoRA): the adapters and their gradients in the
// compute dtype, the gradients' copy an all-reduce in another dtype needs, and the adapters' parts
// of optimizer_bytes() and activation_bytes().
struct LoraMemory {
  int64_t parameter_bytes = 0, gradient_bytes = 0, buffer_bytes = 0, optimizer_bytes = 0, activation_bytes = 0;
};

// What an engine is created with: the model, the largest micro-batch, the optimizer (nullopt: no
// optimizer state, evaluation only), ZeRO, recomputation, LoRA, and where the optimizer runs.
// Every member has an initializer, so designated initializers name only what they change (GCC's
// -Wmissing-field-initializers flags a member left out that has none).
struct EngineConfig {
  ModelConfig model{};
  int64_t max_tokens = 0;
  std::optional<AdamWOptions> adam{};
  double max_grad_norm = 1.0;
  int zero_stage = 0;
  Recompute recompute = Recompute::none;
  bool offload_activations = false;  // --offload_activations (model/residual_stash.h)
  ZeroOptions zero{};
  std::optional<LoraConfig> lora{};
  bool optimizer_in_backward = true;                  // --optimizer_in_backward
  int defer_embedding_rows = AdamWRows::kMaxHistory;  // --defer_embedding_rows: 0 updates every row every step
  // --context_parallel_size: groups of this many consecutive ranks share each micro-batch's row
  // (data/context_split.h); micro-batches given to step() and evaluate() are whole rows, the same on
  // every rank of a group. max_tokens is a whole row's.
  int context_parallel_size = 1;
  // --offload_optimizer cpu (ZeRO stages 1-3): the base model's optimizer state on the host
  // (train/optimizer_offload.h). LoRA's adapters keep theirs on the device.
  OffloadConfig offload{};
  // The gradient norm before the update even without clipping (a pass of its own over the
  // gradients; no update inside backward): what a StepFilter that looks at the norm needs.
  bool norm_before_update = false;
  GradientFault gradient_fault{};
  // Evaluation and generation: no gradients (the base frozen as under LoRA), no backward scratch,
  // one layer's activations at a time (Glm4Model::create); needs adam == nullopt.
  bool forward_only = false;
};

class TrainingEngine {
 public:
  // adam == nullopt: no optimizer state (evaluation only; step() is then an error).
  // lora: the base model is frozen (no gradients, optimizer state or gradient collectives; ZeRO-3
  // still partitions it) and LoRA adapters on its linears are trained: replicated on every rank,
  // their gradients all-reduced in --grad_reduce_dtype, fp32 master weights and Adam moments.
  static Result<std::unique_ptr<TrainingEngine>> create(const EngineConfig& config, Backend& backend,
                                                        Communicator& comm, Communicator* data_comm = nullptr);

  const ParamLayout& layout() const { return model_->layout(); }
  const ModelConfig& config() const { return model_->config(); }
  int64_t max_tokens() const { return model_->max_tokens(); }  // of a micro-batch (a rank's share of its row)
  int zero_stage() const { return zero_->stage(); }
  // The full gradient of the last step (stage 0 only: other stages keep shards).
  Tensor gradients() const { return zero_->stage() == 0 ? zero_->owned_grads_all() : Tensor{}; }
  // Sum of squares of all parameters, equal on every rank at every stage.
  Result<double> parameter_checksum();
  ZeroMemory memory() const { return zero_->memory(); }  // the base model's (frozen under LoRA: no gradients)
  LoraMemory lora_memory() const;
  int64_t optimizer_bytes() const;       // backend memory
  int64_t host_optimizer_bytes() const;  // the offloaded optimizer's host memory, staging included
  // Activations and backward scratch of the model (what the recompute policy changes).
  int64_t activation_bytes() const { return model_->activation_bytes(); }
  int64_t host_activation_bytes() const { return model_->host_activation_bytes(); }
  Backend& backend() { return backend_; }

  Status initialize_parameters(uint64_t seed);

  // LoRA (nullptr / empty without it). Adapters are laid out as lora_layout(); host copies in f32.
  const LoraLayout* lora_layout() const { return lora_layout_.get(); }
  // PEFT's initialisation (A kaiming-uniform, B zero) from seed, which also keys the LoRA dropout
  // masks of every later step (with the optimizer step, micro-batch and rank: lora_dropout_key()).
  Status initialize_lora(uint64_t seed);
  Status set_lora_adapters(std::span<const float> values);
  Result<std::vector<float>> lora_adapters();
  // The base parameters this rank stores, the whole flat layout in f32 (ZeRO stages 0-2 only).
  Result<std::vector<float>> parameters();
  // The adapters' gradient of the last step, all-reduced (before clipping), in f32.
  Result<std::vector<float>> lora_gradients();

  // What this rank's optimizer holds of `unit` of layout() (checkpoints): fp32 master weights and
  // moments of the unit's elements [unit_begin, unit_begin + master.numel) counted from the unit's
  // start. With ZeRO-3 persistent tensors these are not the checkpoint's units (checkpoint.cpp
  // maps them through each tensor's home_unit and home_offset).
  // A split master (master i16, kernels/master_split.h) has its high halves in params; read and
  // write its f32 values through OptimizerStateTransfer.
  struct OptimizerShard {
    Tensor master, exp_avg, exp_avg_sq;
    int64_t unit_begin = 0;
    Tensor params;  // the optimizer's bf16 parameters where master is split, else empty
    bool host = false;  // master and moments are host memory (offloaded)
  };
  OptimizerShard optimizer_shard(int unit) const;
  // LoRA: the adapters' optimizer state, replicated (all of lora_layout()'s elements, unit_begin 0).
  OptimizerShard lora_optimizer_state() const;
  // At ZeRO stage 0 (no LoRA) the embedding rows that no token of a step's batches on any rank reads
  // have a zero gradient, and their update is deferred (AdamWOptimizer::defer_rows: the same bits,
  // at most EngineConfig::defer_embedding_rows steps late; 0 turns it off). Before
  // reading optimizer_shard() or the parameters' memory directly (checkpoints), settle the
  // deferred updates; parameters(), base_checksum(), evaluate() and logits() do it themselves.
  Status settle_optimizer();
  bool optimizer_settled() const;
  bool defers_embedding_rows() const { return deferred_unit_ >= 0; }
  // Sum of squares of the base parameters, frozen under LoRA (collective at ZeRO stages > 0): a cheap
  // fingerprint of the base that LoRA checkpoints record.
  Result<double> base_checksum();
  int64_t optimizer_steps() const { return steps_taken(); }
  // After every optimizer_shard() was written (checkpoint load): parameters follow the masters
  // (gathered again where ZeRO keeps full copies) and the step count continues from `steps`.
  Status optimizer_restored(int64_t steps);
  // Writes one layout entry from f32 host values (weight import); call parameters_updated() after.
  Status set_parameter(int entry, std::span<const float> values);
  // Call after writing parameters() directly (weight import) so that the fp32 masters become them.
  Status parameters_updated();

  // comm (host scalars) and data_comm (parameter and gradient buffers; NCCL on GPUs, else comm)
  // must outlive the engine.
  // Forward/backward over this rank's micro-batches, global loss normalisation, gradient
  // all-reduce, clipping to max_grad_norm, AdamW with learning rate lr. With max_grad_norm <= 0
  // the reported gradient norm is summed by the update itself (no pass of its own over the
  // gradients), so a non-finite one is found after the update: the step fails and nothing of it
  // is saved, as with clipping, but the parameters in memory are not usable any more.
  //
  // Without clipping, on one rank at ZeRO stage 0 (no LoRA), each unit is updated as soon as the
  // last micro-batch's backward finished its gradient, on the backend's side queue beside the rest
  // of backward; the loss is then checked after the update too. set_optimizer_in_backward(false)
  // (--optimizer_in_backward false, EngineConfig::optimizer_in_backward) updates after backward instead: the same
  // arithmetic per element (bit for bit on the CPU; on CUDA the GEMMs beside it are planned for fewer SMs, and the
  // norm's atomic sums and attention's run in another order).
  //
  // filter (optional) sees the loss and norm before the update where they are known then: with
  // clipping, with EngineConfig::norm_before_update, or with the delayed offloaded update. A reason
  // it returns (on any rank) skips the update on every rank. Where the norm comes with the update,
  // a non-finite loss or norm still fails the step as above.
  Result<StepResult> step(std::span<const HostMicroBatch> micro_batches, double lr, const StepFilter& filter = {});
  void set_optimizer_in_backward(bool on) { optimizer_in_backward_ = on; }
  // Loss of this rank's batch summed over all ranks (every rank must call it).
  Result<EvalResult> evaluate(const HostMicroBatch& batch);
  // Ranks sharing each row (EngineConfig::context_parallel_size); the data-parallel rank and world
  // are comm's divided by it.
  int context_parallel_size() const { return split_.size; }
  // Logits [n, vocab] of one batch (this rank only), converted to f32 on the host; with
  // last_row_only the last token's row alone (what generation samples from).
  Status logits(const HostMicroBatch& batch, std::vector<float>& out, bool last_row_only = false);
  // Generation with a KV cache (model/kv_cache.h, train/cached_generator.h): a cache of `capacity`
  // tokens for forwards of up to max_new new tokens (at most the engine's max_tokens).
  Result<std::unique_ptr<KvCache>> create_kv_cache(int64_t capacity, int64_t max_new);
  // The batch's new tokens through `cache` (this rank only): the logits of batch.logit_rows,
  // [rows, vocab] in f32 on the host.
  Status cached_logits(const HostDecodeBatch& batch, KvCache& cache, std::vector<float>& out);
  // The same forward, then greedy decoding on the device: each logit row's argmax (the first on
  // ties, as on the host), so only the ids come back.
  Status cached_argmax(const HostDecodeBatch& batch, KvCache& cache, std::vector<int32_t>& ids);
  // The same forward, then beam search's part on the device (Backend::top_k_rows): each logit row's
  // maximum and log of its sum of exponentials (stats, 2 a row) and its k largest logits (top) and
  // their ids, so that k values a row come back instead of the vocabulary.
  Status cached_top_k(const HostDecodeBatch& batch, KvCache& cache, int64_t k, std::vector<float>& stats,
                      std::vector<float>& top, std::vector<int32_t>& ids);

 private:
  TrainingEngine(Backend& backend, Communicator& comm) : backend_(backend), comm_(comm) {}
  Status create_optimizers(const EngineConfig& ec);
  Result<MicroBatch> upload(const HostMicroBatch& batch);
  // The distinct tokens of the batches of every rank (the embedding rows the step's gradient can
  // reach), in increasing order, into step_rows_; their count. Collective above one rank.
  Result<int64_t> upload_token_rows(std::span<const HostMicroBatch> batches);
  Result<double> local_loss_sum(int64_t n);
  // The pieces of step().
  Status count_window(std::span<const HostMicroBatch> micro, StepResult& r);
  void begin_update(double lr);
  Status zero_step_gradients(std::span<const HostMicroBatch> micro, bool table_rows_only);
  Result<double> run_micro_batches(std::span<const HostMicroBatch> micro, ZeroStep& zero_step, double grad_scale);
  Status check_and_clip(ZeroStep& zero_step, StepResult& r, int64_t this_step, const StepFilter& filter);
  Status apply_update(ZeroStep& zero_step);
  Status skip_update(ZeroStep& zero_step);
  Status inject_gradient_fault(int64_t this_step);  // EngineConfig::gradient_fault
  Status fused_grad_norm(ZeroStep& zero_step, StepResult& r, int64_t this_step);
  Status update_unit(int unit, int64_t from);

  Backend& backend_;
  Communicator& comm_;
  std::unique_ptr<Glm4Model> model_;
  std::unique_ptr<ZeroEngine> zero_;
  Buffer batch_ints_;             // a micro-batch's i32 arrays and index (upload())
  std::vector<int32_t> staging_;  // their host copy
  Buffer correct_, logits_;
  Buffer decode_ints_;    // a decode batch's i32 arrays (cached_logits())
  Buffer decode_logits_;  // their f32 logits, kept between steps
  Buffer decode_top_, decode_top_ids_;  // cached_top_k()'s statistics and values (f32), ids (i32)
  // The cached forward of cached_logits() and cached_argmax(): the logits, [logit rows, vocab] f32.
  Result<Tensor> cached_forward(const HostDecodeBatch& batch, KvCache& cache);
  Status download_f32(Tensor values, std::vector<float>& out);
  Buffer grad_sq_sum_;  // one f64: the gradient norm summed inside AdamW when nothing is clipped
  // One step's update, shared by the hook that updates units in backward and the update after it.
  struct StepUpdate {
    double lr = 0, clip = 1.0;
    bool clipping = false;
    bool norm_pass = false;          // the norm from a pass of its own (clipping, or a delayed update)
    bool delayed = false;            // this step's update is delayed (OffloadConfig::delayed_update)
    bool in_backward = false;        // units are updated as backward finishes them (see step())
    Tensor fused_sq;                 // without a norm pass: the gradient norm the update sums
    std::vector<char> updated;       // per unit: updated in backward
    std::vector<int64_t> tail_from;  // per unit: where its update began early (a layer's MLP half); -1: not yet
  };
  StepUpdate update_;
  bool optimizer_in_backward_ = true;       // EngineConfig::optimizer_in_backward
  std::unique_ptr<OptimizerOffload> offload_;  // before the optimizers, which use it
  std::vector<AdamWOptimizer> optimizers_;     // one per unit, over what this rank owns (none under LoRA)
  // OffloadConfig::delayed_update: the host update of the last step, running on its own thread
  // (run_delayed of every unit) until finish_delayed() waits for it.
  std::future<Status> delayed_job_;
  bool delayed_update() const { return offload_ && offload_->delayed_update(); }
  bool delays_step(int64_t step) const { return offload_ && offload_->delays_step(step); }
  Status finish_delayed();
  Status apply_delayed_update(ZeroStep& zero_step);
  Communicator* data_comm_ = nullptr;
  // Context parallelism: this rank's place in its group, the group, and its cross-rank attention.
  ContextSplit split_;
  std::unique_ptr<Communicator> context_comm_;
  std::unique_ptr<ContextAttention> context_;
  Buffer kv_rows_;  // i32: a share's MicroBatch::kv_rows
  DType grad_reduce_dtype_ = DType::f32;
  std::unique_ptr<LoraLayout> lora_layout_;
  Buffer lora_params_, lora_grads_, lora_reduce_;  // lora_reduce_: grads in the reduce dtype, if it differs
  std::vector<AdamWOptimizer> lora_optimizer_;     // one over all adapters, when training LoRA
  uint64_t lora_seed_ = 0;                         // initialize_lora's: keys the dropout masks
  Result<std::vector<float>> download_f32(Tensor t);
  Status reduce_lora_gradients();
  int64_t steps_taken() const;
  bool has_optimizer_ = false;
  double max_grad_norm_ = 0;
  bool norm_before_update_ = false;
  GradientFault gradient_fault_{};
  int gradient_faults_left_ = 0;
  int deferred_unit_ = -1;  // the unit whose optimizer defers rows (the embedding's), or -1
  Buffer step_rows_;        // i32: a step's distinct tokens (upload_token_rows)
  // Rows of the table's gradient that may be nonzero, the first ones of step_rows_ (the last step's
  // tokens); -1: unknown (before the first step, or a step failed before it knew its rows).
  int64_t dirty_table_rows_ = -1;
  std::vector<int32_t> rows_host_;
  std::vector<int32_t> step_tokens_;  // one rank: the step's tokens, sorted for rows_host_
  std::vector<uint8_t> row_seen_;     // several ranks: a byte per word, max-reduced
};

// Moves f32 values of an optimizer shard between host arrays and where the shard lives: the
// backend (a split master as its two halves, kernels/master_split.h, joined and split on the host
// in chunks of at most kChunkElements, no device memory of its own) or, offloaded, host memory.
class OptimizerStateTransfer {
 public:
  explicit OptimizerStateTransfer(Backend& backend) : backend_(backend) {}
  // Elements [offset, offset + dst.size()) of state d: 0 the master, 1 exp_avg, 2 exp_avg_sq.
  Status download(const TrainingEngine::OptimizerShard& s, int d, int64_t offset, std::span<float> dst);
  Status upload(const TrainingEngine::OptimizerShard& s, int d, int64_t offset, std::span<const float> src);
  // Both moments zeroed (Adam starting over).
  Status zero_moments(const TrainingEngine::OptimizerShard& s);
  Backend& backend() { return backend_; }
  static constexpr int64_t kChunkElements = int64_t{16} << 20;

 private:
  Backend& backend_;
  std::vector<uint16_t> hi_;
  std::vector<int16_t> lo_;
};

}  // namespace glm
