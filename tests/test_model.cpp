// The whole GLM-4 model on the fp64 CPU backend: every parameter's gradient against central
// differences; layout, config validation and determinism of the initialisation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "model/glm4_model.h"
#include "mpi/local_communicator.h"
#include "test_util.h"
#include "train/cached_generator.h"
#include "train/generate.h"
#include "train/trainer.h"
#include "zero/zero_engine.h"

namespace glm::test {
namespace {

// Whole-model central differences in double: a few hundred chained ops lose a little more than a
// single op, so 1e-5 relative; a wrong term shows up as an O(1) relative error.
constexpr double kModelGradTolerance = 1e-5;

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
  c.partial_rotary_factor = 0.5;
  c.rms_norm_eps = 1e-6;
  EXPECT_TRUE(c.finalize_and_validate().is_ok());
  return c;
}

class VectorParameters final : public ParameterProvider {
 public:
  VectorParameters(const ParamLayout& layout, std::vector<double>& params, std::vector<double>& grads)
      : layout_(layout), params_(params), grads_(grads) {}
  Result<Tensor> acquire_params(int unit) override { return slice(params_, unit); }
  Result<Tensor> unit_grads(int unit) override { return slice(grads_, unit); }

 private:
  Tensor slice(std::vector<double>& v, int unit) const {
    const ParamUnit& u = layout_.units()[static_cast<size_t>(unit)];
    return Tensor{v.data() + u.offset, u.numel, DType::f64};
  }
  const ParamLayout& layout_;
  std::vector<double>& params_;
  std::vector<double>& grads_;
};

// A provider whose weight-gradient slots the model may overwrite (the first micro-batch of a step).
class OverwritingParameters final : public ParameterProvider {
 public:
  explicit OverwritingParameters(VectorParameters& inner) : inner_(inner) {}
  Result<Tensor> acquire_params(int unit) override { return inner_.acquire_params(unit); }
  Result<Tensor> unit_grads(int unit) override { return inner_.unit_grads(unit); }
  bool overwrite_grads() const override { return true; }

 private:
  VectorParameters& inner_;
};

// The radix order against its definition (positions sorted by (token as unsigned, position)), with
// repeats, tokens past 2^22 (three 11-bit passes) and negative ones (huge as unsigned), and the
// index's runs against the distinct tokens.
TEST(MicroBatchIndex, RadixOrderMatchesSortedKeys) {
  std::mt19937 rng(20261201);
  for (const auto& [n, range] : std::vector<std::pair<int, int64_t>>{
           {0, 10}, {1, 10}, {7, 3}, {4097, 151552}, {1000, 37}, {513, INT32_MAX}, {300, -1}}) {
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    for (auto& t : tokens)
      t = range > 0 ? static_cast<int32_t>(rng() % static_cast<uint64_t>(range)) : static_cast<int32_t>(rng());
    std::vector<uint64_t> keys(tokens.size());
    for (size_t p = 0; p < tokens.size(); ++p)
      keys[p] = (static_cast<uint64_t>(static_cast<uint32_t>(tokens[p])) << 32) | static_cast<uint32_t>(p);
    std::sort(keys.begin(), keys.end());
    const std::vector<int32_t> order = order_by_token(tokens);
    ASSERT_EQ(order.size(), keys.size());
    for (size_t i = 0; i < keys.size(); ++i) ASSERT_EQ(order[i], static_cast<int32_t>(keys[i] & 0xffffffffu)) << n;
    const MicroBatchIndex ix = index_micro_batch(tokens, tokens);
    EXPECT_EQ(ix.token_order, order);
    std::vector<uint32_t> distinct(tokens.begin(), tokens.end());
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    ASSERT_EQ(ix.token_runs.size(), distinct.size() + 1) << n;
    for (size_t r = 0; r < distinct.size(); ++r)
      EXPECT_EQ(static_cast<uint32_t>(tokens[static_cast<size_t>(order[static_cast<size_t>(ix.token_runs[r])])]),
                distinct[r]);
    EXPECT_EQ(ix.token_runs.back(), n);
  }
}

TEST(Glm4Model, EveryParameterGradientMatchesFiniteDifferences) {
  ModelConfig config = tiny_config();
  auto backend = make_cpu_backend(DType::f64);
  auto model_r = Glm4Model::create(config, *backend, 16);
  ASSERT_TRUE(model_r.is_ok()) << model_r.status().message();
  auto model = model_r.take();
  const ParamLayout& layout = model->layout();
  // Random parameters everywhere (norm weights near 1, biases non-zero) so no term hides.
  std::vector<double> params(static_cast<size_t>(layout.total_numel()), 0.0), grads(params.size(), 0.0);
  auto noise = random_vector(params.size(), 99, 0.5);
  for (const auto& e : layout.entries())
    for (int64_t i = 0; i < e.numel; ++i)
      params[e.offset + i] = (e.kind == ParamKind::norm ? 1.0 : 0.0) + noise[e.offset + i];
  VectorParameters provider(layout, params, grads);
  HostBatch hb = two_document_batch();
  MicroBatch batch = hb.view();
  const double count = 7;  // targets >= 0
  auto loss = [&] {
    EXPECT_TRUE(model->forward(batch, provider).is_ok());
    const double* l = model->losses().as<double>();
    return std::accumulate(l, l + batch.n, 0.0) / count;
  };
  ASSERT_TRUE(model->forward_backward(batch, 1.0 / count, provider).is_ok());
  const double* l = model->losses().as<double>();
  EXPECT_NEAR(std::accumulate(l, l + batch.n, 0.0) / count, loss(), 1e-14) << "forward_backward vs forward";
  for (const auto& e : layout.entries()) {
    std::vector<double> x(params.begin() + e.offset, params.begin() + e.offset + e.numel);
    std::vector<double> analytic(grads.begin() + e.offset, grads.begin() + e.offset + e.numel);
    auto entry_loss = [&] {
      std::copy(x.begin(), x.end(), params.begin() + e.offset);
      return loss();
    };
    expect_gradient_matches(entry_loss, x, analytic, kModelGradTolerance, e.name.c_str());
    std::copy(x.begin(), x.end(), params.begin() + e.offset);
  }
}

TEST(Glm4Model, GradientsAccumulateAcrossMicroBatches) {
  ModelConfig config = tiny_config();
  auto backend = make_cpu_backend(DType::f64);
  auto model = Glm4Model::create(config, *backend, 16).take();
  std::vector<double> params(static_cast<size_t>(model->layout().total_numel())), once(params.size(), 0.0),
      twice(params.size(), 0.0);
  ASSERT_TRUE(
      initialize_parameters(config, 5, *backend, Tensor{params.data(), static_cast<int64_t>(params.size()), DType::f64})
          .is_ok());
  HostBatch hb = two_document_batch();
  VectorParameters p1(model->layout(), params, once), p2(model->layout(), params, twice);
  ASSERT_TRUE(model->forward_backward(hb.view(), 0.25, p1).is_ok());
  ASSERT_TRUE(model->forward_backward(hb.view(), 0.25, p2).is_ok());
  ASSERT_TRUE(model->forward_backward(hb.view(), 0.25, p2).is_ok());
  double max_abs = 0;
  for (size_t i = 0; i < once.size(); ++i) {
    EXPECT_NEAR(twice[i], 2 * once[i], 1e-12 + 1e-12 * std::fabs(once[i]));
    max_abs = std::max(max_abs, std::fabs(once[i]));
  }
  EXPECT_GT(max_abs, 1e-6);
}

// With the batch's index the lm_head runs over the labelled rows only (gathered, the results
// scattered back): the same losses, argmax flags and gradients as over every row, in fp64, for the
// FFN narrower than the hidden size (own scratch) and wider (d_gate_up_'s), and for a batch without
// a single target (the head's weight gradient written as zeros where it is overwritten).
TEST(Glm4Model, LabelledRowsOnlyMatchEveryRow) {
  for (const int64_t ffn : {int64_t{10}, int64_t{30}}) {
    SCOPED_TRACE("ffn " + std::to_string(ffn));
    ModelConfig config = tiny_config();
    config.intermediate_size = ffn;
    ASSERT_TRUE(config.finalize_and_validate().is_ok());
    auto backend = make_cpu_backend(DType::f64);
    auto model = Glm4Model::create(config, *backend, 16).take();
    std::vector<double> params(static_cast<size_t>(model->layout().total_numel()));
    ASSERT_TRUE(initialize_parameters(config, 7, *backend,
                                      Tensor{params.data(), static_cast<int64_t>(params.size()), DType::f64})
                    .is_ok());
    HostBatch labelled = two_document_batch(), unlabelled = two_document_batch();
    std::fill(unlabelled.targets.begin(), unlabelled.targets.end(), -1);
    for (HostBatch* hb : {&labelled, &unlabelled}) {
      std::vector<double> losses[2], grads[2];
      std::vector<int32_t> correct[2];
      for (int indexed = 0; indexed < 2; ++indexed) {
        grads[indexed].assign(params.size(), 0.5);  // stale values the batch must add to
        VectorParameters provider(model->layout(), params, grads[indexed]);
        ASSERT_TRUE(model->forward_backward(hb->view(indexed == 1), 0.25, provider).is_ok());
        const double* l = model->losses().as<double>();
        losses[indexed].assign(l, l + hb->tokens.size());
        correct[indexed].assign(hb->tokens.size(), 7);
        Tensor flags{correct[indexed].data(), static_cast<int64_t>(hb->tokens.size()), DType::i32};
        ASSERT_TRUE(model->forward(hb->view(indexed == 1), provider, flags).is_ok());
      }
      for (size_t t = 0; t < losses[0].size(); ++t) {
        EXPECT_NEAR(losses[1][t], losses[0][t], 1e-13 * (1 + std::fabs(losses[0][t]))) << "token " << t;
        if (hb->targets[t] < 0) {
          EXPECT_EQ(losses[1][t], 0.0);
        }
      }
      EXPECT_EQ(correct[1], correct[0]);
      for (size_t i = 0; i < params.size(); ++i)
        ASSERT_NEAR(grads[1][i], grads[0][i], 1e-13 * (1 + std::fabs(grads[0][i]))) << "parameter " << i;
    }
    // Overwriting: weight gradients start as junk the batch must replace; without a labelled row
    // the lm_head's is zeros either way.
    for (HostBatch* hb : {&labelled, &unlabelled}) {
      std::vector<double> grads[2];
      for (int indexed = 0; indexed < 2; ++indexed) {
        grads[indexed] = random_vector(params.size(), 41, 3.0);
        for (const auto& e : model->layout().entries())  // slots that are added to start at zero
          if (e.kind != ParamKind::weight) std::fill_n(grads[indexed].begin() + e.offset, e.numel, 0.0);
        VectorParameters inner(model->layout(), params, grads[indexed]);
        OverwritingParameters provider(inner);
        ASSERT_TRUE(model->forward_backward(hb->view(indexed == 1), 0.25, provider).is_ok());
      }
      for (size_t i = 0; i < params.size(); ++i)
        ASSERT_NEAR(grads[1][i], grads[0][i], 1e-13 * (1 + std::fabs(grads[0][i]))) << "parameter " << i;
      if (hb == &unlabelled) {
        const ParamEntry& out = model->layout().entry(model->layout().output());
        for (int64_t i = 0; i < out.numel; ++i) ASSERT_EQ(grads[1][static_cast<size_t>(out.offset + i)], 0.0);
      }
    }
  }
}

// Recomputation must change memory only: losses and gradients bit-identical to keeping everything
// (the recomputed ops are the same deterministic calls on the same inputs), over two micro-batches
// so state left in the shared buffers by one layer or batch cannot leak into the next.
TEST(Glm4Model, RecomputationGivesIdenticalLossesAndGradients) {
  const ModelConfig config = tiny_config();
  auto backend = make_cpu_backend(DType::f64);
  std::vector<double> params(static_cast<size_t>(ParamLayout(config).total_numel()));
  ASSERT_TRUE(initialize_parameters(config, 11, *backend,
                                    Tensor{params.data(), static_cast<int64_t>(params.size()), DType::f64})
                  .is_ok());
  HostBatch first = two_document_batch(), second = two_document_batch();
  std::reverse(second.tokens.begin(), second.tokens.end());
  struct Outcome {
    std::vector<double> losses, grads;
    int64_t bytes = 0;
  };
  auto run = [&](Recompute policy) {
    auto model = Glm4Model::create(config, *backend, 16, policy).take();
    Outcome o;
    o.grads.assign(params.size(), 0.0);
    VectorParameters provider(model->layout(), params, o.grads);
    for (HostBatch* hb : {&first, &second}) {
      EXPECT_TRUE(model->forward_backward(hb->view(), 0.5, provider).is_ok());
      const double* l = model->losses().as<double>();
      o.losses.insert(o.losses.end(), l, l + hb->tokens.size());
    }
    o.bytes = model->activation_bytes();
    EXPECT_EQ(o.bytes, Glm4Model::planned_activation_bytes(config, 16, 8, 8, policy)) << enum_name(policy);
    return o;
  };
  const Outcome none = run(Recompute::none), selective = run(Recompute::selective), full = run(Recompute::full);
  for (const Outcome* o : {&selective, &full}) {
    EXPECT_EQ(o->losses, none.losses);
    EXPECT_EQ(o->grads, none.grads);
  }
  EXPECT_GT(*std::max_element(none.grads.begin(), none.grads.end()), 1e-6);
  EXPECT_LT(selective.bytes, none.bytes);
  EXPECT_LT(full.bytes, selective.bytes);
}

// A forward-only model (evaluation, generation) keeps one layer's activations and two residual
// tensors whatever the policy: the same losses, argmax flags and logits, bit for bit, as a training
// model's forward (every row, the labelled rows alone, a few wanted rows' logits), over an odd
// number of layers (the last output in the second slot) and an FFN narrower and wider than the
// hidden size; in the memory the planner names, less than full recomputation's; a training step on
// it is an error.
TEST(Glm4Model, ForwardOnlyGivesTheSameLossesAndLogitsInLessMemory) {
  for (const int64_t ffn : {int64_t{10}, int64_t{30}}) {
    SCOPED_TRACE("ffn " + std::to_string(ffn));
    ModelConfig config = tiny_config();
    config.intermediate_size = ffn;
    config.num_hidden_layers = 3;
    ASSERT_TRUE(config.finalize_and_validate().is_ok());
    auto backend = make_cpu_backend(DType::f64);
    std::vector<double> params(static_cast<size_t>(ParamLayout(config).total_numel()));
    ASSERT_TRUE(initialize_parameters(config, 13, *backend,
                                      Tensor{params.data(), static_cast<int64_t>(params.size()), DType::f64})
                    .is_ok());
    std::vector<double> grads(params.size(), 0.0);
    auto trained = Glm4Model::create(config, *backend, 16).take();
    auto forward =
        Glm4Model::create(config, ParamLayout(config), *backend, 16, Recompute::none, false, /*forward_only=*/true)
            .take();
    VectorParameters provider(trained->layout(), params, grads);
    HostBatch hb = two_document_batch();
    const auto n = static_cast<int64_t>(hb.tokens.size());
    std::vector<int32_t> wanted = {3, static_cast<int32_t>(n - 1)};
    const Tensor wanted_rows{wanted.data(), 2, DType::i32};
    for (const bool indexed : {false, true}) {
      std::vector<double> losses[2], logits[2], some[2];
      std::vector<int32_t> flags[2];
      for (int k = 0; k < 2; ++k) {
        Glm4Model& m = k == 0 ? *trained : *forward;
        flags[k].assign(static_cast<size_t>(n), 7);
        ASSERT_TRUE(m.forward(hb.view(indexed), provider, Tensor{flags[k].data(), n, DType::i32}).is_ok());
        losses[k].assign(m.losses().as<double>(), m.losses().as<double>() + n);
        logits[k].assign(static_cast<size_t>(n * config.vocab_size), 0.0);
        ASSERT_TRUE(
            m.forward_logits(hb.view(indexed), provider, Tensor{logits[k].data(), n * config.vocab_size, DType::f64})
                .is_ok());
        some[k].assign(static_cast<size_t>(2 * config.vocab_size), 0.0);
        ASSERT_TRUE(m.forward_logits(hb.view(indexed), provider,
                                     Tensor{some[k].data(), 2 * config.vocab_size, DType::f64}, wanted_rows)
                        .is_ok());
      }
      EXPECT_EQ(losses[1], losses[0]);
      EXPECT_EQ(flags[1], flags[0]);
      EXPECT_EQ(logits[1], logits[0]);
      EXPECT_EQ(some[1], some[0]);
      EXPECT_GT(*std::max_element(losses[0].begin(), losses[0].end()), 0.1);
    }
    EXPECT_EQ(forward->activation_bytes(),
              Glm4Model::planned_activation_bytes(config, 16, 8, 8, Recompute::none, false, /*forward_only=*/true));
    EXPECT_LT(forward->activation_bytes(), Glm4Model::planned_activation_bytes(config, 16, 8, 8, Recompute::full));
    EXPECT_EQ(forward->forward_backward(hb.view(), 1.0, provider).kind(), ErrorKind::internal);
  }
}

// --offload_activations moves the layers' inputs to host memory between their forward and backward
// through a ring of 3 device tensors: losses and gradients bit-identical to keeping them, with
// recomputation and without, over micro-batches with an evaluation between them (which copies
// nothing and must not disturb the ring), on a model deep enough that the ring wraps twice; the
// device holds 3 residual tensors instead of L + 1, the host the rest, as the planner says.
TEST(Glm4Model, OffloadedActivationsGiveIdenticalLossesAndGradients) {
  ModelConfig config = tiny_config();
  config.num_hidden_layers = 7;
  auto backend = make_cpu_backend(DType::f64);
  std::vector<double> params(static_cast<size_t>(ParamLayout(config).total_numel()));
  ASSERT_TRUE(initialize_parameters(config, 13, *backend,
                                    Tensor{params.data(), static_cast<int64_t>(params.size()), DType::f64})
                  .is_ok());
  HostBatch first = two_document_batch(), second = two_document_batch();
  std::reverse(second.tokens.begin(), second.tokens.end());
  struct Outcome {
    std::vector<double> losses, grads;
    int64_t bytes = 0, host_bytes = 0;
  };
  auto run = [&](Recompute policy, bool offload) {
    auto model = Glm4Model::create(config, ParamLayout(config), *backend, 16, policy, offload).take();
    Outcome o;
    o.grads.assign(params.size(), 0.0);
    VectorParameters provider(model->layout(), params, o.grads);
    for (HostBatch* hb : {&first, &second}) {
      EXPECT_TRUE(model->forward_backward(hb->view(), 0.5, provider).is_ok());
      const double* l = model->losses().as<double>();
      o.losses.insert(o.losses.end(), l, l + hb->tokens.size());
      EXPECT_TRUE(model->forward(second.view(), provider).is_ok());
      o.losses.insert(o.losses.end(), l, l + second.tokens.size());
    }
    o.bytes = model->activation_bytes();
    o.host_bytes = model->host_activation_bytes();
    EXPECT_EQ(o.bytes, Glm4Model::planned_activation_bytes(config, 16, 8, 8, policy, offload));
    EXPECT_EQ(o.host_bytes, Glm4Model::planned_host_activation_bytes(config, 16, 8, offload));
    return o;
  };
  const int64_t residual_bytes = 16 * config.hidden_size * 8;
  for (const Recompute policy : {Recompute::none, Recompute::full}) {
    const Outcome kept = run(policy, false), offloaded = run(policy, true);
    EXPECT_EQ(offloaded.losses, kept.losses) << enum_name(policy);
    EXPECT_EQ(offloaded.grads, kept.grads) << enum_name(policy);
    EXPECT_GT(*std::max_element(kept.grads.begin(), kept.grads.end()), 1e-6);
    EXPECT_EQ(kept.host_bytes, 0);
    EXPECT_EQ(offloaded.host_bytes, (config.num_hidden_layers + 1 - 3) * residual_bytes);
    EXPECT_EQ(kept.bytes - offloaded.bytes, offloaded.host_bytes);
  }
}

// The generation tests' model: the tiny configuration with 32 token ids, on the CPU backend.
ModelConfig generation_config() {
  ModelConfig config = tiny_config();
  config.vocab_size = 32;
  EXPECT_TRUE(config.finalize_and_validate().is_ok());
  return config;
}

// Generation by recomputing the sequence: each greedy token is the argmax of the model's last-row
// logits over everything before it (checked against the full logits of the final sequence, which
// also holds every earlier step's rows: causal attention); a stop token ends the reply without
// joining it; max_new_tokens and the engine's length bound it; sampling is reproducible by seed and
// sequence and differs across them.
TEST(Generate, GreedyFollowsTheLogitsAndStopsWhereAsked) {
  const ModelConfig config = generation_config();
  auto backend = make_cpu_backend(DType::f32);
  LocalCommunicator comm;
  auto engine = TrainingEngine::create({.model = config, .max_tokens = 40}, *backend, comm).take();
  ASSERT_TRUE(engine->initialize_parameters(5).is_ok());
  const std::vector<int32_t> prompt = {3, 9, 4, 1, 7};
  GenerationOptions greedy;
  greedy.sampling.temperature = 0;
  greedy.max_new_tokens = 12;
  greedy.max_tokens = 40;
  auto reply = generate(*engine, prompt, greedy, 0);
  ASSERT_TRUE(reply.is_ok()) << reply.status().message();
  const std::vector<int32_t> tokens = reply.value().tokens;
  ASSERT_EQ(tokens.size(), 12u);
  EXPECT_FALSE(reply.value().stopped);
  HostMicroBatch whole;
  whole.tokens = prompt;
  whole.tokens.insert(whole.tokens.end(), tokens.begin(), tokens.end());
  for (size_t t = 0; t < whole.tokens.size(); ++t) {
    whole.targets.push_back(-1);
    whole.positions.push_back(static_cast<int32_t>(t));
    whole.doc_start.push_back(0);
  }
  std::vector<float> logits;
  ASSERT_TRUE(engine->logits(whole, logits).is_ok());
  const auto vocab = static_cast<size_t>(config.vocab_size);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto row = logits.begin() + static_cast<std::ptrdiff_t>((prompt.size() - 1 + i) * vocab);
    EXPECT_EQ(tokens[i], std::max_element(row, row + static_cast<std::ptrdiff_t>(vocab)) - row) << "step " << i;
  }
  GenerationOptions stopping = greedy;
  stopping.stop_ids = {tokens[3]};
  auto stopped = generate(*engine, prompt, stopping, 0).take();
  EXPECT_TRUE(stopped.stopped);
  const size_t first = static_cast<size_t>(std::find(tokens.begin(), tokens.end(), tokens[3]) - tokens.begin());
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(first)));
  GenerationOptions bounded = greedy;
  bounded.max_tokens = 9;
  EXPECT_EQ(generate(*engine, prompt, bounded, 0).take().tokens.size(), 4u);
  bounded.max_tokens = 5;
  EXPECT_EQ(generate(*engine, prompt, bounded, 0).status().kind(), ErrorKind::user_input);
  GenerationOptions sampled = greedy;
  sampled.sampling.temperature = 1.5;
  const auto a = generate(*engine, prompt, sampled, 1).take().tokens;
  EXPECT_EQ(generate(*engine, prompt, sampled, 1).take().tokens, a);
  EXPECT_NE(generate(*engine, prompt, sampled, 2).take().tokens, a);
  sampled.sampling.seed += 1;
  EXPECT_NE(generate(*engine, prompt, sampled, 1).take().tokens, a);
}

// Feeds two sequences through one cache and checks every fed token's logits against recomputing
// its whole prefix (CachedForwardsGiveTheLogitsOfRecomputingThePrefix).
void check_cached_forwards(bool in_order, bool forward_only) {
  const ModelConfig config = generation_config();
  auto backend = make_cpu_backend(DType::f32);
  LocalCommunicator comm;
  auto engine =
      TrainingEngine::create({.model = config, .max_tokens = 40, .forward_only = forward_only}, *backend, comm).take();
  ASSERT_TRUE(engine->initialize_parameters(11).is_ok());
  auto cache = engine->create_kv_cache(48, 16);
  ASSERT_TRUE(cache.is_ok()) << cache.status().message();
  std::mt19937 rng(3);
  std::vector<int32_t> rows(48);
  std::iota(rows.begin(), rows.end(), 0);
  std::shuffle(rows.begin(), rows.end(), rng);
  if (in_order) std::iota(rows.rbegin(), rows.rend(), 0);  // taken from the back: rows 0, 1, 2, ...
  std::vector<std::vector<int32_t>> sequences(2);
  for (int i = 0; i < 13; ++i) sequences[0].push_back(static_cast<int32_t>(rng() % 32));
  for (int i = 0; i < 11; ++i) sequences[1].push_back(static_cast<int32_t>(rng() % 32));
  const std::vector<std::vector<int>> feed = in_order ? std::vector<std::vector<int>>{{7, 0}, {6, 0}, {0, 3}, {0, 5}, {0, 1}}
                                                      : std::vector<std::vector<int>>{{7, 1}, {6, 1}, {0, 3}, {0, 5}, {0, 1}};
  const DecodeScript script = decode_script(sequences, feed, rows);
  const size_t vocab = 32;
  double worst = 0;
  size_t checked = 0;
  for (size_t k = 0; k < script.batches.size(); ++k) {
    std::vector<float> logits;
    const Status st = engine->cached_logits(script.batches[k], *cache.value(), logits);
    ASSERT_TRUE(st.is_ok()) << st.message();
    ASSERT_EQ(logits.size(), script.wanted[k].size() * vocab);
    for (size_t r = 0; r < script.wanted[k].size(); ++r) {
      const auto [s, t] = script.wanted[k][r];
      const std::vector<float> expect = recomputed_logits(
          *engine, std::vector<int32_t>(sequences[s].begin(), sequences[s].begin() + static_cast<std::ptrdiff_t>(t + 1)));
      const std::span<const float> ours(logits.data() + r * vocab, vocab), theirs(expect.data() + t * vocab, vocab);
      worst = std::max(worst, relative_error(ours, theirs));
      ++checked;
    }
  }
  EXPECT_EQ(checked, sequences[0].size() + (in_order ? 9 : sequences[1].size()));
  EXPECT_LT(worst, 1e-5) << "fp32, the same arithmetic in another order";
}

// The KV cache against recomputation: two sequences fed through one cache in interleaved
// forwards (a prefill in two chunks beside the other's single tokens), their rows scattered over
// the cache out of order; every fed token's logits equal recomputing its whole prefix. Then each
// sequence alone, its prompt in two chunks, over rows handed out in order: a chunk's whole context
// new (the contiguous attention), then one run of cache rows (read without row indices), from row 0
// and from a later row. Both with a training engine and with a forward-only one (what infer makes).
TEST(Generate, CachedForwardsGiveTheLogitsOfRecomputingThePrefix) {
  for (const bool forward_only : {false, true})
    for (const bool in_order : {false, true}) {
      SCOPED_TRACE(in_order ? "rows in order, one sequence at a time" : "rows scattered, interleaved");
      SCOPED_TRACE(forward_only ? "forward-only engine" : "training engine");
      check_cached_forwards(in_order, forward_only);
    }
}

// Continuous batching gives every request the reply the reference generator gives it alone:
// greedy and sampled, a stop id, max_tokens, a prompt longer than one forward (chunked prefill),
// more requests than the batch and a cache too small for all at once (admission waits for rows).
TEST(Generate, ContinuousBatchingGivesEachRequestItsOwnReply) {
  const ModelConfig config = generation_config();
  auto backend = make_cpu_backend(DType::f32);
  LocalCommunicator comm;
  auto engine = TrainingEngine::create({.model = config, .max_tokens = 24}, *backend, comm).take();
  ASSERT_TRUE(engine->initialize_parameters(5).is_ok());
  std::mt19937 rng(9);
  std::vector<std::vector<int32_t>> prompts;
  for (const int length : {5, 1, 30, 9, 17, 3, 12}) {
    prompts.emplace_back();
    for (int i = 0; i < length; ++i) prompts.back().push_back(static_cast<int32_t>(rng() % 32));
  }
  // The reference needs the prefix in one forward: an engine as long as the longest sequence.
  auto reference_engine = TrainingEngine::create({.model = config, .max_tokens = 40}, *backend, comm).take();
  ASSERT_TRUE(reference_engine->initialize_parameters(5).is_ok());
  GenerationOptions probe;
  probe.sampling.temperature = 0;
  probe.max_new_tokens = 10;
  const std::vector<int32_t> probed = generate(*reference_engine, prompts[3], probe, 0).take().tokens;
  ASSERT_EQ(probed.size(), 10u);
  for (const double temperature : {0.0, 1.3}) {
    SCOPED_TRACE(temperature);
    GenerationOptions o;
    o.sampling.temperature = temperature;
    o.sampling.seed = 77;
    o.max_new_tokens = 10;
    o.max_tokens = 36;     // the 30-token prompt gets 6 new tokens at most
    o.stop_ids = {probed[4]};  // ends request 3's greedy reply after at most 4 tokens
    std::vector<GenerationRequest> requests;
    for (size_t i = 0; i < prompts.size(); ++i) requests.push_back({prompts[i], 100 + i});
    auto generator = CachedGenerator::create(*engine, o, /*cache_tokens=*/48, /*max_batch=*/3);
    ASSERT_TRUE(generator.is_ok()) << generator.status().message();
    std::vector<std::optional<Generation>> replies(prompts.size());
    const Status s = generator.value()->run(requests, [&](size_t i, Generation g) { replies[i] = std::move(g); });
    ASSERT_TRUE(s.is_ok()) << s.message();
    bool some_stopped = false, some_sampled_differ = false;
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_TRUE(replies[i].has_value()) << i;
      const Generation expected = generate(*reference_engine, prompts[i], o, 100 + i).take();
      EXPECT_EQ(replies[i]->tokens, expected.tokens) << "request " << i;
      EXPECT_EQ(replies[i]->stopped, expected.stopped) << "request " << i;
      some_stopped |= expected.stopped;
      some_sampled_differ |= i > 0 && expected.tokens != replies[i - 1]->tokens;
    }
    EXPECT_EQ(replies[2]->tokens.size() + prompts[2].size() <= 36, true);
    EXPECT_TRUE(some_stopped || temperature > 0) << "the stop id must end some greedy reply, or it is untested";
    EXPECT_TRUE(some_sampled_differ);
    EXPECT_GT(generator.value()->forwards(), 10);
  }
  // A request that cannot fit the cache is refused before anything runs.
  GenerationOptions o;
  o.max_new_tokens = 40;
  auto small = CachedGenerator::create(*engine, o, 16, 2).take();
  const std::vector<GenerationRequest> too_big = {{prompts[0], 0}};
  const Status refused = small->run(too_big, [](size_t, Generation) {});
  EXPECT_EQ(refused.kind(), ErrorKind::user_input);
  EXPECT_NE(refused.message().find("need 45 KV cache rows; the cache has 16"), std::string::npos) << refused.message();
}

// Beam search over the KV cache gives every request the reply of the reference search (which
// recomputes each beam's whole sequence): beam search with a stop id and each early_stopping mode,
// and beam sample (temperature, top-k, top-p, with a repetition penalty from whole rows, without
// from the device's best of each row), which is reproducible by seed and differs across seeds; prompts longer than one
// forward, more requests than the batch, and a cache only as large as the largest request needs (beams share their
// prefix's rows: a leak would run it out, an internal error).
TEST(Generate, BeamSearchOverTheCacheGivesTheReferenceReplies) {
  const ModelConfig config = generation_config();
  auto backend = make_cpu_backend(DType::f32);
  LocalCommunicator comm;
  auto engine = TrainingEngine::create({.model = config, .max_tokens = 24}, *backend, comm).take();
  ASSERT_TRUE(engine->initialize_parameters(5).is_ok());
  auto reference_engine = TrainingEngine::create({.model = config, .max_tokens = 40}, *backend, comm).take();
  ASSERT_TRUE(reference_engine->initialize_parameters(5).is_ok());
  std::mt19937 rng(13);
  std::vector<std::vector<int32_t>> prompts;
  for (const int length : {5, 1, 30, 9, 17, 3}) {
    prompts.emplace_back();
    for (int i = 0; i < length; ++i) prompts.back().push_back(static_cast<int32_t>(rng() % 32));
  }
  GenerationOptions probe;
  probe.sampling.temperature = 0;
  probe.max_new_tokens = 10;
  const std::vector<int32_t> probed = generate(*reference_engine, prompts[3], probe, 0).take().tokens;
  struct Case {
    double temperature;
    EarlyStopping early;
    double length_penalty;
    uint64_t seed;
    double repetition_penalty = 1.0;  // other than 1: whole logit rows to the host, else the device's best
  };
  std::map<uint64_t, std::vector<std::vector<int32_t>>> sampled;
  for (const Case c : {Case{0.0, EarlyStopping::heuristic, 1.0, 1}, Case{0.0, EarlyStopping::never, 2.0, 1},
                       Case{0.0, EarlyStopping::when_full, 0.5, 1}, Case{1.3, EarlyStopping::heuristic, 1.0, 1, 1.2},
                       Case{1.3, EarlyStopping::heuristic, 1.0, 2, 1.2}, Case{1.3, EarlyStopping::heuristic, 1.0, 3}}) {
    SCOPED_TRACE(concat("temperature ", c.temperature, ", early_stopping ", enum_name(c.early), ", seed ", c.seed,
                        ", repetition_penalty ", c.repetition_penalty));
    GenerationOptions o;
    o.sampling.temperature = c.temperature;
    o.sampling.seed = c.seed;
    if (c.temperature > 0) {
      o.sampling.top_k = 12;
      o.sampling.top_p = 0.95;
      o.sampling.repetition_penalty = c.repetition_penalty;
    }
    o.beams = {.num_beams = 3, .length_penalty = c.length_penalty, .early_stopping = c.early};
    o.max_new_tokens = 8;
    o.max_tokens = 36;
    o.stop_ids = {probed[2], probed[5]};
    std::vector<GenerationRequest> requests;
    for (size_t i = 0; i < prompts.size(); ++i) requests.push_back({prompts[i], 100 + i});
    // The 30-token prompt's 6 replies' rows beside its prompt: 48, the cache.
    auto generator = CachedGenerator::create(*engine, o, /*cache_tokens=*/48, /*max_batch=*/2);
    ASSERT_TRUE(generator.is_ok()) << generator.status().message();
    std::vector<std::optional<Generation>> replies(prompts.size());
    const Status s = generator.value()->run(requests, [&](size_t i, Generation g) { replies[i] = std::move(g); });
    ASSERT_TRUE(s.is_ok()) << s.message();
    bool some_stopped = false;
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_TRUE(replies[i].has_value()) << i;
      const Generation expected = generate(*reference_engine, prompts[i], o, 100 + i).take();
      EXPECT_EQ(replies[i]->tokens, expected.tokens) << "request " << i;
      EXPECT_EQ(replies[i]->stopped, expected.stopped) << "request " << i;
      ASSERT_TRUE(replies[i]->beam_score && expected.beam_score) << "request " << i;
      EXPECT_NEAR(*replies[i]->beam_score, *expected.beam_score, 1e-5) << "request " << i;
      EXPECT_LE(replies[i]->tokens.size() + prompts[i].size(), 36u);
      some_stopped |= expected.stopped;
      if (c.temperature > 0) sampled[c.seed].push_back(expected.tokens);
    }
    EXPECT_TRUE(some_stopped) << "a stop id must end some reply, or it is untested";
  }
  EXPECT_NE(sampled[1], sampled[2]) << "another seed draws other beams";
}

// Without clipping on one rank the optimizer updates each unit as backward finishes it (on the
// CPU in place, at that point of backward), a layer's MLP half first, when the layer's backward
// has passed it (a mutation that leaves part of the other half out fails here). The update reads
// only the unit's final gradient, so
// the trajectory is the one of updating after backward, bit for bit, over steps of two
// micro-batches (units must be updated in the last one only), without recomputation and with the
// layer recomputed at the start of its backward; the fused norm sums the units in another order
// (1e-12).
// The step protocol: the update hook lives exactly as long as the ZeroStep, whether or not the step
// finished, and the protocol refuses steps and micro-batches out of order.
TEST(ZeroEngine, TheUpdateHookEndsWithItsStepAndStepsDoNotNest) {
  const ModelConfig config = tiny_glm4();
  const ParamLayout layout(config);
  LocalCommunicator comm;
  auto backend = make_cpu_backend(DType::f32);
  auto zero = ZeroEngine::create(layout, *backend, comm, 0).take();
  ASSERT_TRUE(zero->grads_final_in_backward());  // one rank at stage 0
  int calls = 0;
  auto schedule = [&](int micro_batches) {
    StepSchedule s;
    s.micro_batches = micro_batches;
    s.on_grads_final = [&calls](int, int64_t) {
      ++calls;
      return Status::ok();
    };
    return s;
  };
  const int head = layout.head_unit();
  {
    auto step = zero->begin_step(schedule(2));
    ASSERT_TRUE(step.is_ok());
    EXPECT_FALSE(zero->begin_step(schedule(1)).is_ok());  // one step at a time
    ZeroStep s = step.take();
    ASSERT_TRUE(s.begin_micro_batch(0).is_ok());
    EXPECT_TRUE(zero->overwrite_grads());  // the first micro-batch writes weight gradients
    ASSERT_TRUE(zero->grads_ready(head).is_ok());
    EXPECT_EQ(calls, 0);  // not the last micro-batch: nothing is final yet
    ASSERT_TRUE(s.begin_micro_batch(1).is_ok());
    EXPECT_FALSE(zero->overwrite_grads());
    ASSERT_TRUE(zero->grads_ready(head).is_ok());
    EXPECT_EQ(calls, 1);
    EXPECT_FALSE(s.begin_micro_batch(2).is_ok());
  }  // the step failed here: no finish_backward, no update
  ASSERT_TRUE(zero->grads_ready(head).is_ok());
  EXPECT_EQ(calls, 1);  // the hook went with its step
  EXPECT_TRUE(zero->begin_step(schedule(1)).is_ok());
}

TEST(TrainingEngine, OptimizerInBackwardGivesTheSameTrajectory) {
  const ModelConfig config = tiny_glm4();
  LocalCommunicator comm;
  const std::vector<HostMicroBatch> window = {random_documents(config.vocab_size, 21, {40, 17}, 3),
                                              random_documents(config.vocab_size, 22, {9, 50, 6}, 2)};
  {  // every layer's MLP half is its unit's tail: backward hands it over early
    auto backend = make_cpu_backend(DType::f32);
    auto model = Glm4Model::create(config, *backend, 16).take();
    for (int64_t l = 0; l < config.num_hidden_layers; ++l) EXPECT_GT(model->mlp_tail_from(l), 0) << l;
  }
  for (const Recompute policy : {Recompute::none, Recompute::full}) {
    SCOPED_TRACE(enum_name(policy));
    auto run = [&](bool in_backward) {
      auto backend = make_cpu_backend(DType::f32);
      const EngineConfig ec{.model = config,
                            .max_tokens = 128,
                            .adam = AdamWOptions{0.9, 0.95, 1e-8, 0.1},
                            .max_grad_norm = 0.0,
                            .recompute = policy};
      auto e = TrainingEngine::create(ec, *backend, comm).take();
      EXPECT_TRUE(e->initialize_parameters(13).is_ok());
      return trace_steps(*e, window, 3e-3, 4, in_backward);
    };
    const StepTrace after = run(false), beside = run(true);
    ASSERT_EQ(beside.losses.size(), 4u);
    ASSERT_EQ(after.losses.size(), 4u);
    EXPECT_EQ(beside.losses, after.losses);
    for (size_t s = 0; s < 4; ++s) EXPECT_NEAR(beside.norms[s], after.norms[s], 1e-12 * after.norms[s]) << s;
    EXPECT_EQ(beside.params, after.params);
    EXPECT_LT(after.losses.back(), after.losses.front());
  }
}

// The embedding's deferred rows (one rank, stage 0): rows no token of a step reads get that step
// later, in order, when a step, an evaluation or a read of the parameters needs them. Windows of
// tokens from disjoint parts of the vocabulary leave most rows untouched for several steps; a lag
// bound of 3 settles every row inside the steps too. Everything is bit-identical to updating every
// row every step, with and without clipping, inside backward or after it: losses, evaluation,
// parameters and the embedding's Adam moments; the fused norm sums fewer zeros (1e-12).
TEST(TrainingEngine, DeferredEmbeddingRowsGiveTheSameBits) {
  const ModelConfig config = tiny_glm4();
  LocalCommunicator comm;
  auto window = [&](uint64_t seed, int32_t first, int32_t span) {
    std::vector<HostMicroBatch> w = {random_documents(span, seed, {30, 11}, 3),
                                     random_documents(span, seed + 1, {25}, 2)};
    for (auto& b : w) {
      for (auto& t : b.tokens) t += first;
      for (auto& t : b.targets) t = t >= 0 ? t + first : t;
    }
    return w;
  };
  const std::vector<std::vector<HostMicroBatch>> windows = {window(31, 0, 40), window(32, 100, 50), window(33, 0, 40),
                                                            window(34, 200, 60), window(35, 230, 42)};
  const HostMicroBatch held_out = random_documents(config.vocab_size, 36, {20}, 1);
  struct Trace {
    std::vector<double> losses, norms, eval;
    std::vector<float> params, exp_avg, exp_avg_sq;
    bool deferred = false;
  };
  auto run = [&](const char* defer, double max_grad_norm, bool in_backward) {
    auto backend = make_cpu_backend(DType::f32);
    EngineConfig ec;
    ec.model = config;
    ec.max_tokens = 128;
    ec.adam = AdamWOptions{0.9, 0.95, 1e-8, 0.1};
    ec.max_grad_norm = max_grad_norm;
    ec.defer_embedding_rows = std::atoi(defer);
    auto e = TrainingEngine::create(ec, *backend, comm).take();
    Trace t;
    t.deferred = e->defers_embedding_rows();
    EXPECT_TRUE(e->initialize_parameters(17).is_ok());
    e->set_optimizer_in_backward(in_backward);
    for (int s = 0; s < 9; ++s) {
      auto r = e->step(windows[static_cast<size_t>(s) % windows.size()], 2e-3 * (1 + s % 3));
      EXPECT_TRUE(r.is_ok()) << r.status().message();
      if (!r.is_ok()) return t;
      t.losses.push_back(r.value().loss);
      t.norms.push_back(r.value().grad_norm);
      if (s == 4) t.eval.push_back(e->evaluate(held_out).value().loss_sum);
    }
    EXPECT_TRUE(e->settle_optimizer().is_ok());
    EXPECT_TRUE(e->optimizer_settled());
    const TrainingEngine::OptimizerShard emb = e->optimizer_shard(e->layout().embedding_unit());
    t.exp_avg.assign(emb.exp_avg.as<float>(), emb.exp_avg.as<float>() + emb.exp_avg.numel);
    t.exp_avg_sq.assign(emb.exp_avg_sq.as<float>(), emb.exp_avg_sq.as<float>() + emb.exp_avg_sq.numel);
    t.eval.push_back(e->evaluate(held_out).value().loss_sum);
    t.params = e->parameters().take();
    return t;
  };
  for (const double clip : {0.0, 1.0}) {
    for (const bool in_backward : {false, true}) {
      const Trace dense = run("0", clip, in_backward);
      ASSERT_FALSE(dense.deferred);
      for (const char* lag : {"3", "64"}) {
        const Trace deferred = run(lag, clip, in_backward);
        const std::string where = std::string("lag ") + lag + (clip > 0 ? ", clipping" : "") +
                                  (in_backward ? ", in backward" : ", after backward");
        ASSERT_TRUE(deferred.deferred) << where;
        ASSERT_EQ(deferred.losses.size(), dense.losses.size()) << where;
        EXPECT_EQ(deferred.losses, dense.losses) << where;
        for (size_t s = 0; s < dense.norms.size(); ++s)
          EXPECT_NEAR(deferred.norms[s], dense.norms[s], 1e-12 * dense.norms[s]) << where << " step " << s;
        EXPECT_EQ(deferred.eval, dense.eval) << where;
        EXPECT_EQ(deferred.params, dense.params) << where;
        EXPECT_EQ(deferred.exp_avg, dense.exp_avg) << where;
        EXPECT_EQ(deferred.exp_avg_sq, dense.exp_avg_sq) << where;
      }
    }
  }
}

// ZeRO-3 persistence moves tensors between units only: the same entries, values and arithmetic, so
// losses and every tensor's gradient are bit-identical, over two micro-batches (gradients of the
// persistent unit accumulate across every layer's backward and across micro-batches).
TEST(Glm4Model, PersistentTensorsGiveIdenticalLossesAndGradients) {
  const ModelConfig config = tiny_config();
  auto backend = make_cpu_backend(DType::f64);
  const ParamLayout plain(config);
  std::vector<double> params(static_cast<size_t>(plain.total_numel()));
  ASSERT_TRUE(initialize_parameters(config, 13, *backend,
                                    Tensor{params.data(), static_cast<int64_t>(params.size()), DType::f64})
                  .is_ok());
  HostBatch first = two_document_batch(), second = two_document_batch();
  std::reverse(second.tokens.begin(), second.tokens.end());
  struct Outcome {
    std::vector<double> losses;
    std::vector<std::vector<double>> grads;  // per entry
  };
  auto run = [&](const PersistencePolicy& persistence, Recompute recompute) {
    auto model = Glm4Model::create(config, ParamLayout(config, 1, persistence), *backend, 16, recompute).take();
    const ParamLayout& layout = model->layout();
    std::vector<double> mine(static_cast<size_t>(layout.total_numel()), 0.0), grads(mine.size(), 0.0);
    for (size_t i = 0; i < layout.entries().size(); ++i)
      std::copy_n(params.begin() + plain.entries()[i].offset, layout.entries()[i].numel,
                  mine.begin() + layout.entries()[i].offset);
    VectorParameters provider(layout, mine, grads);
    Outcome o;
    for (HostBatch* hb : {&first, &second}) {
      EXPECT_TRUE(model->forward_backward(hb->view(), 0.5, provider).is_ok());
      const double* l = model->losses().as<double>();
      o.losses.insert(o.losses.end(), l, l + hb->tokens.size());
    }
    for (const auto& e : layout.entries())
      o.grads.emplace_back(grads.begin() + e.offset, grads.begin() + e.offset + e.numel);
    return o;
  };
  const Outcome reference = run(PersistencePolicy{}, Recompute::none);
  // Norms and biases; a model budget that skips tensors and keeps later ones (the embedding too);
  // everything (every unit empty but the persistent one); the last with layers recomputed.
  for (const PersistencePolicy& p : {PersistencePolicy{32}, PersistencePolicy{400, 300}, PersistencePolicy{1 << 30}}) {
    for (Recompute r : {Recompute::none, Recompute::full}) {
      const Outcome o = run(p, r);
      EXPECT_EQ(o.losses, reference.losses) << p.max_tensor_numel << " " << enum_name(r);
      EXPECT_EQ(o.grads, reference.grads) << p.max_tensor_numel << " " << enum_name(r);
    }
  }
}

// DeepSpeed's mark_persistent_parameters: numel <= the threshold, in order, a tensor that would take
// the total past the model budget skipped (later smaller ones may still fit).
TEST(ParamLayout, PersistentTensorsMoveToALastUnit) {
  const ModelConfig c = tiny_config();
  const ParamLayout plain(c, 3);
  auto persistent_names = [](const ParamLayout& l) {
    std::vector<std::string> names;
    for (const auto& e : l.entries())
      if (e.persistent) names.push_back(e.name);
    return names;
  };
  const std::string l0 = "transformer.encoder.layers.0.", l1 = "transformer.encoder.layers.1.";
  EXPECT_EQ(plain.persistent_unit(), -1);
  EXPECT_TRUE(persistent_names(plain).empty());
  // Norms (12 elements) and the QKV biases (32): the threshold is inclusive.
  const ParamLayout small(c, 3, PersistencePolicy{32});
  EXPECT_EQ(small.persistent_tensors(), 7);
  EXPECT_EQ(small.persistent_parameter_count(), 5 * 12 + 2 * 32);
  EXPECT_EQ(ParamLayout(c, 3, PersistencePolicy{31}).persistent_tensors(), 5);
  const ParamLayout budget(c, 3, PersistencePolicy{400, 300});
  EXPECT_EQ(persistent_names(budget),
            (std::vector<std::string>{"transformer.embedding.word_embeddings.weight", l0 + "input_layernorm.weight",
                                      l0 + "self_attention.query_key_value.bias",
                                      l0 + "post_attention_layernorm.weight", l1 + "input_layernorm.weight"}));
  EXPECT_EQ(budget.persistent_parameter_count(), 228 + 12 + 32 + 12 + 12);
  EXPECT_EQ(budget.units()[static_cast<size_t>(budget.embedding_unit())].numel, 0);  // all of it persistent
  for (const ParamLayout* l : {&small, &budget}) {
    ASSERT_EQ(l->units().size(), 5u);  // embedding, 2 layers, head, persistent
    EXPECT_EQ(l->home_units(), 4);
    EXPECT_EQ(l->persistent_unit(), 4);
    EXPECT_EQ(l->head_unit(), 3);
    EXPECT_EQ(l->total_numel() % (3 * ParamLayout::kAlignment), 0);
    int64_t next = 0;
    for (const auto& u : l->units()) {
      EXPECT_EQ(u.offset, next);
      EXPECT_EQ(u.numel % (3 * ParamLayout::kAlignment), 0);
      next = u.offset + u.numel;
    }
    ASSERT_EQ(l->entries().size(), plain.entries().size());
    for (size_t i = 0; i < plain.entries().size(); ++i) {
      const ParamEntry &e = l->entries()[i], &p = plain.entries()[i];
      EXPECT_EQ(e.name, p.name);  // the same indices: LayerEntries and lookups do not change
      EXPECT_EQ(e.offset % ParamLayout::kAlignment, 0);
      EXPECT_EQ(e.home_unit, p.unit);
      EXPECT_EQ(e.home_offset, p.offset - plain.units()[static_cast<size_t>(p.unit)].offset);
      EXPECT_EQ(e.unit, e.persistent ? l->persistent_unit() : e.home_unit);
      const ParamUnit& u = l->units()[static_cast<size_t>(e.unit)];
      EXPECT_GE(e.offset, u.offset);
      EXPECT_LE(e.offset + e.numel, u.offset + u.numel);
    }
  }
}

TEST(ParamLayout, Glm4_9bChatCountMatchesSpec) {
  ModelConfig c = glm4_9b_chat();
  ParamLayout layout(c);
  EXPECT_EQ(layout.parameter_count(), 9399951360LL);  // GLM4_SPEC.md section 3
  EXPECT_EQ(c.parameter_count(), 9399951360LL);
  EXPECT_EQ(layout.entries().size(), 283u);
  EXPECT_GT(layout.total_numel(), INT32_MAX);  // offsets must be 64-bit
  for (const auto& e : layout.entries()) EXPECT_EQ(e.offset % ParamLayout::kAlignment, 0) << e.name;
  c.num_key_value_heads = 4;  // the 1M variant
  EXPECT_EQ(ParamLayout(c).parameter_count(), 9483857920LL);
  EXPECT_EQ(layout.entry(layout.layer(3).qkv_weight).shape, (std::vector<int64_t>{4608, 4096}));
  EXPECT_EQ(layout.find("transformer.output_layer.weight"), layout.output());
}

TEST(ParamLayout, UnitsAreContiguousAndCoverEveryEntry) {
  ParamLayout layout(tiny_config());
  ASSERT_EQ(layout.units().size(), 4u);  // embedding, 2 layers, head
  int64_t next = 0;
  for (const auto& u : layout.units()) {
    EXPECT_EQ(u.offset, next);
    for (int idx : u.entries) {
      const auto& e = layout.entry(idx);
      EXPECT_GE(e.offset, u.offset);
      EXPECT_LE(e.offset + e.numel, u.offset + u.numel);
    }
    next = u.offset + u.numel;
  }
  EXPECT_EQ(next, layout.total_numel());
}

TEST(ModelConfig, RejectsInconsistentShapes) {
  ModelConfig c = tiny_config();
  c.num_key_value_heads = 3;
  EXPECT_NE(c.finalize_and_validate().message().find("divisible by num_key_value_heads"), std::string::npos);
  c = tiny_config();
  c.partial_rotary_factor = 0.75;  // 4 x 0.75 = 3
  EXPECT_NE(c.finalize_and_validate().message().find("even integer"), std::string::npos);
  c = tiny_config();
  c.head_dim = INT64_MAX;  // refused by the parameter bound before any rotary dimension is computed
  c.partial_rotary_factor = 1.0;
  EXPECT_NE(c.finalize_and_validate().message().find("parameters, more than the 2^44"), std::string::npos);
  c = tiny_config();
  c.head_dim = 0;
  c.hidden_size = 14;  // 14 / 4 heads
  EXPECT_NE(c.finalize_and_validate().message().find("divisible by num_attention_heads"), std::string::npos);
  c = tiny_config();
  c.head_dim = 0;
  c.hidden_size = 16;
  ASSERT_TRUE(c.finalize_and_validate().is_ok());
  EXPECT_EQ(c.head_dim, 4);
  c = tiny_config();
  c.vocab_size = 0;
  EXPECT_EQ(c.finalize_and_validate().exit_code(), 2);
}

TEST(Initialisation, DeterministicAndIndependentOfAllocation) {
  ModelConfig c = tiny_config();
  auto backend = make_cpu_backend(DType::f64);
  ParamLayout layout(c);
  std::vector<double> a(static_cast<size_t>(layout.total_numel()), 3.0), b(a.size(), -1.0);
  ASSERT_TRUE(
      initialize_parameters(c, 7, *backend, Tensor{a.data(), static_cast<int64_t>(a.size()), DType::f64}).is_ok());
  ASSERT_TRUE(
      initialize_parameters(c, 7, *backend, Tensor{b.data(), static_cast<int64_t>(b.size()), DType::f64}).is_ok());
  EXPECT_EQ(a, b);
  const auto& norm = layout.entry(layout.layer(1).post_norm);
  EXPECT_EQ(a[norm.offset], 1.0);
  const auto& bias = layout.entry(layout.layer(0).qkv_bias);
  EXPECT_EQ(a[bias.offset], 0.0);
  const auto& w = layout.entry(layout.layer(0).dense);
  double ss = 0;
  for (int64_t i = 0; i < w.numel; ++i) ss += a[w.offset + i] * a[w.offset + i];
  EXPECT_NEAR(std::sqrt(ss / w.numel), c.initializer_range, 0.3 * c.initializer_range);
}

}  // namespace
}  // namespace glm::test
