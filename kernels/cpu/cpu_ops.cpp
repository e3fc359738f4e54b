// fp32/fp64 reference implementations; reductions accumulate in double.
#include "kernels/cpu/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "base/counter_rng.h"
#include "kernels/cpu/adamw_element.h"

namespace glm::cpu {

SoftmaxStatistics softmax_statistics(const float* row, int64_t n) {
  const float mx = *std::max_element(row, row + n);
  double sum = 0;
  for (int64_t c = 0; c < n; ++c)
    if (row[c] != -std::numeric_limits<float>::infinity()) sum += std::exp(static_cast<double>(row[c] - mx));
  return {mx, static_cast<float>(std::log(sum))};
}

template <typename T>
void embedding_forward(T* out, const T* table, const int32_t* tokens, int64_t n, int64_t hidden) {
  for (int64_t t = 0; t < n; ++t)
    std::memcpy(out + t * hidden, table + static_cast<int64_t>(tokens[t]) * hidden, sizeof(T) * hidden);
}

template <typename T>
void embedding_backward(T* dtable, const T* dout, const int32_t* tokens, int64_t n, int64_t hidden) {
  for (int64_t t = 0; t < n; ++t) {
    T* row = dtable + static_cast<int64_t>(tokens[t]) * hidden;
    const T* g = dout + t * hidden;
    for (int64_t j = 0; j < hidden; ++j) row[j] += g[j];
  }
}

template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* in, const T* weight, int64_t n, int64_t hidden, double eps) {
  for (int64_t t = 0; t < n; ++t) {
    const T* x = in + t * hidden;
    double ss = 0;
    for (int64_t j = 0; j < hidden; ++j) ss += static_cast<double>(x[j]) * x[j];
    const T r = static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(hidden) + eps));
    rstd[t] = r;
    T* y = out + t * hidden;
    for (int64_t j = 0; j < hidden; ++j) y[j] = weight[j] * (x[j] * r);
  }
}

template <typename T>
void rmsnorm_backward(T* din, T* dweight, const T* dout, const T* in, const T* weight, const T* rstd, int64_t n,
                      int64_t hidden) {
  for (int64_t t = 0; t < n; ++t) {
    const T* x = in + t * hidden;
    const T* g = dout + t * hidden;
    const T r = rstd[t];
    double dot = 0;  // sum_j (g_j w_j) x_j
    for (int64_t j = 0; j < hidden; ++j) dot += static_cast<double>(g[j]) * weight[j] * x[j];
    const T c = static_cast<T>(dot / static_cast<double>(hidden)) * r * r * r;
    T* dx = din + t * hidden;
    for (int64_t j = 0; j < hidden; ++j) {
      dx[j] += r * g[j] * weight[j] - x[j] * c;
      dweight[j] += g[j] * x[j] * r;
    }
  }
}

template <typename T>
void linear_forward(T* out, const T* in, const T* weight, const T* bias, int64_t n, int64_t in_features,
                    int64_t out_features) {
  // Four tokens share each weight row read; the inner dot products vectorise (-fopenmp-simd).
  constexpr int64_t kTile = 4;
  int64_t t0 = 0;
  for (; t0 + kTile <= n; t0 += kTile) {
    const T* x0 = in + (t0 + 0) * in_features;
    const T* x1 = in + (t0 + 1) * in_features;
    const T* x2 = in + (t0 + 2) * in_features;
    const T* x3 = in + (t0 + 3) * in_features;
    for (int64_t o = 0; o < out_features; ++o) {
      const T* w = weight + o * in_features;
      T a0 = 0, a1 = 0, a2 = 0, a3 = 0;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
      for (int64_t i = 0; i < in_features; ++i) {
        a0 += x0[i] * w[i];
        a1 += x1[i] * w[i];
        a2 += x2[i] * w[i];
        a3 += x3[i] * w[i];
      }
      const T b = bias != nullptr ? bias[o] : T(0);
      out[(t0 + 0) * out_features + o] = a0 + b;
      out[(t0 + 1) * out_features + o] = a1 + b;
      out[(t0 + 2) * out_features + o] = a2 + b;
      out[(t0 + 3) * out_features + o] = a3 + b;
    }
  }
  for (; t0 < n; ++t0) {
    const T* x = in + t0 * in_features;
    for (int64_t o = 0; o < out_features; ++o) {
      const T* w = weight + o * in_features;
      T a = 0;
#pragma omp simd reduction(+ : a)
      for (int64_t i = 0; i < in_features; ++i) a += x[i] * w[i];
      out[t0 * out_features + o] = a + (bias != nullptr ? bias[o] : T(0));
    }
  }
}

template <typename T>
void linear_backward(T* din, T* dweight, T* dbias, const T* dout, const T* in, const T* weight, int64_t n,
                     int64_t in_features, int64_t out_features, bool accumulate_din) {
  if (din != nullptr) {
    for (int64_t t = 0; t < n; ++t) {
      T* dx = din + t * in_features;
      if (!accumulate_din) std::fill(dx, dx + in_features, T(0));
      const T* g = dout + t * out_features;
      for (int64_t o = 0; o < out_features; ++o) {
        const T go = g[o];
        const T* w = weight + o * in_features;
#pragma omp simd
        for (int64_t i = 0; i < in_features; ++i) dx[i] += go * w[i];
      }
    }
  }
  if (dweight != nullptr) {
    for (int64_t o = 0; o < out_features; ++o) {
      T* dw = dweight + o * in_features;
      for (int64_t t = 0; t < n; ++t) {
        const T go = dout[t * out_features + o];
        const T* x = in + t * in_features;
#pragma omp simd
        for (int64_t i = 0; i < in_features; ++i) dw[i] += go * x[i];
      }
    }
  }
  if (dbias != nullptr) {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t o = 0; o < out_features; ++o) dbias[o] += dout[t * out_features + o];
  }
}

namespace {
// Angles as transformers computes them in the model's float type: inv_freq = 1 / base^(2i/dim),
// angle = position * inv_freq, cos/sin of that (fp32 for float, fp64 for double).
template <typename T>
void rope_rotate(T* qkv, const int32_t* positions, int64_t n, AttentionShape shape, int64_t rotary_dim, double base,
                 T direction) {
  const int64_t width = shape.qkv_width();
  const int64_t pairs = rotary_dim / 2;
  const int64_t rotated_heads = shape.heads + shape.kv_heads;  // q heads then k heads are contiguous
  std::vector<T> inv_freq(static_cast<size_t>(pairs));
  for (int64_t i = 0; i < pairs; ++i)
    inv_freq[i] = T(1) / std::pow(static_cast<T>(base), static_cast<T>(2 * i) / static_cast<T>(rotary_dim));
  for (int64_t t = 0; t < n; ++t) {
    const T pos = static_cast<T>(positions[t]);
    for (int64_t i = 0; i < pairs; ++i) {
      const T angle = pos * inv_freq[i];
      const T c = std::cos(angle), s = direction * std::sin(angle);
      for (int64_t h = 0; h < rotated_heads; ++h) {
        T* x = qkv + t * width + h * shape.head_dim + 2 * i;
        const T x0 = x[0], x1 = x[1];
        x[0] = x0 * c - x1 * s;
        x[1] = x1 * c + x0 * s;
      }
    }
  }
}
}  // namespace

template <typename T>
void rope_forward(T* qkv, const int32_t* positions, int64_t n, AttentionShape shape, int64_t rotary_dim, double base) {
  rope_rotate(qkv, positions, n, shape, rotary_dim, base, T(1));
}

template <typename T>
void rope_backward(T* dqkv, const int32_t* positions, int64_t n, AttentionShape shape, int64_t rotary_dim,
                   double base) {
  rope_rotate(dqkv, positions, n, shape, rotary_dim, base, T(-1));
}

namespace {

// Where attention reads keys and values: k and v of token s (a position in the row) start at
// row * stride, row = rows ? rows[s] : s, plus the KV group's offset. The fused qkv of the whole
// row is the case rows == nullptr; context parallelism reads a gathered k | v buffer.
template <typename T>
struct KeyValues {
  const T* k;
  const T* v;
  int64_t stride;
  const int32_t* rows;
  int64_t row(int64_t s) const { return rows != nullptr ? rows[s] : s; }
};

// Gradients of the keys and values, laid out as KeyValues (accumulates).
template <typename T>
struct KeyValueGrads {
  T* dk;
  T* dv;
  int64_t stride;
};

// Query i (its q block at qkv + i * qkv_width) sits at position[i] of the row (i when null) and
// attends to positions [doc_start[i], position[i]].
int64_t position_of(const int32_t* position, int64_t i) { return position != nullptr ? position[i] : i; }

template <typename T>
void attention_rows_forward(T* out, T* lse, const T* qkv, const KeyValues<T>& kv, const int32_t* position,
                            const int32_t* doc_start, int64_t n, AttentionShape shape) {
  const int64_t d = shape.head_dim, width = shape.qkv_width();
  const int64_t group = shape.heads / shape.kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> scores;
  std::vector<double> acc(static_cast<size_t>(d));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t first = doc_start[i], last = position_of(position, i);
    scores.resize(static_cast<size_t>(last - first + 1));
    for (int64_t h = 0; h < shape.heads; ++h) {
      const int64_t g = h / group;
      const T* q = qkv + i * width + h * d;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t s = first; s <= last; ++s) {
        const T* k = kv.k + kv.row(s) * kv.stride + g * d;
        double dot = 0;
        for (int64_t j = 0; j < d; ++j) dot += static_cast<double>(q[j]) * k[j];
        scores[s - first] = dot * scale;
        mx = std::max(mx, dot * scale);
      }
      double sum = 0;
      for (auto& sc : scores) sum += (sc = std::exp(sc - mx));
      T* o = out + i * shape.heads * d + h * d;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t s = first; s <= last; ++s) {
        const T* v = kv.v + kv.row(s) * kv.stride + g * d;
        const double p = scores[s - first] / sum;
        for (int64_t j = 0; j < d; ++j) acc[j] += p * v[j];
      }
      for (int64_t j = 0; j < d; ++j) o[j] = static_cast<T>(acc[j]);
      lse[i * shape.heads + h] = static_cast<T>(mx + std::log(sum));
    }
  }
}

// dq into dqkv's q blocks (accumulates; the caller zeroes), dk and dv through grads (accumulates).
template <typename T>
void attention_rows_backward(T* dqkv, const KeyValueGrads<T>& grads, const T* dout, const T* out, const T* lse,
                             const T* qkv, const KeyValues<T>& kv, const int32_t* position, const int32_t* doc_start,
                             int64_t n, AttentionShape shape) {
  const int64_t d = shape.head_dim, width = shape.qkv_width();
  const int64_t group = shape.heads / shape.kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t first = doc_start[i], last = position_of(position, i);
    for (int64_t h = 0; h < shape.heads; ++h) {
      const int64_t g = h / group;
      const T* q = qkv + i * width + h * d;
      const T* go = dout + i * shape.heads * d + h * d;
      const T* o = out + i * shape.heads * d + h * d;
      double delta = 0;  // sum_j dout_j out_j = sum_s p_s dp_s
      for (int64_t j = 0; j < d; ++j) delta += static_cast<double>(go[j]) * o[j];
      const double l = lse[i * shape.heads + h];
      T* dq = dqkv + i * width + h * d;
      for (int64_t s = first; s <= last; ++s) {
        const int64_t row = kv.row(s);
        const T* k = kv.k + row * kv.stride + g * d;
        const T* v = kv.v + row * kv.stride + g * d;
        double dot = 0, dp = 0;
        for (int64_t j = 0; j < d; ++j) {
          dot += static_cast<double>(q[j]) * k[j];
          dp += static_cast<double>(go[j]) * v[j];
        }
        const double p = std::exp(dot * scale - l);
        const double ds = p * (dp - delta) * scale;
        T* dk = grads.dk + row * grads.stride + g * d;
        T* dv = grads.dv + row * grads.stride + g * d;
        for (int64_t j = 0; j < d; ++j) {
          dq[j] += static_cast<T>(ds * k[j]);
          dk[j] += static_cast<T>(ds * q[j]);
          dv[j] += static_cast<T>(p * go[j]);
        }
      }
    }
  }
}

}  // namespace

template <typename T>
void attention_forward(T* out, T* lse, const T* qkv, const int32_t* doc_start, int64_t n, AttentionShape shape) {
  const int64_t d = shape.head_dim, width = shape.qkv_width();
  const KeyValues<T> kv{qkv + shape.heads * d, qkv + (shape.heads + shape.kv_heads) * d, width, nullptr};
  attention_rows_forward(out, lse, qkv, kv, nullptr, doc_start, n, shape);
}

template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* out, const T* lse, const T* qkv, const int32_t* doc_start,
                        int64_t n, AttentionShape shape) {
  const int64_t d = shape.head_dim, width = shape.qkv_width();
  const int64_t k_off = shape.heads * d, v_off = (shape.heads + shape.kv_heads) * d;
  std::fill(dqkv, dqkv + n * width, T(0));
  const KeyValues<T> kv{qkv + k_off, qkv + v_off, width, nullptr};
  attention_rows_backward(dqkv, KeyValueGrads<T>{dqkv + k_off, dqkv + v_off, width}, dout, out, lse, qkv, kv, nullptr,
                          doc_start, n, shape);
}

template <typename T>
void attention_forward_gathered(T* out, T* lse, const T* qkv, const T* kv, const int32_t* kv_row,
                                const int32_t* position, const int32_t* doc_start, int64_t n, AttentionShape shape) {
  const int64_t kv_width = shape.kv_heads * shape.head_dim;
  attention_rows_forward(out, lse, qkv, KeyValues<T>{kv, kv + kv_width, 2 * kv_width, kv_row}, position, doc_start, n,
                         shape);
}

template <typename T>
void attention_backward_gathered(T* dqkv, T* dkv, const T* dout, const T* out, const T* lse, const T* qkv,
                                 const T* kv, const int32_t* kv_row, const int32_t* position,
                                 const int32_t* doc_start, int64_t n, AttentionShape shape) {
  const int64_t kv_width = shape.kv_heads * shape.head_dim;
  std::fill(dqkv, dqkv + n * shape.qkv_width(), T(0));
  attention_rows_backward(dqkv, KeyValueGrads<T>{dkv, dkv + kv_width, 2 * kv_width}, dout, out, lse, qkv,
                          KeyValues<T>{kv, kv + kv_width, 2 * kv_width, kv_row}, position, doc_start, n, shape);
}

template <typename T>
void swiglu_forward(T* out, const T* gate_up, int64_t n, int64_t ffn) {
  for (int64_t t = 0; t < n; ++t) {
    const T* gate = gate_up + t * 2 * ffn;
    const T* up = gate + ffn;
    T* y = out + t * ffn;
    for (int64_t j = 0; j < ffn; ++j) y[j] = gate[j] / (T(1) + std::exp(-gate[j])) * up[j];
  }
}

template <typename T>
void swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, int64_t n, int64_t ffn) {
  for (int64_t t = 0; t < n; ++t) {
    const T* gate = gate_up + t * 2 * ffn;
    const T* up = gate + ffn;
    const T* g = dout + t * ffn;
    T* dgate = dgate_up + t * 2 * ffn;
    T* dup = dgate + ffn;
    for (int64_t j = 0; j < ffn; ++j) {
      const T s = T(1) / (T(1) + std::exp(-gate[j]));
      dgate[j] = g[j] * up[j] * s * (T(1) + gate[j] * (T(1) - s));
      dup[j] = g[j] * gate[j] * s;
    }
  }
}

template <typename T>
int64_t cross_entropy(T* losses, T* dlogits, const T* logits, const int32_t* targets, int64_t n, int64_t vocab,
                      double grad_scale, int32_t* correct) {
  int64_t counted = 0;
  for (int64_t t = 0; t < n; ++t) {
    const T* z = logits + t * vocab;
    T* dz = dlogits != nullptr ? dlogits + t * vocab : nullptr;
    if (correct != nullptr) correct[t] = 0;
    if (targets[t] < 0) {
      losses[t] = 0;
      if (dz != nullptr) std::fill(dz, dz + vocab, T(0));
      continue;
    }
    ++counted;
    double mx = -std::numeric_limits<double>::infinity();
    int64_t argmax = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      if (static_cast<double>(z[v]) > mx) {  // strict: the first maximum wins, as torch.argmax
        mx = static_cast<double>(z[v]);
        argmax = v;
      }
    }
    if (correct != nullptr) correct[t] = argmax == targets[t] ? 1 : 0;
    double sum = 0;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(z[v]) - mx);
    const double lse = mx + std::log(sum);
    losses[t] = static_cast<T>(lse - static_cast<double>(z[targets[t]]));
    if (dz != nullptr) {
      for (int64_t v = 0; v < vocab; ++v)
        dz[v] = static_cast<T>(std::exp(static_cast<double>(z[v]) - lse) * grad_scale);
      dz[targets[t]] -= static_cast<T>(grad_scale);
    }
  }
  return counted;
}

template <typename T>
void add(T* out, const T* a, const T* b, int64_t count) {
#pragma omp simd
  for (int64_t i = 0; i < count; ++i) out[i] = a[i] + b[i];
}

template <typename T>
void dropout(T* out, const T* in, int64_t count, double p, uint64_t key, int64_t offset, bool accumulate) {
  const uint64_t threshold = dropout_threshold(p);
  const T scale = static_cast<T>(1.0 / (1.0 - p));
  for (int64_t i = 0; i < count; ++i) {
    const T v = counter_keep(key, static_cast<uint64_t>(offset + i), threshold) ? in[i] * scale : T(0);
    out[i] = accumulate ? out[i] + v : v;
  }
}

template <typename T>
double sum_squares(const T* x, int64_t count) {
  double s = 0;
  for (int64_t i = 0; i < count; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

template <typename T>
void adamw(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, int64_t count, const AdamWStep& step) {
  const AdamWConstants<T> c(step);
  for (int64_t i = 0; i < count; ++i) adamw_element(param[i], grad[i], exp_avg[i], exp_avg_sq[i], c);
}

template <typename T>
double adamw_rows(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, const int32_t* rows, int64_t count,
                  int64_t width, const int32_t* row_step, int64_t floor, const AdamWStep* history, int64_t until,
                  bool gradient) {
  std::vector<AdamWConstants<T>> steps;
  for (int64_t k = floor + 1; k <= until; ++k) steps.emplace_back(history[k - floor - 1]);
  volatile T zero_source = T(0);  // a zero the compiler cannot fold: the same arithmetic as a stored zero
  const T zero = zero_source;
  double squares = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t r = rows != nullptr ? rows[i] : i;
    const int64_t first = std::max<int64_t>(row_step[r], floor) + 1;
    if (first > until) continue;
    for (int64_t j = r * width; j < (r + 1) * width; ++j) {
      for (int64_t k = first; k <= until; ++k) {
        const T g = gradient && k == until ? grad[j] : zero;
        if (gradient && k == until) squares += static_cast<double>(g) * g;
        adamw_element(param[j], g, exp_avg[j], exp_avg_sq[j], steps[static_cast<size_t>(k - floor - 1)]);
      }
    }
  }
  return squares;
}

#define GLM_INSTANTIATE_CPU_OPS(T)                                                                             \
  template void embedding_forward<T>(T*, const T*, const int32_t*, int64_t, int64_t);                          \
  template void embedding_backward<T>(T*, const T*, const int32_t*, int64_t, int64_t);                         \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, int64_t, int64_t, double);                      \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t, int64_t);         \
  template void linear_forward<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t);                \
  template void linear_backward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, bool); \
  template void rope_forward<T>(T*, const int32_t*, int64_t, AttentionShape, int64_t, double);                 \
  template void rope_backward<T>(T*, const int32_t*, int64_t, AttentionShape, int64_t, double);                \
  template void attention_forward<T>(T*, T*, const T*, const int32_t*, int64_t, AttentionShape);               \
  template void attention_backward<T>(T*, const T*, const T*, const T*, const T*, const int32_t*, int64_t,     \
                                      AttentionShape);                                                         \
  template void attention_forward_gathered<T>(T*, T*, const T*, const T*, const int32_t*, const int32_t*,      \
                                              const int32_t*, int64_t, AttentionShape);                        \
  template void attention_backward_gathered<T>(T*, T*, const T*, const T*, const T*, const T*, const T*,       \
                                               const int32_t*, const int32_t*, const int32_t*, int64_t,        \
                                               AttentionShape);                                                \
  template void swiglu_forward<T>(T*, const T*, int64_t, int64_t);                                             \
  template void swiglu_backward<T>(T*, const T*, const T*, int64_t, int64_t);                                  \
  template int64_t cross_entropy<T>(T*, T*, const T*, const int32_t*, int64_t, int64_t, double, int32_t*);     \
  template void add<T>(T*, const T*, const T*, int64_t);                                                       \
  template void dropout<T>(T*, const T*, int64_t, double, uint64_t, int64_t, bool);                            \
  template double sum_squares<T>(const T*, int64_t);                                                           \
  template void adamw<T>(T*, const T*, T*, T*, int64_t, const AdamWStep&);                                     \
  template double adamw_rows<T>(T*, const T*, T*, T*, const int32_t*, int64_t, int64_t, const int32_t*, int64_t, \
                                const AdamWStep*, int64_t, bool);

GLM_INSTANTIATE_CPU_OPS(float)
GLM_INSTANTIATE_CPU_OPS(double)

}  // namespace glm::cpu
