// The op interface the model and trainer are written against, implemented by the CPU backend
// (fp32/fp64 reference ops, host memory) and the CUDA backend (bf16, device memory).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/host_adamw.h"
#include "model/backend_config.h"
#include "model/gpu_peak.h"
#include "base/tensor.h"
#include "base/status.h"

namespace glm {

// Owns one allocation of backend memory (RAII); move-only.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Tensor tensor, std::function<void(void*)> release) : tensor_(tensor), release_(std::move(release)) {}
  ~Buffer() { reset(); }
  Buffer(Buffer&& other) noexcept : tensor_(other.tensor_), release_(std::move(other.release_)) { other.tensor_ = {}; }
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      reset();
      tensor_ = other.tensor_;
      release_ = std::move(other.release_);
      other.tensor_ = {};
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  const Tensor& tensor() const { return tensor_; }
  Tensor slice(int64_t offset, int64_t count) const { return tensor_.slice(offset, count); }
  int64_t numel() const { return tensor_.numel; }

 private:
  void reset() {
    if (tensor_.data != nullptr && release_) release_(tensor_.data);
    tensor_ = {};
  }
  Tensor tensor_;
  std::function<void(void*)> release_;
};

using AttentionShape = cpu::AttentionShape;

// Generation's RoPE and KV-cache store of a forward's new tokens (Backend::rope_store).
struct RopeStore {
  Tensor positions;  // i32 [n]: each token's RoPE position
  AttentionShape shape;
  int64_t rotary_dim = 0;
  double base = 0.0;
  Tensor cache;       // the layer's rows of 2 kv_heads head_dim elements
  Tensor cache_rows;  // i32 [n]: each token's row
  Tensor staging;     // [n, that width], compute dtype: scratch where Backend::rope_store_stages()
};
using AdamWStep = cpu::AdamWStep;

// Rows of the fused lm_head + cross-entropy per chunk on a device backend: the chunk's bf16 logits
// (rows x vocab, 2 bytes each; the gradient overwrites them in place) live at once, within
// budget_bytes (BackendConfig::lm_head_scratch_bytes). A trained lm_head accumulates its weight
// gradient once per chunk (a full read and write of the vocab x hidden gradient, and a K = rows
// GEMM), so chunks should not be small. The planner counts the same chunk.
inline int64_t lm_head_chunk_rows(int64_t n, int64_t vocab, int64_t budget_bytes) {
  const int64_t budget = std::max<int64_t>(budget_bytes, 1);
  const int64_t rows = std::clamp<int64_t>(budget / (std::max<int64_t>(vocab, 1) * 2), 1, std::max<int64_t>(n, 1));
  // Equal chunks: 4096 rows under a 3,900-row budget split 2048 + 2048, not 3900 + 196.
  const int64_t chunks = (n + rows - 1) / rows;
  return chunks > 0 ? (n + chunks - 1) / chunks : rows;
}

inline Status check_argmax_rows(Tensor ids, Tensor values, int64_t rows, int64_t cols) {
  if (ids.dtype != DType::i32 || values.dtype != DType::f32 || rows < 0 || cols < 1 || ids.numel < rows ||
      values.numel < rows * cols)
    return GLM_INTERNAL_ERROR("argmax_rows: ", ids.numel, " ids and ", values.numel, " values for ", rows, " rows of ",
                              cols);
  return Status::ok();
}

inline Status check_top_k_rows(Tensor ids, Tensor top, Tensor stats, Tensor values, int64_t rows, int64_t cols,
                               int64_t k) {
  if (ids.dtype != DType::i32 || top.dtype != DType::f32 || stats.dtype != DType::f32 || values.dtype != DType::f32 ||
      rows < 0 || cols < 1 || k < 1 || k > 4096 || ids.numel < rows * k || top.numel < rows * k ||
      stats.numel < 2 * rows || values.numel < rows * cols)
    return GLM_INTERNAL_ERROR("top_k_rows: ", k, " of ", rows, " rows of ", cols, " values into ", ids.numel, " ids, ",
                              top.numel, " values and ", stats.numel, " statistics");
  return Status::ok();
}

// Shapes of a gather_rows (gather) or scatter_rows: dst and src of one dtype, count i32 rows, and
// the compact side (dst of a gather, src of a scatter) of count x width elements.
inline Status check_rows_op(const char* op, Tensor dst, Tensor src, Tensor rows, int64_t count, int64_t width,
                            bool gather) {
  if (dst.dtype != src.dtype) return GLM_INTERNAL_ERROR(op, ": ", dtype_name(src.dtype), " into ", dtype_name(dst.dtype));
  if (rows.dtype != DType::i32 || rows.numel < count || count < 0 || width <= 0)
    return GLM_INTERNAL_ERROR(op, ": ", count, " rows of width ", width, " from ", rows.numel, " indices");
  const Tensor compact = gather ? dst : src, wide = gather ? src : dst;
  if (compact.numel != count * width || wide.numel % width != 0)
    return GLM_INTERNAL_ERROR(op, ": ", compact.numel, " and ", wide.numel, " elements for ", count, " rows of ",
                              width);
  return Status::ok();
}

// A deferred AdamW over the rows of a table (Backend::adamw_rows): the embedding, whose rows without
// a token in a step have a zero gradient there, so their update is a fixed function of their state
// and the step's scalars, applied later, in order, when something reads them.
struct AdamWRows {
  static constexpr int kMaxHistory = 64;  // steps a row may fall behind
  Tensor rows;        // i32: count distinct row indices; empty: every row r < count
  int64_t count = 0;
  int64_t width = 0;  // elements of a row
  Tensor row_step;    // i32, one per row of the table: the last step applied to the row, where above floor
  int64_t floor = 0;  // every row has had the steps up to floor
  std::span<const AdamWStep> history;  // steps floor + 1, floor + 2, ...: until - floor of them at most kMaxHistory
  int64_t until = 0;  // each row gets its missing steps up to this one,
  bool gradient = false;  // the last of them with grad's row (the others with zero gradients)
};

// A copy between backend memory and host memory started by Backend::start_download/start_upload;
// finish() waits until it is done (and reports its error). Destroying it unfinished waits too.
class AsyncCopy {
 public:
  virtual ~AsyncCopy() = default;
  virtual Status finish() { return Status::ok(); }
  // The device event that marks its end (cudaEvent_t), for ordering device work after it without
  // the host waiting (Backend::wait_for, Communicator::order_next_after); null where the copy was
  // done at once.
  virtual void* device_event() const { return nullptr; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // The name with what a run should know of the device (its model, architecture, the kernel paths).
  virtual std::string description() const { return name(); }
  // Type of parameters, gradients and activations on this backend.
  virtual DType compute_dtype() const = 0;
  // Type of optimizer state (fp32 master weights and moments; f64 in the double-precision oracle).
  virtual DType optimizer_dtype() const = 0;
  // Type of per-row statistics kept for backward (RMSNorm rstd, attention log-sum-exp).
  virtual DType stats_dtype() const = 0;
  virtual bool host_accessible() const = 0;
  // Device memory in use by this process's device (everything is allocated up front, so after
  // the first step this is the peak); -1 where the backend cannot tell (host memory).
  virtual int64_t device_memory_used() const { return -1; }
  // The device's dense bf16 peak, MFU's denominator (model/gpu_peak.h); flops 0 where none applies.
  virtual PeakFlops bf16_peak() const { return {}; }
  // Device memory this process could still allocate; -1 where the backend cannot tell.
  virtual int64_t device_memory_free() const { return -1; }
  // The main stream, where every op outside on_side() is enqueued (cudaStream_t), for ordering
  // collectives; null on the host.
  virtual void* native_stream() { return nullptr; }
  // Where a backend profiles its ops (--profile on CUDA): forget what was measured so far.
  virtual void reset_profile() {}
  // A second queue for work that may run beside the main one (the optimizer updating the units
  // whose gradients backward has finished, while backward goes on). Ops called inside on_side(fn)
  // are enqueued on it after everything enqueued on the main queue so far; the main queue does not
  // wait for them until join_side(), which synchronize() also does. A backend with one queue (the
  // CPU's) runs fn in place: the same order of effects, nothing beside.
  virtual Status on_side(const std::function<Status()>& fn) { return fn(); }
  virtual Status join_side() { return Status::ok(); }

  // Replayable op sequences (CUDA graphs; decode steps, whose many small kernels would otherwise
  // wait on their launches). run_graph(key, record) runs what record() enqueues on the main queue:
  // the first time for key eagerly (kernels plan and size their scratch), then captured as graph
  // key and launched, later by launching the graph alone. A graph reads and writes the same device
  // addresses each time, and its kernels' launch arguments are fixed at capture: record() must
  // enqueue the same ops on the same buffers whenever key is the same, with only device data
  // changed in between. A backend without graphs (the CPU's, or a CUDA run with --profile) runs
  // record() every time. clear_graphs() forgets them (a buffer they use was reallocated).
  virtual Status run_graph(uint64_t key, const std::function<Status()>& record) { return record(); }
  virtual void clear_graphs() {}
  // Graph launches so far (the step replays, with the launch right after each capture).
  virtual int64_t graph_launches() const { return 0; }
  // What of a decode step's launch shapes follows its lengths (n queries over kv_rows cached rows of
  // attention shape `shape`; on CUDA the decode attention's split count): a graph of the step serves
  // the steps that give the same value, so it belongs in run_graph's key.
  virtual int64_t decode_launch_shape(int64_t n, int64_t kv_rows, AttentionShape shape) const { return 0; }

  virtual Result<Buffer> allocate(int64_t numel, DType dtype) = 0;
  // What allocate() is being called for, named in its out-of-memory error (AllocationPurpose sets it).
  const char* allocation_purpose() const { return allocation_purpose_; }
  void set_allocation_purpose(const char* purpose) { allocation_purpose_ = purpose; }
  // What an out-of-memory error advises (a string literal); null: the training memory planner.
  const char* out_of_memory_hint() const { return out_of_memory_hint_; }
  void set_out_of_memory_hint(const char* hint) { out_of_memory_hint_ = hint; }
  // Host memory, zeroed, for state kept off the device (the offloaded optimizer): page-locked
  // where pinned and the backend has a device to copy to (faster, asynchronous copies), plain
  // aligned memory otherwise.
  virtual Result<Buffer> allocate_host(int64_t numel, DType dtype, bool pinned) { return host_buffer(numel, dtype); }
  // The NUMA node nearest the device (where allocate_host prefers its pages and the offloaded
  // optimizer's threads run); -1: none, or the host itself computes.
  virtual int host_numa_node() const { return -1; }
  // The device's PCI bus id ("0000:1B:00.0"), for NVML (model/gpu_health.h); empty on the host.
  virtual std::string pci_bus_id() const { return ""; }
  static Result<Buffer> host_buffer(int64_t numel, DType dtype);
  // The rounding of this backend's adamw(), which an offloaded optimizer on the host repeats.
  virtual cpu::AdamWRounding adamw_rounding() const { return cpu::AdamWRounding::reference; }
  virtual Status zero(Tensor t) = 0;
  // Every tensor zeroed (a device backend may do it in one launch).
  virtual Status zero_all(std::span<const Tensor> ts) {
    for (const Tensor& t : ts) GLM_RETURN_IF_ERROR(zero(t));
    return Status::ok();
  }
  // Copies between host memory of the same dtype and backend memory.
  virtual Status upload(Tensor dst, const void* src) = 0;
  virtual Status download(void* dst, Tensor src) = 0;
  // The same copies, running while the host goes on (CUDA: on a copy stream, after everything
  // enqueued so far, from or to pinned memory at full speed); finish() waits for one. The host
  // memory must stay untouched until then. A backend without a device copies at once.
  virtual Result<std::unique_ptr<AsyncCopy>> start_download(void* dst, Tensor src) {
    GLM_RETURN_IF_ERROR(download(dst, src));
    return std::make_unique<AsyncCopy>();
  }
  virtual Result<std::unique_ptr<AsyncCopy>> start_upload(Tensor dst, const void* src) {
    GLM_RETURN_IF_ERROR(upload(dst, src));
    return std::make_unique<AsyncCopy>();
  }
  // Work enqueued from now on waits for the copy on the device; the host goes on.
  virtual Status wait_for(const AsyncCopy& copy) { return Status::ok(); }
  // dst[i] = src[i] converted between dtypes (compute <-> optimizer copies).
  virtual Status convert(Tensor dst, Tensor src) = 0;
  virtual Status synchronize() = 0;

  // Rows of width elements (any dtype, dst and src alike): gather dst[i] = src[rows[i]], scatter
  // dst[rows[i]] = src[i] (other rows of dst untouched), for i < count; rows is i32, each index
  // below the wide side's row count (the CPU backend checks that; a device backend cannot cheaply).
  virtual Status gather_rows(Tensor dst, Tensor src, Tensor rows, int64_t count, int64_t width) = 0;
  // Greedy decoding on the device: ids[r] (i32) = the column of row r's largest value in values
  // ([rows, cols], f32), the first such column on ties (std::max_element's), for r < rows.
  virtual Status argmax_rows(Tensor ids, Tensor values, int64_t rows, int64_t cols) = 0;
  // Beam search on the device: for r < rows, stats[2r] = the maximum of values' row r ([rows, cols],
  // f32) and stats[2r + 1] = log of the sum of exp(x - maximum) over it (its log-softmax is
  // x - stats[2r] - stats[2r + 1]); ids[r * k + j] (i32) and top[r * k + j] (f32), j < k <= 4096: its
  // k largest values, descending, the lower column first among equal ones (-1 and -inf past cols).
  virtual Status top_k_rows(Tensor ids, Tensor top, Tensor stats, Tensor values, int64_t rows, int64_t cols,
                            int64_t k) = 0;
  virtual Status scatter_rows(Tensor dst, Tensor src, Tensor rows, int64_t count, int64_t width) = 0;
  // dst[rows[i]] = 0 for i < count (rows of width elements, any dtype; indices as scatter_rows').
  virtual Status zero_rows(Tensor dst, Tensor rows, int64_t count, int64_t width) = 0;
  virtual Status embedding_forward(Tensor out, Tensor table, Tensor tokens, int64_t n, int64_t hidden) = 0;
  // dtable[tokens[t]] += dout[t]. token_order and token_runs are the batch's (MicroBatchIndex in
  // model/glm4_model.h): a device backend sums each token's rows in fp32 in that order and adds the
  // sum once (deterministic; a token seen hundreds of times keeps its small terms); the CPU
  // backend, whose dtype is the accumulator, may ignore them.
  virtual Status embedding_backward(Tensor dtable, Tensor dout, Tensor tokens, Tensor token_order, Tensor token_runs,
                                    int64_t n, int64_t hidden) = 0;
  virtual Status rmsnorm_forward(Tensor out, Tensor rstd, Tensor in, Tensor weight, int64_t n, int64_t hidden,
                                 double eps) = 0;
  virtual Status rmsnorm_backward(Tensor din, Tensor dweight, Tensor dout, Tensor in, Tensor weight, Tensor rstd,
                                  int64_t n, int64_t hidden) = 0;
  virtual Status linear_forward(Tensor out, Tensor in, Tensor weight, Tensor bias, int64_t n, int64_t in_features,
                                int64_t out_features) = 0;
  // out = in W^T (+ bias) + addend, addend of out's shape and dtype (it may be out itself); on CUDA the
  // addend is read in the GEMM's epilogue (a residual add or a LoRA update without a pass of its own).
  virtual Status linear_forward_add(Tensor out, Tensor in, Tensor weight, Tensor bias, Tensor addend, int64_t n,
                                    int64_t in_features, int64_t out_features) = 0;
  // din = dout W (din += that when accumulate_din); dweight += dout^T in, or dweight = dout^T in
  // when !accumulate_dweight (no zeroing pass before, no read of the old values on CUDA); dbias +=
  // column sums of dout. din, dweight, dbias may each be empty.
  virtual Status linear_backward(Tensor din, Tensor dweight, Tensor dbias, Tensor dout, Tensor in, Tensor weight,
                                 int64_t n, int64_t in_features, int64_t out_features, bool accumulate_din,
                                 bool accumulate_dweight) = 0;
  virtual Status rope_forward(Tensor qkv, Tensor positions, int64_t n, AttentionShape shape, int64_t rotary_dim,
                              double base) = 0;
  virtual Status rope_backward(Tensor dqkv, Tensor positions, int64_t n, AttentionShape shape, int64_t rotary_dim,
                               double base) = 0;
  // Generation's cached forward: rope_forward on qkv, then cache[cache_rows[i]] = the k | v columns of
  // qkv's row i (the rows of width 2 * kv_heads * head_dim after the q heads), for i < n. A device
  // backend may do all of it in one pass (CUDA: rope and store in one kernel), and then say that it
  // needs no RopeStore::staging.
  virtual bool rope_store_stages() const { return true; }
  virtual Status rope_store(Tensor qkv, int64_t n, const RopeStore& r) {
    GLM_RETURN_IF_ERROR(rope_forward(qkv, r.positions, n, r.shape, r.rotary_dim, r.base));
    const int64_t q_width = r.shape.heads * r.shape.head_dim, width = 2 * r.shape.kv_heads * r.shape.head_dim;
    GLM_RETURN_IF_ERROR(
        copy_columns(r.staging, width, qkv.slice(q_width, qkv.numel - q_width), r.shape.qkv_width(), n, width));
    return scatter_rows(r.cache, r.staging, r.cache_rows, n, width);
  }
  // Generation's few-row linears with the RMSNorm before them and, for the MLP's, the SwiGLU after:
  // out = W rmsnorm(in; norm_weight, eps) (+ bias), or with swiglu out = swiglu(that) ([n, ffn],
  // weight of 2 ffn rows). normed and rstd are rmsnorm_forward's outputs and gate_up ([n, 2 ffn]) the
  // linear's, written only where a backend does not fuse them (scratch: the result is out alone;
  // nothing for a backward). With rope (the attention's q | k | v linear), rope_store(out, n, *rope)
  // follows. A device backend may run it as one kernel (CUDA: the GEMV, for one row), the input in
  // fp32 where the separate ops would round the normed input to the compute dtype.
  virtual Status normed_linear_forward(Tensor out, Tensor in, Tensor norm_weight, double eps, Tensor weight,
                                       Tensor bias, bool swiglu, int64_t n, int64_t in_features, int64_t out_features,
                                       Tensor normed, Tensor rstd, Tensor gate_up, const RopeStore* rope = nullptr) {
    GLM_RETURN_IF_ERROR(rmsnorm_forward(normed, rstd, in, norm_weight, n, in_features, eps));
    if (swiglu) {
      GLM_RETURN_IF_ERROR(linear_forward(gate_up, normed, weight, bias, n, in_features, out_features));
      GLM_RETURN_IF_ERROR(swiglu_forward(out, gate_up, n, out_features / 2));
    } else {
      GLM_RETURN_IF_ERROR(linear_forward(out, normed, weight, bias, n, in_features, out_features));
    }
    return rope != nullptr ? rope_store(out, n, *rope) : Status::ok();
  }
  virtual Status attention_forward(Tensor out, Tensor lse, Tensor qkv, Tensor doc_start, int64_t n,
                                   AttentionShape shape) = 0;
  virtual Status attention_backward(Tensor dqkv, Tensor dout, Tensor out, Tensor lse, Tensor qkv, Tensor doc_start,
                                    int64_t n, AttentionShape shape) = 0;
  // Context parallelism (model/context_attention.h): a rank's n queries against the group's
  // gathered k | v rows (kernels/cpu/cpu_ops.h, attention_forward_gathered); kv_rows i32 [row
  // tokens], row_position and doc_start i32 [n] in row positions. Backward overwrites dqkv (dq, zero
  // k and v) and accumulates dkv. Backends without them refuse --context_parallel_size > 1. The
  // forward also takes kv_rows without data: row position p is then row p of kv (the row's tokens'
  // k | v one after another, as a sequence's KV-cache rows often are).
  virtual bool has_gathered_attention() const { return false; }
  Status no_context_parallelism() const {
    return GLM_USER_ERROR("--context_parallel_size > 1 needs cross-rank attention, which the ", name(),
                          " backend does not have");
  }
  virtual Status attention_forward_gathered(Tensor out, Tensor lse, Tensor qkv, Tensor kv, Tensor kv_rows,
                                            Tensor row_position, Tensor doc_start, int64_t n, AttentionShape shape) {
    return no_context_parallelism();
  }
  // Generation's decode step (model/kv_cache.h): attention_forward_gathered's contract where every
  // query is the newest token of its own sequence (doc_start strictly increasing). A backend may
  // run a kernel made for that shape (CUDA: kernels/cuda/decode_attention.cuh); by default the
  // gathered kernels.
  virtual Status attention_decode(Tensor out, Tensor lse, Tensor qkv, Tensor kv, Tensor kv_rows, Tensor row_position,
                                  Tensor doc_start, int64_t n, AttentionShape shape) {
    return attention_forward_gathered(out, lse, qkv, kv, kv_rows, row_position, doc_start, n, shape);
  }
  virtual Status attention_backward_gathered(Tensor dqkv, Tensor dkv, Tensor dout, Tensor out, Tensor lse, Tensor qkv,
                                             Tensor kv, Tensor kv_rows, Tensor row_position, Tensor doc_start,
                                             int64_t n, AttentionShape shape) {
    return no_context_parallelism();
  }
  // dst[r * dst_stride + c] = src[r * src_stride + c] for r < rows, c < cols (same dtype; the views
  // start where the copied columns do).
  virtual Status copy_columns(Tensor dst, int64_t dst_stride, Tensor src, int64_t src_stride, int64_t rows,
                              int64_t cols) {
    return no_context_parallelism();
  }
  // copy_columns' arguments against its views' dtypes and sizes.
  static Status check_copy_columns(Tensor dst, int64_t dst_stride, Tensor src, int64_t src_stride, int64_t rows,
                                   int64_t cols) {
    if (dst.dtype != src.dtype || rows < 0 || cols < 0 ||
        (rows > 0 && (dst.numel < (rows - 1) * dst_stride + cols || src.numel < (rows - 1) * src_stride + cols)))
      return GLM_INTERNAL_ERROR("copy_columns: ", rows, " x ", cols, " from ", src.numel, " to ", dst.numel,
                                " elements");
    return Status::ok();
  }
  virtual Status swiglu_forward(Tensor out, Tensor gate_up, int64_t n, int64_t ffn) = 0;
  virtual Status swiglu_backward(Tensor dgate_up, Tensor dout, Tensor gate_up, int64_t n, int64_t ffn) = 0;
  virtual Status add(Tensor out, Tensor a, Tensor b, int64_t count) = 0;
  // x[i] *= factor, in place (the LoRA scaling alpha / r on rank-wide intermediates).
  virtual Status scale(Tensor x, double factor) = 0;
  // Fused lm_head + cross-entropy: losses[t] per token (0 where targets[t] < 0). When correct (i32)
  // is non-empty, correct[t] = 1 where the logits' argmax (first maximum) is the target, else 0.
  // When dhidden is non-empty also dhidden = dlogits W and dweight += dlogits^T hidden (= with
  // !accumulate_dweight), with dlogits scaled by grad_scale.
  virtual Status lm_head_cross_entropy(Tensor losses, Tensor correct, Tensor dhidden, Tensor dweight, Tensor hidden,
                                       Tensor weight, Tensor targets, int64_t n, int64_t hidden_size, int64_t vocab,
                                       double grad_scale, bool accumulate_dweight) = 0;
  // LoRA dropout on a compute-dtype tensor: out[i] = in[i] * keep_i / (1 - p), or out[i] += that when
  // accumulate, keep_i = counter_keep(key, offset + i, dropout_threshold(p)) (base/counter_rng.h):
  // the same mask on every backend. Its backward is the same op on the gradient, accumulating.
  virtual Status dropout(Tensor out, Tensor in, double p, uint64_t key, int64_t offset, bool accumulate) = 0;
  virtual Result<double> sum_squares(Tensor x) = 0;
  // sum (one f64 element in backend memory) += the sum of squares of x, enqueued like any op: the
  // host does not wait for it.
  virtual Status accumulate_squares(Tensor x, Tensor sum) = 0;
  // dst[i] = value; dst[i] = std * counter_normal(key, offset + i) (base/counter_rng.h).
  virtual Status fill(Tensor dst, double value) = 0;
  virtual Status fill_normal(Tensor dst, uint64_t key, int64_t offset, double std) = 0;
  // Updates master (optimizer dtype) and writes the compute-dtype copy into param (may alias master).
  // grad_sq_sum, when not empty (one f64 element), gets the sum of squares of grad (as stored,
  // before step.grad_scale) added: the gradient norm without a pass of its own when nothing is
  // clipped.
  // master may also be i16: the low halves of a split master whose high halves are param (bf16;
  // kernels/master_split.h), both updated.
  virtual Status adamw(Tensor param, Tensor master, Tensor grad, Tensor exp_avg, Tensor exp_avg_sq,
                       const AdamWStep& step, Tensor grad_sq_sum) = 0;
  // adamw over the rows r.rows of a table (param, master, grad and moments its rows' elements from
  // row 0): row r gets the steps max(r.row_step[r], r.floor) + 1 .. r.until with the arithmetic
  // per element of adamw over the whole table step by step with zero gradients on that row, the
  // last step reading grad's row when r.gradient: the same bits. Listed rows' row_step becomes
  // r.until; with every row (r.rows empty) row_step is left alone (the caller raises its floor).
  // grad_sq_sum as adamw's, over the gradient rows read; grad may be empty without r.gradient.
  virtual Status adamw_rows(Tensor param, Tensor master, Tensor grad, Tensor exp_avg, Tensor exp_avg_sq,
                            const AdamWRows& r, Tensor grad_sq_sum) = 0;

 private:
  const char* allocation_purpose_ = nullptr;
  const char* out_of_memory_hint_ = nullptr;
};

// Names what the allocations in its scope are for (a string literal), in the backend's
// out-of-memory errors; the enclosing scope's name comes back at its end.
class AllocationPurpose {
 public:
  AllocationPurpose(Backend& backend, const char* purpose)
      : backend_(backend), outer_(backend.allocation_purpose()) {
    backend.set_allocation_purpose(purpose);
  }
  ~AllocationPurpose() { backend_.set_allocation_purpose(outer_); }
  AllocationPurpose(const AllocationPurpose&) = delete;
  AllocationPurpose& operator=(const AllocationPurpose&) = delete;

 private:
  Backend& backend_;
  const char* outer_;
};

// adamw_rows' checks every backend makes: shapes, history, one set of constants over the history.
Status check_adamw_rows(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& exp_avg,
                        const Tensor& exp_avg_sq, const AdamWRows& r);

// dtype: f32 (the CPU backend) or f64 (the gradient-check oracle).
std::unique_ptr<Backend> make_cpu_backend(DType dtype);

// bf16 compute on CUDA device `device` (fp32 master weights, moments and statistics).
// An error when the build has no CUDA or the device cannot be used.
Result<std::unique_ptr<Backend>> make_cuda_backend(int device, const BackendConfig& config = {});
// Usable CUDA devices (0 without CUDA in the build or without a driver).
int cuda_device_count();

}  // namespace glm
