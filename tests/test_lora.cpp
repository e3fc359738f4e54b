// LoRA on the CPU backend: adapter gradients against central differences (fp64, with and without
// dropout), B = 0 leaves the base model's logits untouched, training never changes the frozen base,
// and merging W + s B A gives the logits of base + adapter. Dropout: the same losses under every
// recompute policy, none in evaluation, masks keyed apart. Options: target names and refused values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "model/glm4_model.h"
#include "model/lora.h"
#include "mpi/local_communicator.h"
#include "test_util.h"
#include "train/engine.h"
#include "train/trainer.h"

namespace glm::test {
namespace {

// Whole-model central differences in double, as test_model: a wrong term is an O(1) error.
constexpr double kLoraGradTolerance = 1e-5;
// Merged weights reorder fp32 sums (W x + s Bt^T (A x) vs (W + s Bt^T A) x) over ~20 hidden
// features and two layers: a few ulp of logits of size ~1.
constexpr double kMergedLogitTolerance = 2e-5;

ModelConfig tiny_config() {
  ModelConfig c;
  c.vocab_size = 19;
  c.hidden_size = 12;
  c.intermediate_size = 10;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 4;
  c.max_position_embeddings = 64;
  c.rope_theta = 10000;
  c.rms_norm_eps = 1e-6;
  c.initializer_range = 0.3;  // a frozen lm_head of N(0, 0.02) would leave the adapters little to move
  EXPECT_TRUE(c.finalize_and_validate().is_ok());
  return c;
}

LoraConfig lora_config(int64_t rank = 2) {
  LoraConfig l;
  l.rank = rank;
  l.alpha = 3;  // scale 1.5 at rank 2: a forgotten scale factor shows
  return l;
}

// Base parameters from host memory; frozen: no gradient slots (as ZeroEngine(frozen) gives).
class FrozenParameters final : public ParameterProvider {
 public:
  FrozenParameters(const ParamLayout& layout, std::vector<double>& params) : layout_(layout), params_(params) {}
  Result<Tensor> acquire_params(int unit) override {
    const ParamUnit& u = layout_.units()[static_cast<size_t>(unit)];
    return Tensor{params_.data() + u.offset, u.numel, DType::f64};
  }
  Result<Tensor> unit_grads(int) override { return Tensor{}; }

 private:
  const ParamLayout& layout_;
  std::vector<double>& params_;
};

TEST(LoraOptions, TargetsParseAndUnknownNamesAreRefused) {
  auto all = parse_lora_targets("all-linear");
  ASSERT_TRUE(all.is_ok());
  EXPECT_EQ(all.value().size(), 4u);
  auto two = parse_lora_targets("dense_4h_to_h, query_key_value,dense_4h_to_h");
  ASSERT_TRUE(two.is_ok()) << two.status().message();
  EXPECT_EQ(lora_targets_text(two.value()), "query_key_value,dense_4h_to_h");
  auto bad = parse_lora_targets("query_key_value,q_proj");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("'q_proj'"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(parse_lora_targets("").is_ok());
  LoraConfig c;
  EXPECT_EQ(c.dropout, 0.05) << "ms-swift's default";
  EXPECT_TRUE(c.validate().is_ok());
  for (const double refused : {1.0, -0.1, std::nan("")}) {
    c.dropout = refused;
    EXPECT_NE(c.validate().message().find("--lora_dropout must be in [0, 1)"), std::string::npos) << refused;
  }
  c.dropout = 0;
  EXPECT_TRUE(c.validate().is_ok());
  c.rank = 0;
  EXPECT_NE(c.validate().message().find("--lora_rank"), std::string::npos);
}

TEST(LoraLayout, ShapesFollowTheLinearsAndPeftInitialisation) {
  const ModelConfig c = tiny_config();
  LoraConfig l = lora_config(3);
  const LoraLayout layout(c, l);
  ASSERT_EQ(layout.entries().size(), 8u);
  const LoraEntry& qkv = layout.entries()[static_cast<size_t>(layout.find(1, LoraTarget::query_key_value))];
  EXPECT_EQ(qkv.in_features, 12);
  EXPECT_EQ(qkv.out_features, c.qkv_width());
  EXPECT_EQ(qkv.module_name(), "transformer.encoder.layers.1.self_attention.query_key_value");
  const LoraEntry& down = layout.entries()[static_cast<size_t>(layout.find(0, LoraTarget::dense_4h_to_h))];
  EXPECT_EQ(down.in_features, 10);
  EXPECT_EQ(down.out_features, 12);
  EXPECT_EQ(layout.parameter_count(), 2 * 3 * ((12 + 32) + (16 + 12) + (12 + 20) + (10 + 12)));
  const std::vector<float> v = initial_lora_values(layout, 7);
  for (const LoraEntry& e : layout.entries()) {
    const float bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(e.in_features)));
    double sum_sq = 0;
    for (int64_t i = 0; i < 3 * e.in_features; ++i) {
      const float a = v[static_cast<size_t>(e.a_offset + i)];
      EXPECT_LE(std::fabs(a), bound);
      sum_sq += a * a;
    }
    EXPECT_GT(sum_sq, 0.0) << e.module_name();
    for (int64_t i = 0; i < 3 * e.out_features; ++i) EXPECT_EQ(v[static_cast<size_t>(e.b_offset + i)], 0.0f);
  }
  EXPECT_EQ(v, initial_lora_values(layout, 7));
  EXPECT_NE(v, initial_lora_values(layout, 8));
  // A subset of targets: only those get adapters.
  l.targets = {LoraTarget::dense};
  const LoraLayout dense_only(c, l);
  EXPECT_EQ(dense_only.entries().size(), 2u);
  EXPECT_EQ(dense_only.find(0, LoraTarget::query_key_value), -1);
}

// Every adapter element's gradient against central differences, with every recompute policy (the
// recomputed forward redoes the adapters of three of the four linears) and with dropout off and on:
// the training loss is a smooth function of the adapters for a fixed mask key, and backward must
// redraw the forward's masks (a mask differing in one element is an O(1) error somewhere).
class LoraGradients : public ::testing::TestWithParam<std::tuple<Recompute, double>> {};

TEST_P(LoraGradients, MatchFiniteDifferences) {
  const auto [recompute, dropout] = GetParam();
  const ModelConfig config = tiny_config();
  auto backend = make_cpu_backend(DType::f64);
  auto model = Glm4Model::create(config, *backend, 16, recompute).take();
  const ParamLayout& layout = model->layout();
  LoraConfig lora_options = lora_config();
  lora_options.dropout = dropout;
  const LoraLayout lora(config, lora_options);
  std::vector<double> params(static_cast<size_t>(layout.total_numel()), 0.0);
  auto noise = random_vector(params.size(), 11, 0.5);
  for (const auto& e : layout.entries())
    for (int64_t i = 0; i < e.numel; ++i)
      params[e.offset + i] = (e.kind == ParamKind::norm ? 1.0 : 0.0) + noise[e.offset + i];
  // Both A and B random (B = 0 would hide every A gradient).
  std::vector<double> adapters = random_vector(static_cast<size_t>(lora.total_numel()), 12, 0.5);
  std::vector<double> grads(adapters.size(), 0.0);
  ASSERT_TRUE(model
                  ->attach_lora(lora, Tensor{adapters.data(), lora.total_numel(), DType::f64},
                                Tensor{grads.data(), lora.total_numel(), DType::f64})
                  .is_ok());
  FrozenParameters provider(layout, params);
  HostBatch hb = two_document_batch();
  MicroBatch batch = hb.view();
  const double count = 7;
  constexpr uint64_t kKey = 0xd20b;
  auto sum = [&] {
    const double* l = model->losses().as<double>();
    return std::accumulate(l, l + batch.n, 0.0) / count;
  };
  // The training loss with the masks of kKey (its gradient lands in `grads` and is ignored).
  auto loss = [&] {
    EXPECT_TRUE(model->forward_backward(batch, 1.0 / count, provider, kKey).is_ok());
    return sum();
  };
  const std::vector<double> base_before = params;
  ASSERT_TRUE(model->forward_backward(batch, 1.0 / count, provider, kKey).is_ok());
  EXPECT_EQ(params, base_before) << "backward wrote into frozen parameters";
  const double train_loss = sum();
  const std::vector<double> analytic_all = grads;
  ASSERT_TRUE(model->forward(batch, provider).is_ok());
  if (dropout == 0) {
    EXPECT_NEAR(train_loss, sum(), 1e-14) << "without dropout a training step's loss is the evaluation loss";
  } else {
    EXPECT_GT(std::fabs(train_loss - sum()), 1e-3) << "dropout in training, none in evaluation";
  }
  for (const LoraEntry& e : lora.entries()) {
    for (const auto& [offset, numel, what] : {std::tuple{e.a_offset, lora.rank() * e.in_features, "lora_A"},
                                              std::tuple{e.b_offset, lora.rank() * e.out_features, "lora_B"}}) {
      std::vector<double> x(adapters.begin() + offset, adapters.begin() + offset + numel);
      std::vector<double> analytic(analytic_all.begin() + offset, analytic_all.begin() + offset + numel);
      auto entry_loss = [&, at = offset] {  // a structured binding is captured by a copy (clang)
        std::copy(x.begin(), x.end(), adapters.begin() + at);
        return loss();
      };
      const std::string name = e.module_name() + "." + what;
      expect_gradient_matches(entry_loss, x, analytic, kLoraGradTolerance, name.c_str());
      std::copy(x.begin(), x.end(), adapters.begin() + offset);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(RecomputeAndDropout, LoraGradients,
                         ::testing::Combine(::testing::Values(Recompute::none, Recompute::selective, Recompute::full),
                                            ::testing::Values(0.0, 0.5)));

std::unique_ptr<TrainingEngine> make_engine(const ModelConfig& config, Backend& backend, Communicator& comm,
                                            const LoraConfig* lora, int zero_stage = 0,
                                            Recompute recompute = Recompute::none) {
  EngineConfig ec{.model = config,
                  .max_tokens = 32,
                  .adam = AdamWOptions{0.9, 0.999, 1e-8, 0.01},
                  .zero_stage = zero_stage,
                  .recompute = recompute};
  if (lora != nullptr) ec.lora = *lora;
  auto e = TrainingEngine::create(ec, backend, comm);
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  auto engine = e.take();
  EXPECT_TRUE(engine->initialize_parameters(5).is_ok());
  if (lora != nullptr) {
    EXPECT_TRUE(engine->initialize_lora(6).is_ok());
  }
  return engine;
}

TEST(LoraEngine, ZeroBGivesTheBaseModelsLogits) {
  const ModelConfig config = tiny_config();
  auto backend = make_cpu_backend(DType::f32);
  LocalCommunicator comm;
  const LoraConfig lora = lora_config();
  auto base = make_engine(config, *backend, comm, nullptr);
  auto adapted = make_engine(config, *backend, comm, &lora);
  const HostMicroBatch batch = random_documents(config.vocab_size, 3, {7, 9}, 2);
  std::vector<float> expected, got;
  ASSERT_TRUE(base->logits(batch, expected).is_ok());
  ASSERT_TRUE(adapted->logits(batch, got).is_ok());
  EXPECT_EQ(got, expected) << "B = 0 adds exact zeros";
  EXPECT_EQ(adapted->memory().gradient_bytes, 0) << "the frozen base has no gradient buffers";
  // fp32 compute: the parameters are the master weights; two moments of the adapters only.
  EXPECT_EQ(adapted->optimizer_bytes(), 2 * 4 * adapted->lora_layout()->total_numel());
}

// Training moves the adapters and lowers the loss but leaves every base parameter bit for bit;
// then W + s B A in a plain model gives the adapted model's logits.
TEST(LoraEngine, BaseFrozenAndMergedWeightsGiveTheSameLogits) {
  const ModelConfig config = tiny_config();
  auto backend = make_cpu_backend(DType::f32);
  LocalCommunicator comm;
  const LoraConfig lora = lora_config();
  auto engine = make_engine(config, *backend, comm, &lora);
  auto before = engine->parameters();
  ASSERT_TRUE(before.is_ok());
  std::vector<HostMicroBatch> micro = {random_documents(config.vocab_size, 21, {9, 6}, 1),
                                       random_documents(config.vocab_size, 22, {12}, 3)};
  std::vector<double> losses;
  for (int step = 0; step < 8; ++step) {
    auto r = engine->step(micro, 5e-2);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    losses.push_back(r.value().loss);
    EXPECT_GT(r.value().grad_norm, 0.0);
  }
  EXPECT_LT(losses.back(), losses.front() - 1.0) << "the adapters learn";
  auto after = engine->parameters();
  ASSERT_TRUE(after.is_ok());
  EXPECT_EQ(after.value(), before.value()) << "a frozen base parameter changed";
  auto adapters = engine->lora_adapters();
  ASSERT_TRUE(adapters.is_ok());
  const LoraLayout& layout = *engine->lora_layout();
  double b_norm = 0;
  for (const LoraEntry& e : layout.entries())
    for (int64_t i = 0; i < layout.rank() * e.out_features; ++i)
      b_norm += std::fabs(adapters.value()[static_cast<size_t>(e.b_offset + i)]);
  EXPECT_GT(b_norm, 0.0) << "B left zero";

  // Merge on the host into a plain engine of the same base.
  std::vector<float> merged = before.value();
  const ParamLayout& params = engine->layout();
  for (const LoraEntry& e : layout.entries()) {
    const LayerEntries& le = params.layer(e.layer);
    const int entry = e.target == LoraTarget::query_key_value ? le.qkv_weight
                      : e.target == LoraTarget::dense         ? le.dense
                      : e.target == LoraTarget::dense_h_to_4h ? le.h_to_4h
                                                              : le.four_h_to_h;
    const ParamEntry& pe = params.entry(entry);
    merge_lora_entry(layout, e, adapters.value(),
                     std::span<float>(merged.data() + pe.offset, static_cast<size_t>(pe.numel)));
  }
  auto plain = make_engine(config, *backend, comm, nullptr);
  for (size_t i = 0; i < params.entries().size(); ++i) {
    const ParamEntry& pe = params.entry(static_cast<int>(i));
    ASSERT_TRUE(plain
                    ->set_parameter(static_cast<int>(i),
                                    std::span<const float>(merged.data() + pe.offset, static_cast<size_t>(pe.numel)))
                    .is_ok());
  }
  ASSERT_TRUE(plain->parameters_updated().is_ok());
  const HostMicroBatch batch = random_documents(config.vocab_size, 9, {8, 5}, 0);
  std::vector<float> adapted_logits, merged_logits, base_logits;
  ASSERT_TRUE(engine->logits(batch, adapted_logits).is_ok());
  ASSERT_TRUE(plain->logits(batch, merged_logits).is_ok());
  ASSERT_EQ(adapted_logits.size(), merged_logits.size());
  double max_diff = 0, max_shift = 0;
  auto base = make_engine(config, *backend, comm, nullptr);
  ASSERT_TRUE(base->logits(batch, base_logits).is_ok());
  for (size_t i = 0; i < merged_logits.size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(adapted_logits[i] - merged_logits[i])));
    max_shift = std::max(max_shift, static_cast<double>(std::fabs(adapted_logits[i] - base_logits[i])));
  }
  EXPECT_LE(max_diff, kMergedLogitTolerance);
  EXPECT_GT(max_shift, 100 * kMergedLogitTolerance) << "the adapters changed the logits measurably";
}

TEST(LoraEngine, ZeroStageThreeKeepsTheBasePartitionedAndGivesTheSameLosses) {
  const ModelConfig config = tiny_config();
  auto backend = make_cpu_backend(DType::f32);
  LocalCommunicator comm;
  const LoraConfig lora = lora_config();
  auto stage0 = make_engine(config, *backend, comm, &lora, 0);
  auto stage3 = make_engine(config, *backend, comm, &lora, 3);
  std::vector<HostMicroBatch> micro = {random_documents(config.vocab_size, 31, {10}, 1)};
  for (int step = 0; step < 3; ++step) {
    auto a = stage0->step(micro, 1e-2);
    auto b = stage3->step(micro, 1e-2);
    ASSERT_TRUE(a.is_ok() && b.is_ok());
    EXPECT_EQ(a.value().loss, b.value().loss) << "step " << step;
  }
  EXPECT_EQ(stage3->memory().gradient_bytes, 0);
}

// Dropout's masks are redrawn from their key in backward and by recomputation, never stored: the
// losses and adapters of several steps are bit-identical under every recompute policy.
TEST(LoraDropout, SameLossesUnderEveryRecomputePolicy) {
  const ModelConfig config = tiny_config();
  auto backend = make_cpu_backend(DType::f32);
  LocalCommunicator comm;
  LoraConfig lora = lora_config();
  lora.dropout = 0.3;
  std::vector<HostMicroBatch> micro = {random_documents(config.vocab_size, 41, {9, 6}, 1),
                                       random_documents(config.vocab_size, 42, {12}, 3)};
  auto run = [&](Recompute recompute, double dropout) {
    lora.dropout = dropout;
    auto engine = make_engine(config, *backend, comm, &lora, 0, recompute);
    std::vector<double> losses;
    for (int step = 0; step < 4; ++step) {
      auto r = engine->step(micro, 5e-2);
      EXPECT_TRUE(r.is_ok()) << r.status().message();
      losses.push_back(r.is_ok() ? r.value().loss : 0.0);
    }
    return std::pair{losses, engine->lora_adapters().take()};
  };
  const auto none = run(Recompute::none, 0.3);
  for (Recompute recompute : {Recompute::selective, Recompute::full}) {
    const auto other = run(recompute, 0.3);
    EXPECT_EQ(other.first, none.first) << enum_name(recompute);
    EXPECT_EQ(other.second, none.second) << enum_name(recompute);
  }
  // Steps after the first (B = 0 at the start hides every mask) differ from dropout-free training.
  const auto plain = run(Recompute::none, 0.0);
  EXPECT_EQ(plain.first[0], none.first[0]);
  EXPECT_NE(plain.first[1], none.first[1]);
}

// Evaluation (logits, eval loss) uses no dropout; training steps do; the scratch for dropout(x) is
// allocated up front and counted, and only when dropout is on.
TEST(LoraDropout, EvaluationHasNoDropoutAndTheScratchIsCounted) {
  const ModelConfig config = tiny_config();
  auto backend = make_cpu_backend(DType::f32);
  LocalCommunicator comm;
  LoraConfig with = lora_config(), without = lora_config();
  with.dropout = 0.5;
  without.dropout = 0;
  auto dropped = make_engine(config, *backend, comm, &with);
  auto plain = make_engine(config, *backend, comm, &without);
  // Random A and B: the adapters change the logits, so a mask would show.
  auto adapters = random_vector(static_cast<size_t>(dropped->lora_layout()->total_numel()), 51, 0.5);
  const std::vector<float> values(adapters.begin(), adapters.end());
  ASSERT_TRUE(dropped->set_lora_adapters(values).is_ok());
  ASSERT_TRUE(plain->set_lora_adapters(values).is_ok());
  const HostMicroBatch batch = random_documents(config.vocab_size, 52, {8, 5}, 0);
  std::vector<float> a, b;
  ASSERT_TRUE(dropped->logits(batch, a).is_ok());
  ASSERT_TRUE(plain->logits(batch, b).is_ok());
  EXPECT_EQ(a, b) << "logits";
  auto ea = dropped->evaluate(batch), eb = plain->evaluate(batch);
  ASSERT_TRUE(ea.is_ok() && eb.is_ok());
  EXPECT_EQ(ea.value().loss_sum, eb.value().loss_sum) << "eval loss";
  auto ta = dropped->step(std::vector<HostMicroBatch>{batch}, 0.0),
       tb = plain->step(std::vector<HostMicroBatch>{batch}, 0.0);
  ASSERT_TRUE(ta.is_ok() && tb.is_ok());
  EXPECT_GT(std::fabs(ta.value().loss - tb.value().loss), 1e-3) << "a training step drops";
  // After the step (lr 0: nothing moved) evaluation is still dropout-free.
  ASSERT_TRUE(dropped->logits(batch, a).is_ok());
  EXPECT_EQ(a, b) << "logits after a training step";
  const int64_t scratch = 32 * dropped->lora_layout()->max_in_features() * static_cast<int64_t>(sizeof(float));
  EXPECT_EQ(dropped->activation_bytes() - plain->activation_bytes(), scratch);
}

// Keys: another seed, step, micro-batch or rank (every rank its own masks) gives another key, and
// every adapter of a micro-batch its own stream.
TEST(LoraDropout, KeysSeparateSeedStepMicroBatchRankAndAdapter) {
  const uint64_t k = lora_dropout_key(42, 3, 1, 0);
  EXPECT_EQ(k, lora_dropout_key(42, 3, 1, 0));
  for (const uint64_t other :
       {lora_dropout_key(43, 3, 1, 0), lora_dropout_key(42, 4, 1, 0), lora_dropout_key(42, 3, 0, 0),
        lora_dropout_key(42, 3, 1, 1), lora_dropout_key(42, 1, 3, 0)})
    EXPECT_NE(other, k);
  const LoraLayout layout(tiny_config(), lora_config());
  std::vector<uint64_t> streams;
  for (const LoraEntry& e : layout.entries()) streams.push_back(lora_dropout_entry_key(k, e));
  std::sort(streams.begin(), streams.end());
  EXPECT_EQ(std::unique(streams.begin(), streams.end()), streams.end());
}

}  // namespace
}  // namespace glm::test
