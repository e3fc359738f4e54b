// AdamW over a contiguous range of the flat parameter layout (a unit, or this rank's ZeRO shard of
// it; or the LoRA adapters): fp32 master weights and moments, no weight decay on norms and biases.
#pragma once

#include <vector>

#include "model/backend.h"
#include "model/param_layout.h"
#include "train/optimizer_offload.h"

namespace glm {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  // With bf16 parameters and fp32 optimizer state (CUDA), keep the fp32 master split into the bf16
  // parameters (its high halves) and a 16-bit buffer of low halves (kernels/master_split.h): exact,
  // 2 bytes a parameter less memory and update traffic. false: a whole fp32 copy (--split_master_weights).
  bool split_master = true;
};

class AdamWOptimizer {
 public:
  // params/grads cover layout range [offset, offset + params.numel). With offload the fp32 master
  // and moments are host memory that offload's threads update (train/optimizer_offload.h); the
  // master then starts as the parameters' values. params_on_host (with offload only): params are
  // host memory too (--offload_param cpu), which the host update writes in place; grads_on_host:
  // the gradients given to step() are host memory (ZeroOptions::offload_grads), read in place.
  static Result<AdamWOptimizer> create(Backend& backend, const ParamLayout& layout, Tensor params, int64_t offset,
                                       const AdamWOptions& options, OptimizerOffload* offload = nullptr,
                                       bool params_on_host = false, bool grads_on_host = false);
  // Every element decayed alike (LoRA adapters: PEFT decays both A and B).
  static Result<AdamWOptimizer> create_uniform(Backend& backend, Tensor params, const AdamWOptions& options,
                                               bool decay);
  // One update with learning rate lr; gradients are multiplied by grad_scale first (clipping).
  // grad_sq_sum (one f64 element, may be empty) gets the sum of squares of grads added.
  Status step(Tensor grads, double lr, double grad_scale, Tensor grad_sq_sum = {});
  // One update in parts: step_part(..., begin, end, true) starts the step with the elements
  // [begin, end) of the range, later calls with first = false update further elements of the same
  // step; together the parts must cover the range once (the caller's to keep). Not with deferred rows.
  Status step_part(Tensor grads, double lr, double grad_scale, Tensor grad_sq_sum, int64_t begin, int64_t end,
                   bool first);
  int64_t steps_taken() const { return step_; }
  // Optimizer state over the range (checkpoints): the master weights and both moments. master() is
  // f32 (or the parameters themselves where they are f32), or i16 where split: the low halves, the
  // high halves being params(); OptimizerStateTransfer (train/engine.h) moves f32 values either way.
  Tensor master() const { return master_; }
  Tensor params() const { return params_; }
  bool split() const { return master_.dtype == DType::i16; }
  // master() and the moments are host memory (read and write them with memcpy, not the backend).
  bool offloaded() const { return offload_ != nullptr; }
  Tensor exp_avg() const { return exp_avg_.tensor(); }
  Tensor exp_avg_sq() const { return exp_avg_sq_.tensor(); }
  // After master() and the moments were written from outside (checkpoint load): the working copy
  // follows a whole master (a split one was written through both halves) and bias correction
  // continues from `steps`.
  Status restored(int64_t steps);
  // After the parameters were written from outside (import): the master becomes them exactly (a
  // copy, or a split master's low halves zeroed).
  Status reset_master();
  int64_t state_bytes() const;  // backend memory
  int64_t host_state_bytes() const;

  // The delayed update (offloaded only, OffloadConfig::delayed_update), in three parts:
  // start_delayed() copies the gradient to the host and counts the step; run_delayed() (on any
  // one thread, while the caller's thread goes on with the backend) updates the host state and
  // writes the new working copy to a host buffer; land_delayed() writes it to params() (after
  // run_delayed() returned). Until then params() keep their values and the state is the host's.
  Status prepare_delayed();  // the two host buffers, once
  Status start_delayed(Tensor grads, double lr, double grad_scale);
  Status run_delayed();
  Status land_delayed();
  bool delayed_pending() const { return delayed_.started; }
  // Deferred rows: the range's first table_rows x width elements are a table (the embedding at ZeRO
  // stage 0, alone in its unit: one decay range) whose rows without a token in a step have a zero
  // gradient there. step() then updates only
  // the rows set_step_rows() named for it; the others fall behind by at most `history` steps
  // (<= AdamWRows::kMaxHistory; step() then settles every row) and get their missed steps, in
  // order, from catch_up() before a forward reads them or from settle() before anything reads the
  // whole state: the same bits as updating every row every step. The rest of the range (alignment
  // padding, zero) is not updated: zero stays zero there.
  Status defer_rows(int64_t table_rows, int64_t width, int history);
  bool deferred() const { return table_rows_ > 0; }
  // Every row has had every step (nothing deferred is pending).
  bool settled() const { return !deferred() || floor_ == step_; }
  // rows (i32, count distinct indices below table_rows) are the rows the next step()'s gradient may
  // be nonzero in; the tensor must stay valid until that step.
  void set_step_rows(Tensor rows, int64_t count) {
    step_rows_ = rows;
    step_rows_count_ = count;
  }
  // The named rows brought to steps_taken().
  Status catch_up(Tensor rows, int64_t count);
  // Every row brought to steps_taken().
  Status settle();

 private:
  struct Range {
    int64_t begin, end;  // relative to the optimizer's range
    bool decay;
  };
  AdamWOptimizer(Backend& backend, Tensor params, AdamWOptions options)
      : backend_(&backend), params_(params), options_(options) {}
  // The master (an fp32 copy, the low halves of a split one, or the params themselves) and zeroed
  // moments; no decay ranges yet.
  static Result<AdamWOptimizer> with_state(Backend& backend, Tensor params, const AdamWOptions& options,
                                           OptimizerOffload* offload, bool params_on_host, bool grads_on_host);
  // step_part's update on the host (offloaded): the gradient comes over a chunk at a time and the
  // chunk's working copy goes back.
  Status host_step_part(Tensor grads, double lr, double grad_scale, Tensor grad_sq_sum, int64_t begin, int64_t end);
  // The host update of elements [at, at + k): their gradient and new working copy are host tensors
  // of k elements (a staging slot, the parameters themselves, the delayed update's buffers); returns
  // the gradient's sum of squares where sum_squares.
  double host_update(Tensor grads, Tensor params, int64_t at, int64_t k, double lr, double grad_scale,
                     bool sum_squares);
  void parallel_copy(void* dst, const void* src, size_t bytes);  // host memory

  Backend* backend_;
  Tensor params_;
  AdamWOptions options_;
  Buffer master_buffer_;  // empty when the compute dtype is the optimizer dtype (params are the master)
  Tensor master_;
  Buffer exp_avg_, exp_avg_sq_;
  std::vector<Range> ranges_;
  int64_t step_ = 0;
  int64_t own_state_bytes() const;  // the moments and the master buffer, wherever they live
  OptimizerOffload* offload_ = nullptr;
  bool params_on_host_ = false;  // params_ in host memory (with offload_)
  bool grads_on_host_ = false;   // step()'s gradients in host memory (with offload_)
  struct Delayed {
    Buffer grads, params;  // host, the compute dtype: the step's gradient, the new working copy
    double lr = 0, grad_scale = 1;
    bool started = false, ran = false;
  };
  Delayed delayed_;
  cpu::Bf16Rounding bf16_ = cpu::Bf16Rounding::nearest_even;  // the working copy's, when offloaded
  // Deferred rows (defer_rows): the table's shape, each row's last step where above floor_, the
  // steps floor_ + 1 .. step_ (history_), the bound on their number, and the next step's rows.
  Status apply_rows(Tensor rows, int64_t count, bool gradient, Tensor grads, Tensor grad_sq_sum);
  AdamWStep step_scalars(int64_t step, double lr, double grad_scale, bool decay) const;
  int64_t table_rows_ = 0, width_ = 0, floor_ = 0, step_rows_count_ = -1;
  int max_history_ = 0;
  Buffer row_step_;
  std::vector<AdamWStep> history_;
  Tensor step_rows_;
};

}  // namespace glm
