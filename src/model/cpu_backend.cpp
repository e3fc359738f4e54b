// The CPU backend: host memory and the reference ops of kernels/cpu, in fp32 or fp64.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "base/counter_rng.h"
#include "model/backend.h"

namespace glm {
namespace {

template <typename T>
constexpr DType dtype_of() {
  return std::is_same_v<T, double> ? DType::f64 : DType::f32;
}

template <typename T>
class CpuBackend final : public Backend {
 public:
  std::string name() const override { return std::is_same_v<T, double> ? "cpu-f64" : "cpu"; }
  DType compute_dtype() const override { return dtype_of<T>(); }
  DType optimizer_dtype() const override { return dtype_of<T>(); }
  DType stats_dtype() const override { return dtype_of<T>(); }
  bool host_accessible() const override { return true; }

  Result<Buffer> allocate(int64_t numel, DType dtype) override {
    Result<Buffer> b = host_buffer(numel, dtype);
    if (b.is_ok() || allocation_purpose() == nullptr) return b;
    return GLM_ERROR(ErrorKind::internal, b.status().message(), " for ", allocation_purpose());
  }
  Status zero(Tensor t) override {
    if (!t.empty()) std::memset(t.data, 0, t.bytes());
    return Status::ok();
  }
  Status upload(Tensor dst, const void* src) override {
    std::memcpy(dst.data, src, dst.bytes());
    return Status::ok();
  }
  Status download(void* dst, Tensor src) override {
    std::memcpy(dst, src.data, src.bytes());
    return Status::ok();
  }
  Status convert(Tensor dst, Tensor src) override {
    if (dst.numel != src.numel) return GLM_INTERNAL_ERROR("convert size mismatch ", dst.numel, " vs ", src.numel);
    if (dst.dtype == src.dtype) {
      if (dst.data != src.data) std::memmove(dst.data, src.data, dst.bytes());
      return Status::ok();
    }
    // bf16 (ZeRO's --grad_reduce_dtype bf16): the upper 16 bits of an fp32, rounded to nearest even.
    auto load = [&](int64_t i) -> double {
      if (src.dtype == DType::f64) return src.as<double>()[i];
      if (src.dtype == DType::bf16) {
        const uint32_t bits = static_cast<uint32_t>(src.as<uint16_t>()[i]) << 16;
        float f;
        std::memcpy(&f, &bits, 4);
        return f;
      }
      return static_cast<double>(src.as<float>()[i]);
    };
    for (int64_t i = 0; i < dst.numel; ++i) {
      if (dst.dtype == DType::f64) {
        dst.as<double>()[i] = load(i);
      } else if (dst.dtype == DType::bf16) {
        const float f = static_cast<float>(load(i));
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        if ((bits & 0x7fffffffu) > 0x7f800000u)
          bits |= 0x00400000u;  // NaN stays a (quiet) NaN
        else
          bits += 0x7fffu + ((bits >> 16) & 1u);
        dst.as<uint16_t>()[i] = static_cast<uint16_t>(bits >> 16);
      } else {
        dst.as<float>()[i] = static_cast<float>(load(i));
      }
    }
    return Status::ok();
  }
  Status synchronize() override { return Status::ok(); }

  Status embedding_forward(Tensor out, Tensor table, Tensor tokens, int64_t n, int64_t hidden) override {
    cpu::embedding_forward(p(out), p(table), tokens.as<int32_t>(), n, hidden);
    return Status::ok();
  }
  Status embedding_backward(Tensor dtable, Tensor dout, Tensor tokens, Tensor, Tensor, int64_t n,
                            int64_t hidden) override {
    cpu::embedding_backward(p(dtable), p(dout), tokens.as<int32_t>(), n, hidden);
    return Status::ok();
  }
  Status gather_rows(Tensor dst, Tensor src, Tensor rows, int64_t count, int64_t width) override {
    return move_rows("gather_rows", dst, src, rows, count, width, true);
  }
  Status argmax_rows(Tensor ids, Tensor values, int64_t rows, int64_t cols) override {
    GLM_RETURN_IF_ERROR(check_argmax_rows(ids, values, rows, cols));
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = values.as<float>() + r * cols;
      ids.as<int32_t>()[r] = static_cast<int32_t>(std::max_element(row, row + cols) - row);
    }
    return Status::ok();
  }
  Status top_k_rows(Tensor ids, Tensor top, Tensor stats, Tensor values, int64_t rows, int64_t cols,
                    int64_t k) override {
    GLM_RETURN_IF_ERROR(check_top_k_rows(ids, top, stats, values, rows, cols, k));
    std::vector<int32_t> order(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = values.as<float>() + r * cols;
      const cpu::SoftmaxStatistics st = cpu::softmax_statistics(row, cols);
      stats.as<float>()[2 * r] = st.max;
      stats.as<float>()[2 * r + 1] = st.log_sum;
      std::iota(order.begin(), order.end(), 0);
      const int64_t kept = std::min(k, cols);
      std::partial_sort(order.begin(), order.begin() + kept, order.end(),
                        [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
      for (int64_t j = 0; j < k; ++j) {
        ids.as<int32_t>()[r * k + j] = j < kept ? order[static_cast<size_t>(j)] : -1;
        top.as<float>()[r * k + j] =
            j < kept ? row[order[static_cast<size_t>(j)]] : -std::numeric_limits<float>::infinity();
      }
    }
    return Status::ok();
  }
  Status scatter_rows(Tensor dst, Tensor src, Tensor rows, int64_t count, int64_t width) override {
    return move_rows("scatter_rows", dst, src, rows, count, width, false);
  }
  Status zero_rows(Tensor dst, Tensor rows, int64_t count, int64_t width) override {
    if (rows.dtype != DType::i32 || rows.numel < count || count < 0 || width <= 0 || dst.numel % width != 0)
      return GLM_INTERNAL_ERROR("zero_rows: ", count, " rows of width ", width, " of ", dst.numel, " elements");
    const size_t row_bytes = static_cast<size_t>(width) * dtype_size(dst.dtype);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t r = rows.as<int32_t>()[i];
      if (r < 0 || (r + 1) * width > dst.numel)
        return GLM_INTERNAL_ERROR("zero_rows: row ", r, " outside ", dst.numel / width, " rows");
      std::memset(static_cast<char*>(dst.data) + static_cast<size_t>(r) * row_bytes, 0, row_bytes);
    }
    return Status::ok();
  }
  Status rmsnorm_forward(Tensor out, Tensor rstd, Tensor in, Tensor weight, int64_t n, int64_t hidden,
                         double eps) override {
    cpu::rmsnorm_forward(p(out), p(rstd), p(in), p(weight), n, hidden, eps);
    return Status::ok();
  }
  Status rmsnorm_backward(Tensor din, Tensor dweight, Tensor dout, Tensor in, Tensor weight, Tensor rstd, int64_t n,
                          int64_t hidden) override {
    cpu::rmsnorm_backward(p(din), p(dweight), p(dout), p(in), p(weight), p(rstd), n, hidden);
    return Status::ok();
  }
  Status linear_forward(Tensor out, Tensor in, Tensor weight, Tensor bias, int64_t n, int64_t in_features,
                        int64_t out_features) override {
    cpu::linear_forward(p(out), p(in), p(weight), bias.empty() ? nullptr : p(bias), n, in_features, out_features);
    return Status::ok();
  }
  Status linear_forward_add(Tensor out, Tensor in, Tensor weight, Tensor bias, Tensor addend, int64_t n,
                            int64_t in_features, int64_t out_features) override {
    if (addend.numel != n * out_features || addend.dtype != out.dtype)
      return GLM_INTERNAL_ERROR("linear_forward_add: addend of ", addend.numel, " elements for ", n * out_features);
    // The product into a temporary: the addend may be the output itself.
    GLM_ASSIGN_OR_RETURN(Buffer product, allocate(n * out_features, out.dtype));
    GLM_RETURN_IF_ERROR(linear_forward(product.tensor(), in, weight, bias, n, in_features, out_features));
    return add(out, product.tensor(), addend, n * out_features);
  }
  Status linear_backward(Tensor din, Tensor dweight, Tensor dbias, Tensor dout, Tensor in, Tensor weight, int64_t n,
                         int64_t in_features, int64_t out_features, bool accumulate_din,
                         bool accumulate_dweight) override {
    if (!accumulate_dweight && !dweight.empty()) std::fill(p(dweight), p(dweight) + dweight.numel, T(0));
    cpu::linear_backward(din.empty() ? nullptr : p(din), dweight.empty() ? nullptr : p(dweight),
                         dbias.empty() ? nullptr : p(dbias), p(dout), p(in), p(weight), n, in_features, out_features,
                         accumulate_din);
    return Status::ok();
  }
  Status rope_forward(Tensor qkv, Tensor positions, int64_t n, AttentionShape shape, int64_t rotary_dim,
                      double base) override {
    cpu::rope_forward(p(qkv), positions.as<int32_t>(), n, shape, rotary_dim, base);
    return Status::ok();
  }
  Status rope_backward(Tensor dqkv, Tensor positions, int64_t n, AttentionShape shape, int64_t rotary_dim,
                       double base) override {
    cpu::rope_backward(p(dqkv), positions.as<int32_t>(), n, shape, rotary_dim, base);
    return Status::ok();
  }
  Status attention_forward(Tensor out, Tensor lse, Tensor qkv, Tensor doc_start, int64_t n,
                           AttentionShape shape) override {
    cpu::attention_forward(p(out), p(lse), p(qkv), doc_start.as<int32_t>(), n, shape);
    return Status::ok();
  }
  Status attention_backward(Tensor dqkv, Tensor dout, Tensor out, Tensor lse, Tensor qkv, Tensor doc_start, int64_t n,
                            AttentionShape shape) override {
    cpu::attention_backward(p(dqkv), p(dout), p(out), p(lse), p(qkv), doc_start.as<int32_t>(), n, shape);
    return Status::ok();
  }
  bool has_gathered_attention() const override { return true; }
  Status attention_forward_gathered(Tensor out, Tensor lse, Tensor qkv, Tensor kv, Tensor kv_rows, Tensor row_position,
                                    Tensor doc_start, int64_t n, AttentionShape shape) override {
    cpu::attention_forward_gathered(p(out), p(lse), p(qkv), p(kv), kv_rows.as<int32_t>(), row_position.as<int32_t>(),
                                    doc_start.as<int32_t>(), n, shape);
    return Status::ok();
  }
  Status attention_backward_gathered(Tensor dqkv, Tensor dkv, Tensor dout, Tensor out, Tensor lse, Tensor qkv,
                                     Tensor kv, Tensor kv_rows, Tensor row_position, Tensor doc_start, int64_t n,
                                     AttentionShape shape) override {
    cpu::attention_backward_gathered(p(dqkv), p(dkv), p(dout), p(out), p(lse), p(qkv), p(kv), kv_rows.as<int32_t>(),
                                     row_position.as<int32_t>(), doc_start.as<int32_t>(), n, shape);
    return Status::ok();
  }
  Status copy_columns(Tensor dst, int64_t dst_stride, Tensor src, int64_t src_stride, int64_t rows,
                      int64_t cols) override {
    GLM_RETURN_IF_ERROR(check_copy_columns(dst, dst_stride, src, src_stride, rows, cols));
    const size_t element = dtype_size(dst.dtype);
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(dst.data) + static_cast<size_t>(r * dst_stride) * element,
                  static_cast<const char*>(src.data) + static_cast<size_t>(r * src_stride) * element,
                  static_cast<size_t>(cols) * element);
    return Status::ok();
  }
  Status swiglu_forward(Tensor out, Tensor gate_up, int64_t n, int64_t ffn) override {
    cpu::swiglu_forward(p(out), p(gate_up), n, ffn);
    return Status::ok();
  }
  Status swiglu_backward(Tensor dgate_up, Tensor dout, Tensor gate_up, int64_t n, int64_t ffn) override {
    cpu::swiglu_backward(p(dgate_up), p(dout), p(gate_up), n, ffn);
    return Status::ok();
  }
  Status add(Tensor out, Tensor a, Tensor b, int64_t count) override {
    cpu::add(p(out), p(a), p(b), count);
    return Status::ok();
  }
  Status scale(Tensor x, double factor) override {
    T* v = p(x);
    for (int64_t i = 0; i < x.numel; ++i) v[i] = static_cast<T>(v[i] * factor);
    return Status::ok();
  }
  Status lm_head_cross_entropy(Tensor losses, Tensor correct, Tensor dhidden, Tensor dweight, Tensor hidden,
                               Tensor weight, Tensor targets, int64_t n, int64_t hidden_size, int64_t vocab,
                               double grad_scale, bool accumulate_dweight) override {
    // Token chunks bound the logits scratch to kChunk x vocab.
    constexpr int64_t kChunk = 32;
    const bool grad = !dhidden.empty();
    if (grad && !accumulate_dweight && !dweight.empty()) std::fill(p(dweight), p(dweight) + dweight.numel, T(0));
    logits_.resize(static_cast<size_t>(kChunk * vocab));
    if (grad) dlogits_.resize(static_cast<size_t>(kChunk * vocab));
    for (int64_t t0 = 0; t0 < n; t0 += kChunk) {
      const int64_t m = std::min(kChunk, n - t0);
      const T* h = p(hidden) + t0 * hidden_size;
      cpu::linear_forward(logits_.data(), h, p(weight), static_cast<const T*>(nullptr), m, hidden_size, vocab);
      cpu::cross_entropy(p(losses) + t0, grad ? dlogits_.data() : static_cast<T*>(nullptr), logits_.data(),
                         targets.as<int32_t>() + t0, m, vocab, grad_scale,
                         correct.empty() ? nullptr : correct.as<int32_t>() + t0);
      if (grad)
        cpu::linear_backward(p(dhidden) + t0 * hidden_size, dweight.empty() ? static_cast<T*>(nullptr) : p(dweight),
                             static_cast<T*>(nullptr), dlogits_.data(), h, p(weight), m, hidden_size, vocab, false);
    }
    return Status::ok();
  }
  Status dropout(Tensor out, Tensor in, double prob, uint64_t key, int64_t offset, bool accumulate) override {
    if (out.numel != in.numel) return GLM_INTERNAL_ERROR("dropout size mismatch ", out.numel, " vs ", in.numel);
    if (!(prob >= 0 && prob < 1)) return GLM_INTERNAL_ERROR("dropout probability ", prob, " outside [0, 1)");
    cpu::dropout(p(out), p(in), out.numel, prob, key, offset, accumulate);
    return Status::ok();
  }
  Result<double> sum_squares(Tensor x) override { return cpu::sum_squares(p(x), x.numel); }
  Status accumulate_squares(Tensor x, Tensor sum) override {
    if (sum.dtype != DType::f64 || sum.numel != 1) return GLM_INTERNAL_ERROR("accumulate_squares into ", sum.numel, " ", dtype_name(sum.dtype));
    *sum.as<double>() += cpu::sum_squares(p(x), x.numel);
    return Status::ok();
  }
  Status fill(Tensor dst, double value) override {
    std::fill(p(dst), p(dst) + dst.numel, static_cast<T>(value));
    return Status::ok();
  }
  Status fill_normal(Tensor dst, uint64_t key, int64_t offset, double std) override {
    T* out = p(dst);
    for (int64_t i = 0; i < dst.numel; ++i)
      out[i] = static_cast<T>(std * counter_normal(key, static_cast<uint64_t>(offset + i)));
    return Status::ok();
  }
  Status adamw(Tensor param, Tensor master, Tensor grad, Tensor exp_avg, Tensor exp_avg_sq, const AdamWStep& step,
               Tensor grad_sq_sum) override {
    if (master.dtype != dtype_of<T>())
      return GLM_INTERNAL_ERROR("adamw: a ", dtype_name(master.dtype), " master on the CPU");
    if (!grad_sq_sum.empty()) *grad_sq_sum.as<double>() += cpu::sum_squares(p(grad), grad.numel);
    cpu::adamw(p(master), p(grad), p(exp_avg), p(exp_avg_sq), master.numel, step);
    if (param.data != master.data) return convert(param, master);
    return Status::ok();
  }
  Status adamw_rows(Tensor param, Tensor master, Tensor grad, Tensor exp_avg, Tensor exp_avg_sq, const AdamWRows& r,
                    Tensor grad_sq_sum) override {
    GLM_RETURN_IF_ERROR(check_adamw_rows(param, master, grad, exp_avg, exp_avg_sq, r));
    if (master.dtype != dtype_of<T>() || param.data != master.data)
      return GLM_INTERNAL_ERROR("adamw_rows: the CPU's master is its ", dtype_name(dtype_of<T>()), " parameters");
    const int64_t table_rows = r.row_step.numel;
    const int32_t* rows = r.rows.empty() ? nullptr : r.rows.as<int32_t>();
    int32_t* row_step = r.row_step.as<int32_t>();
    for (int64_t i = 0; rows != nullptr && i < r.count; ++i)
      if (rows[i] < 0 || rows[i] >= table_rows)
        return GLM_INTERNAL_ERROR("adamw_rows: row ", rows[i], " outside ", table_rows, " rows");
    const double sq = cpu::adamw_rows(p(master), p(grad), p(exp_avg), p(exp_avg_sq), rows, r.count, r.width, row_step,
                                      r.floor, r.history.data(), r.until, r.gradient);
    if (!grad_sq_sum.empty()) *grad_sq_sum.as<double>() += sq;
    for (int64_t i = 0; rows != nullptr && i < r.count; ++i) row_step[rows[i]] = static_cast<int32_t>(r.until);
    return Status::ok();
  }

 private:
  static T* p(const Tensor& t) { return t.as<T>(); }
  static Status move_rows(const char* op, Tensor dst, Tensor src, Tensor rows, int64_t count, int64_t width,
                          bool gather) {
    GLM_RETURN_IF_ERROR(check_rows_op(op, dst, src, rows, count, width, gather));
    const size_t row_bytes = static_cast<size_t>(width) * dtype_size(dst.dtype);
    const Tensor wide = gather ? src : dst;  // the side the indices point into
    auto* d = static_cast<char*>(dst.data);
    const auto* s = static_cast<const char*>(src.data);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t r = rows.as<int32_t>()[i];
      if (r < 0 || (r + 1) * width > wide.numel)
        return GLM_INTERNAL_ERROR(op, ": row ", r, " outside ", wide.numel / width, " rows");
      const size_t at = static_cast<size_t>(r) * row_bytes, compact = static_cast<size_t>(i) * row_bytes;
      std::memcpy(d + (gather ? compact : at), s + (gather ? at : compact), row_bytes);
    }
    return Status::ok();
  }
  std::vector<T> logits_, dlogits_;
};

}  // namespace

Result<Buffer> Backend::host_buffer(int64_t numel, DType dtype) {
  if (numel < 0) return GLM_INTERNAL_ERROR("negative allocation of ", numel, " elements");
  size_t bytes = static_cast<size_t>(std::max<int64_t>(numel, 1)) * dtype_size(dtype);
  bytes = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes);
  if (p == nullptr) return GLM_ERROR(ErrorKind::internal, "out of host memory allocating ", bytes, " bytes");
  std::memset(p, 0, bytes);
  return Buffer(Tensor{p, numel, dtype}, [](void* q) { std::free(q); });
}

Status check_adamw_rows(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& exp_avg,
                        const Tensor& exp_avg_sq, const AdamWRows& r) {
  const int64_t table_rows = r.row_step.numel;
  if (r.row_step.dtype != DType::i32 || (!r.rows.empty() && (r.rows.dtype != DType::i32 || r.rows.numel < r.count)))
    return GLM_INTERNAL_ERROR("adamw_rows: row indices and row steps are i32");
  if (r.width <= 0 || r.count < 0 || (r.rows.empty() && r.count != table_rows) || r.count > table_rows)
    return GLM_INTERNAL_ERROR("adamw_rows: ", r.count, " rows of ", r.width, " of a table of ", table_rows);
  const int64_t n = table_rows * r.width;
  for (const Tensor* t : {&param, &master, &grad, &exp_avg, &exp_avg_sq})
    if (t->numel != n && !(t == &grad && !r.gradient && grad.empty()))
      return GLM_INTERNAL_ERROR("adamw_rows: ", t->numel, " elements for ", table_rows, " rows of ", r.width);
  const int64_t steps = r.until - r.floor;
  if (steps < 0 || steps > AdamWRows::kMaxHistory || static_cast<int64_t>(r.history.size()) < steps ||
      r.until > INT32_MAX)
    return GLM_INTERNAL_ERROR("adamw_rows: steps ", r.floor, " .. ", r.until, " from a history of ", r.history.size());
  for (int64_t k = 0; k < steps; ++k) {
    const AdamWStep& a = r.history[static_cast<size_t>(k)];
    const AdamWStep& first = r.history.front();
    if (a.step != r.floor + 1 + k || a.beta1 != first.beta1 || a.beta2 != first.beta2 || a.eps != first.eps ||
        a.weight_decay != first.weight_decay)
      return GLM_INTERNAL_ERROR("adamw_rows: history entry ", k, " is step ", a.step,
                                " of other constants; expected step ", r.floor + 1 + k);
  }
  return Status::ok();
}

std::unique_ptr<Backend> make_cpu_backend(DType dtype) {
  if (dtype == DType::f64) return std::make_unique<CpuBackend<double>>();
  return std::make_unique<CpuBackend<float>>();
}

}  // namespace glm
