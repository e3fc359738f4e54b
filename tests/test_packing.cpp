// Packing (--packing): the packer's invariants, the loader over packed rows, and the promise that
// packing changes nothing but speed: the same documents give the same loss and gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "data/packing.h"
#include "data/sharded_loader.h"
#include "model/backend.h"
#include "mpi/local_communicator.h"
#include "train/engine.h"
#include "train/trainer.h"

namespace glm::test {
namespace {

// Packed and unpacked runs may sum the same fp32 per-token terms in a different order (one long
// micro-batch vs several short ones). Measured on the CPU backend: identical first-step loss and
// gradients, ~3e-8 relative after an update; a document that sees its neighbour (attention or
// positions across the boundary) moves the loss by ~1.5e-2 and the gradients by O(1).
constexpr double kFp32PackingTolerance = 1e-5;

std::vector<int64_t> seeded_lengths(size_t n, uint64_t seed, int64_t max) {
  SplitMix64 rng(seed);
  std::vector<int64_t> v(n);
  for (auto& x : v) x = 1 + static_cast<int64_t>(rng.next() % static_cast<uint64_t>(max));
  return v;
}

void expect_valid_plan(const PackingPlan& plan, const std::vector<int64_t>& lengths) {
  std::vector<int> seen(lengths.size(), 0);
  int64_t tokens = 0;
  for (int64_t r = 0; r < plan.rows(); ++r) {
    int64_t row_tokens = 0;
    ASSERT_FALSE(plan.row(r).empty()) << "row " << r;
    for (int64_t s : plan.row(r)) {
      ASSERT_GE(s, 0);
      ASSERT_LT(s, static_cast<int64_t>(lengths.size()));
      ++seen[static_cast<size_t>(s)];
      row_tokens += lengths[static_cast<size_t>(s)];
    }
    EXPECT_LE(row_tokens, plan.capacity) << "row " << r << " overflows";
    tokens += row_tokens;
  }
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << "sample " << i;
  EXPECT_EQ(tokens, plan.tokens);
}

TEST(Packing, FirstFitDecreasingOnAWorkedExample) {
  // Decreasing: 8 (#2), 7 (#4), 5 (#0), 3 (#1), 2 (#3), 1 (#5). 8 opens row 0, 7 row 1, 5 row 2;
  // 3 fits row 1 (room 3), 2 fits row 0 (room 2), 1 fits row 2 (room 5) but not rows 0 and 1.
  const std::vector<int64_t> lengths = {5, 3, 8, 2, 7, 1};
  auto plan = pack_lengths(lengths, 10);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  const PackingPlan& p = plan.value();
  ASSERT_EQ(p.rows(), 3);
  EXPECT_EQ(std::vector<int64_t>(p.row(0).begin(), p.row(0).end()), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::vector<int64_t>(p.row(1).begin(), p.row(1).end()), (std::vector<int64_t>{4, 1}));
  EXPECT_EQ(std::vector<int64_t>(p.row(2).begin(), p.row(2).end()), (std::vector<int64_t>{0, 5}));
  EXPECT_DOUBLE_EQ(p.fill_ratio(), 26.0 / 30.0);
  EXPECT_NE(p.summary().find("6 samples into 3 rows of up to 10 tokens, fill ratio 0.8667"), std::string::npos)
      << p.summary();
  // Pairs that fill a row exactly are found (a greedy in input order would need 15 rows here).
  std::vector<int64_t> pairs;
  for (int i = 0; i < 10; ++i) pairs.insert(pairs.end(), {4, 6});
  auto exact = pack_lengths(pairs, 10);
  ASSERT_TRUE(exact.is_ok());
  EXPECT_EQ(exact.value().rows(), 10);
  EXPECT_DOUBLE_EQ(exact.value().fill_ratio(), 1.0);
}

TEST(Packing, CapacityHoldsEverySampleOnceAndPlansAreDeterministic) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    for (int64_t capacity : {16, 64, 512}) {
      const std::vector<int64_t> lengths = seeded_lengths(3000, seed, capacity);
      auto a = pack_lengths(lengths, capacity), b = pack_lengths(lengths, capacity);
      ASSERT_TRUE(a.is_ok() && b.is_ok()) << a.status().message();
      expect_valid_plan(a.value(), lengths);
      EXPECT_EQ(a.value().row_begin, b.value().row_begin);
      EXPECT_EQ(a.value().sample_order, b.value().sample_order);
      // No two rows can be merged (first fit) and the rows are no more than the lower bound allows.
      const int64_t lower = (a.value().tokens + capacity - 1) / capacity;
      EXPECT_GE(a.value().rows(), lower);
      EXPECT_LT(a.value().rows(), 2 * a.value().tokens / capacity + 2);
      EXPECT_GT(a.value().fill_ratio(), 0.5) << "first fit leaves at most one row half empty";
    }
  }
}

TEST(Packing, RejectsSamplesThatDoNotFitAndPacksNothingToNothing) {
  auto too_long = pack_lengths(std::vector<int64_t>{3, 11, 2}, 10);
  ASSERT_FALSE(too_long.is_ok());
  EXPECT_NE(too_long.status().message().find("sample 1 has 11 tokens"), std::string::npos)
      << too_long.status().message();
  EXPECT_FALSE(pack_lengths(std::vector<int64_t>{3, 0}, 10).is_ok());
  auto empty = pack_lengths(std::vector<int64_t>{}, 10);
  ASSERT_TRUE(empty.is_ok());
  EXPECT_EQ(empty.value().rows(), 0);
}

// Documents with distinct first tokens (the document's id) and varied lengths and targets.
Dataset make_documents(int count, int64_t vocab, uint64_t seed) {
  Dataset d;
  SplitMix64 rng(seed);
  for (int i = 0; i < count; ++i) {
    TokenizedSample s;
    const int64_t length = 3 + static_cast<int64_t>(rng.next() % 20);
    s.tokens.push_back(i);
    s.labels.push_back(-1);
    for (int64_t t = 1; t < length; ++t) {
      const auto id = static_cast<int32_t>(count + rng.next() % static_cast<uint64_t>(vocab - count));
      s.tokens.push_back(id);
      s.labels.push_back(rng.next() % 4 == 0 ? -1 : id);  // some positions carry no loss
    }
    s.labels.back() = s.tokens.back();  // at least one target per document
    d.samples.push_back(s);
  }
  return d;
}

TEST(Packing, LoaderServesPackedRowsWithEveryDocumentOncePerEpoch) {
  const Dataset d = make_documents(40, 100, 7);
  auto plan = pack_dataset(d, 32);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  const int64_t rows = plan.value().rows();
  ASSERT_LT(rows, 40) << "packing merged some documents";
  ShardedLoader loader(d, 3, 0, 1, 1, 1, &plan.value());
  EXPECT_EQ(loader.epoch_size(), rows);
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::multiset<int32_t> ids;
    for (int64_t step = epoch * rows; step < (epoch + 1) * rows; ++step) {
      HostMicroBatch b = loader.micro_batch(step, 0);
      EXPECT_LE(b.size(), 32);
      int64_t targets = 0;
      for (int64_t t = 0; t < b.size(); ++t) {
        const auto i = static_cast<size_t>(t);
        targets += b.targets[i] >= 0 ? 1 : 0;
        if (b.positions[i] == 0) {  // a document starts: its id token, its own start
          EXPECT_EQ(b.doc_start[i], t);
          ids.insert(b.tokens[i]);
        } else {
          EXPECT_EQ(b.positions[i], b.positions[i - 1] + 1);
          EXPECT_EQ(b.doc_start[i], b.doc_start[i - 1]);
        }
      }
      EXPECT_EQ(targets, b.target_count);
    }
    EXPECT_EQ(ids.size(), 40u);
    EXPECT_EQ(std::set<int32_t>(ids.begin(), ids.end()).size(), 40u) << "epoch " << epoch;
  }
}

ModelConfig tiny_model(int64_t vocab) {
  ModelConfig c;
  c.vocab_size = vocab;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 128;
  c.rope_theta = 10000;
  c.partial_rotary_factor = 0.5;
  c.rms_norm_eps = 1e-6;
  c.initializer_range = 0.2;  // large enough that a wrong attention span changes the loss visibly
  EXPECT_TRUE(c.finalize_and_validate().is_ok());
  return c;
}

struct StepOutput {
  double loss = 0;
  int64_t targets = 0;
  std::vector<float> grads;
};

StepOutput one_step(const ModelConfig& config, std::span<const HostMicroBatch> window) {
  auto backend = make_cpu_backend(DType::f32);
  LocalCommunicator comm;
  int64_t max_tokens = 0;
  for (const auto& m : window) max_tokens = std::max(max_tokens, m.size());
  auto e = TrainingEngine::create(
      {.model = config, .max_tokens = max_tokens, .adam = AdamWOptions{}, .max_grad_norm = 0.0}, *backend, comm);
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  auto engine = e.take();
  EXPECT_TRUE(engine->initialize_parameters(11).is_ok());
  auto r = engine->step(window, 1e-3);
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  StepOutput out;
  out.loss = r.value().loss;
  out.targets = r.value().targets;
  const Tensor g = engine->gradients();
  out.grads.assign(g.as<float>(), g.as<float>() + g.numel);
  return out;
}

double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / norm);
}

// One packed row of several documents against the same documents as separate micro-batches of
// one accumulation window: equal loss (per target token) and gradients.
TEST(Packing, PackedRowGivesTheLossAndGradientsOfSeparateDocuments) {
  const ModelConfig config = tiny_model(64);
  const Dataset d = make_documents(5, 64, 21);
  HostMicroBatch packed;
  std::vector<HostMicroBatch> separate(d.samples.size());
  for (size_t i = 0; i < d.samples.size(); ++i) {
    append_document(packed, d.samples[i]);
    append_document(separate[i], d.samples[i]);
  }
  const StepOutput a = one_step(config, std::span<const HostMicroBatch>(&packed, 1));
  const StepOutput b = one_step(config, separate);
  EXPECT_EQ(a.targets, b.targets);
  EXPECT_NEAR(a.loss, b.loss, kFp32PackingTolerance * b.loss);
  ASSERT_EQ(a.grads.size(), b.grads.size());
  EXPECT_LT(relative_difference(a.grads, b.grads), kFp32PackingTolerance);

  // The check can fail: the same row read as one long document (positions and attention run
  // across the boundaries) gives a different loss.
  HostMicroBatch joined = packed;
  for (int64_t t = 0; t < joined.size(); ++t) {
    joined.positions[static_cast<size_t>(t)] = static_cast<int32_t>(t);
    joined.doc_start[static_cast<size_t>(t)] = 0;
  }
  const StepOutput c = one_step(config, std::span<const HostMicroBatch>(&joined, 1));
  EXPECT_GT(std::fabs(c.loss - b.loss), 100 * kFp32PackingTolerance * b.loss);
  EXPECT_GT(relative_difference(c.grads, b.grads), 100 * kFp32PackingTolerance);
}

// Through the trainer: a global batch of one whole epoch, packed (rows) and unpacked (samples),
// gives the same losses and gradient norms for two optimizer steps.
TEST(Packing, TrainerLossIsTheSamePackedOrNot) {
  const Dataset d = make_documents(12, 64, 5);
  TrainConfig config;
  config.model = tiny_model(64);
  config.max_length = 32;
  config.max_steps = 2;
  config.learning_rate = 1e-2;
  config.warmup_ratio = 0;
  config.lr_scheduler_type = LrSchedulerType::constant;
  config.log_to_console = false;
  config.per_device_train_batch_size = 2;
  config.gradient_accumulation_steps = 6;  // 12 samples per step
  auto backend = make_cpu_backend(DType::f32);
  LocalCommunicator comm;
  auto unpacked = train(config, d, comm, *backend);
  ASSERT_TRUE(unpacked.is_ok()) << unpacked.status().message();

  auto plan = pack_dataset(d, config.max_length);
  ASSERT_TRUE(plan.is_ok());
  ASSERT_LT(plan.value().rows(), 12);
  config.packing = true;
  config.per_device_train_batch_size = 1;
  config.gradient_accumulation_steps = plan.value().rows();  // every row per step
  auto packed = train(config, d, comm, *backend);
  ASSERT_TRUE(packed.is_ok()) << packed.status().message();
  ASSERT_EQ(packed.value().losses.size(), 2u);
  for (size_t s = 0; s < 2; ++s) {
    EXPECT_NEAR(packed.value().losses[s], unpacked.value().losses[s],
                kFp32PackingTolerance * unpacked.value().losses[s])
        << "step " << s + 1;
    EXPECT_NEAR(packed.value().grad_norms[s], unpacked.value().grad_norms[s],
                kFp32PackingTolerance * unpacked.value().grad_norms[s])
        << "step " << s + 1;
  }
  // Steps per epoch count rows with packing.
  config.max_steps = -1;
  config.num_train_epochs = 1;
  config.gradient_accumulation_steps = 1;
  EXPECT_EQ(total_training_steps(config, plan.value().rows(), 1).value(), plan.value().rows());
}

}  // namespace
}  // namespace glm::test
