// CUDA kernels on GLM-4-9B shapes (seq 4096 and 8192, one micro-batch) through the Backend
// interface, next to two ceilings measured in the same run: a large device-to-device copy (GB/s,
// bytes read + written) and a large bf16 GEMM through cuBLASLt (TFLOP/s). Each row reports its
// achieved rate and the fraction of the matching ceiling. Skips when no GPU is visible. Besides
// Google Benchmark's flags it takes the backend's kernel choices (BackendConfig) to compare variants:
//   --attention_kernel auto|mma  --attention_backward_head_chunk N  --attention_dq_vector_atomics true|false
//   --gemm_autotune off|large|all  --lm_head_scratch_mb N  --shared_memory_limit_kib N
#include <unistd.h>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/enum_names.h"
#include "data/context_split.h"
#include "model/backend.h"
#include "model/backend_config.h"
#include "model/glm4_model.h"

namespace {

using glm::AttentionShape;
using glm::Backend;
using glm::Buffer;
using glm::DType;
using glm::MicroBatchIndex;
using glm::Tensor;

glm::BackendConfig g_config;  // from the command line, before the first benchmark

Backend* gpu() {
  static std::unique_ptr<Backend> backend = [] {
    if (glm::cuda_device_count() == 0) return std::unique_ptr<Backend>();
    auto r = glm::make_cuda_backend(0, g_config);
    return r.is_ok() ? r.take() : std::unique_ptr<Backend>();
  }();
  return backend.get();
}

double g_copy_gbs = 0, g_gemm_tflops = 0;  // ceilings, measured first

Buffer filled(int64_t n, DType dtype, double value_std = 0.5, uint64_t key = 1) {
  Buffer b = gpu()->allocate(n, dtype).take();
  if (dtype == DType::i32 || dtype == DType::i16) return b;  // zeros
  if (!gpu()->fill_normal(b.tensor(), key, 0, value_std).is_ok()) std::abort();
  return b;
}

Buffer device_ints(const std::vector<int32_t>& v) {
  Buffer b = gpu()->allocate(static_cast<int64_t>(v.size()), DType::i32).take();
  if (!gpu()->upload(b.tensor(), v.data()).is_ok()) std::abort();
  return b;
}

// Runs fn once to warm up, then times iterations with device synchronisation around each batch.
template <typename Fn>
void time_loop(benchmark::State& state, Fn&& fn) {
  if (!fn().is_ok()) {
    state.SkipWithError("op failed");
    return;
  }
  (void)gpu()->synchronize();
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 5; ++i) (void)fn();
    (void)gpu()->synchronize();
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 5);
  }
}

void report_bytes(benchmark::State& state, double bytes) {
  state.counters["GB/s"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  if (g_copy_gbs > 0)
    state.counters["%copy"] =
        benchmark::Counter(100.0 * bytes / 1e9 / g_copy_gbs, benchmark::Counter::kIsIterationInvariantRate);
}
void report_flops(benchmark::State& state, double flops) {
  state.counters["TFLOP/s"] = benchmark::Counter(flops / 1e12, benchmark::Counter::kIsIterationInvariantRate);
  if (g_gemm_tflops > 0)
    state.counters["%gemm"] =
        benchmark::Counter(100.0 * flops / 1e12 / g_gemm_tflops, benchmark::Counter::kIsIterationInvariantRate);
}

#define REQUIRE_GPU(state)                         \
  if (gpu() == nullptr) {                          \
    state.SkipWithError("no CUDA device visible"); \
    return;                                        \
  }

void BM_CeilingCopy(benchmark::State& state) {
  REQUIRE_GPU(state);
  const int64_t n = int64_t{1} << 30;  // 2 GiB of bf16
  Buffer a = filled(n, DType::bf16), b = gpu()->allocate(n, DType::bf16).take();
  time_loop(state, [&] { return gpu()->convert(b.tensor(), a.tensor()); });
  report_bytes(state, 2.0 * 2 * n);  // read + write
}

void BM_CeilingGemm(benchmark::State& state) {
  REQUIRE_GPU(state);
  const int64_t m = 8192;
  Buffer x = filled(m * m, DType::bf16), w = filled(m * m, DType::bf16, 0.02, 2), y = filled(m * m, DType::bf16);
  time_loop(state, [&] { return gpu()->linear_forward(y.tensor(), x.tensor(), w.tensor(), Tensor{}, m, m, m); });
  report_flops(state, 2.0 * m * m * m);
}

constexpr int64_t kHidden = 4096, kFfn = 13696, kHeads = 32, kKv = 2, kHeadDim = 128, kVocab = 151552;

// Bytes counted for the memory-bound rows: the bf16 tensors each kernel must read and write once,
// nothing for what stays in cache (the weight vector, rstd, positions, RMSNorm backward's per-block
// dweight partials), so GB/s and %copy are a lower bound on the traffic the kernel really makes:
//   RMSNorm forward   read x, write out                               2 x 2 bytes x n x hidden
//   RMSNorm backward  read x, dout, din; write din (din += dx)        4 x 2 bytes x n x hidden
//   SwiGLU forward    read gate, up; write out                        3 x 2 bytes x n x ffn
//   SwiGLU backward   read gate, up, dout; write dgate, dup           5 x 2 bytes x n x ffn
//   RoPE              read and write the rotated half of q and k      2 x 2 bytes x n x (heads + kv) x 64
//   AdamW             see BM_AdamW

void BM_RmsNormForward(benchmark::State& state) {
  REQUIRE_GPU(state);
  const int64_t n = state.range(0);
  Buffer x = filled(n * kHidden, DType::bf16), w = filled(kHidden, DType::bf16), y = filled(n * kHidden, DType::bf16),
         r = filled(n, DType::f32);
  time_loop(state, [&] {
    return gpu()->rmsnorm_forward(y.tensor(), r.tensor(), x.tensor(), w.tensor(), n, kHidden, 1.5625e-7);
  });
  report_bytes(state, 2.0 * 2 * n * kHidden);
}

void BM_RmsNormBackward(benchmark::State& state) {
  REQUIRE_GPU(state);
  const int64_t n = state.range(0);
  Buffer x = filled(n * kHidden, DType::bf16), w = filled(kHidden, DType::bf16), dy = filled(n * kHidden, DType::bf16),
         dx = filled(n * kHidden, DType::bf16), dw = filled(kHidden, DType::bf16), r = filled(n, DType::f32, 0.1);
  time_loop(state, [&] {
    return gpu()->rmsnorm_backward(dx.tensor(), dw.tensor(), dy.tensor(), x.tensor(), w.tensor(), r.tensor(), n,
                                   kHidden);
  });
  report_bytes(state, 2.0 * 4 * n * kHidden);  // read x, dy, dx; write dx
}

void BM_SwigluForward(benchmark::State& state) {
  REQUIRE_GPU(state);
  const int64_t n = state.range(0);
  Buffer gu = filled(n * 2 * kFfn, DType::bf16), y = filled(n * kFfn, DType::bf16);
  time_loop(state, [&] { return gpu()->swiglu_forward(y.tensor(), gu.tensor(), n, kFfn); });
  report_bytes(state, 2.0 * 3 * n * kFfn);
}

void BM_SwigluBackward(benchmark::State& state) {
  REQUIRE_GPU(state);
  const int64_t n = state.range(0);
  Buffer gu = filled(n * 2 * kFfn, DType::bf16), dy = filled(n * kFfn, DType::bf16),
         dgu = filled(n * 2 * kFfn, DType::bf16);
  time_loop(state, [&] { return gpu()->swiglu_backward(dgu.tensor(), dy.tensor(), gu.tensor(), n, kFfn); });
  report_bytes(state, 2.0 * 5 * n * kFfn);
}

void BM_Rope(benchmark::State& state) {
  REQUIRE_GPU(state);
  const int64_t n = state.range(0), width = (kHeads + 2 * kKv) * kHeadDim;
  Buffer qkv = filled(n * width, DType::bf16), pos = gpu()->allocate(n, DType::i32).take();
  time_loop(state, [&] {
    return gpu()->rope_forward(qkv.tensor(), pos.tensor(), n, AttentionShape{kHeads, kKv, kHeadDim}, 64, 5e6);
  });
  report_bytes(state, 2.0 * 2 * n * (kHeads + kKv) * 64);  // the rotated half of q and k, read and written
}

// The embedding backward over n tokens drawn as text draws them (Zipf, exponent 1, over the
// vocabulary: the commonest token ~8% of positions) or, with skew > 0, one token at skew percent of
// the positions and the rest uniform: its runs of equal tokens decide the time.
void BM_EmbeddingBackward(benchmark::State& state) {
  REQUIRE_GPU(state);
  const int64_t n = state.range(0), skew = state.range(1);
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  std::vector<double> cdf;
  double total = 0;
  for (int64_t r = 1; r <= kVocab; ++r) cdf.push_back(total += 1.0 / static_cast<double>(r));
  uint64_t x = 88172645463325252ull;  // xorshift64
  auto uniform = [&] {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return static_cast<double>(x >> 11) / 9007199254740992.0;
  };
  for (auto& t : tokens) {
    if (skew > 0)
      t = uniform() * 100 < static_cast<double>(skew) ? 7 : static_cast<int32_t>(uniform() * kVocab);
    else
      t = static_cast<int32_t>(std::lower_bound(cdf.begin(), cdf.end(), uniform() * total) - cdf.begin());
  }
  const MicroBatchIndex ix = glm::index_micro_batch(tokens, std::vector<int32_t>(tokens.size(), -1));
  Buffer tok = device_ints(tokens), order = device_ints(ix.token_order), runs = device_ints(ix.token_runs);
  Buffer dout = filled(n * kHidden, DType::bf16), dtable = filled(kVocab * kHidden, DType::bf16, 0.0);
  time_loop(state, [&] {
    return gpu()->embedding_backward(dtable.tensor(), dout.tensor(), tok.tensor(), order.tensor(), runs.tensor(), n,
                                     kHidden);
  });
  const double touched = static_cast<double>(ix.token_runs.size() - 1);
  report_bytes(state, 2.0 * n * kHidden + 2.0 * 2 * touched * kHidden);  // read dout; read and write the rows
}

Buffer doc_starts(int64_t n) { return gpu()->allocate(n, DType::i32).take(); }  // zeros: one document


void BM_AttentionForward(benchmark::State& state) {
  REQUIRE_GPU(state);
  const int64_t n = state.range(0), width = (kHeads + 2 * kKv) * kHeadDim;
  Buffer qkv = filled(n * width, DType::bf16), out = filled(n * kHeads * kHeadDim, DType::bf16),
         lse = filled(n * kHeads, DType::f32), doc = doc_starts(n);
  time_loop(state, [&] {
    return gpu()->attention_forward(out.tensor(), lse.tensor(), qkv.tensor(), doc.tensor(), n,
                                    AttentionShape{kHeads, kKv, kHeadDim});
  });
  report_flops(state, 2.0 * n * n * kHeadDim * kHeads);  // causal: half of 4 n^2 d per head
}

void BM_AttentionBackward(benchmark::State& state) {
  REQUIRE_GPU(state);
  const int64_t n = state.range(0), width = (kHeads + 2 * kKv) * kHeadDim;
  const AttentionShape s{kHeads, kKv, kHeadDim};
  Buffer qkv = filled(n * width, DType::bf16), out = filled(n * kHeads * kHeadDim, DType::bf16),
         lse = filled(n * kHeads, DType::f32), doc = doc_starts(n), dout = filled(n * kHeads * kHeadDim, DType::bf16),
         dqkv = filled(n * width, DType::bf16);
  if (!gpu()->attention_forward(out.tensor(), lse.tensor(), qkv.tensor(), doc.tensor(), n, s).is_ok()) std::abort();
  time_loop(state, [&] {
    return gpu()->attention_backward(dqkv.tensor(), dout.tensor(), out.tensor(), lse.tensor(), qkv.tensor(),
                                     doc.tensor(), n, s);
  });
  report_flops(state, 5.0 * n * n * kHeadDim * kHeads);  // causal: 2.5 x the forward
}

// Context parallelism's cross-rank attention (one rank's side: the all-gather is bench_comm's):
// the zigzag share of rank range(2) of a group of range(1) over a range(0)-token row, one document,
// forward (range(3) 0) or backward (1), against the keys and values of the whole row. Ideal: the
// whole row's time (BM_Attention* at the row's length) over the group size, for every rank alike.
void BM_AttentionGathered(benchmark::State& state) {
  REQUIRE_GPU(state);
  const int64_t row = state.range(0), width = (kHeads + 2 * kKv) * kHeadDim, kvw = 2 * kKv * kHeadDim;
  const int group = static_cast<int>(state.range(1));
  const bool backward = state.range(3) != 0;
  const AttentionShape s{kHeads, kKv, kHeadDim};
  const std::vector<int32_t> pos = glm::ContextSplit{group, static_cast<int>(state.range(2))}.positions(row);
  const std::vector<int32_t> kv_rows = glm::ContextSplit::gathered_rows(row, group);
  const int64_t n = static_cast<int64_t>(pos.size());
  Buffer qkv = filled(n * width, DType::bf16), kv = filled(row * kvw, DType::bf16, 0.5, 2),
         out = filled(n * kHeads * kHeadDim, DType::bf16), lse = filled(n * kHeads, DType::f32),
         dout = filled(n * kHeads * kHeadDim, DType::bf16, 0.5, 3), dqkv = filled(n * width, DType::bf16),
         dkv = filled(row * kvw, DType::bf16, 0.0), doc = doc_starts(n), position = device_ints(pos),
         rows = device_ints(kv_rows);
  auto forward = [&] {
    return gpu()->attention_forward_gathered(out.tensor(), lse.tensor(), qkv.tensor(), kv.tensor(), rows.tensor(),
                                             position.tensor(), doc.tensor(), n, s);
  };
  if (!forward().is_ok()) {
    state.SkipWithError("gathered attention failed");
    return;
  }
  if (backward)
    time_loop(state, [&] {
      return gpu()->attention_backward_gathered(dqkv.tensor(), dkv.tensor(), dout.tensor(), out.tensor(), lse.tensor(),
                                                qkv.tensor(), kv.tensor(), rows.tensor(), position.tensor(),
                                                doc.tensor(), n, s);
    });
  else
    time_loop(state, forward);
  double visible = 0;  // (query, key) pairs under the causal mask
  for (const int32_t p : pos) visible += static_cast<double>(p) + 1;
  report_flops(state, (backward ? 10.0 : 4.0) * visible * kHeadDim * kHeads);
}

// Generation's chunked prefill (glm_hpc infer): the last range(1) tokens of a range(0)-token prompt
// against the cache rows of the whole prompt (GLM-4-9B-Chat's heads, one layer), the rows read
// through a row index each (range(2) 1: kv_rows, as paged rows are) or as one run (0: kv_rows
// without data, as a fresh cache hands a sequence's rows out). Ideal: the whole-row forward's
// TFLOP/s (BM_AttentionForward at the prompt's length).
void BM_AttentionPrefillChunk(benchmark::State& state) {
  REQUIRE_GPU(state);
  const int64_t row = state.range(0), n = state.range(1), width = (kHeads + 2 * kKv) * kHeadDim;
  const int64_t kvw = 2 * kKv * kHeadDim;
  std::vector<int32_t> kv_rows(static_cast<size_t>(row)), pos(static_cast<size_t>(n));
  std::iota(kv_rows.begin(), kv_rows.end(), 0);
  std::iota(pos.begin(), pos.end(), static_cast<int32_t>(row - n));
  Buffer qkv = filled(n * width, DType::bf16), kv = filled(row * kvw, DType::bf16, 0.5, 2),
         out = filled(n * kHeads * kHeadDim, DType::bf16), lse = filled(n * kHeads, DType::f32),
         doc = doc_starts(n), position = device_ints(pos), rows = device_ints(kv_rows);
  const Tensor index = state.range(2) != 0 ? rows.tensor() : Tensor{nullptr, 0, DType::i32};
  time_loop(state, [&] {
    return gpu()->attention_forward_gathered(out.tensor(), lse.tensor(), qkv.tensor(), kv.tensor(), index,
                                             position.tensor(), doc.tensor(), n, AttentionShape{kHeads, kKv, kHeadDim});
  });
  double visible = 0;  // (query, key) pairs under the causal mask
  for (const int32_t p : pos) visible += static_cast<double>(p) + 1;
  report_flops(state, 4.0 * visible * kHeadDim * kHeads);
}

// Generation's decode attention (glm_hpc infer): range(0) sequences of range(1) cached keys each,
// one new query a sequence, GLM-4-9B-Chat's heads; each sequence's rows contiguous in the cache, as
// a fresh cache hands them out. Bytes: the keys and values read; one layer's call of a decode step.
void BM_DecodeAttention(benchmark::State& state) {
  REQUIRE_GPU(state);
  const int64_t n = state.range(0), keys = state.range(1), width = (kHeads + 2 * kKv) * kHeadDim;
  const int64_t kvw = 2 * kKv * kHeadDim;
  std::vector<int32_t> kv_rows, position, doc_start;
  for (int64_t q = 0; q < n; ++q) {
    for (int64_t p = 0; p < keys; ++p) kv_rows.push_back(static_cast<int32_t>(q * keys + p));
    doc_start.push_back(static_cast<int32_t>(q * keys));
    position.push_back(static_cast<int32_t>(q * keys + keys - 1));
  }
  Buffer qkv = filled(n * width, DType::bf16), kv = filled(n * keys * kvw, DType::bf16),
         out = filled(n * kHeads * kHeadDim, DType::bf16), lse = filled(n * kHeads, DType::f32),
         rows = device_ints(kv_rows), pos = device_ints(position), docs = device_ints(doc_start);
  time_loop(state, [&] {
    return gpu()->attention_decode(out.tensor(), lse.tensor(), qkv.tensor(), kv.tensor(), rows.tensor(), pos.tensor(),
                                   docs.tensor(), n, AttentionShape{kHeads, kKv, kHeadDim});
  });
  report_bytes(state, 2.0 * static_cast<double>(n * keys * kvw));
}

// A decode step's linear layers (glm_hpc infer): range(0) rows (one token a sequence) through the
// weights of GLM-4-9B-Chat's layer matrix range(1) (0 q|k|v with its bias, 1 o, 2 gate|up, 3 down);
// bytes: the weights, read once whatever the rows (the GEMV up to kGemvMaxRows, cuBLASLt beyond).
void BM_LinearFewRows(benchmark::State& state) {
  REQUIRE_GPU(state);
  const int64_t n = state.range(0);
  const int64_t shapes[4][2] = {{kHidden, (kHeads + 2 * kKv) * kHeadDim}, {kHidden, kHidden}, {kHidden, 2 * kFfn},
                                {kFfn, kHidden}};
  const int64_t in_f = shapes[state.range(1)][0], out_f = shapes[state.range(1)][1];
  Buffer x = filled(n * in_f, DType::bf16), w = filled(out_f * in_f, DType::bf16, 0.02),
         y = filled(n * out_f, DType::bf16), bias = filled(out_f, DType::bf16, 0.02);
  const bool biased = state.range(1) == 0;  // GLM-4's q|k|v bias
  time_loop(state, [&] {
    return gpu()->linear_forward(y.tensor(), x.tensor(), w.tensor(), biased ? bias.tensor() : Tensor{}, n, in_f,
                                 out_f);
  });
  report_bytes(state, 2.0 * static_cast<double>(in_f * out_f));
}

// Generation's norm + linear (+ SwiGLU) at range(0) rows: GLM-4-9B-Chat's q|k|v with its bias
// (range(1) 0) or gate|up with the SwiGLU (1); range(2) 1 runs Backend::normed_linear_forward as
// the backend does it (the GEMV with the norm and SwiGLU fused, for one row), 0 the
// separate ops (RMSNorm, linear, SwiGLU). bytes: the weights.
void BM_NormedLinear(benchmark::State& state) {
  REQUIRE_GPU(state);
  const int64_t n = state.range(0);
  const bool swiglu = state.range(1) == 1, fused = state.range(2) == 1;
  const int64_t out_f = swiglu ? 2 * kFfn : (kHeads + 2 * kKv) * kHeadDim;
  Buffer x = filled(n * kHidden, DType::bf16), g = filled(kHidden, DType::bf16),
         w = filled(out_f * kHidden, DType::bf16, 0.02), bias = filled(out_f, DType::bf16, 0.02),
         y = filled(n * out_f, DType::bf16), normed = filled(n * kHidden, DType::bf16), rstd = filled(n, DType::f32),
         gate_up = filled(n * out_f, DType::bf16);
  time_loop(state, [&] {
    Backend* b = gpu();
    const Tensor bias_t = swiglu ? Tensor{} : bias.tensor();
    if (fused)
      return b->normed_linear_forward(y.tensor(), x.tensor(), g.tensor(), 1e-5, w.tensor(), bias_t, swiglu, n, kHidden,
                                      out_f, normed.tensor(), rstd.tensor(), gate_up.tensor());
    return b->Backend::normed_linear_forward(y.tensor(), x.tensor(), g.tensor(), 1e-5, w.tensor(), bias_t, swiglu, n,
                                             kHidden, out_f, normed.tensor(), rstd.tensor(), gate_up.tensor());
  });
  report_bytes(state, 2.0 * static_cast<double>(kHidden * out_f));
}

// Generation's RoPE and KV-cache store of n tokens: GLM-4-9B-Chat's heads, a 4096-row cache filled
// from its last row down, positions from 700.
struct RopeStoreFixture {
  Buffer cache, staging, positions, rows;
  glm::RopeStore store;
  bool ok = false;
  explicit RopeStoreFixture(int64_t n) {
    const int64_t kv_width = 2 * kKv * kHeadDim;
    cache = filled(4096 * kv_width, DType::bf16);
    staging = filled(n * kv_width, DType::bf16);
    positions = gpu()->allocate(n, DType::i32).take();
    rows = gpu()->allocate(n, DType::i32).take();
    std::vector<int32_t> host_positions(static_cast<size_t>(n)), host_rows(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      host_positions[static_cast<size_t>(i)] = static_cast<int32_t>(700 + i);
      host_rows[static_cast<size_t>(i)] = static_cast<int32_t>(4095 - i);
    }
    ok = gpu()->upload(positions.tensor(), host_positions.data()).is_ok() &&
         gpu()->upload(rows.tensor(), host_rows.data()).is_ok();
    store.positions = positions.tensor();
    store.shape = AttentionShape{kHeads, kKv, kHeadDim};
    store.rotary_dim = kHeadDim / 2;
    store.base = 5e6;
    store.cache = cache.tensor();
    store.cache_rows = rows.tensor();
    store.staging = staging.tensor();
  }
};

// Generation's RoPE and KV-cache store of range(0) tokens: range(1) 1 Backend::rope_store as the
// backend does it (one kernel on CUDA), 0 the separate ops (RoPE, the k | v columns copied out,
// scattered into the rows).
void BM_RopeStore(benchmark::State& state) {
  REQUIRE_GPU(state);
  const int64_t n = state.range(0), width = (kHeads + 2 * kKv) * kHeadDim, kv_width = 2 * kKv * kHeadDim;
  const bool fused = state.range(1) == 1;
  Buffer qkv = filled(n * width, DType::bf16);
  RopeStoreFixture f(n);
  if (!f.ok) {
    state.SkipWithError("upload failed");
    return;
  }
  time_loop(state, [&] {
    Backend* b = gpu();
    return fused ? b->rope_store(qkv.tensor(), n, f.store) : b->Backend::rope_store(qkv.tensor(), n, f.store);
  });
  report_bytes(state, 2.0 * static_cast<double>(n * (width + kv_width)));
}

// A decode step's attention linear of one token (GLM-4-9B-Chat's q|k|v with its bias) with the norm
// before it and the RoPE and KV-cache store after it: range(0) 2 as the backend runs it (one GEMV
// kernel on CUDA), 1 the GEMV with the norm, then rope_store (two kernels), 0 every op apart.
// bytes: the weights.
void BM_NormedLinearRopeStore(benchmark::State& state) {
  REQUIRE_GPU(state);
  const int64_t form = state.range(0), out_f = (kHeads + 2 * kKv) * kHeadDim;
  Buffer x = filled(kHidden, DType::bf16), g = filled(kHidden, DType::bf16),
         w = filled(out_f * kHidden, DType::bf16, 0.02), bias = filled(out_f, DType::bf16, 0.02),
         y = filled(out_f, DType::bf16), normed = filled(kHidden, DType::bf16), rstd = filled(1, DType::f32);
  RopeStoreFixture f(1);
  if (!f.ok) {
    state.SkipWithError("upload failed");
    return;
  }
  time_loop(state, [&] {
    Backend* b = gpu();
    if (form == 2)
      return b->normed_linear_forward(y.tensor(), x.tensor(), g.tensor(), 1e-5, w.tensor(), bias.tensor(), false, 1,
                                      kHidden, out_f, normed.tensor(), rstd.tensor(), Tensor{}, &f.store);
    if (form == 1) {
      const glm::Status s = b->normed_linear_forward(y.tensor(), x.tensor(), g.tensor(), 1e-5, w.tensor(),
                                                     bias.tensor(), false, 1, kHidden, out_f, normed.tensor(),
                                                     rstd.tensor(), Tensor{});
      return s.is_ok() ? b->rope_store(y.tensor(), 1, f.store) : s;
    }
    return b->Backend::normed_linear_forward(y.tensor(), x.tensor(), g.tensor(), 1e-5, w.tensor(), bias.tensor(), false,
                                             1, kHidden, out_f, normed.tensor(), rstd.tensor(), Tensor{}, &f.store);
  });
  report_bytes(state, 2.0 * static_cast<double>(kHidden * out_f));
}

void BM_LmHeadCrossEntropy(benchmark::State& state) {
  REQUIRE_GPU(state);
  const int64_t n = state.range(0);
  Buffer h = filled(n * kHidden, DType::bf16), w = filled(kVocab * kHidden, DType::bf16, 0.02),
         dw = filled(kVocab * kHidden, DType::bf16, 0.0), dh = filled(n * kHidden, DType::bf16),
         losses = filled(n, DType::f32), targets = gpu()->allocate(n, DType::i32).take();
  time_loop(state, [&] {
    return gpu()->lm_head_cross_entropy(losses.tensor(), Tensor{}, dh.tensor(), dw.tensor(), h.tensor(), w.tensor(),
                                        targets.tensor(), n, kHidden, kVocab, 1.0 / n, true);
  });
  report_flops(state, 6.0 * n * kHidden * kVocab);
}

void BM_AdamW(benchmark::State& state) {
  REQUIRE_GPU(state);
  const int64_t n = int64_t{1} << 28;
  Buffer p = filled(n, DType::bf16), g = filled(n, DType::bf16), master = filled(n, DType::f32),
         m = filled(n, DType::f32, 0.0), v = filled(n, DType::f32, 0.0);
  glm::AdamWStep step;
  step.lr = 1e-5;
  step.step = 10;
  time_loop(state, [&] {
    return gpu()->adamw(p.tensor(), master.tensor(), g.tensor(), m.tensor(), v.tensor(), step, glm::Tensor{});
  });
  report_bytes(state, 28.0 * n);  // read grad 2, master 4, m 4, v 4; write master, m, v 12, param 2
}

// The master split into the bf16 parameters and 16-bit low halves (kernels/master_split.h).
void BM_AdamWSplitMaster(benchmark::State& state) {
  REQUIRE_GPU(state);
  const int64_t n = int64_t{1} << 28;
  Buffer p = filled(n, DType::bf16), g = filled(n, DType::bf16), lo = filled(n, DType::i16, 0.0),
         m = filled(n, DType::f32, 0.0), v = filled(n, DType::f32, 0.0);
  glm::AdamWStep step;
  step.lr = 1e-5;
  step.step = 10;
  time_loop(state, [&] {
    return gpu()->adamw(p.tensor(), lo.tensor(), g.tensor(), m.tensor(), v.tensor(), step, glm::Tensor{});
  });
  report_bytes(state, 26.0 * n);  // read grad, param, low halves 6, m, v 8; write param, low halves 4, m, v 8
}

// The embedding's deferred rows (GLM-4's 151,552 x 4,096 table, split masters, weight decay 0.1):
// the catch-up of a step's rows (args: row count, missed steps each, moments) or, with 0 rows,
// every row (a settle). A missed step costs the update's arithmetic (two divisions and a square
// root an element) without its traffic, or one multiply where the moments are zero (rows no token
// has reached: third arg 0); rows' bytes counted once (2 + 2 + 8 read, the same written).
// Gelem-steps/s is rows x 4096 x steps a second.
void BM_AdamWRows(benchmark::State& state) {
  REQUIRE_GPU(state);
  const int64_t listed = state.range(0), steps = state.range(1);
  const bool moments = state.range(2) != 0;
  const int64_t rows = listed > 0 ? listed : kVocab, n = kVocab * kHidden;
  Buffer p = filled(n, DType::bf16), lo = filled(n, DType::i16, 0.0), m = filled(n, DType::f32, 0.01),
         v = filled(n, DType::f32, 0.0), row_step = filled(kVocab, DType::i32), list = filled(rows, DType::i32);
  if (moments) {  // v: the square of m's scale
    if (!gpu()->fill(v.tensor(), 1e-4).is_ok()) std::abort();
  } else if (!gpu()->zero(m.tensor()).is_ok() || !gpu()->zero(v.tensor()).is_ok()) {
    std::abort();
  }
  std::vector<int32_t> ids(static_cast<size_t>(kVocab));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  uint64_t state_bits = 7;
  for (size_t i = ids.size(); i > 1; --i) {  // a random distinct subset, in random order
    state_bits = state_bits * 6364136223846793005ull + 1442695040888963407ull;
    std::swap(ids[i - 1], ids[(state_bits >> 33) % i]);
  }
  if (!gpu()->upload(list.tensor(), ids.data()).is_ok()) std::abort();
  std::vector<glm::AdamWStep> history(static_cast<size_t>(steps));
  for (int64_t k = 0; k < steps; ++k) {
    history[static_cast<size_t>(k)].lr = 1e-5;
    history[static_cast<size_t>(k)].weight_decay = 0.1;
    history[static_cast<size_t>(k)].step = k + 1;
  }
  glm::AdamWRows r;
  r.rows = listed > 0 ? list.tensor() : glm::Tensor{};
  r.count = rows;
  r.width = kHidden;
  r.row_step = row_step.tensor();
  r.history = history;
  r.until = steps;
  time_loop(state, [&] {
    if (listed > 0) GLM_RETURN_IF_ERROR(gpu()->zero(row_step.tensor()));  // every listed row behind again
    return gpu()->adamw_rows(p.tensor(), lo.tensor(), glm::Tensor{}, m.tensor(), v.tensor(), r, glm::Tensor{});
  });
  report_bytes(state, 24.0 * rows * kHidden);
  state.counters["Gelem-steps/s"] = benchmark::Counter(static_cast<double>(rows * kHidden * steps) / 1e9,
                                                       benchmark::Counter::kIsIterationInvariantRate);
}

// The ceilings must be known before the rest: run them first and keep their rates.
class CeilingReporter : public benchmark::ConsoleReporter {
 public:
  explicit CeilingReporter(OutputOptions options) : ConsoleReporter(options) {}
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& r : runs) {
      if (r.benchmark_name().rfind("BM_CeilingCopy", 0) == 0 && r.counters.count("GB/s"))
        g_copy_gbs = r.counters.at("GB/s");
      if (r.benchmark_name().rfind("BM_CeilingGemm", 0) == 0 && r.counters.count("TFLOP/s"))
        g_gemm_tflops = r.counters.at("TFLOP/s");
    }
    ConsoleReporter::ReportRuns(runs);
  }
};

BENCHMARK(BM_CeilingCopy)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CeilingGemm)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RmsNormForward)->Arg(4096)->Arg(8192)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RmsNormBackward)->Arg(4096)->Arg(8192)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SwigluForward)->Arg(4096)->Arg(8192)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SwigluBackward)->Arg(4096)->Arg(8192)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_EmbeddingBackward)
    ->Args({4096, 0})
    ->Args({4096, 30})
    ->Args({65536, 0})
    ->Args({65536, 30})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Rope)->Arg(4096)->Arg(8192)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AttentionForward)->Arg(4096)->Arg(8192)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AttentionBackward)->Arg(4096)->Arg(8192)->UseManualTime()->Unit(benchmark::kMillisecond);
// A 32k and a 128k row over 4 ranks: each share against the whole row (ranks 0 and 3 hold the
// lightest and the heaviest chunk); the whole row for comparison (ideal share: its time over 4; a
// 128k row's share does the work of a 64k whole row). Group 1: the gathered kernels on a whole row,
// the same work as the whole-row kernels.
BENCHMARK(BM_AttentionForward)->Arg(32768)->Arg(65536)->Arg(131072)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AttentionBackward)->Arg(32768)->Arg(65536)->Arg(131072)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AttentionGathered)
    ->ArgsProduct({{32768, 131072}, {4}, {0, 3}, {0, 1}})
    ->Args({32768, 1, 0, 0})
    ->Args({32768, 1, 0, 1})
    ->ArgNames({"row", "group", "rank", "backward"})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AttentionPrefillChunk)
    ->Args({32768, 8192, 1})
    ->Args({32768, 8192, 0})
    ->ArgNames({"prompt", "chunk", "indexed"})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
// One sequence and 32 at a chat's length and at 32k (the single-sequence and the batch kernels).
BENCHMARK(BM_DecodeAttention)
    ->Args({1, 768})
    ->Args({8, 768})
    ->Args({32, 768})
    ->Args({1, 32768})
    ->Args({32, 4096})
    ->ArgNames({"n", "keys"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LinearFewRows)
    ->ArgsProduct({{1, 2, 3, 4, 5, 8, 9, 16, 32, 64}, {0, 1, 2, 3}})
    ->ArgNames({"rows", "matrix"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_NormedLinear)
    ->ArgsProduct({{1, 2}, {0, 1}, {0, 1}})
    ->ArgNames({"rows", "swiglu", "fused"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RopeStore)
    ->ArgsProduct({{1, 32, 512}, {0, 1}})
    ->ArgNames({"n", "fused"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_NormedLinearRopeStore)
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->ArgName("form")
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LmHeadCrossEntropy)->Arg(4096)->Arg(8192)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AdamW)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AdamWSplitMaster)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AdamWRows)
    ->Args({4040, 1, 1})
    ->Args({4040, 32, 1})
    ->Args({4040, 64, 1})
    ->Args({0, 64, 1})
    ->Args({4040, 32, 0})
    ->Args({0, 64, 0})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// Takes the BackendConfig flags out of argv (Google Benchmark has removed its own); anything else
// left is an error.
bool parse_backend_flags(int argc, char** argv) {
  auto fail = [](std::string_view flag, std::string_view why) {
    std::fprintf(stderr, "bench_kernels: %.*s %.*s\n", static_cast<int>(flag.size()), flag.data(),
                 static_cast<int>(why.size()), why.data());
    return false;
  };
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i], value;
    if (const size_t eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg.resize(eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return fail(arg, "needs a value");
    }
    char* end = nullptr;
    const long long number = std::strtoll(value.c_str(), &end, 10);
    const bool integer = !value.empty() && *end == '\0';
    if (arg == "--attention_kernel") {
      const auto k = glm::enum_from_name<glm::AttentionKernel>(value);
      if (!k) return fail(arg, "must be " + glm::enum_choices<glm::AttentionKernel>());
      g_config.attention_kernel = *k;
    } else if (arg == "--gemm_autotune") {
      const auto t = glm::enum_from_name<glm::GemmAutotune>(value);
      if (!t) return fail(arg, "must be " + glm::enum_choices<glm::GemmAutotune>());
      g_config.gemm_autotune = *t;
    } else if (arg == "--attention_backward_head_chunk") {
      if (!integer || number < 1) return fail(arg, "must be a positive integer");
      g_config.attention_backward_head_chunk = static_cast<int>(number);
    } else if (arg == "--attention_dq_vector_atomics") {
      if (value != "true" && value != "false") return fail(arg, "must be true or false");
      g_config.attention_dq_vector_atomics = value == "true";
    } else if (arg == "--shared_memory_limit_kib") {
      if (!integer || number < 0) return fail(arg, "must be a number of KiB (0: the GPU's)");
      g_config.shared_memory_limit_kib = static_cast<int>(number);
    } else if (arg == "--lm_head_scratch_mb") {
      if (!integer || number < 1) return fail(arg, "must be a positive number of MiB");
      g_config.lm_head_scratch_bytes = static_cast<int64_t>(number) << 20;
    } else {
      return fail(arg, "is not a flag of bench_kernels (see the comment at the top of bench_kernels.cpp)");
    }
  }
  std::printf(
      "bench_kernels: attention_kernel %s, attention_backward_head_chunk %d, attention_dq_vector_atomics %s, "
      "gemm_autotune %s, lm_head_scratch_mb %lld, shared_memory_limit_kib %d\n",
      std::string(glm::enum_name(g_config.attention_kernel)).c_str(), g_config.attention_backward_head_chunk,
      g_config.attention_dq_vector_atomics ? "true" : "false",
      std::string(glm::enum_name(g_config.gemm_autotune)).c_str(),
      static_cast<long long>(g_config.lm_head_scratch_bytes >> 20), g_config.shared_memory_limit_kib);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (!parse_backend_flags(argc, argv)) return 2;
  // Colours only on a terminal: a reporter of our own does not read --benchmark_color.
  CeilingReporter reporter(isatty(STDOUT_FILENO) ? benchmark::ConsoleReporter::OO_Defaults
                                                 : benchmark::ConsoleReporter::OO_Tabular);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
