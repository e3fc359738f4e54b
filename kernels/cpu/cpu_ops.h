// fp32/fp64 reference of every GLM-4 op: the CPU backend and the oracle for the CUDA kernels.
// Layouts: activations are [N tokens, features] row-major; weights are [out, in] (PyTorch Linear).
// Unless a comment says "accumulates", outputs are overwritten. All sizes and indices are 64-bit.
#pragma once

#include <cstdint>

namespace glm::cpu {

// out[t] = table[tokens[t]]
template <typename T>
void embedding_forward(T* out, const T* table, const int32_t* tokens, int64_t n, int64_t hidden);
// dtable[tokens[t]] += dout[t] (accumulates)
template <typename T>
void embedding_backward(T* dtable, const T* dout, const int32_t* tokens, int64_t n, int64_t hidden);

// out = w * x / sqrt(mean(x^2) + eps); rstd[t] saved for backward.
template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* in, const T* weight, int64_t n, int64_t hidden, double eps);
// din += dx (accumulates, so the residual gradient flows in), dweight += (accumulates).
template <typename T>
void rmsnorm_backward(T* din, T* dweight, const T* dout, const T* in, const T* weight, const T* rstd, int64_t n,
                      int64_t hidden);

// out[n, o] = in[n, :] . weight[o, :] + bias[o]; bias may be null.
template <typename T>
void linear_forward(T* out, const T* in, const T* weight, const T* bias, int64_t n, int64_t in_features,
                    int64_t out_features);
// din = dout weight (accumulates into din when accumulate_din, din may be null); dweight += dout^T in;
// dbias += column sums of dout (dbias may be null).
template <typename T>
void linear_backward(T* din, T* dweight, T* dbias, const T* dout, const T* in, const T* weight, int64_t n,
                     int64_t in_features, int64_t out_features, bool accumulate_din);

// Shapes of the fused qkv activation: [n, (heads + 2 * kv_heads) * head_dim], blocks q | k | v, head-major.
struct AttentionShape {
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t qkv_width() const { return (heads + 2 * kv_heads) * head_dim; }
};

// Partial interleaved RoPE on q and k, in place: pairs (2i, 2i+1), i < rotary_dim / 2,
// angle = positions[t] * base^(-2i / rotary_dim). Dims >= rotary_dim pass through; v untouched.
template <typename T>
void rope_forward(T* qkv, const int32_t* positions, int64_t n, AttentionShape shape, int64_t rotary_dim, double base);
// Gradient of rope_forward: rotation by the negative angle, in place.
template <typename T>
void rope_backward(T* dqkv, const int32_t* positions, int64_t n, AttentionShape shape, int64_t rotary_dim, double base);

// Causal grouped-query attention over packed documents: token t attends to s in [doc_start[t], t].
// out [n, heads * head_dim]; lse [n, heads] = log-sum-exp of the scaled scores (for backward).
template <typename T>
void attention_forward(T* out, T* lse, const T* qkv, const int32_t* doc_start, int64_t n, AttentionShape shape);
// dqkv overwritten (q, k and v blocks).
template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* out, const T* lse, const T* qkv, const int32_t* doc_start,
                        int64_t n, AttentionShape shape);

// Context parallelism: the n queries a rank holds against the keys and values of the whole row,
// gathered from every rank of its group. qkv [n, qkv_width]: the rank's fused rows (q blocks read);
// kv [rows, 2 * kv_heads * head_dim]: k | v of every token of the row in gathered order, kv_row[s]
// the kv row of the row's token s. Query i sits at position[i] of the row and attends to positions
// [doc_start[i], position[i]]. out and lse as attention_forward's, for the n queries.
template <typename T>
void attention_forward_gathered(T* out, T* lse, const T* qkv, const T* kv, const int32_t* kv_row,
                                const int32_t* position, const int32_t* doc_start, int64_t n, AttentionShape shape);
// dqkv [n, qkv_width]: dq in the q blocks, k and v blocks zeroed (overwritten); dkv accumulates the
// gradient of every kv row these queries read (summed over the group, it is the row's dk | dv).
template <typename T>
void attention_backward_gathered(T* dqkv, T* dkv, const T* dout, const T* out, const T* lse, const T* qkv,
                                 const T* kv, const int32_t* kv_row, const int32_t* position,
                                 const int32_t* doc_start, int64_t n, AttentionShape shape);

// gate_up [n, 2F]: first F columns gate, last F up. out [n, F] = silu(gate) * up.
template <typename T>
void swiglu_forward(T* out, const T* gate_up, int64_t n, int64_t ffn);
template <typename T>
void swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, int64_t n, int64_t ffn);

// losses[t] = logsumexp(logits[t]) - logits[t, targets[t]], or 0 where targets[t] < 0.
// If dlogits is non-null: dlogits = (softmax - onehot) * grad_scale on targeted rows, 0 elsewhere.
// If correct is non-null: correct[t] = 1 where the first index of the row's maximum is the target
// (torch.argmax), else 0 (also on untargeted rows): token accuracy.
// Returns the number of targeted rows.
template <typename T>
int64_t cross_entropy(T* losses, T* dlogits, const T* logits, const int32_t* targets, int64_t n, int64_t vocab,
                      double grad_scale, int32_t* correct = nullptr);

// One row's softmax statistics: its maximum and the log of the sum of exp(x - maximum), summed in
// double (-inf entries add nothing), so that its log-softmax is (x - max) - log_sum.
struct SoftmaxStatistics {
  float max, log_sum;
};
SoftmaxStatistics softmax_statistics(const float* row, int64_t n);

// out = a + b (elementwise); out may alias a or b.
template <typename T>
void add(T* out, const T* a, const T* b, int64_t count);

// Dropout (PEFT's nn.Dropout on a LoRA adapter's input): element i is kept when
// counter_keep(key, offset + i, dropout_threshold(p)) (base/counter_rng.h) and scaled by
// 1 / (1 - p), else 0. out = that, or out += that when accumulate (the backward: the same mask on the
// gradient). out may alias in.
template <typename T>
void dropout(T* out, const T* in, int64_t count, double p, uint64_t key, int64_t offset, bool accumulate);

// Sum of squares accumulated in double.
template <typename T>
double sum_squares(const T* x, int64_t count);

struct AdamWStep {
  double lr = 0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  double grad_scale = 1;  // multiplies the gradient first (clipping)
  int64_t step = 1;       // 1-based, for bias correction
};
// Decoupled AdamW (Loshchilov & Hutter), bias-corrected as in torch.optim.AdamW.
template <typename T>
void adamw(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, int64_t count, const AdamWStep& step);

// Deferred AdamW over rows of a table of `width`-element rows (the backend's adamw_rows): each
// listed row r (rows[i] for i < count; every row r < count when rows is null) gets the steps
// max(row_step[r], floor) + 1 .. until, history[k - floor - 1] being step k, each with a zero
// gradient except the last (step until) when `gradient`, which reads grad's row. The same
// arithmetic per element as adamw() over the whole table step by step, whose untouched rows have
// zero gradients: the same bits. row_step is read only. Returns the sum of squares (in double) of
// the gradient values used.
template <typename T>
double adamw_rows(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, const int32_t* rows, int64_t count,
                  int64_t width, const int32_t* row_step, int64_t floor, const AdamWStep* history, int64_t until,
                  bool gradient);

}  // namespace glm::cpu
