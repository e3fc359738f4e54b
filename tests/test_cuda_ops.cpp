// Every CUDA op against the CPU reference on random inputs (odd sizes, packed documents, GQA),
// outputs poisoned before the run; then the whole tiny model, and the transformers parity fixtures
// in bf16. Skipped where no GPU is visible (compiled everywhere).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>

#include "data/context_split.h"
#include "io/hf_import.h"
#include "io/safetensors.h"
#include "kernels/cuda/decode_attention.cuh"
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/flash_attention_sm90.cuh"
#include "kernels/cuda/gemm.cuh"
#include "base/bf16.h"
#include "base/thread_pool.h"
#include "kernels/cpu/host_adamw.h"
#include "kernels/master_split.h"
#include "model/backend.h"
#include "mpi/local_communicator.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/engine.h"

namespace glm::test {
namespace {
namespace fs = std::filesystem;

// Inputs are rounded to bf16 for both backends; the GPU computes in fp32 and rounds each output
// to bf16 (2^-9 relative), so single ops agree to well under 1e-2 norm-wise.
constexpr double kBf16OpTolerance = 1e-2;
// Through the whole model bf16 activations compound: loss to 1e-2, gradients to 5e-2.
constexpr double kBf16LossTolerance = 1e-2;
constexpr double kBf16GradTolerance = 5e-2;
// Over many steps the trajectories drift: bf16 working weights round small updates away (a norm
// weight near 1 moves in steps of 2^-7) and memorising one batch at lr 2e-3 is chaotic. Measured
// on an H200: within 1.2% over the first 10 steps; single later steps up to 3.6% apart in either
// direction. So: each of the first 10 steps within 3%, the mean of the last 5 within 5%.
constexpr double kBf16TrajectoryTolerance = 3e-2;
constexpr double kBf16LateMeanTolerance = 5e-2;

#define REQUIRE_GPU()                                                       \
  do {                                                                      \
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible"; \
  } while (0)

float round_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  bits &= 0xffff0000u;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::vector<float> random_bf16(size_t n, uint64_t seed, double scale = 1.0) {
  auto d = random_vector(n, seed, scale);
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = round_bf16(static_cast<float>(d[i]));
  return f;
}

// The kernel paths of the GPUs users own, forced on this one: the A100's shared memory (163 KiB per
// block) and the RTX 4090's or A6000's (99 KiB), with Hopper's wgmma kernels off; the kernels that
// fit run as they would there.
struct DeviceProfile {
  const char* name;
  int shared_memory_limit_kib;  // 0: this GPU's own
  AttentionKernel attention = AttentionKernel::auto_select;
  BackendConfig config() const {
    BackendConfig c;
    c.shared_memory_limit_kib = shared_memory_limit_kib;
    c.attention_kernel = attention;
    return c;
  }
};
const DeviceProfile kProfiles[] = {
    {"this_gpu", 0}, {"a100", 163, AttentionKernel::mma}, {"rtx4090", 99, AttentionKernel::mma}};
void PrintTo(const DeviceProfile& p, std::ostream* os) { *os << p.name; }

// One logical tensor on both backends: f32 on the CPU, dtype on the GPU.
class Ops : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
    cpu_ = make_cpu_backend(DType::f32);
    auto g = make_cuda_backend(0, gpu_config());
    ASSERT_TRUE(g.is_ok()) << g.status().message();
    gpu_ = g.take();
  }
  // The GPU backend's settings: a suite parametrized by DeviceProfile runs another GPU's kernels.
  virtual BackendConfig gpu_config() const { return {}; }
  struct Dual {
    Buffer cpu, gpu;
  };
  Dual dual(const std::vector<float>& host, DType gpu_dtype = DType::bf16) {
    Dual d;
    const int64_t n = static_cast<int64_t>(host.size());
    d.cpu = cpu_->allocate(n, DType::f32).take();
    EXPECT_TRUE(cpu_->upload(d.cpu.tensor(), host.data()).is_ok());
    d.gpu = gpu_->allocate(n, gpu_dtype).take();
    Buffer staging = gpu_->allocate(n, DType::f32).take();
    EXPECT_TRUE(gpu_->upload(staging.tensor(), host.data()).is_ok());
    EXPECT_TRUE(gpu_->convert(d.gpu.tensor(), staging.tensor()).is_ok());
    return d;
  }
  // An output the op must overwrite: NaN on the GPU, so an unwritten element fails the check.
  Dual output(int64_t n, DType gpu_dtype = DType::bf16) {
    return dual(std::vector<float>(static_cast<size_t>(n), NAN), gpu_dtype);
  }
  Dual ints(const std::vector<int32_t>& host) {
    Dual d;
    const int64_t n = static_cast<int64_t>(host.size());
    d.cpu = cpu_->allocate(n, DType::i32).take();
    d.gpu = gpu_->allocate(n, DType::i32).take();
    EXPECT_TRUE(cpu_->upload(d.cpu.tensor(), host.data()).is_ok());
    EXPECT_TRUE(gpu_->upload(d.gpu.tensor(), host.data()).is_ok());
    return d;
  }
  std::vector<float> from_gpu(const Buffer& b) {
    Buffer staging = gpu_->allocate(b.numel(), DType::f32).take();
    EXPECT_TRUE(gpu_->convert(staging.tensor(), b.tensor()).is_ok());
    std::vector<float> out(static_cast<size_t>(b.numel()));
    EXPECT_TRUE(gpu_->download(out.data(), staging.tensor()).is_ok());
    return out;
  }
  static std::vector<float> from_cpu(const Buffer& b) {
    const float* p = b.tensor().as<float>();
    return std::vector<float>(p, p + b.numel());
  }
  void expect_close(const Dual& d, const char* what, double tolerance = kBf16OpTolerance) {
    const double err = relative_error(from_gpu(d.gpu), from_cpu(d.cpu));
    EXPECT_LT(err, tolerance) << what;
  }
  std::unique_ptr<Backend> cpu_, gpu_;
};

// Decode attention (kernels/cuda/decode_attention.cuh) against the CPU's gathered attention: one
// query per sequence, sequences of 1 to 2,600 keys (one split up to many, chunks of 16 keys cut by
// the end), rows of a paged cache in random order, GLM-4-9B-Chat's group of 16 heads, the 1M model's
// 8, a group of 32 (two tiles of heads) at head_dim 256, and small odd shapes (head_dim 40 and 16,
// padded to the kernel's 64); every row of out and lse. A batch of six sequences (a cluster of 8
// splits on Hopper, where the short ones leave splits empty), single sequences of 200 and 700 keys
// (clusters of 4 and 8), 1,100 and 2,600 (the merge kernel). On each device profile: this GPU's
// kernels (on Hopper the cluster merge) and the mma ones of the A100 and RTX 4090 (the merge kernel).
// Each call runs twice for the same bits.
class DecodeAttention : public Ops, public ::testing::WithParamInterface<DeviceProfile> {
 protected:
  BackendConfig gpu_config() const override { return GetParam().config(); }
};
TEST_P(DecodeAttention, MatchesTheGatheredReference) {
  std::printf("decode attention clusters %s on this GPU\n",
              cuda::decode_attention_clusters_available() ? "available" : "not available");
  const AttentionShape shapes[] = {{32, 2, 128}, {32, 4, 128}, {6, 2, 64}, {3, 3, 16}, {64, 2, 256}, {10, 2, 40}};
  const std::vector<int64_t> batches[] = {{1, 7, 300, 1100, 2600, 257}, {200}, {700}, {1100}, {2600}, {7}};
  for (const std::vector<int64_t>& lengths : batches)
    for (const AttentionShape& s : shapes) {
    SCOPED_TRACE(s.heads * 1000 + s.kv_heads * 100 + s.head_dim + 100000 * static_cast<int>(lengths.size()));
    const int64_t n = static_cast<int64_t>(lengths.size()), width = s.qkv_width(), qw = s.heads * s.head_dim;
    const int64_t kvw = 2 * s.kv_heads * s.head_dim;
    int64_t total = 0;
    for (const int64_t l : lengths) total += l;
    std::vector<int32_t> rows(static_cast<size_t>(total + 9));  // spare rows: the cache is larger
    std::iota(rows.begin(), rows.end(), 0);
    std::mt19937 rng(static_cast<uint32_t>(s.head_dim + s.heads));
    std::shuffle(rows.begin(), rows.end(), rng);
    std::vector<int32_t> kv_rows, position, doc_start;
    for (int64_t q = 0, start = 0; q < n; ++q) {  // sequence q: row positions [start, start + length)
      for (int64_t p = 0; p < lengths[static_cast<size_t>(q)]; ++p)
        kv_rows.push_back(rows[static_cast<size_t>(start + p)]);
      doc_start.push_back(static_cast<int32_t>(start));
      start += lengths[static_cast<size_t>(q)];
      position.push_back(static_cast<int32_t>(start - 1));
    }
    const std::vector<float> qkv = random_bf16(static_cast<size_t>(n * width), 81 + s.head_dim, 1.5);
    const std::vector<float> cache = random_bf16(rows.size() * static_cast<size_t>(kvw), 82 + s.head_dim);
    auto q = dual(qkv);
    auto kv = dual(cache);
    auto kr = ints(kv_rows), pos = ints(position), docs = ints(doc_start);
    auto out = output(n * qw);
    auto lse = output(n * s.heads, DType::f32);
    ASSERT_TRUE(cpu_->attention_forward_gathered(out.cpu.tensor(), lse.cpu.tensor(), q.cpu.tensor(), kv.cpu.tensor(),
                                                 kr.cpu.tensor(), pos.cpu.tensor(), docs.cpu.tensor(), n, s)
                    .is_ok());
    auto again = output(n * qw);
    auto again_lse = output(n * s.heads, DType::f32);
    for (Dual* o : {&out, &again}) {
      Dual* l = o == &out ? &lse : &again_lse;
      const Status st = gpu_->attention_decode(o->gpu.tensor(), l->gpu.tensor(), q.gpu.tensor(), kv.gpu.tensor(),
                                               kr.gpu.tensor(), pos.gpu.tensor(), docs.gpu.tensor(), n, s);
      ASSERT_TRUE(st.is_ok()) << st.message();
    }
    EXPECT_EQ(from_gpu(out.gpu), from_gpu(again.gpu)) << "decode out differs between two calls";
    EXPECT_EQ(from_gpu(lse.gpu), from_gpu(again_lse.gpu)) << "decode lse differs between two calls";
    expect_close(out, "decode out");
    expect_close(lse, "decode lse", 1e-4);
    // Every row on its own: a wrong split or group shows in the row it touches.
    const std::vector<float> gpu_out = from_gpu(out.gpu), cpu_out = from_cpu(out.cpu);
    double worst = 0;
    for (int64_t i = 0; i < n; ++i)
      worst = std::max(worst, relative_error(std::span<const float>(gpu_out).subspan(i * qw, qw),
                                             std::span<const float>(cpu_out).subspan(i * qw, qw)));
    EXPECT_LT(worst, kBf16OpTolerance);
  }
}
INSTANTIATE_TEST_SUITE_P(Profiles, DecodeAttention, ::testing::ValuesIn(kProfiles),
                         [](const ::testing::TestParamInfo<DeviceProfile>& p) { return std::string(p.param.name); });

// hidden 70 takes the scalar kernels, 64 the 16-byte vector ones. Few tokens over many rows, then
// 2,000 positions over 5 tokens (runs of ~400: bf16 atomic adds lost their small terms there, 3%
// off), each against the CPU's fp32 sums and run twice for bit-identical results.
TEST_F(Ops, Embedding) {
  for (const int64_t hidden : {int64_t{70}, int64_t{64}}) {
    for (const auto& [vocab, n] : {std::pair<int64_t, int64_t>{37, 45}, {5, 2000}}) {
      SCOPED_TRACE("hidden " + std::to_string(hidden) + ", vocab " + std::to_string(vocab) + ", n " +
                   std::to_string(n));
      std::vector<int32_t> tok;
      for (int64_t i = 0; i < n; ++i) tok.push_back(static_cast<int32_t>((i * 7 + 3 + i / 11) % vocab));
      const std::vector<int32_t> no_targets(tok.size(), -1);
      const MicroBatchIndex ix = index_micro_batch(tok, no_targets);
      auto tokens = ints(tok);
      auto order = ints(ix.token_order);
      auto runs = ints(ix.token_runs);
      auto table = dual(random_bf16(vocab * hidden, 1));
      auto out = output(n * hidden);
      ASSERT_TRUE(
          cpu_->embedding_forward(out.cpu.tensor(), table.cpu.tensor(), tokens.cpu.tensor(), n, hidden).is_ok());
      ASSERT_TRUE(
          gpu_->embedding_forward(out.gpu.tensor(), table.gpu.tensor(), tokens.gpu.tensor(), n, hidden).is_ok());
      expect_close(out, "embedding forward", 1e-6);
      auto dout = dual(random_bf16(n * hidden, 2));
      const std::vector<float> dtable0 = random_bf16(vocab * hidden, 3);
      auto dtable = dual(dtable0);
      auto again = dual(dtable0);
      ASSERT_TRUE(cpu_->embedding_backward(dtable.cpu.tensor(), dout.cpu.tensor(), tokens.cpu.tensor(),
                                           order.cpu.tensor(), runs.cpu.tensor(), n, hidden)
                      .is_ok());
      for (Buffer* b : {&dtable.gpu, &again.gpu})
        ASSERT_TRUE(gpu_->embedding_backward(b->tensor(), dout.gpu.tensor(), tokens.gpu.tensor(), order.gpu.tensor(),
                                             runs.gpu.tensor(), n, hidden)
                        .is_ok());
      expect_close(dtable, "embedding backward", 4e-3);
      EXPECT_EQ(from_gpu(dtable.gpu), from_gpu(again.gpu)) << "embedding backward is not deterministic";
    }
  }
  // Without the index a device backend refuses (rather than guessing).
  auto tokens = ints({1, 2});
  auto dtable = dual(random_bf16(3 * 8, 4));
  auto dout = dual(random_bf16(2 * 8, 5));
  EXPECT_FALSE(
      gpu_->embedding_backward(dtable.gpu.tensor(), dout.gpu.tensor(), tokens.gpu.tensor(), Tensor{}, Tensor{}, 2, 8)
          .is_ok());
}

// zero_all: 70 slices of one bf16 buffer (more than one launch's 64), at odd element offsets and of
// odd lengths (2-byte alignment, heads and tails around 16-byte vectors), one over 1 MiB (its own
// memset) and one empty; every element outside them keeps its value.
TEST_F(Ops, ZeroAllClearsOnlyItsRanges) {
  const int64_t total = 1 << 20;
  auto buf = dual(random_bf16(total, 10));
  std::vector<Tensor> parts;
  std::vector<char> inside(static_cast<size_t>(total), 0);
  int64_t at = 3;
  for (int k = 0; k < 70; ++k) {
    const int64_t n = k == 35 ? (int64_t{600} << 10) : k == 50 ? 0 : 1 + (k * 37) % 301;
    parts.push_back(buf.gpu.tensor().slice(at, n));
    for (int64_t i = at; i < at + n; ++i) inside[static_cast<size_t>(i)] = 1;
    at += n + 1 + k % 5;
  }
  ASSERT_LT(at, total);
  const std::vector<float> before = from_cpu(buf.cpu);
  ASSERT_TRUE(gpu_->zero_all(parts).is_ok());
  const std::vector<float> after = from_gpu(buf.gpu);
  for (int64_t i = 0; i < total; ++i) {
    const auto j = static_cast<size_t>(i);
    if (inside[j]) {
      ASSERT_EQ(after[j], 0.0f) << i;
    } else {
      ASSERT_EQ(after[j], before[j]) << i;
    }
  }
}

// Row gathers and scatters (the lm_head's labelled rows): bf16 rows of 70 (4-byte units), 4096 (16-byte)
// and 3 elements (2-byte), single f32 and i32 elements, against the CPU bit for bit; a scatter
// leaves the other rows as they were.
TEST_F(Ops, GatherScatterRows) {
  const int64_t total = 301;
  std::vector<int32_t> picked;
  for (int32_t r = 0; r < total; ++r)
    if ((r * 37) % 5 != 0) picked.push_back((r * 113) % static_cast<int32_t>(total));  // a permuted subset
  const auto count = static_cast<int64_t>(picked.size());
  auto rows = ints(picked);
  for (const auto& [width, dtype] :
       {std::pair<int64_t, DType>{70, DType::bf16}, {4096, DType::bf16}, {3, DType::bf16}, {1, DType::f32}}) {
    SCOPED_TRACE("width " + std::to_string(width) + " " + dtype_name(dtype));
    auto wide = dual(random_bf16(total * width, 6), dtype);
    auto compact = output(count * width, dtype);
    ASSERT_TRUE(cpu_->gather_rows(compact.cpu.tensor(), wide.cpu.tensor(), rows.cpu.tensor(), count, width).is_ok());
    ASSERT_TRUE(gpu_->gather_rows(compact.gpu.tensor(), wide.gpu.tensor(), rows.gpu.tensor(), count, width).is_ok());
    EXPECT_EQ(from_gpu(compact.gpu), from_cpu(compact.cpu));
    auto src = dual(random_bf16(count * width, 7), dtype);
    auto dst = dual(random_bf16(total * width, 8), dtype);
    ASSERT_TRUE(cpu_->scatter_rows(dst.cpu.tensor(), src.cpu.tensor(), rows.cpu.tensor(), count, width).is_ok());
    ASSERT_TRUE(gpu_->scatter_rows(dst.gpu.tensor(), src.gpu.tensor(), rows.gpu.tensor(), count, width).is_ok());
    EXPECT_EQ(from_gpu(dst.gpu), from_cpu(dst.cpu));
    // Zeroed rows (the embedding gradient's rows of the last step): the others as they were.
    auto zeroed = dual(random_bf16(total * width, 9), dtype);
    const std::vector<float> before = from_cpu(zeroed.cpu);
    ASSERT_TRUE(cpu_->zero_rows(zeroed.cpu.tensor(), rows.cpu.tensor(), count, width).is_ok());
    ASSERT_TRUE(gpu_->zero_rows(zeroed.gpu.tensor(), rows.gpu.tensor(), count, width).is_ok());
    const std::vector<float> after = from_gpu(zeroed.gpu);
    EXPECT_EQ(after, from_cpu(zeroed.cpu));
    std::vector<char> is_picked(static_cast<size_t>(total), 0);
    for (const int32_t r : picked) is_picked[static_cast<size_t>(r)] = 1;
    int64_t kept = 0;
    for (int64_t r = 0; r < total; ++r)
      for (int64_t j = 0; j < width; ++j) {
        const auto at = static_cast<size_t>(r * width + j);
        if (is_picked[static_cast<size_t>(r)]) {
          EXPECT_EQ(after[at], 0.0f);
        } else {
          kept += after[at] == before[at] && before[at] != 0.0f;
        }
      }
    EXPECT_GT(kept, 0);
  }
  std::vector<int32_t> values(static_cast<size_t>(total));
  for (int32_t i = 0; i < static_cast<int32_t>(total); ++i) values[static_cast<size_t>(i)] = i * 7919 - 1000;
  auto wide = ints(values);
  Buffer compact = gpu_->allocate(count, DType::i32).take();
  ASSERT_TRUE(gpu_->gather_rows(compact.tensor(), wide.gpu.tensor(), rows.gpu.tensor(), count, 1).is_ok());
  std::vector<int32_t> got(static_cast<size_t>(count));
  ASSERT_TRUE(gpu_->download(got.data(), compact.tensor()).is_ok());
  for (int64_t i = 0; i < count; ++i) EXPECT_EQ(got[static_cast<size_t>(i)], values[static_cast<size_t>(picked[i])]);
  // Shapes are checked: a compact side of the wrong size, or dtypes that differ.
  EXPECT_FALSE(gpu_->gather_rows(compact.tensor(), wide.gpu.tensor(), rows.gpu.tensor(), count - 1, 1).is_ok());
  EXPECT_FALSE(gpu_->zero_rows(wide.gpu.tensor(), rows.gpu.tensor(), count, 2).is_ok());  // 301 not a multiple of 2
  auto floats = dual(random_bf16(total, 9), DType::f32);
  EXPECT_FALSE(gpu_->gather_rows(compact.tensor(), floats.gpu.tensor(), rows.gpu.tensor(), count, 1).is_ok());
}

// Sizes for both RMSNorm paths: odd hidden sizes take the scalar kernels; multiples of 8 the
// 16-byte vector kernels, here with few vectors per row (24: most threads idle), GLM-4's 4096 (two
// rows per backward iteration, with an odd row count so the last iteration has one), more rows
// than the backward's resident blocks (2000 x 256), a vector count that is no multiple of the
// threads (8200), and a row too wide for the vectorised backward (16392: scalar backward, vector
// forward). Fewer rows than blocks happens in all the small-n cases.
class RmsNorm : public Ops, public ::testing::WithParamInterface<std::tuple<int, int>> {};

TEST_P(RmsNorm, MatchesCpuAndWeightGradientIsDeterministic) {
  const auto [rows, width] = GetParam();
  const int64_t n = rows, hidden = width;
  auto in = dual(random_bf16(n * hidden, 4, 2.0));
  auto w = dual(random_bf16(hidden, 5));
  auto out = output(n * hidden);
  auto rstd = output(n, DType::f32);
  ASSERT_TRUE(
      cpu_->rmsnorm_forward(out.cpu.tensor(), rstd.cpu.tensor(), in.cpu.tensor(), w.cpu.tensor(), n, hidden, 1e-6)
          .is_ok());
  ASSERT_TRUE(
      gpu_->rmsnorm_forward(out.gpu.tensor(), rstd.gpu.tensor(), in.gpu.tensor(), w.gpu.tensor(), n, hidden, 1e-6)
          .is_ok());
  expect_close(out, "rmsnorm out");
  expect_close(rstd, "rmsnorm rstd", 1e-5);
  auto dout = dual(random_bf16(n * hidden, 6));
  const std::vector<float> din0 = random_bf16(n * hidden, 7), dw0 = random_bf16(hidden, 8);
  auto din = dual(din0);  // accumulates
  auto dw = dual(dw0);
  ASSERT_TRUE(cpu_->rmsnorm_backward(din.cpu.tensor(), dw.cpu.tensor(), dout.cpu.tensor(), in.cpu.tensor(),
                                     w.cpu.tensor(), rstd.cpu.tensor(), n, hidden)
                  .is_ok());
  ASSERT_TRUE(gpu_->rmsnorm_backward(din.gpu.tensor(), dw.gpu.tensor(), dout.gpu.tensor(), in.gpu.tensor(),
                                     w.gpu.tensor(), rstd.gpu.tensor(), n, hidden)
                  .is_ok());
  expect_close(din, "rmsnorm din");
  expect_close(dw, "rmsnorm dweight");
  // The same inputs again: bit-identical gradients (fixed-order reduction, no float atomics).
  auto din2 = dual(din0);
  auto dw2 = dual(dw0);
  ASSERT_TRUE(gpu_->rmsnorm_backward(din2.gpu.tensor(), dw2.gpu.tensor(), dout.gpu.tensor(), in.gpu.tensor(),
                                     w.gpu.tensor(), rstd.gpu.tensor(), n, hidden)
                  .is_ok());
  EXPECT_EQ(from_gpu(dw2.gpu), from_gpu(dw.gpu)) << "dweight differs between two identical runs";
  EXPECT_EQ(from_gpu(din2.gpu), from_gpu(din.gpu)) << "din differs between two identical runs";
}

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNorm,
                         ::testing::Values(std::make_tuple(19, 333), std::make_tuple(3, 24), std::make_tuple(37, 4096),
                                           std::make_tuple(2000, 256), std::make_tuple(3, 8200),
                                           std::make_tuple(5, 16392)));

// Bias forward (epilogue or prefill) and the bias gradient's column sums at odd widths and at
// row counts that span several 64-row splits.
class LinearBias : public Ops, public ::testing::WithParamInterface<std::tuple<int64_t, int64_t, int64_t>> {};
TEST_P(LinearBias, ForwardAndBiasGradientMatchCpu) {
  const auto [n, in_f, out_f] = GetParam();
  auto x = dual(random_bf16(n * in_f, 31));
  auto w = dual(random_bf16(out_f * in_f, 32, 0.2));
  auto bias = dual(random_bf16(out_f, 33));
  auto y = output(n * out_f);
  ASSERT_TRUE(
      cpu_->linear_forward(y.cpu.tensor(), x.cpu.tensor(), w.cpu.tensor(), bias.cpu.tensor(), n, in_f, out_f).is_ok());
  ASSERT_TRUE(
      gpu_->linear_forward(y.gpu.tensor(), x.gpu.tensor(), w.gpu.tensor(), bias.gpu.tensor(), n, in_f, out_f).is_ok());
  expect_close(y, "linear forward with bias");
  auto dy = dual(random_bf16(n * out_f, 34));
  auto db = dual(random_bf16(out_f, 35));
  ASSERT_TRUE(cpu_->linear_backward(Tensor{}, Tensor{}, db.cpu.tensor(), dy.cpu.tensor(), x.cpu.tensor(),
                                    w.cpu.tensor(), n, in_f, out_f, false, true)
                  .is_ok());
  ASSERT_TRUE(gpu_->linear_backward(Tensor{}, Tensor{}, db.gpu.tensor(), dy.gpu.tensor(), x.gpu.tensor(),
                                    w.gpu.tensor(), n, in_f, out_f, false, true)
                  .is_ok());
  expect_close(db, "linear dbias (accumulated)");
}
INSTANTIATE_TEST_SUITE_P(Shapes, LinearBias,
                         ::testing::Values(std::make_tuple(23, 96, 72), std::make_tuple(1000, 32, 131),
                                           std::make_tuple(4099, 16, 70), std::make_tuple(300, 64, 4608)));

// A decode step's few rows (kernels/cuda/gemv.cuh up to 2 rows, then cuBLASLt): with and without
// bias, fp32 logits, an addend apart and out itself, at odd feature counts (in_features a multiple
// of 8: 17 and 513 vectors) and one output feature.
class FewRows : public Ops, public ::testing::WithParamInterface<std::tuple<int64_t, int64_t, int64_t>> {};
TEST_P(FewRows, LinearForwardMatchesCpu) {
  const auto [n, in_f, out_f] = GetParam();
  auto x = dual(random_bf16(n * in_f, 41));
  auto w = dual(random_bf16(out_f * in_f, 42, 0.2));
  auto bias = dual(random_bf16(out_f, 43));
  auto y = output(n * out_f);
  ASSERT_TRUE(cpu_->linear_forward(y.cpu.tensor(), x.cpu.tensor(), w.cpu.tensor(), Tensor{}, n, in_f, out_f).is_ok());
  ASSERT_TRUE(gpu_->linear_forward(y.gpu.tensor(), x.gpu.tensor(), w.gpu.tensor(), Tensor{}, n, in_f, out_f).is_ok());
  expect_close(y, "few-row linear");
  ASSERT_TRUE(
      cpu_->linear_forward(y.cpu.tensor(), x.cpu.tensor(), w.cpu.tensor(), bias.cpu.tensor(), n, in_f, out_f).is_ok());
  ASSERT_TRUE(
      gpu_->linear_forward(y.gpu.tensor(), x.gpu.tensor(), w.gpu.tensor(), bias.gpu.tensor(), n, in_f, out_f).is_ok());
  expect_close(y, "few-row linear with bias");
  auto logits = output(n * out_f, DType::f32);
  ASSERT_TRUE(
      cpu_->linear_forward(logits.cpu.tensor(), x.cpu.tensor(), w.cpu.tensor(), Tensor{}, n, in_f, out_f).is_ok());
  ASSERT_TRUE(
      gpu_->linear_forward(logits.gpu.tensor(), x.gpu.tensor(), w.gpu.tensor(), Tensor{}, n, in_f, out_f).is_ok());
  expect_close(logits, "few-row linear, fp32 out", 1e-5);
  auto addend = dual(random_bf16(n * out_f, 44));
  ASSERT_TRUE(cpu_->linear_forward_add(y.cpu.tensor(), x.cpu.tensor(), w.cpu.tensor(), bias.cpu.tensor(),
                                       addend.cpu.tensor(), n, in_f, out_f)
                  .is_ok());
  ASSERT_TRUE(gpu_->linear_forward_add(y.gpu.tensor(), x.gpu.tensor(), w.gpu.tensor(), bias.gpu.tensor(),
                                       addend.gpu.tensor(), n, in_f, out_f)
                  .is_ok());
  expect_close(y, "few-row linear + bias + addend");
  ASSERT_TRUE(cpu_->linear_forward_add(y.cpu.tensor(), x.cpu.tensor(), w.cpu.tensor(), Tensor{}, y.cpu.tensor(), n,
                                       in_f, out_f)
                  .is_ok());
  ASSERT_TRUE(gpu_->linear_forward_add(y.gpu.tensor(), x.gpu.tensor(), w.gpu.tensor(), Tensor{}, y.gpu.tensor(), n,
                                       in_f, out_f)
                  .is_ok());
  expect_close(y, "few-row linear added to out");
}
// Generation's norm + linear (+ SwiGLU) (Backend::normed_linear_forward; the GEMV with the norm and
// the SwiGLU fused for one row, the separate ops beyond): against the CPU backend's separate
// ops, with a bias, and with the SwiGLU over 2 out_f features (out_f odd: a block's last gate
// features without partners). The fused input is not rounded to bf16 after the norm: the
// separate ops' tolerance still holds. One row of 4,104 features stages 513 vectors (256 threads,
// a lane's last round partial); 12,272 are the staged input's limit (48 KiB of shared memory with
// the kernel's own), 12,296 past it (the separate ops).
TEST_P(FewRows, NormedLinearAndSwigluMatchCpu) {
  const auto [n, in_f, out_f] = GetParam();
  auto x = dual(random_bf16(n * in_f, 51, 3.0));
  auto g = dual(random_bf16(in_f, 52));
  auto w = dual(random_bf16(2 * out_f * in_f, 53, 0.2));
  auto bias = dual(random_bf16(out_f, 54));
  auto normed = output(n * in_f), rstd = output(n, DType::f32), gate_up = output(2 * n * out_f);
  auto y = output(n * out_f);
  for (const bool swiglu : {false, true}) {
    const int64_t features = swiglu ? 2 * out_f : out_f;
    for (Backend* be : {cpu_.get(), gpu_.get()}) {
      const bool gpu = be == gpu_.get();
      auto t = [gpu](Dual& d) { return gpu ? d.gpu.tensor() : d.cpu.tensor(); };
      ASSERT_TRUE(be->normed_linear_forward(t(y), t(x), t(g), 1.5625e-7, t(w), swiglu ? Tensor{} : t(bias), swiglu,
                                            n, in_f, features, t(normed), t(rstd), t(gate_up))
                      .is_ok());
    }
    expect_close(y, swiglu ? "norm + linear + swiglu" : "norm + linear + bias");
  }
}
INSTANTIATE_TEST_SUITE_P(Shapes, FewRows,
                         ::testing::Values(std::make_tuple(1, 136, 37), std::make_tuple(3, 4104, 1),
                                           std::make_tuple(8, 136, 4099), std::make_tuple(1, 4096, 4608),
                                           std::make_tuple(5, 8, 333), std::make_tuple(9, 136, 37),
                                           std::make_tuple(2, 2048, 333), std::make_tuple(1, 4104, 333),
                                           std::make_tuple(1, 12272, 40), std::make_tuple(1, 12296, 40)));

// Device greedy decoding: each row's first maximum, on odd widths up to a vocabulary and a half,
// with the maximum planted twice in most rows (the lower column wins, as std::max_element's) and a
// row of -inf (its first column).
TEST_F(Ops, ArgmaxRowsMatchesCpu) {
  for (const int64_t cols : {int64_t{1}, int64_t{37}, int64_t{1029}, int64_t{227331}}) {
    SCOPED_TRACE(cols);
    const int64_t rows = 5;
    std::vector<float> values = random_bf16(static_cast<size_t>(rows * cols), 51 + cols);
    for (int64_t r = 0; r + 1 < rows && cols > 2; ++r) {
      const int64_t a = (r * 7919) % cols, b = (a + 1 + r * 1031) % cols;
      values[static_cast<size_t>(r * cols + a)] = 9.0f;
      values[static_cast<size_t>(r * cols + b)] = 9.0f;
    }
    for (int64_t c = 0; c < cols; ++c) values[static_cast<size_t>((rows - 1) * cols + c)] = -INFINITY;
    auto v = dual(values, DType::f32);
    auto ids = ints(std::vector<int32_t>(static_cast<size_t>(rows), -1));
    ASSERT_TRUE(cpu_->argmax_rows(ids.cpu.tensor(), v.cpu.tensor(), rows, cols).is_ok());
    ASSERT_TRUE(gpu_->argmax_rows(ids.gpu.tensor(), v.gpu.tensor(), rows, cols).is_ok());
    std::vector<int32_t> got(static_cast<size_t>(rows));
    ASSERT_TRUE(gpu_->download(got.data(), ids.gpu.tensor()).is_ok());
    const int32_t* want = ids.cpu.tensor().as<int32_t>();
    for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(got[static_cast<size_t>(r)], want[r]) << "row " << r;
    EXPECT_EQ(want[rows - 1], 0);
  }
}

// Beam search's device part: each row's maximum and log-sum of exponentials, and its k largest
// values with their columns (descending, the lower column first among equal ones), on odd widths up
// to a vocabulary and a half, k from 1 to more than a row holds, with values planted three times in
// a row (ties), a row partly -inf, and one wholly -inf: ids and values as the CPU's, bit for bit.
TEST_F(Ops, TopKRowsMatchesCpu) {
  for (const int64_t cols : {int64_t{5}, int64_t{37}, int64_t{1029}, int64_t{227331}})
    for (const int64_t k : {int64_t{1}, int64_t{7}, int64_t{16}, int64_t{40}}) {
      SCOPED_TRACE(concat(cols, " columns, k ", k));
      const int64_t rows = 6;
      std::vector<float> values = random_bf16(static_cast<size_t>(rows * cols), 77 + cols);
      for (int64_t r = 0; r + 2 < rows && cols > 3; ++r)
        for (const int64_t at : {(r * 7919) % cols, (r * 7919 + 3) % cols, (r * 104729 + 1) % cols})
          values[static_cast<size_t>(r * cols + at)] = 5.0f + static_cast<float>(r % 2);
      for (int64_t c = 0; c < cols; c += 2) values[static_cast<size_t>((rows - 2) * cols + c)] = -INFINITY;
      for (int64_t c = 0; c < cols; ++c) values[static_cast<size_t>((rows - 1) * cols + c)] = -INFINITY;
      auto v = dual(values, DType::f32);
      auto ids = ints(std::vector<int32_t>(static_cast<size_t>(rows * k), -7));
      auto top = output(rows * k, DType::f32);
      auto stats = output(2 * rows, DType::f32);
      ASSERT_TRUE(
          cpu_->top_k_rows(ids.cpu.tensor(), top.cpu.tensor(), stats.cpu.tensor(), v.cpu.tensor(), rows, cols, k)
              .is_ok());
      ASSERT_TRUE(
          gpu_->top_k_rows(ids.gpu.tensor(), top.gpu.tensor(), stats.gpu.tensor(), v.gpu.tensor(), rows, cols, k)
              .is_ok());
      std::vector<int32_t> got_ids(static_cast<size_t>(rows * k));
      std::vector<float> got_top(static_cast<size_t>(rows * k)), got_stats(static_cast<size_t>(2 * rows));
      ASSERT_TRUE(gpu_->download(got_ids.data(), ids.gpu.tensor()).is_ok());
      ASSERT_TRUE(gpu_->download(got_top.data(), top.gpu.tensor()).is_ok());
      ASSERT_TRUE(gpu_->download(got_stats.data(), stats.gpu.tensor()).is_ok());
      const int32_t* want_ids = ids.cpu.tensor().as<int32_t>();
      const float* want_top = top.cpu.tensor().as<float>();
      const float* want_stats = stats.cpu.tensor().as<float>();
      for (int64_t i = 0; i < rows * k; ++i) {
        EXPECT_EQ(got_ids[static_cast<size_t>(i)], want_ids[i]) << "row " << i / k << ", place " << i % k;
        EXPECT_EQ(got_top[static_cast<size_t>(i)], want_top[i]) << "row " << i / k << ", place " << i % k;
      }
      for (int64_t r = 0; r + 1 < rows; ++r) {
        EXPECT_EQ(got_stats[static_cast<size_t>(2 * r)], want_stats[2 * r]) << "row " << r;
        EXPECT_NEAR(got_stats[static_cast<size_t>(2 * r + 1)], want_stats[2 * r + 1], 2e-5) << "row " << r;
      }
      EXPECT_EQ(got_ids[static_cast<size_t>((rows - 1) * k)], 0) << "a row of -inf still names its columns";
      if (k > cols) {
        EXPECT_EQ(want_ids[k - 1], -1) << "past the row's columns";
      }
    }
}

class Linear : public Ops {
 protected:
  // The linear ops against the CPU on odd sizes: forward with bias and with an addend (a separate
  // one and out itself), backward writing, overwriting and accumulating.
  void check() {
    const int64_t n = 23, in_f = 96, out_f = 72;
    auto x = dual(random_bf16(n * in_f, 9));
    auto w = dual(random_bf16(out_f * in_f, 10, 0.2));
    auto bias = dual(random_bf16(out_f, 11));
    auto y = output(n * out_f);
    ASSERT_TRUE(cpu_->linear_forward(y.cpu.tensor(), x.cpu.tensor(), w.cpu.tensor(), bias.cpu.tensor(), n, in_f, out_f)
                    .is_ok());
    ASSERT_TRUE(gpu_->linear_forward(y.gpu.tensor(), x.gpu.tensor(), w.gpu.tensor(), bias.gpu.tensor(), n, in_f, out_f)
                    .is_ok());
    expect_close(y, "linear forward with bias");
    auto dy = dual(random_bf16(n * out_f, 12));
    auto dx = output(n * in_f);
    auto dw = dual(random_bf16(out_f * in_f, 13));
    auto db = dual(random_bf16(out_f, 14));
    ASSERT_TRUE(cpu_->linear_backward(dx.cpu.tensor(), dw.cpu.tensor(), db.cpu.tensor(), dy.cpu.tensor(),
                                      x.cpu.tensor(), w.cpu.tensor(), n, in_f, out_f, false, true)
                    .is_ok());
    ASSERT_TRUE(gpu_->linear_backward(dx.gpu.tensor(), dw.gpu.tensor(), db.gpu.tensor(), dy.gpu.tensor(),
                                      x.gpu.tensor(), w.gpu.tensor(), n, in_f, out_f, false, true)
                    .is_ok());
    expect_close(dx, "linear din");
    expect_close(dw, "linear dweight (accumulated)");
    expect_close(db, "linear dbias (accumulated)");
    // Overwritten (the first micro-batch of a step): what dweight held must not leak in.
    ASSERT_TRUE(cpu_->linear_backward(Tensor{}, dw.cpu.tensor(), Tensor{}, dy.cpu.tensor(), x.cpu.tensor(),
                                      w.cpu.tensor(), n, in_f, out_f, false, false)
                    .is_ok());
    ASSERT_TRUE(gpu_->linear_backward(Tensor{}, dw.gpu.tensor(), Tensor{}, dy.gpu.tensor(), x.gpu.tensor(),
                                      w.gpu.tensor(), n, in_f, out_f, false, false)
                    .is_ok());
    expect_close(dw, "linear dweight (overwritten)");
    ASSERT_TRUE(cpu_->linear_backward(dx.cpu.tensor(), Tensor{}, Tensor{}, dy.cpu.tensor(), x.cpu.tensor(),
                                      w.cpu.tensor(), n, in_f, out_f, true, true)
                    .is_ok());
    ASSERT_TRUE(gpu_->linear_backward(dx.gpu.tensor(), Tensor{}, Tensor{}, dy.gpu.tensor(), x.gpu.tensor(),
                                      w.gpu.tensor(), n, in_f, out_f, true, true)
                    .is_ok());
    expect_close(dx, "linear din accumulated");
    auto addend = dual(random_bf16(n * out_f, 15));
    ASSERT_TRUE(cpu_->linear_forward_add(y.cpu.tensor(), x.cpu.tensor(), w.cpu.tensor(), Tensor{}, addend.cpu.tensor(),
                                         n, in_f, out_f)
                    .is_ok());
    ASSERT_TRUE(gpu_->linear_forward_add(y.gpu.tensor(), x.gpu.tensor(), w.gpu.tensor(), Tensor{}, addend.gpu.tensor(),
                                         n, in_f, out_f)
                    .is_ok());
    expect_close(y, "linear forward + addend");
    ASSERT_TRUE(cpu_->linear_forward_add(y.cpu.tensor(), x.cpu.tensor(), w.cpu.tensor(), bias.cpu.tensor(),
                                         y.cpu.tensor(), n, in_f, out_f)
                    .is_ok());
    ASSERT_TRUE(gpu_->linear_forward_add(y.gpu.tensor(), x.gpu.tensor(), w.gpu.tensor(), bias.gpu.tensor(),
                                         y.gpu.tensor(), n, in_f, out_f)
                    .is_ok());
    expect_close(y, "linear forward + bias, added to out");
  }
};

TEST_F(Linear, MatchesCpu) { check(); }

// Every shape's cuBLASLt candidates timed first (--gemm_autotune all; large tunes large shapes
// only): the trials must leave no trace, so an output accumulated into (C = D) is added to once,
// not once per trial.
TEST_F(Linear, MatchesCpuWithTunedAlgorithms) {
  BackendConfig tuned;
  tuned.gemm_autotune = GemmAutotune::all;
  auto g = make_cuda_backend(0, tuned);
  ASSERT_TRUE(g.is_ok()) << g.status().message();
  gpu_ = g.take();
  check();
  // The knob's tuner ran on such a shape: more than one candidate was offered and timed.
  glm::cuda::Gemm gemm;
  ASSERT_EQ(gemm.init(), "");
  gemm.set_autotune(glm::cuda::Gemm::Autotune::all);
  const int64_t n = 23, in_f = 96, out_f = 72;
  auto x = dual(random_bf16(n * in_f, 16));
  auto w = dual(random_bf16(out_f * in_f, 17, 0.2));
  auto y = output(n * out_f);
  ASSERT_TRUE(gpu_->synchronize().is_ok());
  ASSERT_EQ(
      gemm.linear_forward(y.gpu.tensor().data, false, static_cast<const glm::cuda::bf16*>(x.gpu.tensor().data),
                          static_cast<const glm::cuda::bf16*>(w.gpu.tensor().data), nullptr, n, in_f, out_f, nullptr),
      CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_TRUE(cpu_->linear_forward(y.cpu.tensor(), x.cpu.tensor(), w.cpu.tensor(), Tensor{}, n, in_f, out_f).is_ok());
  expect_close(y, "tuned linear forward");
  ASSERT_EQ(gemm.tune_log().size(), 1u);
  EXPECT_GE(gemm.tune_log()[0].seconds.size(), 2u) << "one candidate: nothing to choose between";
}

// head_dim 40 takes the warp-per-row kernel; 32, 64 and 128 the tensor-core flash kernels (128 on
// Hopper: the wgmma ones, down to a single token and one KV head for four query heads), here
// with documents that straddle its tiles and lengths that are no multiple of them; at 777 and 1000
// tokens most tiles lie below the diagonal inside one document and take the unmasked path.
// Each shape also runs with the kernels of the A100 and the RTX 4090 (kProfiles).
class Attention : public Ops,
                  public ::testing::WithParamInterface<std::tuple<std::tuple<int, int, int, int>, DeviceProfile>> {
 protected:
  BackendConfig gpu_config() const override { return std::get<1>(GetParam()).config(); }
};

TEST_P(Attention, RopeAndAttentionWithDocumentsAndGqa) {
  const auto [heads, kv_heads, head_dim, length] = std::get<0>(GetParam());
  AttentionShape s{heads, kv_heads, head_dim};
  const int64_t rot = head_dim / 2;
  std::vector<int32_t> doc, pos;
  for (int t = 0; t < length; ++t) {  // documents of 31, 1, 100 tokens, then the rest
    const int start = t < 31 ? 0 : (t < 32 ? 31 : (t < 132 ? 32 : 132));
    doc.push_back(start);
    pos.push_back(t - start);
  }
  const int64_t n = static_cast<int64_t>(doc.size()), width = s.qkv_width(), qw = s.heads * s.head_dim;
  auto docs = ints(doc);
  auto positions = ints(pos);
  auto qkv = dual(random_bf16(n * width, 15, 1.5));
  ASSERT_TRUE(cpu_->rope_forward(qkv.cpu.tensor(), positions.cpu.tensor(), n, s, rot, 5e6).is_ok());
  ASSERT_TRUE(gpu_->rope_forward(qkv.gpu.tensor(), positions.gpu.tensor(), n, s, rot, 5e6).is_ok());
  expect_close(qkv, "rope forward");
  // The same rotated input on both sides for attention.
  auto rotated = dual(from_gpu(qkv.gpu));
  auto out = output(n * qw);
  auto lse = output(n * s.heads, DType::f32);
  ASSERT_TRUE(cpu_->attention_forward(out.cpu.tensor(), lse.cpu.tensor(), rotated.cpu.tensor(), docs.cpu.tensor(), n, s)
                  .is_ok());
  ASSERT_TRUE(gpu_->attention_forward(out.gpu.tensor(), lse.gpu.tensor(), rotated.gpu.tensor(), docs.gpu.tensor(), n, s)
                  .is_ok());
  expect_close(out, "attention out");
  expect_close(lse, "attention lse", 1e-4);
  auto dout = dual(random_bf16(n * qw, 16));
  auto o = dual(from_gpu(out.gpu));
  auto l = dual(from_gpu(lse.gpu), DType::f32);
  auto dqkv = output(n * width);
  ASSERT_TRUE(cpu_->attention_backward(dqkv.cpu.tensor(), dout.cpu.tensor(), o.cpu.tensor(), l.cpu.tensor(),
                                       rotated.cpu.tensor(), docs.cpu.tensor(), n, s)
                  .is_ok());
  ASSERT_TRUE(gpu_->attention_backward(dqkv.gpu.tensor(), dout.gpu.tensor(), o.gpu.tensor(), l.gpu.tensor(),
                                       rotated.gpu.tensor(), docs.gpu.tensor(), n, s)
                  .is_ok());
  expect_close(dqkv, "attention dqkv", 2e-2);
  auto g = dual(random_bf16(n * width, 17));
  ASSERT_TRUE(cpu_->rope_backward(g.cpu.tensor(), positions.cpu.tensor(), n, s, rot, 5e6).is_ok());
  ASSERT_TRUE(gpu_->rope_backward(g.gpu.tensor(), positions.gpu.tensor(), n, s, rot, 5e6).is_ok());
  expect_close(g, "rope backward");
}

std::string attention_case_name(
    const ::testing::TestParamInfo<std::tuple<std::tuple<int, int, int, int>, DeviceProfile>>& param) {
  const auto [heads, kv_heads, head_dim, length] = std::get<0>(param.param);
  return "heads" + std::to_string(heads) + "x" + std::to_string(kv_heads) + "_d" + std::to_string(head_dim) + "_n" +
         std::to_string(length) + "_" + std::get<1>(param.param).name;
}

INSTANTIATE_TEST_SUITE_P(Shapes, Attention,
                         ::testing::Combine(::testing::Values(std::make_tuple(8, 2, 40, 70),
                                                              std::make_tuple(4, 2, 32, 150),
                                                              std::make_tuple(8, 4, 64, 200),
                                                              std::make_tuple(32, 2, 128, 333),
                                                              std::make_tuple(6, 6, 128, 65),
                                                              std::make_tuple(16, 2, 128, 1000),
                                                              std::make_tuple(4, 2, 64, 777),
                                                              std::make_tuple(4, 2, 128, 1),
                                                              std::make_tuple(4, 1, 128, 129)),
                                            ::testing::ValuesIn(kProfiles)),
                         attention_case_name);

// Worst relative error over rows of row_len elements (per token and head), each row's error against
// its own norm with a floor of 1e-3 of the mean row norm: a single wrong row, which a norm-wise
// error over everything would dilute, fails it.
double worst_row_error(const std::vector<float>& ours, const std::vector<float>& ref, size_t row_len) {
  const size_t rows = ref.size() / row_len;
  double mean_norm = 0;
  std::vector<double> diff(rows, 0), norm(rows, 0);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t i = r * row_len; i < (r + 1) * row_len; ++i) {
      if (!std::isfinite(ours[i])) return INFINITY;
      diff[r] += (static_cast<double>(ours[i]) - ref[i]) * (static_cast<double>(ours[i]) - ref[i]);
      norm[r] += static_cast<double>(ref[i]) * ref[i];
    }
    mean_norm += std::sqrt(norm[r]) / static_cast<double>(rows);
  }
  double worst = 0;
  for (size_t r = 0; r < rows; ++r)
    worst = std::max(worst, std::sqrt(diff[r]) / std::max(std::sqrt(norm[r]), 1e-3 * mean_norm));
  return worst;
}

// GLM-4's head size on Hopper takes the wgmma kernels, --attention_kernel mma the mma.sync ones: both,
// forward and backward (both dQ paths, and the backward's blocks in chunks of 3 heads that do not
// divide the 8), against each other with GQA 4:1 on two packings: 2,053
// tokens (17 key blocks, the last partial) in four documents, one of a single token; and 1,024
// tokens (a multiple of the tiles) with documents starting on 128- and 64-token boundaries, 128
// single-token documents, and one starting inside the last tile. Each (token, head) row is checked
// on its own. The CPU comparison above covers the wgmma kernels up to 1,000 tokens.
class FlashPackings : public Ops, public ::testing::WithParamInterface<int> {};

TEST_P(FlashPackings, WgmmaAgreesWithMma) {
  const AttentionShape s{8, 2, 128};
  const bool wgmma = cuda::flash_wgmma_available(s.head_dim);
  if (!wgmma) GTEST_SKIP() << "no wgmma attention on this device (needs an sm_90a build on compute capability 9.0)";
  std::vector<int32_t> doc;
  const int64_t n = GetParam() == 0 ? 2053 : 1024, qw = s.heads * s.head_dim, d = s.head_dim;
  for (int32_t t = 0; t < n; ++t) {
    if (GetParam() == 0)
      doc.push_back(t < 701 ? 0 : (t < 702 ? 701 : (t < 1501 ? 702 : 1501)));
    else
      doc.push_back(t < 128 ? 0 : t < 192 ? 128 : t < 320 ? 192 : t < 512 ? 320 : t < 640 ? t : t < 1000 ? 640 : 1000);
  }
  auto docs = ints(doc);
  auto qkv = dual(random_bf16(n * s.qkv_width(), 61 + GetParam(), 1.5));
  auto dout = dual(random_bf16(n * qw, 62 + GetParam()));
  auto check = [&](const char* what, const std::vector<float>& ours, const std::vector<float>& ref, size_t row_len) {
    EXPECT_LT(relative_error(ours, ref), kBf16OpTolerance) << what;
    EXPECT_LT(worst_row_error(ours, ref, row_len), 3e-2) << what << ": worst (token, head) row";
  };
  struct Forward {
    Dual out, lse;
  };
  // A backend of the variant's configuration runs the op on this fixture's memory.
  auto variant = [&](const BackendConfig& config) {
    EXPECT_TRUE(gpu_->synchronize().is_ok());
    auto made = make_cuda_backend(0, config);
    EXPECT_TRUE(made.is_ok()) << made.status().message();
    return made.take();
  };
  BackendConfig mma;
  mma.attention_kernel = AttentionKernel::mma;
  auto forward = [&](const BackendConfig& config) {
    auto backend = variant(config);
    Forward f{output(n * qw), output(n * s.heads, DType::f32)};
    EXPECT_TRUE(gpu_->synchronize().is_ok());
    EXPECT_TRUE(
        backend->attention_forward(f.out.gpu.tensor(), f.lse.gpu.tensor(), qkv.gpu.tensor(), docs.gpu.tensor(), n, s)
            .is_ok());
    EXPECT_TRUE(backend->synchronize().is_ok());
    return f;
  };
  const Forward ours = forward(BackendConfig{}), reference = forward(mma);
  check("forward out", from_gpu(ours.out.gpu), from_gpu(reference.out.gpu), static_cast<size_t>(d));
  EXPECT_LT(relative_error(from_gpu(ours.lse.gpu), from_gpu(reference.lse.gpu)), 1e-4) << "forward lse";
  // The backwards from the same forward results.
  auto backward = [&](const BackendConfig& config) {
    auto dqkv = output(n * s.qkv_width());
    auto backend = variant(config);
    EXPECT_TRUE(backend
                    ->attention_backward(dqkv.gpu.tensor(), dout.gpu.tensor(), reference.out.gpu.tensor(),
                                         reference.lse.gpu.tensor(), qkv.gpu.tensor(), docs.gpu.tensor(), n, s)
                    .is_ok());
    EXPECT_TRUE(backend->synchronize().is_ok());
    return from_gpu(dqkv.gpu);
  };
  const auto reference_grads = backward(mma);
  // The default wgmma backward (dQ by 16-byte atomics), dQ by paired atomics, and the blocks' order
  // in chunks of 3, 3 and 2 heads.
  struct Variant {
    const char* name;
    bool dq_vector_atomics;
    int head_chunk;
  };
  const Variant variants[] = {{"default", true, 8}, {"dQ pair atomics", false, 8}, {"3-head chunks", true, 3}};
  std::vector<std::vector<float>> variant_grads;
  for (const Variant& v : variants) {
    BackendConfig config;
    config.attention_dq_vector_atomics = v.dq_vector_atomics;
    config.attention_backward_head_chunk = v.head_chunk;
    variant_grads.push_back(backward(config));
  }
  const int64_t width = s.qkv_width(), kv_width = s.kv_heads * d;
  const char* names[3] = {"dQ", "dK", "dV"};
  const int64_t begin[4] = {0, qw, qw + kv_width, width};
  for (int part = 0; part < 3; ++part) {  // each of dQ, dK, dV on its own scale
    auto columns = [&](const std::vector<float>& all) {
      std::vector<float> out;
      for (int64_t t = 0; t < n; ++t)
        for (int64_t col = begin[part]; col < begin[part + 1]; ++col)
          out.push_back(all[static_cast<size_t>(t * width + col)]);
      return out;
    };
    const std::vector<float> ref = columns(reference_grads);
    for (size_t i = 0; i < variant_grads.size(); ++i)
      check((std::string(names[part]) + ": wgmma (" + variants[i].name + ") against mma.sync").c_str(),
            columns(variant_grads[i]), ref, static_cast<size_t>(d));
  }
}

INSTANTIATE_TEST_SUITE_P(TwoPackings, FlashPackings, ::testing::Values(0, 1));

// Every variant of the mma.sync backward (flash_backward_variant: the first that fits a
// shared-memory limit) at each head size, forward and backward against the CPU on 777 tokens in
// four documents with GQA 4:1 (limits from none down to below the smallest variant's), and each
// (token, head) row of dQ, dK and dV against the fastest variant's (the same bf16 arithmetic in
// other tiles: a wrong row shows there, where the CPU's fp32 would hide it in the norm).
class FlashVariants : public Ops, public ::testing::WithParamInterface<int> {};

TEST_P(FlashVariants, EachBackwardVariantMatchesCpu) {
  const AttentionShape s{8, 2, GetParam()};
  const int64_t n = 777, width = s.qkv_width(), qw = s.heads * s.head_dim;
  std::vector<int32_t> doc;
  for (int32_t t = 0; t < n; ++t) doc.push_back(t < 300 ? 0 : t < 301 ? 300 : t < 650 ? 301 : 650);
  auto docs = ints(doc);
  auto qkv = dual(random_bf16(static_cast<size_t>(n * width), 81 + GetParam(), 1.5));
  auto dout = dual(random_bf16(static_cast<size_t>(n * qw), 82 + GetParam()));
  auto ref_out = output(n * qw);
  auto ref_lse = output(n * s.heads, DType::f32);
  ASSERT_TRUE(
      cpu_->attention_forward(ref_out.cpu.tensor(), ref_lse.cpu.tensor(), qkv.cpu.tensor(), docs.cpu.tensor(), n, s)
          .is_ok());
  auto ref_dqkv = output(n * width);
  ASSERT_TRUE(cpu_->attention_backward(ref_dqkv.cpu.tensor(), dout.cpu.tensor(), ref_out.cpu.tensor(),
                                       ref_lse.cpu.tensor(), qkv.cpu.tensor(), docs.cpu.tensor(), n, s)
                  .is_ok());
  std::vector<std::string> seen;
  std::vector<float> fastest;
  for (int kib : {0, 200, 163, 120, 99, 90, 70, 64, 48, 40, 24}) {
    const size_t limit = static_cast<size_t>(kib) * 1024;
    const std::string variant = cuda::flash_backward_variant(s.head_dim, false, limit);
    if (variant.empty() || cuda::flash_attention_shared_bytes(s.head_dim) > (kib == 0 ? SIZE_MAX : limit)) continue;
    if (std::find(seen.begin(), seen.end(), variant) != seen.end()) continue;
    seen.push_back(variant);
    SCOPED_TRACE("head_dim " + std::to_string(s.head_dim) + ", limit " + std::to_string(kib) + " KiB: " + variant);
    BackendConfig config;
    config.attention_kernel = AttentionKernel::mma;
    config.shared_memory_limit_kib = kib;
    ASSERT_TRUE(gpu_->synchronize().is_ok());
    auto backend = make_cuda_backend(0, config).take();
    auto out = output(n * qw);
    auto lse = output(n * s.heads, DType::f32);
    ASSERT_TRUE(
        backend->attention_forward(out.gpu.tensor(), lse.gpu.tensor(), qkv.gpu.tensor(), docs.gpu.tensor(), n, s)
            .is_ok());
    auto dqkv = output(n * width);
    ASSERT_TRUE(backend
                    ->attention_backward(dqkv.gpu.tensor(), dout.gpu.tensor(), out.gpu.tensor(), lse.gpu.tensor(),
                                         qkv.gpu.tensor(), docs.gpu.tensor(), n, s)
                    .is_ok());
    ASSERT_TRUE(backend->synchronize().is_ok());
    EXPECT_LT(relative_error(from_gpu(out.gpu), from_cpu(ref_out.cpu)), kBf16OpTolerance) << "out";
    const std::vector<float> grads = from_gpu(dqkv.gpu);
    EXPECT_LT(relative_error(grads, from_cpu(ref_dqkv.cpu)), 2e-2) << "dqkv";
    if (fastest.empty()) fastest = grads;
    EXPECT_LT(worst_row_error(grads, fastest, static_cast<size_t>(s.head_dim)), 3e-2)
        << "dqkv: worst (token, head) row against the fastest variant";
  }
  EXPECT_EQ(seen.size(), 3u) << "each of the three backward variants ran";
  // Below the smallest variant the backend refuses with the sizes named, not a failed launch.
  BackendConfig tiny;
  tiny.attention_kernel = AttentionKernel::mma;
  tiny.shared_memory_limit_kib = 16;
  auto backend = make_cuda_backend(0, tiny).take();
  auto out = output(n * qw);
  auto lse = output(n * s.heads, DType::f32);
  const Status st =
      backend->attention_forward(out.gpu.tensor(), lse.gpu.tensor(), qkv.gpu.tensor(), docs.gpu.tensor(), n, s);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("KiB of shared memory per block"), std::string::npos) << st.message();
}

INSTANTIATE_TEST_SUITE_P(HeadDims, FlashVariants, ::testing::Values(32, 64, 128));

// Context parallelism's cross-rank attention: each rank of a group of C holds the zigzag share of a
// row (data/context_split.h) and runs its queries against the gathered k | v. Every rank's out,
// lse and dq, and the group's summed dk | dv, against the CPU's gathered op on the same inputs and
// against the GPU's whole-row attention, every (token, head) row; rows of odd lengths (no multiple
// of the tiles, so that query tiles straddle a share's two chunks), documents that start inside
// chunks and on chunk edges, and the one-token documents the data path pads with. Each share's
// forward also runs against k | v in row order without row indices (kv_rows without data, as a KV
// cache's run of rows is read): the gathered forward's numbers, bit for bit. On this GPU the
// head_dim 128 cases run the kernels the whole row runs (wgmma on an H200); the A100 and RTX 4090
// profiles run the mma.sync ones.
struct GatheredCase {
  int group;
  int64_t chunk;
  AttentionShape shape;
  std::vector<int32_t> starts;  // document starts in the row (0 first)
};

std::string gathered_case_name(const ::testing::TestParamInfo<std::tuple<GatheredCase, DeviceProfile>>& param) {
  const GatheredCase& c = std::get<0>(param.param);
  return "cp" + std::to_string(c.group) + "_chunk" + std::to_string(c.chunk) + "_heads" + std::to_string(c.shape.heads) +
         "x" + std::to_string(c.shape.kv_heads) + "_d" + std::to_string(c.shape.head_dim) + "_" +
         std::get<1>(param.param).name;
}
void PrintTo(const GatheredCase& c, std::ostream* os) {
  *os << "group " << c.group << ", chunk " << c.chunk << ", " << c.shape.heads << " heads on " << c.shape.kv_heads
      << " KV groups of " << c.shape.head_dim;
}

class GatheredAttention : public Ops, public ::testing::WithParamInterface<std::tuple<GatheredCase, DeviceProfile>> {
 protected:
  BackendConfig gpu_config() const override { return std::get<1>(GetParam()).config(); }
};

TEST_P(GatheredAttention, SharesMatchCpuAndWholeRow) {
  const GatheredCase& c = std::get<0>(GetParam());
  const AttentionShape s = c.shape;
  const int64_t row = 2 * c.group * c.chunk, width = s.qkv_width(), qw = s.heads * s.head_dim;
  const int64_t kvw = 2 * s.kv_heads * s.head_dim;
  std::vector<int32_t> doc(static_cast<size_t>(row));
  for (int64_t t = 0, next = 0; t < row; ++t) {
    while (next < static_cast<int64_t>(c.starts.size()) && c.starts[static_cast<size_t>(next)] <= t) ++next;
    doc[static_cast<size_t>(t)] = c.starts[static_cast<size_t>(next - 1)];
  }
  const std::vector<float> qkv = random_bf16(static_cast<size_t>(row * width), 71 + c.group, 1.5);
  const std::vector<float> dout = random_bf16(static_cast<size_t>(row * qw), 72 + c.group);
  // The whole row on the GPU: what the shares must add up to.
  auto whole_qkv = dual(qkv);
  auto whole_doc = ints(doc);
  auto whole_out = output(row * qw);
  auto whole_lse = output(row * s.heads, DType::f32);
  ASSERT_TRUE(gpu_->attention_forward(whole_out.gpu.tensor(), whole_lse.gpu.tensor(), whole_qkv.gpu.tensor(),
                                      whole_doc.gpu.tensor(), row, s)
                  .is_ok());
  auto whole_dout = dual(dout);
  auto whole_dqkv = output(row * width);
  ASSERT_TRUE(gpu_->attention_backward(whole_dqkv.gpu.tensor(), whole_dout.gpu.tensor(), whole_out.gpu.tensor(),
                                       whole_lse.gpu.tensor(), whole_qkv.gpu.tensor(), whole_doc.gpu.tensor(), row, s)
                  .is_ok());
  const std::vector<float> ref_out = from_gpu(whole_out.gpu), ref_lse = from_gpu(whole_lse.gpu);
  const std::vector<float> ref_dqkv = from_gpu(whole_dqkv.gpu);

  // The all-gather of k | v (rank-major), and the gradient the group's reduce-scatter sums.
  const std::vector<int32_t> rows = ContextSplit::gathered_rows(row, c.group);
  std::vector<float> kv_host(static_cast<size_t>(row * kvw));
  for (int64_t t = 0; t < row; ++t)
    std::copy_n(qkv.begin() + t * width + qw, kvw, kv_host.begin() + rows[static_cast<size_t>(t)] * kvw);
  auto kv = dual(kv_host);
  auto kv_rows = ints(rows);
  std::vector<float> kv_in_order(kv_host.size());
  for (int64_t t = 0; t < row; ++t) std::copy_n(qkv.begin() + t * width + qw, kvw, kv_in_order.begin() + t * kvw);
  auto kv_run = dual(kv_in_order);
  const Tensor no_rows{nullptr, 0, DType::i32};
  auto dkv = dual(std::vector<float>(kv_host.size(), 0.0f));
  std::vector<float> share_ref_out, share_out, share_ref_dq, share_dq;
  for (int r = 0; r < c.group; ++r) {
    const std::vector<int32_t> pos = ContextSplit{c.group, r}.positions(row);
    const int64_t n = static_cast<int64_t>(pos.size());
    std::vector<float> local_qkv(static_cast<size_t>(n * width)), local_dout(static_cast<size_t>(n * qw));
    std::vector<int32_t> local_doc(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = pos[static_cast<size_t>(i)];
      std::copy_n(qkv.begin() + p * width, width, local_qkv.begin() + i * width);
      std::copy_n(dout.begin() + p * qw, qw, local_dout.begin() + i * qw);
      local_doc[static_cast<size_t>(i)] = doc[static_cast<size_t>(p)];
    }
    auto q = dual(local_qkv);
    auto positions = ints(pos);
    auto docs = ints(local_doc);
    auto out = output(n * qw);
    auto lse = output(n * s.heads, DType::f32);
    for (Backend* backend : {cpu_.get(), gpu_.get()}) {
      const bool gpu = backend == gpu_.get();
      ASSERT_TRUE(backend
                      ->attention_forward_gathered((gpu ? out.gpu : out.cpu).tensor(), (gpu ? lse.gpu : lse.cpu).tensor(),
                                                   (gpu ? q.gpu : q.cpu).tensor(), (gpu ? kv.gpu : kv.cpu).tensor(),
                                                   (gpu ? kv_rows.gpu : kv_rows.cpu).tensor(),
                                                   (gpu ? positions.gpu : positions.cpu).tensor(),
                                                   (gpu ? docs.gpu : docs.cpu).tensor(), n, s)
                      .is_ok());
    }
    expect_close(out, "gathered out");
    expect_close(lse, "gathered lse", 1e-4);
    auto run_out = output(n * qw);
    auto run_lse = output(n * s.heads, DType::f32);
    for (Backend* backend : {cpu_.get(), gpu_.get()}) {
      const bool gpu = backend == gpu_.get();
      auto pick = [&](Dual& x) { return (gpu ? x.gpu : x.cpu).tensor(); };
      ASSERT_TRUE(backend
                      ->attention_forward_gathered(pick(run_out), pick(run_lse), pick(q), pick(kv_run), no_rows,
                                                   pick(positions), pick(docs), n, s)
                      .is_ok());
    }
    expect_close(run_out, "out, k | v in row order");
    EXPECT_EQ(from_gpu(run_out.gpu), from_gpu(out.gpu)) << "k | v in row order against gathered";
    EXPECT_EQ(from_gpu(run_lse.gpu), from_gpu(lse.gpu)) << "k | v in row order against gathered";
    // Both backwards from the GPU's forward results, as the engine runs them.
    auto o = dual(from_gpu(out.gpu));
    auto l = dual(from_gpu(lse.gpu), DType::f32);
    auto d = dual(local_dout);
    auto dqkv = output(n * width);
    for (Backend* backend : {cpu_.get(), gpu_.get()}) {
      const bool gpu = backend == gpu_.get();
      auto pick = [&](Dual& x) { return (gpu ? x.gpu : x.cpu).tensor(); };
      ASSERT_TRUE(backend
                      ->attention_backward_gathered(pick(dqkv), pick(dkv), pick(d), pick(o), pick(l), pick(q),
                                                    pick(kv), pick(kv_rows), pick(positions), pick(docs), n, s)
                      .is_ok());
    }
    expect_close(dqkv, "gathered dqkv", 2e-2);
    const std::vector<float> ours = from_gpu(out.gpu), grads = from_gpu(dqkv.gpu);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = pos[static_cast<size_t>(i)];
      share_out.insert(share_out.end(), ours.begin() + i * qw, ours.begin() + (i + 1) * qw);
      share_ref_out.insert(share_ref_out.end(), ref_out.begin() + p * qw, ref_out.begin() + (p + 1) * qw);
      share_dq.insert(share_dq.end(), grads.begin() + i * width, grads.begin() + i * width + qw);
      share_ref_dq.insert(share_ref_dq.end(), ref_dqkv.begin() + p * width, ref_dqkv.begin() + p * width + qw);
      for (int64_t j = qw; j < width; ++j) ASSERT_EQ(grads[static_cast<size_t>(i * width + j)], 0.0f) << "k, v zeroed";
    }
  }
  expect_close(dkv, "gathered dk | dv summed over the group", 2e-2);
  EXPECT_LT(worst_row_error(share_out, share_ref_out, static_cast<size_t>(s.head_dim)), 3e-2) << "out: whole row";
  EXPECT_LT(relative_error(share_dq, share_ref_dq), 2e-2) << "dq: whole row";
  EXPECT_LT(worst_row_error(share_dq, share_ref_dq, static_cast<size_t>(s.head_dim)), 3e-2) << "dq: worst row";
  const std::vector<float> summed = from_gpu(dkv.gpu);
  std::vector<float> ours_kv, ref_kv;
  for (int64_t t = 0; t < row; ++t) {
    const auto at = summed.begin() + rows[static_cast<size_t>(t)] * kvw;
    ours_kv.insert(ours_kv.end(), at, at + kvw);
    ref_kv.insert(ref_kv.end(), ref_dqkv.begin() + t * width + qw, ref_dqkv.begin() + (t + 1) * width);
  }
  EXPECT_LT(relative_error(ours_kv, ref_kv), 2e-2) << "dk | dv: whole row";
  EXPECT_LT(worst_row_error(ours_kv, ref_kv, static_cast<size_t>(s.head_dim)), 3e-2) << "dk | dv: worst row";
}

INSTANTIATE_TEST_SUITE_P(
    Groups, GatheredAttention,
    ::testing::Combine(::testing::Values(GatheredCase{2, 37, {4, 2, 64}, {0, 30, 31, 100}},
                                         GatheredCase{3, 50, {8, 2, 128}, {0, 150, 170, 299}},
                                         GatheredCase{4, 128, {32, 2, 128}, {0, 700}},
                                         GatheredCase{2, 300, {4, 1, 32}, {0}},
                                         GatheredCase{8, 45, {16, 4, 128}, {0, 90, 400, 715, 716, 717, 718, 719}},
                                         GatheredCase{2, 333, {8, 2, 128}, {0, 100, 333, 666, 1000, 1330, 1331}},
                                         GatheredCase{3, 700, {4, 1, 128}, {0, 1500, 2801}}),
                       ::testing::ValuesIn(kProfiles)),
    gathered_case_name);

// SwiGLU on both paths: odd ffn (scalar), multiples of 8 (vectors) with totals that leave a partial
// last block, GLM-4's 13696, and offset 1 bf16 into the buffers (misaligned: scalar fallback).
class Swiglu : public Ops, public ::testing::WithParamInterface<std::tuple<int, int, int>> {};

TEST_P(Swiglu, ForwardAndBackwardMatchCpu) {
  const auto [rows, width, offset] = GetParam();
  const int64_t n = rows, ffn = width, off = offset;
  auto gu = dual(random_bf16(off + n * 2 * ffn, 18, 3.0));
  auto out = output(off + n * ffn);
  auto view = [&](const Buffer& b, int64_t count) { return b.slice(off, count); };
  ASSERT_TRUE(cpu_->swiglu_forward(view(out.cpu, n * ffn), view(gu.cpu, n * 2 * ffn), n, ffn).is_ok());
  ASSERT_TRUE(gpu_->swiglu_forward(view(out.gpu, n * ffn), view(gu.gpu, n * 2 * ffn), n, ffn).is_ok());
  if (off > 0) {  // the elements before the view stay NaN on both sides; compare the view only
    auto ours = from_gpu(out.gpu), ref = from_cpu(out.cpu);
    EXPECT_TRUE(std::isnan(ours[0])) << "swiglu forward wrote before its output";
    ours.erase(ours.begin(), ours.begin() + off);
    ref.erase(ref.begin(), ref.begin() + off);
    EXPECT_LT(relative_error(ours, ref), kBf16OpTolerance) << "swiglu forward (offset view)";
  } else {
    expect_close(out, "swiglu forward");
  }
  auto dout = dual(random_bf16(off + n * ffn, 19));
  auto dgu = output(off + n * 2 * ffn);
  ASSERT_TRUE(
      cpu_->swiglu_backward(view(dgu.cpu, n * 2 * ffn), view(dout.cpu, n * ffn), view(gu.cpu, n * 2 * ffn), n, ffn)
          .is_ok());
  ASSERT_TRUE(
      gpu_->swiglu_backward(view(dgu.gpu, n * 2 * ffn), view(dout.gpu, n * ffn), view(gu.gpu, n * 2 * ffn), n, ffn)
          .is_ok());
  auto ours = from_gpu(dgu.gpu), ref = from_cpu(dgu.cpu);
  ours.erase(ours.begin(), ours.begin() + off);
  ref.erase(ref.begin(), ref.begin() + off);
  EXPECT_LT(relative_error(ours, ref), kBf16OpTolerance) << "swiglu backward";
}

INSTANTIATE_TEST_SUITE_P(Shapes, Swiglu,
                         ::testing::Values(std::make_tuple(13, 111, 0), std::make_tuple(1, 8, 0),
                                           std::make_tuple(7, 64, 0), std::make_tuple(300, 24, 0),
                                           std::make_tuple(3, 13696, 0), std::make_tuple(5, 64, 1)));

TEST_F(Ops, Add) {
  auto a = dual(random_bf16(1001, 20));
  auto b = dual(random_bf16(1001, 21));
  auto c = output(1001);
  ASSERT_TRUE(cpu_->add(c.cpu.tensor(), a.cpu.tensor(), b.cpu.tensor(), 1001).is_ok());
  ASSERT_TRUE(gpu_->add(c.gpu.tensor(), a.gpu.tensor(), b.gpu.tensor(), 1001).is_ok());
  expect_close(c, "add");
}

// RoPE alone on the vectorised shapes (GLM-4-9B's 32 + 2 heads of 128 with 64 rotated; 28 + 4 heads,
// exactly 8 per thread group; one 16-byte vector per head at head_dim 16) and the scalar one (rotary
// 20), with positions up to 131,071 (fp32 angles past sincosf's fast range). Everything outside
// the rotated part of q and k (the other half of each head, all of v) must come back bit-identical.
class Rope : public Ops, public ::testing::WithParamInterface<std::tuple<int, int, int, int>> {
 protected:
  static RopeStore rope_store_args(AttentionShape s, int64_t rotary, Dual& positions, Dual& cache, Dual& rows,
                                   Dual& staging, bool gpu) {
    RopeStore r;
    r.positions = gpu ? positions.gpu.tensor() : positions.cpu.tensor();
    r.shape = s;
    r.rotary_dim = rotary;
    r.base = 5e6;
    r.cache = gpu ? cache.gpu.tensor() : cache.cpu.tensor();
    r.cache_rows = gpu ? rows.gpu.tensor() : rows.cpu.tensor();
    r.staging = gpu ? staging.gpu.tensor() : staging.cpu.tensor();
    return r;
  }
};

TEST_P(Rope, RotatesOnlyTheRotaryPartOfQAndK) {
  const auto [heads, kv_heads, head_dim, rotary] = GetParam();
  const AttentionShape s{heads, kv_heads, head_dim};
  const int64_t n = 67, width = s.qkv_width();
  std::vector<int32_t> pos;
  // A few tokens far out: an ulp of difference between host and device powf moves their angles by
  // up to ~1e-2 rad, so they are kept to 7 of 67 tokens to stay inside the norm-wise tolerance.
  for (int t = 0; t < n; ++t) pos.push_back(t < 60 ? 61 * t : 131071 - 977 * (t - 60));
  auto positions = ints(pos);
  const std::vector<float> input = random_bf16(n * width, 25, 1.5);
  for (const double direction : {1.0, -1.0}) {
    auto qkv = dual(input);
    if (direction > 0) {
      ASSERT_TRUE(cpu_->rope_forward(qkv.cpu.tensor(), positions.cpu.tensor(), n, s, rotary, 5e6).is_ok());
      ASSERT_TRUE(gpu_->rope_forward(qkv.gpu.tensor(), positions.gpu.tensor(), n, s, rotary, 5e6).is_ok());
    } else {
      ASSERT_TRUE(cpu_->rope_backward(qkv.cpu.tensor(), positions.cpu.tensor(), n, s, rotary, 5e6).is_ok());
      ASSERT_TRUE(gpu_->rope_backward(qkv.gpu.tensor(), positions.gpu.tensor(), n, s, rotary, 5e6).is_ok());
    }
    expect_close(qkv, direction > 0 ? "rope forward" : "rope backward");
    const auto ours = from_gpu(qkv.gpu);
    int64_t changed_outside = 0;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < width; ++j) {
        const bool rotated = j < (heads + kv_heads) * head_dim && j % head_dim < rotary;
        const size_t i = static_cast<size_t>(t * width + j);
        if (!rotated && std::memcmp(&ours[i], &input[i], sizeof(float)) != 0) ++changed_outside;
      }
    EXPECT_EQ(changed_outside, 0) << "rope wrote outside the rotated part";
  }
}

// Generation's RoPE and KV-cache store (Backend::rope_store): q and k rotated exactly as rope_forward
// rotates them on the same backend (bit-identical on the GPU, one kernel on the vectorised shapes),
// each token's k | v columns in its cache row (rows in shuffled order), the other rows untouched.
TEST_P(Rope, StoreRotatesAndWritesTheCacheRows) {
  const auto [heads, kv_heads, head_dim, rotary] = GetParam();
  const AttentionShape s{heads, kv_heads, head_dim};
  const int64_t n = 19, width = s.qkv_width(), kv_width = 2 * kv_heads * head_dim, cache_rows = 40;
  std::vector<int32_t> pos, rows;
  for (int t = 0; t < n; ++t) {
    pos.push_back(t < 16 ? 97 * t + 3 : 131071 - 5 * t);
    rows.push_back(static_cast<int32_t>((t * 7 + 5) % cache_rows));
  }
  auto positions = ints(pos), row_index = ints(rows);
  const std::vector<float> input = random_bf16(n * width, 61, 1.5), old_cache = random_bf16(cache_rows * kv_width, 62);
  auto qkv = dual(input), reference = dual(input), cache = dual(old_cache), staging = output(n * kv_width);
  for (const bool gpu : {false, true}) {
    const RopeStore store = rope_store_args(s, rotary, positions, cache, row_index, staging, gpu);
    Backend& be = gpu ? *gpu_ : *cpu_;
    ASSERT_TRUE(be.rope_store(gpu ? qkv.gpu.tensor() : qkv.cpu.tensor(), n, store).is_ok());
  }
  expect_close(qkv, "rope_store's qkv");
  expect_close(cache, "rope_store's cache");
  ASSERT_TRUE(gpu_->rope_forward(reference.gpu.tensor(), positions.gpu.tensor(), n, s, rotary, 5e6).is_ok());
  const auto ours = from_gpu(qkv.gpu), rotated = from_gpu(reference.gpu), stored = from_gpu(cache.gpu);
  EXPECT_EQ(std::memcmp(ours.data(), rotated.data(), ours.size() * sizeof(float)), 0)
      << "rope_store's rotation differs from rope_forward's";
  std::vector<bool> written(cache_rows, false);
  int64_t wrong = 0;
  for (int64_t t = 0; t < n; ++t) {
    written[static_cast<size_t>(rows[t])] = true;
    for (int64_t c = 0; c < kv_width; ++c)
      wrong += std::memcmp(&stored[static_cast<size_t>(rows[t] * kv_width + c)],
                           &rotated[static_cast<size_t>(t * width + heads * head_dim + c)], sizeof(float)) != 0;
  }
  for (int64_t r = 0; r < cache_rows; ++r)
    if (!written[static_cast<size_t>(r)])
      for (int64_t c = 0; c < kv_width; ++c)
        wrong += std::memcmp(&stored[static_cast<size_t>(r * kv_width + c)],
                             &old_cache[static_cast<size_t>(r * kv_width + c)], sizeof(float)) != 0;
  EXPECT_EQ(wrong, 0) << "cache elements other than the tokens' rotated k | v";
}

// Generation's attention linear of one token with the RoPE and the store fused into the GEMV
// (Backend::normed_linear_forward with a RopeStore): bit-identical on the GPU to the GEMV with the norm
// alone followed by rope_store (q | k | v and the whole cache), within tolerance of the CPU's
// separate ops, at positions up to 131,067.
TEST_P(Rope, NormedLinearWithTheStoreMatchesTheSeparateOps) {
  const auto [heads, kv_heads, head_dim, rotary] = GetParam();
  const AttentionShape s{heads, kv_heads, head_dim};
  const int64_t in_f = 136, width = s.qkv_width(), kv_width = 2 * kv_heads * head_dim, cache_rows = 9;
  auto x = dual(random_bf16(in_f, 71, 3.0)), g = dual(random_bf16(in_f, 72));
  auto w = dual(random_bf16(width * in_f, 73, 0.2)), bias = dual(random_bf16(width, 74));
  auto normed = output(in_f), rstd = output(1, DType::f32), staging = output(kv_width);
  const std::vector<float> old_cache = random_bf16(cache_rows * kv_width, 75);
  for (const int32_t position : {3, 4097, 131067}) {
    SCOPED_TRACE(position);
    auto positions = ints({position}), row_index = ints({5});
    auto fused = output(width), separate = output(width);
    auto cache = dual(old_cache), cache_separate = dual(old_cache);
    for (const bool gpu : {false, true}) {
      Backend& be = gpu ? *gpu_ : *cpu_;
      auto t = [gpu](Dual& d) { return gpu ? d.gpu.tensor() : d.cpu.tensor(); };
      const RopeStore store = rope_store_args(s, rotary, positions, cache, row_index, staging, gpu);
      ASSERT_TRUE(be.normed_linear_forward(t(fused), t(x), t(g), 1e-5, t(w), t(bias), false, 1, in_f, width,
                                           t(normed), t(rstd), Tensor{}, &store)
                      .is_ok());
    }
    expect_close(fused, "norm + linear + rope + store");
    expect_close(cache, "norm + linear + rope + store: the cache");
    const RopeStore store = rope_store_args(s, rotary, positions, cache_separate, row_index, staging, true);
    ASSERT_TRUE(gpu_->normed_linear_forward(separate.gpu.tensor(), x.gpu.tensor(), g.gpu.tensor(), 1e-5,
                                            w.gpu.tensor(), bias.gpu.tensor(), false, 1, in_f, width,
                                            normed.gpu.tensor(), rstd.gpu.tensor(), Tensor{})
                    .is_ok());
    ASSERT_TRUE(gpu_->rope_store(separate.gpu.tensor(), 1, store).is_ok());
    const auto a = from_gpu(fused.gpu), b = from_gpu(separate.gpu);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "q | k | v differ from the separate ops'";
    const auto ca = from_gpu(cache.gpu), cb = from_gpu(cache_separate.gpu);
    EXPECT_EQ(std::memcmp(ca.data(), cb.data(), ca.size() * sizeof(float)), 0) << "the cache differs from the separate ops'";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Rope,
                         ::testing::Values(std::make_tuple(32, 2, 128, 64), std::make_tuple(28, 4, 64, 32),
                                           std::make_tuple(3, 1, 16, 8), std::make_tuple(4, 2, 40, 20)));

// vocab 1003 and 1004 take the element-wise cross-entropy, 1008 and 4104 the 16-byte rows.
class LmHead : public Ops, public ::testing::WithParamInterface<int64_t> {};
INSTANTIATE_TEST_SUITE_P(Vocab, LmHead, ::testing::Values(1003, 1004, 1008, 4096 + 8));
TEST_P(LmHead, CrossEntropyMatchesCpu) {
  const int64_t n = 29, hidden = 64, vocab = GetParam();
  std::vector<int32_t> tgt;
  for (int t = 0; t < n; ++t) tgt.push_back(t % 5 == 0 ? -1 : (t * 131) % vocab);
  auto targets = ints(tgt);
  auto h = dual(random_bf16(n * hidden, 22));
  auto w = dual(random_bf16(vocab * hidden, 23, 0.3));
  auto losses = output(n, DType::f32);
  auto dh = output(n * hidden);
  auto dw = dual(random_bf16(vocab * hidden, 24, 0.01));
  const double scale = 1.0 / 23;
  ASSERT_TRUE(cpu_->lm_head_cross_entropy(losses.cpu.tensor(), Tensor{}, dh.cpu.tensor(), dw.cpu.tensor(),
                                          h.cpu.tensor(), w.cpu.tensor(), targets.cpu.tensor(), n, hidden, vocab, scale,
                                          true)
                  .is_ok());
  ASSERT_TRUE(gpu_->lm_head_cross_entropy(losses.gpu.tensor(), Tensor{}, dh.gpu.tensor(), dw.gpu.tensor(),
                                          h.gpu.tensor(), w.gpu.tensor(), targets.gpu.tensor(), n, hidden, vocab, scale,
                                          true)
                  .is_ok());
  expect_close(losses, "losses", 5e-3);
  expect_close(dh, "dhidden");
  expect_close(dw, "dweight");
  // Overwritten: the accumulated values just checked must not leak in.
  ASSERT_TRUE(cpu_->lm_head_cross_entropy(losses.cpu.tensor(), Tensor{}, dh.cpu.tensor(), dw.cpu.tensor(),
                                          h.cpu.tensor(), w.cpu.tensor(), targets.cpu.tensor(), n, hidden, vocab, scale,
                                          false)
                  .is_ok());
  ASSERT_TRUE(gpu_->lm_head_cross_entropy(losses.gpu.tensor(), Tensor{}, dh.gpu.tensor(), dw.gpu.tensor(),
                                          h.gpu.tensor(), w.gpu.tensor(), targets.gpu.tensor(), n, hidden, vocab, scale,
                                          false)
                  .is_ok());
  expect_close(dw, "dweight (overwritten)");
}

// GLM-4's vocabulary at more rows than one chunk of a 512 MiB logits budget holds (1771 rows): the
// weight gradient is written by the first chunk's GEMM (beta = 0) and added to by the second, both
// when accumulating onto an old gradient and when overwriting it. (Half a minute, nearly all of it
// the CPU reference's 2500 x 151552 logits.)
TEST_F(Ops, LmHeadTwoChunksAccumulateAndOverwrite) {
  const int64_t vocab = 151552, hidden = 32, n = 2500;
  BackendConfig small;
  small.lm_head_scratch_bytes = int64_t{512} << 20;
  auto g = make_cuda_backend(0, small);
  ASSERT_TRUE(g.is_ok()) << g.status().message();
  gpu_ = g.take();
  ASSERT_EQ(lm_head_chunk_rows(n, vocab, small.lm_head_scratch_bytes), 1250);
  std::vector<int32_t> tgt;
  for (int t = 0; t < n; ++t) tgt.push_back(t % 7 == 0 ? -1 : static_cast<int32_t>((t * 7919) % vocab));
  auto targets = ints(tgt);
  auto h = dual(random_bf16(n * hidden, 41));
  auto w = dual(random_bf16(vocab * hidden, 42, 0.3));
  auto losses = output(n, DType::f32);
  auto dh = output(n * hidden);
  auto dw = dual(random_bf16(vocab * hidden, 43, 0.01));
  for (bool accumulate : {true, false}) {
    SCOPED_TRACE(accumulate ? "accumulating" : "overwriting");
    ASSERT_TRUE(cpu_->lm_head_cross_entropy(losses.cpu.tensor(), Tensor{}, dh.cpu.tensor(), dw.cpu.tensor(),
                                            h.cpu.tensor(), w.cpu.tensor(), targets.cpu.tensor(), n, hidden, vocab,
                                            1.0 / n, accumulate)
                    .is_ok());
    ASSERT_TRUE(gpu_->lm_head_cross_entropy(losses.gpu.tensor(), Tensor{}, dh.gpu.tensor(), dw.gpu.tensor(),
                                            h.gpu.tensor(), w.gpu.tensor(), targets.gpu.tensor(), n, hidden, vocab,
                                            1.0 / n, accumulate)
                    .is_ok());
    expect_close(losses, "losses", 5e-3);
    expect_close(dh, "dhidden");
    expect_close(dw, "dweight");
  }
}

// The argmax-correct flags (token accuracy) against the CPU reference, exactly: half of the targeted
// rows aim at their row's argmax (taken from the CPU's logits, where the runner-up is clearly below,
// so fp32 summation order cannot flip it), the rest elsewhere; ignored rows must read 0.
TEST_F(Ops, LmHeadCrossEntropyTokenAccuracy) {
  // vocab 1003 takes the element-wise kernel, 1008 the 16-byte rows (their argmax indices).
  for (const int64_t vocab : {int64_t{1003}, int64_t{1008}}) {
    SCOPED_TRACE("vocab " + std::to_string(vocab));
    const int64_t n = 61, hidden = 64;
    // A clear winner: logits are O(2) and the GPU rounds them to bf16 (a step of 2^-7 between 1 and
    // 2, 2^-6 between 2 and 4), so a runner-up within two steps could tie or pass it there.
    constexpr double kArgmaxMargin = 2.0 / 64;
    auto h = dual(random_bf16(n * hidden, 31));
    auto w = dual(random_bf16(vocab * hidden, 32, 0.3));
    Buffer logits = cpu_->allocate(n * vocab, DType::f32).take();
    ASSERT_TRUE(
        cpu_->linear_forward(logits.tensor(), h.cpu.tensor(), w.cpu.tensor(), Tensor{}, n, hidden, vocab).is_ok());
    const float* z = logits.tensor().as<float>();
    std::vector<int32_t> tgt, expected;
    for (int64_t t = 0; t < n; ++t) {
      const float* row = z + t * vocab;
      const int64_t best = std::max_element(row, row + vocab) - row;
      float second = -INFINITY;
      for (int64_t v = 0; v < vocab; ++v)
        if (v != best) second = std::max(second, row[v]);
      const bool clear = row[best] - second > kArgmaxMargin;
      if (t % 7 == 3) {
        tgt.push_back(-1);
        expected.push_back(0);
      } else if (t % 2 == 0 && clear) {
        tgt.push_back(static_cast<int32_t>(best));
        expected.push_back(1);
      } else {
        tgt.push_back(static_cast<int32_t>((best + 1 + t) % vocab));
        expected.push_back(0);
      }
    }
    ASSERT_GE(std::count(expected.begin(), expected.end(), 1), 12) << "too few clear argmax rows to test";
    auto targets = ints(tgt);
    auto losses = output(n, DType::f32);
    auto correct = ints(std::vector<int32_t>(static_cast<size_t>(n), 7));  // poisoned: must be overwritten
    ASSERT_TRUE(cpu_->lm_head_cross_entropy(losses.cpu.tensor(), correct.cpu.tensor(), Tensor{}, Tensor{},
                                            h.cpu.tensor(), w.cpu.tensor(), targets.cpu.tensor(), n, hidden, vocab, 0.0,
                                            true)
                    .is_ok());
    ASSERT_TRUE(gpu_->lm_head_cross_entropy(losses.gpu.tensor(), correct.gpu.tensor(), Tensor{}, Tensor{},
                                            h.gpu.tensor(), w.gpu.tensor(), targets.gpu.tensor(), n, hidden, vocab, 0.0,
                                            true)
                    .is_ok());
    std::vector<int32_t> on_cpu(static_cast<size_t>(n)), on_gpu(static_cast<size_t>(n));
    ASSERT_TRUE(cpu_->download(on_cpu.data(), correct.cpu.tensor()).is_ok());
    ASSERT_TRUE(gpu_->download(on_gpu.data(), correct.gpu.tensor()).is_ok());
    EXPECT_EQ(on_cpu, expected) << "the CPU reference";
    EXPECT_EQ(on_gpu, expected) << "the CUDA kernel";
    expect_close(losses, "losses next to the argmax", 5e-3);
  }
}

// bf16 <-> fp32 conversion and the sum of squares on the vector path (16-byte aligned views, 8
// elements per vector, lengths that leave a tail) and the scalar one (views 1 and 3 elements in),
// exactly against the host's round-to-nearest-even.
TEST_F(Ops, ConvertAndSumSquaresAlignedAndNot) {
  for (const int64_t offset : {0, 1, 3, 8})
    for (const int64_t n : {int64_t{13}, int64_t{4096}, int64_t{100003}}) {
      const int64_t total = offset + n;
      std::vector<float> wide(static_cast<size_t>(total));  // not representable in bf16
      const auto d = random_vector(wide.size(), static_cast<uint64_t>(91 + n + offset), 3.0);
      for (size_t i = 0; i < wide.size(); ++i) wide[i] = static_cast<float>(d[i]);
      Buffer f = gpu_->allocate(total, DType::f32).take(), h = gpu_->allocate(total, DType::bf16).take();
      Buffer back = gpu_->allocate(total, DType::f32).take();
      ASSERT_TRUE(gpu_->upload(f.tensor(), wide.data()).is_ok());
      ASSERT_TRUE(gpu_->fill(back.tensor(), NAN).is_ok());
      ASSERT_TRUE(gpu_->convert(h.slice(offset, n), f.slice(offset, n)).is_ok());
      ASSERT_TRUE(gpu_->convert(back.slice(offset, n), h.slice(offset, n)).is_ok());
      std::vector<float> got(static_cast<size_t>(total));
      ASSERT_TRUE(gpu_->download(got.data(), back.tensor()).is_ok());
      int64_t wrong = 0;
      double bf16_squares = 0, f32_squares = 0;
      for (int64_t i = 0; i < offset; ++i) wrong += std::isnan(got[static_cast<size_t>(i)]) ? 0 : 1;
      for (int64_t i = offset; i < total; ++i) {
        const float r = round_bf16(wide[static_cast<size_t>(i)]);
        wrong += std::memcmp(&got[static_cast<size_t>(i)], &r, sizeof r) == 0 ? 0 : 1;
        bf16_squares += static_cast<double>(r) * r;
        f32_squares += static_cast<double>(wide[static_cast<size_t>(i)]) * wide[static_cast<size_t>(i)];
      }
      EXPECT_EQ(wrong, 0) << "offset " << offset << ", n " << n << ": elements not round-tripped exactly";
      auto hs = gpu_->sum_squares(h.slice(offset, n));
      auto fs = gpu_->sum_squares(f.slice(offset, n));
      ASSERT_TRUE(hs.is_ok() && fs.is_ok());
      EXPECT_NEAR(hs.value(), bf16_squares, 1e-5 * bf16_squares) << "bf16 sum of squares, offset " << offset;
      EXPECT_NEAR(fs.value(), f32_squares, 1e-5 * f32_squares) << "fp32 sum of squares, offset " << offset;
    }
}

TEST_F(Ops, SumSquaresAndAdamW) {
  // 375,002 vectors of 8 and a 3-element tail: more than one resident wave of the fused norm's
  // grid, so threads stride over several vectors.
  const int64_t n = 3000019;
  auto g = dual(random_bf16(static_cast<size_t>(n), 25));
  auto cs = cpu_->sum_squares(g.cpu.tensor());
  auto gs = gpu_->sum_squares(g.gpu.tensor());
  ASSERT_TRUE(cs.is_ok() && gs.is_ok());
  EXPECT_NEAR(gs.value(), cs.value(), 1e-5 * cs.value());
  {  // accumulate_squares: two odd-sized parts into one f64 on the device, nothing waited for between
    auto acc = gpu_->allocate(1, DType::f64).take();
    const int64_t half = 1000003;
    ASSERT_TRUE(gpu_->accumulate_squares(g.gpu.tensor().slice(0, half), acc.tensor()).is_ok());
    ASSERT_TRUE(gpu_->accumulate_squares(g.gpu.tensor().slice(half, n - half), acc.tensor()).is_ok());
    double got = 0;
    ASSERT_TRUE(gpu_->download(&got, acc.tensor()).is_ok());
    EXPECT_NEAR(got, cs.value(), 1e-5 * cs.value());
  }
  // offset 0: every pointer aligned, vectors of 8 and a 3-element tail; offset 1: the bf16
  // gradient and working copy start one element in, so the whole update goes element by element.
  // Beside: on the side stream (the optimizer inside backward), whose summing grid is short blocks
  // of at most 8 vectors per thread instead of one resident wave.
  for (const auto& [offset, beside] : {std::pair<int64_t, bool>{0, false}, {1, false}, {0, true}, {1, true}}) {
    SCOPED_TRACE("bf16 views at element " + std::to_string(offset) + (beside ? ", beside" : ""));
    auto grad = dual(random_bf16(static_cast<size_t>(n + offset), 25 + static_cast<uint64_t>(offset)));
    auto master = dual(random_bf16(static_cast<size_t>(n), 26), DType::f32);
    auto param = output(n + offset);
    auto m = dual(random_bf16(static_cast<size_t>(n), 27, 0.1), DType::f32);
    auto v_host = random_bf16(static_cast<size_t>(n), 28, 0.1);
    for (auto& x : v_host) x = x * x;
    auto v = dual(v_host, DType::f32);
    AdamWStep step;
    step.lr = 1e-3;
    step.weight_decay = 0.1;
    step.grad_scale = 0.5;
    step.step = 3;
    ASSERT_TRUE(cpu_->adamw(master.cpu.tensor(), master.cpu.tensor(), grad.cpu.tensor().slice(offset, n),
                            m.cpu.tensor(), v.cpu.tensor(), step, Tensor{})
                    .is_ok());
    // The fused gradient norm adds onto what the accumulator holds.
    Buffer acc = gpu_->allocate(1, DType::f64).take();
    const double start = 1.5;
    ASSERT_TRUE(gpu_->upload(acc.tensor(), &start).is_ok());
    auto update = [&] {
      return gpu_->adamw(param.gpu.tensor().slice(offset, n), master.gpu.tensor(), grad.gpu.tensor().slice(offset, n),
                         m.gpu.tensor(), v.gpu.tensor(), step, acc.tensor());
    };
    ASSERT_TRUE((beside ? gpu_->on_side(update) : update()).is_ok());
    ASSERT_TRUE(gpu_->join_side().is_ok());
    double fused = 0;
    ASSERT_TRUE(gpu_->download(&fused, acc.tensor()).is_ok());
    const double squares = cpu_->sum_squares(grad.cpu.tensor().slice(offset, n)).take();
    EXPECT_NEAR(fused - start, squares, 1e-5 * squares) << "sum of squares fused into the update";
    expect_close(master, "adamw master", 1e-6);
    expect_close(m, "adamw exp_avg", 1e-6);
    expect_close(v, "adamw exp_avg_sq", 1e-6);
    std::vector<float> copy = from_gpu(param.gpu);
    copy.erase(copy.begin(), copy.begin() + offset);
    EXPECT_LT(relative_error(copy, from_cpu(master.cpu)), kBf16OpTolerance) << "bf16 working copy";
  }
}

// Split masters (kernels/master_split.h) in AdamW on the GPU. First the kernel's own split and
// join against the host functions, bit for bit, on random bit patterns with exact ties, signed
// zeros, subnormals, values near FLT_MAX, infinities and NaN: a step of lr 0 leaves each master
// as it was (x * 1 - 0), so the halves written must be the host's split of the halves read. Then
// a real step on a split master against the same step on a whole fp32 one: the same fp32
// arithmetic on the same values, so the joined master and the moments equal the whole path's bit
// for bit, the bf16 parameters are the new masters' high halves, some low halves are nonzero, and
// the fused gradient norms agree (offset 0: vectors of 8 and a tail; offset 1: every view
// misaligned, element by element).
TEST_F(Ops, SplitMasters) {
  auto upload_bits = [&](const auto& host, DType dtype) {
    Buffer b = gpu_->allocate(static_cast<int64_t>(host.size()), dtype).take();
    EXPECT_TRUE(gpu_->upload(b.tensor(), host.data()).is_ok());
    return b;
  };
  auto download_u32 = [&](Tensor t) {
    std::vector<uint32_t> out(static_cast<size_t>(t.numel));
    EXPECT_TRUE(gpu_->download(out.data(), t).is_ok());
    return out;
  };
  {
    const int64_t n = 100003;
    std::vector<uint32_t> bits(static_cast<size_t>(n));
    uint64_t state = 0x1234567u;
    for (auto& b : bits) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      b = static_cast<uint32_t>(state >> 32);
    }
    const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x7f7f8000u, 0xff7fffffu, 0x00000000u,
                                0x80000000u, 0x00000001u, 0x807fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u};
    std::copy(std::begin(special), std::end(special), bits.begin());
    std::vector<uint16_t> hi(bits.size());
    std::vector<int16_t> lo(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) split_master(bits_float(bits[i]), hi[i], lo[i]);
    Buffer h = upload_bits(hi, DType::bf16), l = upload_bits(lo, DType::i16);
    Buffer g = upload_bits(std::vector<uint16_t>(bits.size(), 0), DType::bf16);
    Buffer m = upload_bits(std::vector<float>(bits.size(), 0.0f), DType::f32);
    Buffer v = upload_bits(std::vector<float>(bits.size(), 0.0f), DType::f32);
    AdamWStep still;
    still.lr = 0;
    still.step = 1;
    ASSERT_TRUE(gpu_->adamw(h.tensor(), l.tensor(), g.tensor(), m.tensor(), v.tensor(), still, Tensor{}).is_ok());
    std::vector<uint16_t> got_hi(bits.size());
    std::vector<int16_t> got_lo(bits.size());
    ASSERT_TRUE(gpu_->download(got_hi.data(), h.tensor()).is_ok());
    ASSERT_TRUE(gpu_->download(got_lo.data(), l.tensor()).is_ok());
    int64_t wrong = 0;
    for (size_t i = 0; i < bits.size(); ++i) {
      const float x = bits_float(bits[i]), back = join_master(got_hi[i], got_lo[i]);
      const bool ok = std::isnan(x) ? std::isnan(back) : (got_hi[i] == hi[i] && got_lo[i] == lo[i]);
      if (!ok && ++wrong <= 5)
        ADD_FAILURE() << std::hex << "master bits " << bits[i] << ": gpu " << got_hi[i] << "/" << got_lo[i] << ", host "
                      << hi[i] << "/" << lo[i];
    }
    EXPECT_EQ(wrong, 0);
  }

  const int64_t m = 1000003;
  for (const int64_t offset : {int64_t{0}, int64_t{1}}) {
    SCOPED_TRACE("views at element " + std::to_string(offset));
    const std::vector<float> master0 = random_bf16(static_cast<size_t>(m), 31);
    std::vector<float> master_host(static_cast<size_t>(m));
    for (size_t i = 0; i < master_host.size(); ++i)  // full fp32 values, not bf16 ones
      master_host[i] = master0[i] * (1.0f + 1e-3f * static_cast<float>(i % 977) / 977.0f);
    std::vector<uint16_t> hi(static_cast<size_t>(m + offset), 0);
    std::vector<int16_t> lo(static_cast<size_t>(m + offset), 0);
    for (size_t i = 0; i < master_host.size(); ++i)
      split_master(master_host[i], hi[i + static_cast<size_t>(offset)], lo[i + static_cast<size_t>(offset)]);
    std::vector<float> v_host = random_bf16(static_cast<size_t>(m + offset), 34, 0.1);
    for (auto& e : v_host) e = e * e;
    const std::vector<float> m_host = random_bf16(static_cast<size_t>(m + offset), 33, 0.1);
    Buffer grad = dual(random_bf16(static_cast<size_t>(m + offset), 32)).gpu;
    Buffer master_whole = upload_bits(master_host, DType::f32), param_whole = gpu_->allocate(m, DType::bf16).take();
    Buffer m1 = upload_bits(m_host, DType::f32), v1 = upload_bits(v_host, DType::f32);
    Buffer m2 = upload_bits(m_host, DType::f32), v2 = upload_bits(v_host, DType::f32);
    Buffer param_split = upload_bits(hi, DType::bf16), low = upload_bits(lo, DType::i16);
    Tensor ps = param_split.slice(offset, m), ls = low.slice(offset, m);
    Buffer sums = upload_bits(std::vector<double>{0.0, 0.0}, DType::f64);
    AdamWStep step;
    step.lr = 1e-3;
    step.weight_decay = 0.1;
    step.grad_scale = 0.5;
    step.step = 3;
    ASSERT_TRUE(gpu_->adamw(param_whole.tensor(), master_whole.tensor(), grad.slice(offset, m), m1.slice(offset, m),
                            v1.slice(offset, m), step, sums.slice(0, 1))
                    .is_ok());
    ASSERT_TRUE(
        gpu_->adamw(ps, ls, grad.slice(offset, m), m2.slice(offset, m), v2.slice(offset, m), step, sums.slice(1, 1))
            .is_ok());
    const std::vector<uint32_t> expect_master = download_u32(master_whole.tensor());
    std::vector<uint16_t> got_hi(static_cast<size_t>(m));
    std::vector<int16_t> got_lo(static_cast<size_t>(m));
    ASSERT_TRUE(gpu_->download(got_hi.data(), ps).is_ok());
    ASSERT_TRUE(gpu_->download(got_lo.data(), ls).is_ok());
    int64_t master_off = 0, param_off = 0, nonzero_lo = 0, moved = 0;
    for (size_t i = 0; i < got_hi.size(); ++i) {
      master_off += float_bits(join_master(got_hi[i], got_lo[i])) != expect_master[i];
      uint16_t h = 0;
      int16_t l = 0;
      split_master(bits_float(expect_master[i]), h, l);
      param_off += got_hi[i] != h;
      nonzero_lo += got_lo[i] != 0;
      moved += expect_master[i] != float_bits(master_host[i]);
    }
    EXPECT_EQ(master_off, 0) << "masters joined from the split update against the whole one";
    EXPECT_EQ(param_off, 0) << "bf16 parameters: the updated masters' high halves";
    EXPECT_GT(nonzero_lo, m / 2);
    EXPECT_GT(moved, m / 2) << "the update moved the masters";
    EXPECT_EQ(download_u32(m2.tensor()), download_u32(m1.tensor())) << "exp_avg";
    EXPECT_EQ(download_u32(v2.tensor()), download_u32(v1.tensor())) << "exp_avg_sq";
    double norms[2] = {0, 0};
    ASSERT_TRUE(gpu_->download(norms, sums.tensor()).is_ok());
    EXPECT_GT(norms[0], 0.0);
    EXPECT_NEAR(norms[1], norms[0], 1e-6 * norms[0]) << "fused sums of squares";
  }
}

// The offloaded optimizer's host AdamW (kernels/cpu/host_adamw.h, the CUDA rounding) against the
// kernel, bit for bit: full fp32 masters, moments and bf16 gradients, two steps, the working copy
// rounded to nearest even beside a whole master and as the high half of a split one; odd size.
TEST_F(Ops, HostAdamWIsTheKernelsBits) {
  const int64_t n = 300007;
  const std::vector<float> g_values = random_bf16(static_cast<size_t>(n), 41);
  std::vector<uint16_t> grad(static_cast<size_t>(n));
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = float_to_bf16_bits(g_values[i]);
  std::vector<float> master(static_cast<size_t>(n)), m = random_bf16(static_cast<size_t>(n), 43, 0.01),
                                                     v = random_bf16(static_cast<size_t>(n), 44, 0.01);
  const std::vector<float> base = random_bf16(static_cast<size_t>(n), 42, 0.05);
  for (size_t i = 0; i < master.size(); ++i) master[i] = base[i] * (1.0f + 1e-3f * static_cast<float>(i % 613) / 613.0f);
  for (float& e : v) e = e * e;
  auto upload = [&](const auto& host, DType dtype) {
    Buffer b = gpu_->allocate(static_cast<int64_t>(host.size()), dtype).take();
    EXPECT_TRUE(gpu_->upload(b.tensor(), host.data()).is_ok());
    return b;
  };
  for (const bool split : {false, true}) {
    SCOPED_TRACE(split ? "split master" : "whole master");
    std::vector<uint16_t> hi(master.size());
    std::vector<int16_t> lo(master.size());
    for (size_t i = 0; i < master.size(); ++i) split_master(master[i], hi[i], lo[i]);
    Buffer dm = upload(m, DType::f32), dv = upload(v, DType::f32), dg = upload(grad, DType::bf16);
    Buffer dmaster = split ? upload(lo, DType::i16) : upload(master, DType::f32);
    Buffer dparam = split ? upload(hi, DType::bf16) : gpu_->allocate(n, DType::bf16).take();
    std::vector<float> hm = master, hmo = m, hv = v;
    std::vector<uint16_t> hparam(master.size());
    ThreadPool pool(3);
    for (int64_t k = 1; k <= 2; ++k) {
      AdamWStep step;
      step.lr = 2e-3;
      step.weight_decay = 0.1;
      step.grad_scale = 0.37;
      step.step = k;
      ASSERT_TRUE(gpu_->adamw(dparam.tensor(), dmaster.tensor(), dg.tensor(), dm.tensor(), dv.tensor(), step, Tensor{})
                      .is_ok());
      cpu::HostAdamWArrays a;
      a.master = hm.data();
      a.exp_avg = hmo.data();
      a.exp_avg_sq = hv.data();
      a.grad_bf16 = grad.data();
      a.param_bf16 = hparam.data();
      cpu::host_adamw(pool, a, n, step, gpu_->adamw_rounding(),
                      split ? cpu::Bf16Rounding::split_high : cpu::Bf16Rounding::nearest_even, false);
    }
    std::vector<float> got_m(master.size()), got_v(master.size()), got_master(master.size());
    std::vector<uint16_t> got_param(master.size());
    ASSERT_TRUE(gpu_->download(got_m.data(), dm.tensor()).is_ok());
    ASSERT_TRUE(gpu_->download(got_v.data(), dv.tensor()).is_ok());
    ASSERT_TRUE(gpu_->download(got_param.data(), dparam.tensor()).is_ok());
    if (split) {
      std::vector<int16_t> got_lo(master.size());
      ASSERT_TRUE(gpu_->download(got_lo.data(), dmaster.tensor()).is_ok());
      for (size_t i = 0; i < master.size(); ++i) got_master[i] = join_master(got_param[i], got_lo[i]);
    } else {
      ASSERT_TRUE(gpu_->download(got_master.data(), dmaster.tensor()).is_ok());
    }
    int64_t off[4] = {0, 0, 0, 0}, moved = 0;
    for (size_t i = 0; i < master.size(); ++i) {
      off[0] += float_bits(got_master[i]) != float_bits(hm[i]);
      off[1] += float_bits(got_m[i]) != float_bits(hmo[i]);
      off[2] += float_bits(got_v[i]) != float_bits(hv[i]);
      off[3] += got_param[i] != hparam[i];
      moved += float_bits(hm[i]) != float_bits(master[i]);
    }
    EXPECT_EQ(off[0], 0) << "masters";
    EXPECT_EQ(off[1], 0) << "exp_avg";
    EXPECT_EQ(off[2], 0) << "exp_avg_sq";
    EXPECT_EQ(off[3], 0) << "bf16 working copies";
    EXPECT_GT(moved, n / 2);
  }
}

// The deferred AdamW over a table's rows (the embedding's untouched rows) against the update of the
// whole table every step, bit for bit: masters (split and whole), moments and bf16 parameters. Each
// step's gradient has a random subset of rows (in shuffled order), the others zero; the deferred
// side brings a step's rows up to date, updates them with their gradient and, every 3 steps,
// settles every row, as AdamWOptimizer does with a lag bound of 3; a quarter of the rows start with
// zero moments (some -0), which the kernel steps with one multiply. Width 64 takes the 16-byte
// vectors, 37 single elements; beside: on the side stream. Learning rate and gradient scale vary
// per step; the fused sums of squares agree with the whole table's.
TEST_F(Ops, AdamWRowsMatchDenseSteps) {
  struct Case {
    int64_t rows, width;
    bool split, beside;
  };
  for (const Case c : {Case{513, 64, true, false}, Case{129, 37, false, false}, Case{257, 64, false, true},
                       Case{65, 37, true, true}}) {
    SCOPED_TRACE("rows " + std::to_string(c.rows) + " x " + std::to_string(c.width) +
                 (c.split ? ", split" : ", whole") + (c.beside ? ", beside" : ""));
    const int64_t n = c.rows * c.width;
    auto up = [&](const auto& host, DType dtype) {
      Buffer b = gpu_->allocate(static_cast<int64_t>(host.size()), dtype).take();
      EXPECT_TRUE(gpu_->upload(b.tensor(), host.data()).is_ok());
      return b;
    };
    auto bits = [&](Tensor t) {
      std::vector<uint16_t> out(static_cast<size_t>(t.numel * static_cast<int64_t>(dtype_size(t.dtype)) / 2));
      EXPECT_TRUE(gpu_->download(out.data(), t).is_ok());
      return out;
    };
    const std::vector<float> p0 = random_bf16(static_cast<size_t>(n), 51);
    std::vector<float> master0(p0.size());
    for (size_t i = 0; i < p0.size(); ++i) master0[i] = p0[i] * (1.0f + 1e-3f * static_cast<float>(i % 613) / 613.0f);
    std::vector<uint16_t> hi(master0.size());
    std::vector<int16_t> lo(master0.size());
    for (size_t i = 0; i < master0.size(); ++i) split_master(master0[i], hi[i], lo[i]);
    std::vector<float> m0 = random_bf16(static_cast<size_t>(n), 52, 0.1);
    std::vector<float> v0 = random_bf16(static_cast<size_t>(n), 53, 0.1);
    for (auto& x : v0) x = x * x;
    // Rows 1, 5, 9, ... start with zero moments (rows no token reached yet: the kernel's shortcut),
    // some exp_avg -0; row 1 never gets a gradient.
    for (int64_t r = 1; r < c.rows; r += 4)
      for (int64_t j = r * c.width; j < (r + 1) * c.width; ++j) {
        m0[static_cast<size_t>(j)] = j % 3 == 0 ? -0.0f : 0.0f;
        v0[static_cast<size_t>(j)] = 0.0f;
      }
    struct State {
      Buffer param, master, m, v;
    };
    auto make_state = [&] {
      State s;
      s.param = c.split ? up(hi, DType::bf16) : gpu_->allocate(n, DType::bf16).take();
      s.master = c.split ? up(lo, DType::i16) : up(master0, DType::f32);
      s.m = up(m0, DType::f32);
      s.v = up(v0, DType::f32);
      return s;
    };
    State dense = make_state(), lazy = make_state();
    Buffer row_step = gpu_->allocate(c.rows, DType::i32).take();
    Buffer sums = up(std::vector<double>(2, 0.0), DType::f64);
    std::vector<AdamWStep> history;
    int64_t floor = 0;
    SplitMix64 rng(54);
    auto run = [&](const std::function<Status()>& fn) { return c.beside ? gpu_->on_side(fn) : fn(); };
    auto rows_op = [&](Tensor grad, Tensor list, int64_t count, int64_t until, bool gradient) {
      AdamWRows r;
      r.rows = list;
      r.count = count;
      r.width = c.width;
      r.row_step = row_step.tensor();
      r.floor = floor;
      r.history = history;
      r.until = until;
      r.gradient = gradient;
      return run([&] {
        return gpu_->adamw_rows(lazy.param.tensor(), lazy.master.tensor(), grad, lazy.m.tensor(), lazy.v.tensor(), r,
                                gradient ? sums.slice(1, 1) : Tensor{});
      });
    };
    for (int64_t k = 1; k <= 8; ++k) {
      std::vector<int32_t> rows;
      for (int32_t r = 0; r < c.rows; ++r)
        if (r != 1 && rng.uniform() < 0.3) rows.push_back(r);  // row 1 never has a gradient
      for (size_t i = rows.size(); i > 1; --i) std::swap(rows[i - 1], rows[rng.next() % i]);
      std::vector<float> g(static_cast<size_t>(n), 0.0f);
      const std::vector<float> values = random_bf16(static_cast<size_t>(n), 60 + static_cast<uint64_t>(k));
      for (const int32_t r : rows)
        std::copy(values.begin() + r * c.width, values.begin() + (r + 1) * c.width, g.begin() + r * c.width);
      Buffer grad = dual(g).gpu, row_list = up(rows, DType::i32);
      AdamWStep step;
      step.lr = 1e-3 * (1.0 + 0.5 * static_cast<double>(k % 3));
      step.weight_decay = 0.1;
      step.grad_scale = k % 2 == 0 ? 0.5 : 1.0;
      step.step = k;
      history.push_back(step);
      const int64_t count = static_cast<int64_t>(rows.size());
      ASSERT_TRUE(run([&] {
                    return gpu_->adamw(dense.param.tensor(), dense.master.tensor(), grad.tensor(), dense.m.tensor(),
                                       dense.v.tensor(), step, sums.slice(0, 1));
                  }).is_ok());
      ASSERT_TRUE(rows_op(Tensor{}, row_list.tensor(), count, k - 1, false).is_ok()) << "catch up, step " << k;
      ASSERT_TRUE(rows_op(grad.tensor(), row_list.tensor(), count, k, true).is_ok()) << "update, step " << k;
      if (k - floor >= 3) {
        ASSERT_TRUE(rows_op(Tensor{}, Tensor{}, c.rows, k, false).is_ok()) << "settle, step " << k;
        floor = k;
        history.clear();
      }
      ASSERT_TRUE(gpu_->join_side().is_ok());
    }
    ASSERT_TRUE(rows_op(Tensor{}, Tensor{}, c.rows, 8, false).is_ok()) << "final settle";
    ASSERT_TRUE(gpu_->join_side().is_ok());
    EXPECT_EQ(bits(lazy.master.tensor()), bits(dense.master.tensor())) << "masters";
    EXPECT_EQ(bits(lazy.param.tensor()), bits(dense.param.tensor())) << "bf16 parameters";
    EXPECT_EQ(bits(lazy.m.tensor()), bits(dense.m.tensor())) << "exp_avg";
    EXPECT_EQ(bits(lazy.v.tensor()), bits(dense.v.tensor())) << "exp_avg_sq";
    EXPECT_NE(bits(dense.param.tensor()), std::vector<uint16_t>(hi)) << "the steps moved the parameters";
    double norms[2] = {0, 0};
    ASSERT_TRUE(gpu_->download(norms, sums.tensor()).is_ok());
    EXPECT_GT(norms[0], 0.0);
    EXPECT_NEAR(norms[1], norms[0], 1e-6 * norms[0]) << "fused sums of squares";
  }
}

// LoRA dropout: the mask must be the CPU reference's bit for bit (both draw counter_keep), the kept
// values its within one bf16 rounding. 1000003 elements take the 16-byte vector body and a tail; the
// slice at element 3 is misaligned (element by element throughout); a nonzero offset shifts the
// stream. Overwritten outputs are poisoned with NaN; the accumulating form (the backward) adds onto
// random values.
class Dropout : public Ops, public ::testing::WithParamInterface<double> {};

TEST_P(Dropout, MaskBitIdenticalToCpu) {
  const double p = GetParam();
  const int64_t n = 1000003, offset = 77;
  const uint64_t key = 0x5eedULL;
  std::vector<float> host = random_bf16(static_cast<size_t>(n), 40);
  for (float& v : host)
    if (v == 0.0f) v = 1.0f;  // a zero input would hide its mask bit
  auto in = dual(host);
  for (const int64_t start : {int64_t{0}, int64_t{3}}) {
    SCOPED_TRACE("start " + std::to_string(start));
    const int64_t m = n - start;
    auto out = output(n);
    ASSERT_TRUE(cpu_->dropout(out.cpu.slice(start, m), in.cpu.slice(start, m), p, key, offset, false).is_ok());
    ASSERT_TRUE(gpu_->dropout(out.gpu.slice(start, m), in.gpu.slice(start, m), p, key, offset, false).is_ok());
    const std::vector<float> g = from_gpu(out.gpu), c = from_cpu(out.cpu);
    int64_t mask_differs = 0;
    for (int64_t i = start; i < n; ++i)
      mask_differs += (g[static_cast<size_t>(i)] == 0.0f) != (c[static_cast<size_t>(i)] == 0.0f);
    EXPECT_EQ(mask_differs, 0);
    std::vector<float> gs(g.begin() + start, g.end()), cs(c.begin() + start, c.end());
    EXPECT_LT(relative_error(gs, cs), kBf16OpTolerance) << "dropout";
    auto acc = dual(random_bf16(static_cast<size_t>(n), 41));
    ASSERT_TRUE(cpu_->dropout(acc.cpu.slice(start, m), in.cpu.slice(start, m), p, key, offset, true).is_ok());
    ASSERT_TRUE(gpu_->dropout(acc.gpu.slice(start, m), in.gpu.slice(start, m), p, key, offset, true).is_ok());
    expect_close(acc, "dropout accumulating");
  }
}

INSTANTIATE_TEST_SUITE_P(Probabilities, Dropout, ::testing::Values(0.05, 0.5));

ModelConfig small_model() {
  ModelConfig c;
  c.vocab_size = 300;
  c.hidden_size = 128;
  c.intermediate_size = 224;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.max_position_embeddings = 1024;
  c.rope_theta = 5e6;
  EXPECT_TRUE(c.finalize_and_validate().is_ok());
  return c;
}

HostMicroBatch random_batch(const ModelConfig& c, uint64_t seed) {
  return random_documents(c.vocab_size, seed, {57, 200, 3}, 5);
}

// 20 AdamW steps of a model on the GPU against the CPU's fp32 backend: the first step's loss and
// gradients, then the trajectory.
void expect_steps_match_cpu(const ModelConfig& c, const BackendConfig& gpu_config) {
  auto cpu = make_cpu_backend(DType::f32);
  auto gpu = make_cuda_backend(0, gpu_config).take();
  LocalCommunicator comm;
  AdamWOptions adam{0.9, 0.999, 1e-8, 0.1};
  const EngineConfig ec{.model = c, .max_tokens = 512, .adam = adam};
  auto ce = TrainingEngine::create(ec, *cpu, comm).take();
  auto ge = TrainingEngine::create(ec, *gpu, comm).take();
  ASSERT_TRUE(ce->initialize_parameters(7).is_ok());
  ASSERT_TRUE(ge->initialize_parameters(7).is_ok());
  std::vector<HostMicroBatch> window = {random_batch(c, 1), random_batch(c, 2)};
  std::vector<double> cpu_losses, gpu_losses;
  for (int s = 0; s < 20; ++s) {
    auto cr = ce->step(window, 2e-3);
    auto gr = ge->step(window, 2e-3);
    ASSERT_TRUE(cr.is_ok() && gr.is_ok()) << gr.status().message();
    cpu_losses.push_back(cr.value().loss);
    gpu_losses.push_back(gr.value().loss);
    if (s == 0) {
      EXPECT_NEAR(gr.value().grad_norm, cr.value().grad_norm, kBf16GradTolerance * cr.value().grad_norm);
      // Gradients of the first step, tensor by tensor.
      const ParamLayout& layout = ce->layout();
      Buffer staging = gpu->allocate(layout.total_numel(), DType::f32).take();
      ASSERT_TRUE(gpu->convert(staging.tensor(), ge->gradients()).is_ok());
      std::vector<float> g(static_cast<size_t>(layout.total_numel()));
      ASSERT_TRUE(gpu->download(g.data(), staging.tensor()).is_ok());
      const float* cg = ce->gradients().as<float>();
      for (const auto& e : layout.entries()) {
        std::vector<float> ours(g.begin() + e.offset, g.begin() + e.offset + e.numel);
        std::vector<float> ref(cg + e.offset, cg + e.offset + e.numel);
        EXPECT_LT(relative_error(ours, ref), kBf16GradTolerance) << e.name;
      }
    }
  }
  EXPECT_NEAR(gpu_losses[0], cpu_losses[0], kBf16LossTolerance * cpu_losses[0]) << "first step";
  for (size_t s = 1; s < 10; ++s)
    EXPECT_NEAR(gpu_losses[s], cpu_losses[s], kBf16TrajectoryTolerance * cpu_losses[s]) << "step " << s + 1;
  double gpu_late = 0, cpu_late = 0;
  for (size_t s = cpu_losses.size() - 5; s < cpu_losses.size(); ++s) {
    gpu_late += gpu_losses[s] / 5;
    cpu_late += cpu_losses[s] / 5;
  }
  EXPECT_NEAR(gpu_late, cpu_late, kBf16LateMeanTolerance * cpu_late) << "mean of the last 5 steps";
  EXPECT_LT(gpu_losses.back(), gpu_losses.front() - 0.5);
}

// An allocation the GPU cannot hold fails at once with what it was for (AllocationPurpose, nested
// scopes restoring the outer name), the GPU's free memory and the `glm_hpc plan` line to run, or
// the advice a forward-only command set instead.
TEST(CudaBackend, OutOfMemoryNamesWhatItWasForAndThePlan) {
  REQUIRE_GPU();
  auto gpu = make_cuda_backend(0).take();
  const int64_t huge = int64_t{1} << 47;  // 256 TiB of bf16: refused by cudaMalloc without allocating
  {
    AllocationPurpose outer(*gpu, "the outer buffers");
    {
      AllocationPurpose inner(*gpu, "the test's buffer");
      auto r = gpu->allocate(huge, DType::bf16);
      ASSERT_FALSE(r.is_ok());
      const std::string m = r.status().message();
      for (const char* part : {"out of GPU memory allocating 281474976710656 bytes for the test's buffer", "GiB free of",
                               "glm_hpc plan", "--gpu_memory_gib"})
        EXPECT_NE(m.find(part), std::string::npos) << part << "\n" << m;
    }
    auto r = gpu->allocate(huge, DType::bf16);
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("bytes for the outer buffers ("), std::string::npos) << r.status().message();
  }
  auto r = gpu->allocate(huge, DType::bf16);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message().find(" for "), std::string::npos) << r.status().message();
  gpu->set_out_of_memory_hint("infer's advice");  // what infer and eval set instead of the planner's line
  r = gpu->allocate(huge, DType::bf16);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("); infer's advice"), std::string::npos) << r.status().message();
  EXPECT_EQ(r.status().message().find("glm_hpc plan"), std::string::npos) << r.status().message();
  auto fine = gpu->allocate(1000, DType::bf16);  // the failures left the device usable
  EXPECT_TRUE(fine.is_ok()) << fine.status().message();
}

TEST(CudaModel, StepMatchesCpuBackend) {
  REQUIRE_GPU();
  expect_steps_match_cpu(small_model(), {});
}

// GLM-4's head size (128) with the kernels of each GPU in kProfiles: wgmma on Hopper, and the
// mma.sync variants an A100 and an RTX 4090 run.
class CudaModelProfiles : public ::testing::TestWithParam<DeviceProfile> {};

TEST_P(CudaModelProfiles, StepAtHeadDim128MatchesCpuBackend) {
  REQUIRE_GPU();
  ModelConfig c = small_model();
  c.hidden_size = 256;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 128;
  ASSERT_TRUE(c.finalize_and_validate().is_ok());
  expect_steps_match_cpu(c, GetParam().config());
}

INSTANTIATE_TEST_SUITE_P(Gpus, CudaModelProfiles, ::testing::ValuesIn(kProfiles),
                         [](const ::testing::TestParamInfo<DeviceProfile>& p) { return std::string(p.param.name); });

// Five steps of a window from seed 9: the losses, the last step's gradients (f32) and the engine's
// activation bytes on the device and in host memory.
struct EngineOutcome {
  std::vector<double> losses;
  std::vector<float> grads;
  int64_t bytes = 0, host_bytes = 0;
};
EngineOutcome five_steps(Backend& gpu, Communicator& comm, const EngineConfig& ec,
                         const std::vector<HostMicroBatch>& window) {
  auto e = TrainingEngine::create(ec, gpu, comm).take();
  EXPECT_TRUE(e->initialize_parameters(9).is_ok());
  EngineOutcome o;
  for (int s = 0; s < 5; ++s) {
    auto r = e->step(window, 2e-3);
    EXPECT_TRUE(r.is_ok()) << r.status().message();
    if (r.is_ok()) o.losses.push_back(r.value().loss);
  }
  Buffer staging = gpu.allocate(e->layout().total_numel(), DType::f32).take();
  EXPECT_TRUE(gpu.convert(staging.tensor(), e->gradients()).is_ok());
  o.grads.resize(static_cast<size_t>(e->layout().total_numel()));
  EXPECT_TRUE(gpu.download(o.grads.data(), staging.tensor()).is_ok());
  o.bytes = e->activation_bytes();
  o.host_bytes = e->host_activation_bytes();
  return o;
}

// The first loss the same to rounding, later ones and the gradients to bf16 tolerance.
void expect_same_trajectory(const EngineOutcome& o, const EngineOutcome& ref, const std::string& what) {
  ASSERT_EQ(o.losses.size(), ref.losses.size()) << what;
  EXPECT_NEAR(o.losses[0], ref.losses[0], 1e-6 * ref.losses[0]) << what;
  for (size_t s = 1; s < o.losses.size(); ++s)
    EXPECT_NEAR(o.losses[s], ref.losses[s], kBf16TrajectoryTolerance * ref.losses[s]) << what;
  EXPECT_LT(relative_error(o.grads, ref.grads), kBf16GradTolerance) << what;
}

// Recomputation on the GPU: the recomputed forward kernels are deterministic, so the first loss is
// the same to rounding; attention and embedding backward accumulate with atomics (order varies run
// to run), so gradients and later steps agree to bf16 tolerance, not bit for bit. Memory shrinks.
TEST(CudaModel, RecomputationIsExactOnGpu) {
  REQUIRE_GPU();
  const ModelConfig c = small_model();
  auto gpu = make_cuda_backend(0).take();
  LocalCommunicator comm;
  const std::vector<HostMicroBatch> window = {random_batch(c, 3), random_batch(c, 4)};
  auto run = [&](Recompute policy) {
    return five_steps(*gpu, comm, {.model = c, .max_tokens = 512, .adam = AdamWOptions{}, .recompute = policy}, window);
  };
  const EngineOutcome none = run(Recompute::none);
  for (Recompute policy : {Recompute::selective, Recompute::full}) {
    const EngineOutcome o = run(policy);
    expect_same_trajectory(o, none, std::string(enum_name(policy)));
    EXPECT_LT(o.bytes, none.bytes) << enum_name(policy);
  }
}

// --offload_activations on the GPU: the layers' inputs go to pinned host memory on the copy
// stream while the next layers run and come back a layer ahead of their backward, through a ring
// of 3 device tensors (7 layers: it wraps twice). Any missing wait (a slot overwritten before its
// copy down finished, a layer reading its input before the copy up arrived) changes the numbers;
// the trajectory matches keeping the inputs on the device to the tolerance of attention's atomics.
TEST(CudaModel, OffloadedActivationsFollowTheResidentRun) {
  REQUIRE_GPU();
  ModelConfig c = small_model();
  c.num_hidden_layers = 7;
  ASSERT_TRUE(c.finalize_and_validate().is_ok());
  auto gpu = make_cuda_backend(0).take();
  LocalCommunicator comm;
  const std::vector<HostMicroBatch> window = {random_batch(c, 5), random_batch(c, 6)};
  for (Recompute policy : {Recompute::none, Recompute::full}) {
    EngineConfig ec{.model = c, .max_tokens = 512, .adam = AdamWOptions{}, .recompute = policy};
    const EngineOutcome kept = five_steps(*gpu, comm, ec, window);
    ec.offload_activations = true;
    const EngineOutcome offloaded = five_steps(*gpu, comm, ec, window);
    expect_same_trajectory(offloaded, kept, std::string(enum_name(policy)));
    EXPECT_EQ(offloaded.host_bytes, (c.num_hidden_layers + 1 - 3) * 512 * c.hidden_size * 2);
    EXPECT_EQ(kept.bytes - offloaded.bytes, offloaded.host_bytes);
  }
}

// The optimizer beside backward (no clipping, one GPU): each unit's update runs on the side stream
// once backward has finished the unit's gradient, and the next step waits for it. The first loss
// is before any update (the same to rounding); the parameters' movement over three steps of two
// micro-batches matches updating after backward. Attention's backward sums with atomics in varying
// order, so to bf16 tolerance: an update that read a gradient before it was final (zeros or a
// half-written one) or a step that read parameters mid-update would move them differently.
TEST(CudaModel, OptimizerBesideBackwardMatchesAfter) {
  REQUIRE_GPU();
  const ModelConfig c = small_model();
  auto gpu = make_cuda_backend(0).take();
  LocalCommunicator comm;
  std::vector<HostMicroBatch> window = {random_batch(c, 7), random_batch(c, 8)};
  std::vector<float> initial;
  auto run = [&](bool beside) {
    const EngineConfig ec{
        .model = c, .max_tokens = 512, .adam = AdamWOptions{0.9, 0.999, 1e-8, 0.1}, .max_grad_norm = 0.0};
    auto e = TrainingEngine::create(ec, *gpu, comm).take();
    EXPECT_TRUE(e->initialize_parameters(11).is_ok());
    if (initial.empty()) initial = e->parameters().take();
    StepTrace t = trace_steps(*e, window, 2e-3, 3, beside);
    for (size_t i = 0; i < t.params.size(); ++i) t.params[i] -= initial[i];  // how far each moved
    return t;
  };
  const StepTrace after = run(false), beside = run(true);
  ASSERT_EQ(beside.losses.size(), 3u);
  ASSERT_EQ(after.losses.size(), 3u);
  EXPECT_NEAR(beside.losses[0], after.losses[0], 1e-6 * after.losses[0]);
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_NEAR(beside.losses[s], after.losses[s], kBf16TrajectoryTolerance * after.losses[s]) << "step " << s + 1;
    EXPECT_NEAR(beside.norms[s], after.norms[s], kBf16GradTolerance * after.norms[s]) << "step " << s + 1;
  }
  EXPECT_LT(relative_error(beside.params, after.params), 5e-2);
  EXPECT_GT(*std::max_element(after.params.begin(), after.params.end()), 1e-3f);
}

// The optimizer offloaded to the host (ZeRO-1 on one GPU, clipping on): its state is pinned host
// memory, none on the device, and three steps follow the device optimizer's trajectory. The host
// update computes the kernel's bits (HostAdamWIsTheKernelsBits); attention's backward sums with
// atomics in varying order, so two runs agree to bf16 tolerance, not bit for bit.
TEST(CudaModel, OffloadedOptimizerFollowsTheDevicesTrajectory) {
  REQUIRE_GPU();
  const ModelConfig c = small_model();
  auto gpu = make_cuda_backend(0).take();
  LocalCommunicator comm;
  std::vector<HostMicroBatch> window = {random_batch(c, 12), random_batch(c, 13)};
  std::vector<float> initial;
  auto run = [&](bool offload) {
    EngineConfig ec{.model = c, .max_tokens = 512, .adam = AdamWOptions{0.9, 0.999, 1e-8, 0.1}, .zero_stage = 1};
    if (offload) ec.offload = OffloadConfig{true, true, 3};
    auto e = TrainingEngine::create(ec, *gpu, comm).take();
    EXPECT_EQ(e->optimizer_bytes() == 0, offload);
    EXPECT_EQ(e->host_optimizer_bytes() > 0, offload);
    EXPECT_TRUE(e->initialize_parameters(11).is_ok());
    if (initial.empty()) initial = e->parameters().take();
    StepTrace t = trace_steps(*e, window, 2e-3, 3, false);
    for (size_t i = 0; i < t.params.size(); ++i) t.params[i] -= initial[i];
    return t;
  };
  const StepTrace device = run(false), host = run(true);
  ASSERT_EQ(host.losses.size(), 3u);
  ASSERT_EQ(device.losses.size(), 3u);
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_NEAR(host.losses[s], device.losses[s], kBf16TrajectoryTolerance * device.losses[s]) << "step " << s + 1;
    EXPECT_NEAR(host.norms[s], device.norms[s], kBf16GradTolerance * device.norms[s]) << "step " << s + 1;
  }
  EXPECT_LT(relative_error(host.params, device.params), 5e-2);
  EXPECT_GT(*std::max_element(device.params.begin(), device.params.end()), 1e-3f);
}

// ZeRO-3's parameter shards in pinned host memory (--offload_param cpu, with the optimizer
// offloaded; the norms persistent on the device): every gather uploads the unit from the host on a
// copy stream and compute waits for it on the device, the host update writes the shards in place.
// Every shard on the host, and (--offload_param_ratio 0.5) half of them, interleaved with units
// gathered from the device; and with one micro-batch a step, the gradient shards in host memory too
// (ZeroOptions::offload_grads: each of many small buckets copied there during backward while
// backward fills the other bucket buffer, the norm from squares summed on the device). Three steps
// follow the run with everything on the device, and the parameters' sum of squares (read through
// the gathered buffer) agrees.
TEST(CudaModel, OffloadedParametersFollowTheDevicesTrajectory) {
  REQUIRE_GPU();
  const ModelConfig c = small_model();
  auto gpu = make_cuda_backend(0).take();
  LocalCommunicator comm;
  const std::vector<HostMicroBatch> two = {random_batch(c, 14), random_batch(c, 15)}, one = {two[0]};
  struct Run {
    std::vector<double> losses, norms;
    double checksum = 0;
  };
  auto run = [&](const std::vector<HostMicroBatch>& window, bool offload_params, double ratio, bool offload_grads) {
    EngineConfig ec{.model = c, .max_tokens = 512, .adam = AdamWOptions{0.9, 0.999, 1e-8, 0.1}, .zero_stage = 3};
    ec.offload = OffloadConfig{true, true, 3};
    ec.zero.param_persistence_threshold = 1000;
    ec.zero.reduce_bucket_size = 20000;
    ec.zero.offload_params = offload_params;
    ec.zero.offload_param_ratio = ratio;
    ec.zero.offload_grads = offload_grads;
    auto e = TrainingEngine::create(ec, *gpu, comm).take();
    EXPECT_EQ(e->memory().host_parameter_bytes > 0, offload_params);
    EXPECT_EQ(e->memory().host_gradient_bytes > 0, offload_grads);
    EXPECT_EQ(e->memory().gradient_bytes == 0, offload_grads);
    EXPECT_TRUE(e->initialize_parameters(11).is_ok());
    Run r;
    for (int s = 0; s < 3; ++s) {
      auto step = e->step(window, 2e-3);
      EXPECT_TRUE(step.is_ok()) << step.status().message();
      if (!step.is_ok()) return r;
      r.losses.push_back(step.value().loss);
      r.norms.push_back(step.value().grad_norm);
    }
    r.checksum = e->parameter_checksum().take();
    return r;
  };
  for (const bool offload_grads : {false, true}) {
    const std::vector<HostMicroBatch>& window = offload_grads ? one : two;
    const Run device = run(window, false, 1.0, false);
    ASSERT_EQ(device.losses.size(), 3u);
    EXPECT_GT(device.checksum, 0);
    for (const double ratio : {1.0, 0.5}) {
      const std::string what = concat("ratio ", ratio, offload_grads ? ", gradients on the host" : "");
      const Run host = run(window, true, ratio, offload_grads);
      ASSERT_EQ(host.losses.size(), 3u) << what;
      for (size_t s = 0; s < 3; ++s) {
        EXPECT_NEAR(host.losses[s], device.losses[s], kBf16TrajectoryTolerance * device.losses[s])
            << what << ", step " << s + 1;
        EXPECT_NEAR(host.norms[s], device.norms[s], kBf16GradTolerance * device.norms[s]) << what << ", step " << s + 1;
      }
      EXPECT_NEAR(host.checksum, device.checksum, 1e-3 * device.checksum) << what;
    }
  }
}

// The fp32 master split beside the bf16 parameters (the CUDA default) against a whole fp32 copy
// (AdamWOptions::split_master = false): the same fp32 update, the working copy differing only where
// a master lies exactly halfway between two bf16 values, so three steps follow the same trajectory
// to bf16 tolerance. Then a checkpoint of the split engine: the masters in its file are the
// engine's halves joined on the host (raw downloads, not through the code under test), some of
// whose low halves are nonzero; loaded into a fresh split engine and into a whole one, every f32
// master and moment comes back bit for bit, and into the split one every bf16 parameter.
TEST(CudaModel, SplitMasterMatchesWholeAndRoundTrips) {
  REQUIRE_GPU();
  const ModelConfig c = small_model();
  auto gpu = make_cuda_backend(0).take();
  LocalCommunicator comm;
  std::vector<HostMicroBatch> window = {random_batch(c, 9), random_batch(c, 10)};
  auto make = [&](bool split) {
    AdamWOptions adam{0.9, 0.999, 1e-8, 0.1};
    adam.split_master = split;
    auto e = TrainingEngine::create({.model = c, .max_tokens = 512, .adam = adam}, *gpu, comm).take();
    EXPECT_TRUE(e->initialize_parameters(12).is_ok());
    EXPECT_EQ(e->optimizer_shard(0).master.dtype, split ? DType::i16 : DType::f32);
    return e;
  };
  auto split = make(true), whole = make(false);
  EXPECT_LT(split->optimizer_bytes(), whole->optimizer_bytes());
  std::vector<float> initial = whole->parameters().take();
  for (int s = 0; s < 3; ++s) {
    auto a = split->step(window, 2e-3), b = whole->step(window, 2e-3);
    ASSERT_TRUE(a.is_ok() && b.is_ok());
    EXPECT_NEAR(a.value().loss, b.value().loss, kBf16TrajectoryTolerance * b.value().loss) << "step " << s + 1;
  }
  std::vector<float> moved_split = split->parameters().take(), moved_whole = whole->parameters().take();
  for (size_t i = 0; i < initial.size(); ++i) {
    moved_split[i] -= initial[i];
    moved_whole[i] -= initial[i];
  }
  EXPECT_LT(relative_error(moved_split, moved_whole), 5e-2);

  // Per unit: f32 masters (a split one joined on the host from raw downloads of its halves), moments.
  const int units = static_cast<int>(split->layout().units().size());
  auto state = [&](TrainingEngine& e, int64_t* nonzero_lo = nullptr) {
    std::vector<std::vector<float>> out;
    for (int u = 0; u < units; ++u) {
      const TrainingEngine::OptimizerShard s = e.optimizer_shard(u);
      const size_t n = static_cast<size_t>(s.exp_avg.numel);
      std::vector<float> m(n), a(n), v(n);
      if (s.master.dtype == DType::i16) {
        std::vector<uint16_t> hi(n);
        std::vector<int16_t> lo(n);
        EXPECT_TRUE(gpu->download(hi.data(), s.params).is_ok());
        EXPECT_TRUE(gpu->download(lo.data(), s.master).is_ok());
        for (size_t i = 0; i < n; ++i) m[i] = join_master(hi[i], lo[i]);
        if (nonzero_lo != nullptr) *nonzero_lo += std::count_if(lo.begin(), lo.end(), [](int16_t x) { return x != 0; });
      } else {
        EXPECT_TRUE(gpu->download(m.data(), s.master).is_ok());
      }
      EXPECT_TRUE(gpu->download(a.data(), s.exp_avg).is_ok());
      EXPECT_TRUE(gpu->download(v.data(), s.exp_avg_sq).is_ok());
      out.push_back(std::move(m));
      out.push_back(std::move(a));
      out.push_back(std::move(v));
    }
    return out;
  };
  int64_t nonzero_lo = 0;
  const auto saved_state = state(*split, &nonzero_lo);
  EXPECT_GT(nonzero_lo, split->layout().total_numel() / 4) << "the low halves carry the masters' low bits";
  const fs::path dir = fs::temp_directory_path() / ("glm_split_master_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  CheckpointState cs;
  cs.step = 3;
  auto saved = save_checkpoint(*split, comm, dir.string(), cs, 0);
  ASSERT_TRUE(saved.is_ok()) << saved.status().message();
  auto info = read_checkpoint_info(saved.value().dir);
  ASSERT_TRUE(info.is_ok()) << info.status().message();
  int64_t compared = 0;
  ASSERT_TRUE(read_checkpoint_masters(info.value(), [&](int unit, std::span<const float> values) {
                const std::vector<float>& held = saved_state[static_cast<size_t>(3 * unit)];
                EXPECT_LE(values.size(), held.size()) << unit;
                for (size_t i = 0; i < values.size() && i < held.size(); ++i) {
                  if (values[i] != held[i]) {
                    ADD_FAILURE() << "unit " << unit << " element " << i << ": file " << values[i] << ", engine "
                                  << held[i];
                    return Status::ok();
                  }
                }
                compared += static_cast<int64_t>(values.size());
                return Status::ok();
              }).is_ok());
  EXPECT_GE(compared, split->layout().parameter_count());
  for (const bool into_split : {true, false}) {
    SCOPED_TRACE(into_split ? "loaded into split masters" : "loaded into whole masters");
    auto fresh = make(into_split);
    auto loaded = load_checkpoint(*fresh, comm, saved.value().dir);
    ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
    EXPECT_EQ(state(*fresh), saved_state);
    // A whole master's working copy rounds exact ties to even, a split one's away from zero.
    if (into_split) {
      EXPECT_EQ(fresh->parameters().take(), split->parameters().take());
    }
  }
  fs::remove_all(dir);
}

// LoRA with dropout on both backends: the same masks (counter_keep on each), so the first step's
// loss and adapter gradients agree to bf16 tolerance, while without the mask they would not; and
// full recomputation redraws the forward's masks on the GPU too.
TEST(CudaModel, LoraDropoutMatchesCpuAndRecomputation) {
  REQUIRE_GPU();
  const ModelConfig c = small_model();
  auto cpu = make_cpu_backend(DType::f32);
  auto gpu = make_cuda_backend(0).take();
  LocalCommunicator comm;
  std::vector<HostMicroBatch> window = {random_batch(c, 5), random_batch(c, 6)};
  struct Outcome {
    double loss = 0;
    std::vector<float> grads;
  };
  auto run = [&](Backend& backend, double dropout, Recompute policy) {
    LoraConfig lora;
    lora.rank = 4;
    lora.alpha = 8;
    lora.dropout = dropout;
    const EngineConfig ec{.model = c, .max_tokens = 512, .adam = AdamWOptions{}, .recompute = policy, .lora = lora};
    auto e = TrainingEngine::create(ec, backend, comm).take();
    EXPECT_TRUE(e->initialize_parameters(7).is_ok());
    EXPECT_TRUE(e->initialize_lora(8).is_ok());
    // B != 0, so that the masks reach the loss and every gradient.
    EXPECT_TRUE(
        e->set_lora_adapters(random_bf16(static_cast<size_t>(e->lora_layout()->total_numel()), 9, 0.2)).is_ok());
    Outcome o;
    auto r = e->step(window, 1e-3);
    EXPECT_TRUE(r.is_ok()) << r.status().message();
    if (r.is_ok()) o.loss = r.value().loss;
    o.grads = e->lora_gradients().take();
    return o;
  };
  // p = 0.1 (ms-swift's default is 0.05). At 0.5 the GPU/CPU gap was 5x the dropout-free one on
  // H200 (0.105 against 0.021, growing toward the first layer); fp32 against fp64 on the CPU grows
  // 2.4x there too: dropout's conditioning, which bf16 magnifies.
  constexpr double kP = 0.1;
  const Outcome cpu_ref = run(*cpu, kP, Recompute::none), cpu_plain = run(*cpu, 0.0, Recompute::none);
  const Outcome on_gpu = run(*gpu, kP, Recompute::none), gpu_full = run(*gpu, kP, Recompute::full);
  const Outcome gpu_plain = run(*gpu, 0.0, Recompute::none);
  EXPECT_GT(relative_error(cpu_plain.grads, cpu_ref.grads), 4 * kBf16GradTolerance) << "dropout changes the step";
  EXPECT_NEAR(on_gpu.loss, cpu_ref.loss, kBf16LossTolerance * cpu_ref.loss);
  // The same masks on both backends: the dropout run's gap is bounded by the dropout-free GPU/CPU gap
  // of the same model and batch, with room for the conditioning above.
  const double plain_gap = relative_error(gpu_plain.grads, cpu_plain.grads);
  const double dropout_gap = relative_error(on_gpu.grads, cpu_ref.grads);
  std::printf(
      "LoRA adapter gradients, GPU (bf16) against CPU (fp32), relative: dropout 0 %.4f, dropout %.2f %.4f; "
      "losses GPU/CPU %.6f/%.6f (0), %.6f/%.6f (p)\n",
      plain_gap, kP, dropout_gap, gpu_plain.loss, cpu_plain.loss, on_gpu.loss, cpu_ref.loss);
  EXPECT_LT(dropout_gap, std::max(kBf16GradTolerance, 2.5 * plain_gap)) << "dropout 0 gap " << plain_gap;
  if (HasFailure()) {  // where the gap sits: per adapter matrix
    LoraConfig lora;
    lora.rank = 4;
    lora.alpha = 8;
    const LoraLayout layout(c, lora);
    for (const LoraEntry& e : layout.entries())
      for (const auto& [name, off, numel] : {std::make_tuple("A", e.a_offset, lora.rank * e.in_features),
                                             std::make_tuple("Bt", e.b_offset, lora.rank * e.out_features)}) {
        auto part = [&](const std::vector<float>& g) {
          return std::vector<float>(g.begin() + off, g.begin() + off + numel);
        };
        std::printf("  %s %s: gap dropout 0 %.4f, dropout %.2f %.4f\n", e.module_name().c_str(), name,
                    relative_error(part(gpu_plain.grads), part(cpu_plain.grads)), kP,
                    relative_error(part(on_gpu.grads), part(cpu_ref.grads)));
      }
  }
  EXPECT_LT(plain_gap, 4 * kBf16GradTolerance) << "bf16 LoRA gradients far from the CPU's";
  EXPECT_NEAR(gpu_full.loss, on_gpu.loss, 1e-6 * on_gpu.loss) << "recomputation";
  EXPECT_LT(relative_error(gpu_full.grads, on_gpu.grads), kBf16GradTolerance) << "recomputation";
}

// Generation's KV cache on the GPU (the gathered attention kernels over paged rows and over one run
// of rows, decode-shaped batches: single tokens of several sequences beside prefill chunks): every forward's logits
// against the CPU backend's and against recomputing the prefix on the GPU, to bf16 tolerance; at
// GLM-4's head size 128 (Hopper's wgmma kernels here) and at 32. Forward-only engines, as infer's.
TEST(CudaModel, CachedDecodingFollowsTheCpuBackend) {
  REQUIRE_GPU();
  for (const int64_t head_dim : {128, 32}) {
    SCOPED_TRACE(head_dim);
    ModelConfig c = small_model();
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = head_dim;
    c.hidden_size = 4 * head_dim;
    ASSERT_TRUE(c.finalize_and_validate().is_ok());
    std::mt19937 rng(5);
    std::vector<std::vector<int32_t>> sequences(3);
    for (const auto& [s, length] : {std::pair{0, 150}, std::pair{1, 37}, std::pair{2, 70}})
      for (int i = 0; i < length; ++i) sequences[static_cast<size_t>(s)].push_back(static_cast<int32_t>(rng() % c.vocab_size));
    std::vector<std::vector<int>> feed = {{100, 0, 0}, {30, 1, 0}, {1, 1, 60}, {1, 1, 1}};
    for (int k = 0; k < 18; ++k) feed.push_back({1, 1, k < 9 ? 1 : 0});
    // Rows are taken from the back: the first 131 in order (sequence 0's prompt in two chunks, then
    // sequence 1's first token: one run of rows, read without row indices), the others scattered.
    std::vector<int32_t> rows(269);
    std::iota(rows.begin(), rows.end(), 131);
    std::shuffle(rows.begin(), rows.end(), rng);
    for (int32_t r = 130; r >= 0; --r) rows.push_back(r);
    const DecodeScript script = decode_script(sequences, feed, rows);
    auto cpu = make_cpu_backend(DType::f32);
    BackendConfig graphs;
    graphs.cuda_graphs = true;
    auto gpu = make_cuda_backend(0, graphs).take();
    LocalCommunicator comm;
    auto run = [&](Backend& backend, std::vector<std::vector<float>>& out) -> std::unique_ptr<TrainingEngine> {
      auto engine = TrainingEngine::create({.model = c, .max_tokens = 256, .forward_only = true}, backend, comm).take();
      EXPECT_TRUE(engine->initialize_parameters(21).is_ok());
      auto cache = engine->create_kv_cache(400, 256).take();
      for (const HostDecodeBatch& b : script.batches) {
        const Status st = engine->cached_logits(b, *cache, out.emplace_back());
        EXPECT_TRUE(st.is_ok()) << st.message();
      }
      return engine;
    };
    std::vector<std::vector<float>> on_cpu, on_gpu, op_by_op;
    run(*cpu, on_cpu);
    auto gpu_engine = run(*gpu, on_gpu);
    // The decode steps of 3 sequences (10) and of 2 (9): each graph key (n and the attention's split
    // count) runs eagerly once, is captured and launched the second time, replayed after; op by op
    // (--cuda_graphs false) the same kernels: the same logits, bit for bit.
    EXPECT_GE(gpu->graph_launches(), (10 - 3) + (9 - 3));
    BackendConfig eager;
    eager.cuda_graphs = false;
    auto gpu_eager = make_cuda_backend(0, eager).take();
    run(*gpu_eager, op_by_op);
    EXPECT_EQ(gpu_eager->graph_launches(), 0);
    std::printf("CUDA graph launches: %lld\n", static_cast<long long>(gpu->graph_launches()));
    double worst_graph = 0;
    for (size_t k = 0; k < script.batches.size(); ++k)
      worst_graph = std::max(worst_graph, relative_error(on_gpu[k], op_by_op[k]));
    EXPECT_EQ(worst_graph, 0.0) << "graph replays against op by op";
    const size_t vocab = static_cast<size_t>(c.vocab_size);
    double worst_cpu = 0, worst_recomputed = 0;
    for (size_t k = 0; k < script.batches.size(); ++k) {
      ASSERT_EQ(on_gpu[k].size(), on_cpu[k].size());
      worst_cpu = std::max(worst_cpu, relative_error(on_gpu[k], on_cpu[k]));
      const auto [s, t] = script.wanted[k].back();
      const std::vector<float> whole = recomputed_logits(
          *gpu_engine, std::vector<int32_t>(sequences[s].begin(), sequences[s].begin() + static_cast<std::ptrdiff_t>(t + 1)));
      const std::span<const float> last(on_gpu[k].data() + on_gpu[k].size() - vocab, vocab);
      worst_recomputed = std::max(worst_recomputed, relative_error(last, std::span<const float>(whole).subspan(t * vocab, vocab)));
    }
    EXPECT_LT(worst_cpu, 2e-2);
    EXPECT_LT(worst_recomputed, 2e-2);
    std::printf("KV cache on CUDA, head_dim %lld: %zu forwards, logits vs CPU %.2e, vs recomputing the prefix %.2e, "
                "graphs vs op by op %.2e\n",
                static_cast<long long>(head_dim), script.batches.size(), worst_cpu, worst_recomputed, worst_graph);
  }
}

TEST(CudaModel, TransformersParityInBf16) {
  REQUIRE_GPU();
  for (const char* name : {"glm_a", "chatglm_a", "glm_b"}) {
    const std::string dir = std::string(GLM_SOURCE_DIR) + "/tests/data/" + name;
    const std::string golden_dir = std::string(GLM_SOURCE_DIR) + "/tests/data/" + (name[0] == 'c' ? "glm_a" : name);
    auto model = read_hf_config(dir).take();
    std::ifstream in(golden_dir + "/golden.json");
    auto golden = nlohmann::json::parse(in);
    HostMicroBatch batch;
    for (size_t row = 0; row < golden["input_ids"].size(); ++row) {
      TokenizedSample s;
      for (size_t t = 0; t < golden["input_ids"][row].size(); ++t) {
        s.tokens.push_back(golden["input_ids"][row][t].get<int32_t>());
        const int32_t l = golden["labels"][row][t].get<int32_t>();
        s.labels.push_back(l == -100 ? -1 : l);
      }
      append_document(batch, s);
    }
    auto gpu = make_cuda_backend(0).take();
    LocalCommunicator comm;
    const EngineConfig ec{
        .model = model.config, .max_tokens = batch.size(), .adam = AdamWOptions{}, .max_grad_norm = 0.0};
    auto engine = TrainingEngine::create(ec, *gpu, comm).take();
    ASSERT_TRUE(load_hf_weights(model, engine->layout(), [&](int e, std::span<const float> v) {
                  return engine->set_parameter(e, v);
                }).is_ok());
    ASSERT_TRUE(engine->parameters_updated().is_ok());
    std::vector<float> logits;
    ASSERT_TRUE(engine->logits(batch, logits).is_ok());
    auto gf = SafetensorsFile::open(golden_dir + "/golden.safetensors").take();
    std::vector<float> ref(static_cast<size_t>(gf.find("logits")->numel()));
    ASSERT_TRUE(read_as_f32(gf, *gf.find("logits"), ref).is_ok());
    EXPECT_LT(relative_error(logits, ref), 2e-2) << name << " logits";
    auto r = engine->evaluate(batch);
    ASSERT_TRUE(r.is_ok());
    const double loss = golden["loss"].get<double>();
    EXPECT_NEAR(r.value().mean_loss(), loss, kBf16LossTolerance * loss) << name << " loss";
    std::printf("%s on CUDA (bf16) vs transformers (fp32): loss %.6f vs %.6f, logits relative error %.2e\n", name,
                r.value().mean_loss(), loss, relative_error(logits, ref));
  }
}

}  // namespace
}  // namespace glm::test
