// Every CPU reference op: finite-difference gradient checks in double on random inputs with odd
// sizes, forward properties (causality, document boundaries, RoPE pass-through, dropout's kept
// fraction), and fp32 vs fp64.
#include <gtest/gtest.h>

#include <numeric>

#include "base/counter_rng.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/master_split.h"
#include "test_util.h"

namespace glm::test {
namespace {

// Central differences in double with step 1e-5: truncation ~1e-10 relative, roundoff under atol.
constexpr double kGradTolerance = 1e-6;
// fp32 against fp64 on O(1) inputs of these sizes: a few ulps of accumulated rounding.
constexpr double kFloatVsDoubleTolerance = 2e-5;

TEST(CpuOps, EmbeddingGradient) {
  const int64_t vocab = 7, hidden = 5, n = 9;
  std::vector<int32_t> tokens = {3, 0, 6, 3, 1, 3, 5, 2, 6};  // repeats exercise the scatter-add
  auto table = random_vector(vocab * hidden, 1);
  auto w = random_vector(n * hidden, 2);
  auto loss = [&] {
    std::vector<double> out(n * hidden);
    cpu::embedding_forward(out.data(), table.data(), tokens.data(), n, hidden);
    return dot(out, w);
  };
  std::vector<double> dtable(table.size(), 0.0);
  cpu::embedding_backward(dtable.data(), w.data(), tokens.data(), n, hidden);
  expect_gradient_matches(loss, table, dtable, kGradTolerance, "dtable");
}

TEST(CpuOps, RmsNormGradient) {
  const int64_t n = 3, hidden = 7;
  auto x = random_vector(n * hidden, 3);
  auto weight = random_vector(hidden, 4);
  auto w = random_vector(n * hidden, 5);
  const double eps = 1e-5;
  auto loss = [&] {
    std::vector<double> out(n * hidden), rstd(n);
    cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), weight.data(), n, hidden, eps);
    return dot(out, w);
  };
  std::vector<double> out(n * hidden), rstd(n), dx(n * hidden, 0.0), dweight(hidden, 0.0);
  cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), weight.data(), n, hidden, eps);
  // Forward against the formula.
  for (int64_t t = 0; t < n; ++t) {
    double ms = 0;
    for (int64_t j = 0; j < hidden; ++j) ms += x[t * hidden + j] * x[t * hidden + j] / hidden;
    for (int64_t j = 0; j < hidden; ++j)
      EXPECT_NEAR(out[t * hidden + j], weight[j] * x[t * hidden + j] / std::sqrt(ms + eps), 1e-12);
  }
  cpu::rmsnorm_backward(dx.data(), dweight.data(), w.data(), x.data(), weight.data(), rstd.data(), n, hidden);
  expect_gradient_matches(loss, x, dx, kGradTolerance, "dx");
  expect_gradient_matches(loss, weight, dweight, kGradTolerance, "dweight");
  // din accumulates: a second backward adds the same gradient again.
  std::vector<double> twice = dx, dweight2(hidden, 0.0);
  cpu::rmsnorm_backward(twice.data(), dweight2.data(), w.data(), x.data(), weight.data(), rstd.data(), n, hidden);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(twice[i], 2 * dx[i], 1e-12);
}

TEST(CpuOps, LinearGradient) {
  // n = 6 covers the 4-token tile and the remainder loop.
  const int64_t n = 6, in = 7, out_f = 5;
  auto x = random_vector(n * in, 6);
  auto weight = random_vector(out_f * in, 7);
  auto bias = random_vector(out_f, 8);
  auto w = random_vector(n * out_f, 9);
  auto loss = [&] {
    std::vector<double> y(n * out_f);
    cpu::linear_forward(y.data(), x.data(), weight.data(), bias.data(), n, in, out_f);
    return dot(y, w);
  };
  std::vector<double> y(n * out_f);
  cpu::linear_forward(y.data(), x.data(), weight.data(), bias.data(), n, in, out_f);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t o = 0; o < out_f; ++o) {
      double r = bias[o];
      for (int64_t i = 0; i < in; ++i) r += x[t * in + i] * weight[o * in + i];
      EXPECT_NEAR(y[t * out_f + o], r, 1e-12);
    }
  std::vector<double> dx(n * in, 123.0), dweight(weight.size(), 0.0), dbias(out_f, 0.0);
  cpu::linear_backward(dx.data(), dweight.data(), dbias.data(), w.data(), x.data(), weight.data(), n, in, out_f, false);
  expect_gradient_matches(loss, x, dx, kGradTolerance, "dx");
  expect_gradient_matches(loss, weight, dweight, kGradTolerance, "dweight");
  expect_gradient_matches(loss, bias, dbias, kGradTolerance, "dbias");
  std::vector<double> acc = dx;
  cpu::linear_backward(acc.data(), static_cast<double*>(nullptr), static_cast<double*>(nullptr), w.data(), x.data(),
                       weight.data(), n, in, out_f, true);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(acc[i], 2 * dx[i], 1e-12);
}

TEST(CpuOps, RopeForwardProperties) {
  cpu::AttentionShape shape{4, 2, 10};
  const int64_t rot = 6, n = 3;
  const double base = 5e6;
  auto qkv = random_vector(n * shape.qkv_width(), 10);
  std::vector<int32_t> pos = {0, 1, 1234};
  auto out = qkv;
  cpu::rope_forward(out.data(), pos.data(), n, shape, rot, base);
  const int64_t width = shape.qkv_width();
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < shape.heads + 2 * shape.kv_heads; ++h) {
      const bool rotated = h < shape.heads + shape.kv_heads;  // q and k heads, not v
      for (int64_t j = 0; j < shape.head_dim; ++j) {
        const int64_t idx = t * width + h * shape.head_dim + j;
        if (!rotated || j >= rot || pos[t] == 0) {
          EXPECT_EQ(out[idx], qkv[idx]) << "t " << t << " head " << h << " dim " << j;
        } else if (j % 2 == 0) {
          const double angle = pos[t] * std::pow(base, -static_cast<double>(j) / rot);
          EXPECT_NEAR(out[idx], qkv[idx] * std::cos(angle) - qkv[idx + 1] * std::sin(angle), 1e-12);
          EXPECT_NEAR(out[idx + 1], qkv[idx + 1] * std::cos(angle) + qkv[idx] * std::sin(angle), 1e-12);
        }
      }
    }
  }
}

TEST(CpuOps, RopeGradient) {
  cpu::AttentionShape shape{4, 2, 10};
  const int64_t rot = 6, n = 5;
  auto qkv = random_vector(n * shape.qkv_width(), 11);
  auto w = random_vector(qkv.size(), 12);
  std::vector<int32_t> pos = {0, 3, 1, 77, 2048};
  auto loss = [&] {
    auto y = qkv;
    cpu::rope_forward(y.data(), pos.data(), n, shape, rot, 10000.0);
    return dot(y, w);
  };
  auto grad = w;
  cpu::rope_backward(grad.data(), pos.data(), n, shape, rot, 10000.0);
  expect_gradient_matches(loss, qkv, grad, kGradTolerance, "dqkv");
}

struct AttentionCase {
  cpu::AttentionShape shape;
  std::vector<int32_t> doc_start;
};

AttentionCase two_documents() {
  // Documents of 3 and 4 tokens packed in one row; odd head_dim 5, GQA 4 heads on 2 KV groups.
  return {{4, 2, 5}, {0, 0, 0, 3, 3, 3, 3}};
}

TEST(CpuOps, AttentionForwardRespectsCausalityAndDocuments) {
  auto c = two_documents();
  const int64_t n = static_cast<int64_t>(c.doc_start.size()), width = c.shape.qkv_width();
  const int64_t q_width = c.shape.heads * c.shape.head_dim;
  auto qkv = random_vector(n * width, 13);
  std::vector<double> out(n * q_width), lse(n * c.shape.heads);
  cpu::attention_forward(out.data(), lse.data(), qkv.data(), c.doc_start.data(), n, c.shape);
  // The first token of each document attends only to itself: output = its own v.
  for (int64_t t : {0, 3})
    for (int64_t h = 0; h < c.shape.heads; ++h)
      for (int64_t j = 0; j < c.shape.head_dim; ++j) {
        const int64_t g = h / (c.shape.heads / c.shape.kv_heads);
        const double v = qkv[t * width + (c.shape.heads + c.shape.kv_heads + g) * c.shape.head_dim + j];
        EXPECT_NEAR(out[t * q_width + h * c.shape.head_dim + j], v, 1e-12);
      }
  // Changing tokens 2 (document 1's future) and 4..6 changes nothing at tokens 0..1 and 3.
  auto changed = qkv;
  for (int64_t t : {2, 4, 5, 6})
    for (int64_t j = 0; j < width; ++j) changed[t * width + j] += 0.5;
  std::vector<double> out2(out.size()), lse2(lse.size());
  cpu::attention_forward(out2.data(), lse2.data(), changed.data(), c.doc_start.data(), n, c.shape);
  for (int64_t t : {0, 1, 3})
    for (int64_t j = 0; j < q_width; ++j) EXPECT_EQ(out[t * q_width + j], out2[t * q_width + j]) << "token " << t;
}

TEST(CpuOps, AttentionGradient) {
  auto c = two_documents();
  const int64_t n = static_cast<int64_t>(c.doc_start.size());
  auto qkv = random_vector(n * c.shape.qkv_width(), 14, 2.0);
  auto w = random_vector(n * c.shape.heads * c.shape.head_dim, 15);
  std::vector<double> out(w.size()), lse(n * c.shape.heads);
  auto loss = [&] {
    cpu::attention_forward(out.data(), lse.data(), qkv.data(), c.doc_start.data(), n, c.shape);
    return dot(out, w);
  };
  loss();
  std::vector<double> dqkv(qkv.size(), 7.0);  // poisoned: backward must overwrite
  cpu::attention_backward(dqkv.data(), w.data(), out.data(), lse.data(), qkv.data(), c.doc_start.data(), n, c.shape);
  expect_gradient_matches(loss, qkv, dqkv, kGradTolerance, "dqkv");
}

TEST(CpuOps, SwigluGradient) {
  const int64_t n = 3, ffn = 7;
  auto gu = random_vector(n * 2 * ffn, 16, 3.0);
  auto w = random_vector(n * ffn, 17);
  auto loss = [&] {
    std::vector<double> y(n * ffn);
    cpu::swiglu_forward(y.data(), gu.data(), n, ffn);
    return dot(y, w);
  };
  std::vector<double> y(n * ffn);
  cpu::swiglu_forward(y.data(), gu.data(), n, ffn);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < ffn; ++j) {
      const double g = gu[t * 2 * ffn + j], u = gu[t * 2 * ffn + ffn + j];
      EXPECT_NEAR(y[t * ffn + j], g / (1 + std::exp(-g)) * u, 1e-12);
    }
  std::vector<double> dgu(gu.size());
  cpu::swiglu_backward(dgu.data(), w.data(), gu.data(), n, ffn);
  expect_gradient_matches(loss, gu, dgu, kGradTolerance, "dgate_up");
}

TEST(CpuOps, CrossEntropyGradientAndIgnoredRows) {
  const int64_t n = 5, vocab = 11;
  auto logits = random_vector(n * vocab, 18, 4.0);
  std::vector<int32_t> targets = {3, -1, 10, 0, -1};
  const double scale = 1.0 / 3.0;
  std::vector<double> losses(n);
  auto loss = [&] {
    cpu::cross_entropy(losses.data(), static_cast<double*>(nullptr), logits.data(), targets.data(), n, vocab, 0.0);
    return scale * std::accumulate(losses.begin(), losses.end(), 0.0);
  };
  std::vector<double> dlogits(logits.size(), 9.0);
  EXPECT_EQ(cpu::cross_entropy(losses.data(), dlogits.data(), logits.data(), targets.data(), n, vocab, scale), 3);
  EXPECT_EQ(losses[1], 0.0);
  EXPECT_EQ(losses[4], 0.0);
  double lse = 0;
  for (int64_t v = 0; v < vocab; ++v) lse += std::exp(logits[v]);
  EXPECT_NEAR(losses[0], std::log(lse) - logits[3], 1e-12);
  expect_gradient_matches(loss, logits, dlogits, kGradTolerance, "dlogits");
}

// Token accuracy: argmax == target with torch.argmax's tie rule (the first maximum), 0 on ignored rows.
TEST(CpuOps, CrossEntropyCountsArgmaxHits) {
  const int64_t n = 6, vocab = 5;
  const std::vector<double> logits = {
      0.1, 2.0, -1.0, 0.5, 0.0,  // argmax 1, target 1: hit
      0.1, 2.0, -1.0, 0.5, 0.0,  // target 3: miss
      3.0, 0.0, 0.0, 3.0, 1.0,   // tie between 0 and 3, target 3: miss (the first maximum wins)
      3.0, 0.0, 0.0, 3.0, 1.0,   // same row, target 0: hit
      0.0, 0.0, 0.0, 0.0, 9.0,   // ignored row whose argmax would be its (absent) target
      -5., -4., -3., -2., -1.,   // argmax is the last index, target 4: hit
  };
  const std::vector<int32_t> targets = {1, 3, 3, 0, -1, 4};
  std::vector<double> losses(n);
  std::vector<int32_t> correct(n, 7);
  EXPECT_EQ(cpu::cross_entropy(losses.data(), static_cast<double*>(nullptr), logits.data(), targets.data(), n, vocab,
                               0.0, correct.data()),
            5);
  EXPECT_EQ(correct, (std::vector<int32_t>{1, 0, 0, 1, 0, 1}));
  std::vector<double> without(n);
  cpu::cross_entropy(without.data(), static_cast<double*>(nullptr), logits.data(), targets.data(), n, vocab, 0.0);
  EXPECT_EQ(losses, without) << "asking for the argmax changes no loss";
}

TEST(CpuOps, AdamWMatchesClosedFormFirstTwoSteps) {
  // With bias correction, step 1 moves by lr * g / (|g| + eps) after decay p *= 1 - lr * wd.
  cpu::AdamWStep s;
  s.lr = 0.1;
  s.weight_decay = 0.5;
  s.eps = 1e-8;
  s.grad_scale = 0.5;
  double p = 2.0, m = 0, v = 0;
  const double g = 3.0, gs = g * 0.5;
  s.step = 1;
  cpu::adamw(&p, &g, &m, &v, 1, s);
  double expected = 2.0 * (1 - 0.1 * 0.5) - 0.1 * gs / (std::fabs(gs) + 1e-8);
  EXPECT_NEAR(p, expected, 1e-12);
  // Step 2 with the same gradient: m_hat = g, v_hat = g^2 again.
  s.step = 2;
  cpu::adamw(&p, &g, &m, &v, 1, s);
  expected = expected * (1 - 0.1 * 0.5) - 0.1 * gs / (std::fabs(gs) + 1e-8);
  EXPECT_NEAR(p, expected, 1e-12);
}

// Dropout's mask is Bernoulli(1 - p) per element: over 2^20 elements of one key the kept count is
// binomial with sigma = sqrt(N p (1 - p)) (about 220 at p = 0.05, 512 at 0.5); 6 sigma never flakes
// for a fixed key and still catches a threshold off by 1%.
constexpr double kDropoutSigmas = 6;

class Dropout : public ::testing::TestWithParam<double> {};

TEST_P(Dropout, KeepsOneMinusPScaledAndIsAFunctionOfKeyAndIndex) {
  const double p = GetParam();
  const int64_t n = int64_t{1} << 20;
  const uint64_t key = 0x1234abcdULL;
  const std::vector<float> ones(static_cast<size_t>(n), 1.0f);
  std::vector<float> out(static_cast<size_t>(n), -7.0f);
  cpu::dropout(out.data(), ones.data(), n, p, key, 0, false);
  const float kept_value = static_cast<float>(1.0 / (1.0 - p));
  int64_t kept = 0, pairs_dropped = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(out[i] == 0.0f || out[i] == kept_value) << i << ": " << out[i];
    kept += out[i] != 0.0f;
    // Neighbours are independent: both dropped with probability p^2.
    if (i % 2 == 1) pairs_dropped += out[i] == 0.0f && out[i - 1] == 0.0f;
  }
  const double nd = static_cast<double>(n);
  EXPECT_NEAR(static_cast<double>(kept), (1 - p) * nd, kDropoutSigmas * std::sqrt(nd * p * (1 - p)));
  const double pairs = nd / 2, q = p * p;
  EXPECT_NEAR(static_cast<double>(pairs_dropped), q * pairs, kDropoutSigmas * std::sqrt(pairs * q * (1 - q)) + 1);
  // The mask is counter_keep's and depends only on (key, offset + i): two chunks give the whole.
  std::vector<float> chunked(static_cast<size_t>(n), -7.0f);
  const int64_t split = 1001;
  cpu::dropout(chunked.data(), ones.data(), split, p, key, 0, false);
  cpu::dropout(chunked.data() + split, ones.data() + split, n - split, p, key, split, false);
  EXPECT_EQ(chunked, out);
  const uint64_t threshold = dropout_threshold(p);
  for (int64_t i = 0; i < 1000; ++i)
    EXPECT_EQ(out[i] != 0.0f, counter_keep(key, static_cast<uint64_t>(i), threshold)) << i;
  // Another key, another mask.
  std::vector<float> other(static_cast<size_t>(n));
  cpu::dropout(other.data(), ones.data(), n, p, key + 1, 0, false);
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) differ += (other[i] != 0.0f) != (out[i] != 0.0f);
  const double expect_differ = 2 * p * (1 - p) * nd;
  EXPECT_NEAR(static_cast<double>(differ), expect_differ, kDropoutSigmas * std::sqrt(expect_differ));
  // Accumulating (the backward) adds the same masked, scaled values.
  auto x = random_vector(257, 9);
  std::vector<double> acc = random_vector(257, 10), dropped(257);
  const std::vector<double> before = acc;
  cpu::dropout(dropped.data(), x.data(), 257, p, key, 5, false);
  cpu::dropout(acc.data(), x.data(), 257, p, key, 5, true);
  for (size_t i = 0; i < acc.size(); ++i) {
    EXPECT_EQ(acc[i], before[i] + dropped[i]) << i;
    EXPECT_TRUE(dropped[i] == 0.0 || dropped[i] == x[i] * (1.0 / (1.0 - p))) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Probabilities, Dropout, ::testing::Values(0.05, 0.5));

TEST(CpuOps, DropoutOfZeroKeepsEverything) {
  auto x = random_vector(33, 11);
  std::vector<double> out(33);
  cpu::dropout(out.data(), x.data(), 33, 0.0, 7, 0, false);
  EXPECT_EQ(out, x);
}

TEST(CpuOps, FloatMatchesDouble) {
  cpu::AttentionShape shape{4, 2, 8};
  const int64_t n = 9, width = shape.qkv_width(), qw = shape.heads * shape.head_dim;
  std::vector<int32_t> doc = {0, 0, 0, 0, 0, 5, 5, 5, 5}, pos = {0, 1, 2, 3, 4, 0, 1, 2, 3};
  auto qkv_d = random_vector(n * width, 19);
  std::vector<float> qkv_f(qkv_d.begin(), qkv_d.end());
  cpu::rope_forward(qkv_d.data(), pos.data(), n, shape, 4, 5e6);
  cpu::rope_forward(qkv_f.data(), pos.data(), n, shape, 4, 5e6);
  std::vector<double> out_d(n * qw), lse_d(n * shape.heads);
  std::vector<float> out_f(n * qw), lse_f(n * shape.heads);
  cpu::attention_forward(out_d.data(), lse_d.data(), qkv_d.data(), doc.data(), n, shape);
  cpu::attention_forward(out_f.data(), lse_f.data(), qkv_f.data(), doc.data(), n, shape);
  for (size_t i = 0; i < out_d.size(); ++i) EXPECT_NEAR(out_f[i], out_d[i], kFloatVsDoubleTolerance);
  for (size_t i = 0; i < lse_d.size(); ++i) EXPECT_NEAR(lse_f[i], lse_d[i], kFloatVsDoubleTolerance);
}

// Split fp32 masters (kernels/master_split.h) over every 1021st bit pattern and the first 2^17:
// join(split(x)) is x bit for bit (NaN stays NaN), and the high half is a nearest bf16 of x, the
// one away from zero on an exact tie (where round-to-nearest-even may take the other: the one
// place they differ), unrounded for infinities.
TEST(CpuOps, SplitMastersAreExactAndNearest) {
  int64_t checked = 0, ties = 0;
  for (uint64_t i = 0; i < (uint64_t{1} << 32); i += i < (uint64_t{1} << 17) ? 1 : 1021) {
    const uint32_t b = static_cast<uint32_t>(i);
    const float x = bits_float(b);
    uint16_t hi = 0;
    int16_t lo = 0;
    split_master(x, hi, lo);
    const float back = join_master(hi, lo);
    ++checked;
    if (std::isnan(x)) {
      ASSERT_TRUE(std::isnan(back)) << std::hex << b;
      ASSERT_TRUE(std::isnan(bits_float(static_cast<uint32_t>(hi) << 16))) << std::hex << b;
      continue;
    }
    ASSERT_EQ(float_bits(back), b) << std::hex << b;
    if (std::isinf(x)) {
      ASSERT_EQ(hi, b >> 16) << std::hex << b;
      continue;
    }
    const uint32_t low = b & 0xffffu, up = b >> 16;
    ASSERT_EQ(hi, low >= 0x8000u ? up + 1 : up) << std::hex << b;  // nearest in magnitude, ties away
    ties += low == 0x8000u;
  }
  EXPECT_GT(checked, 4000000);
  EXPECT_GT(ties, 1);
}

}  // namespace
}  // namespace glm::test
