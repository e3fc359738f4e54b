// Under mpirun -np N (1-4): the same global batch gives the same 10-step loss trajectory at every
// world size and ZeRO stage 0-3, with and without gradient accumulation, as one process at stage 0
// (relative difference < 1e-5), and every rank ends with identical parameters, also with ZeRO-3's
// persistent tensors at any threshold; the per-rank model-state bytes follow the ZeRO formulas; the
// memory planner matches the allocations; checkpoints resume across stages, world sizes and thresholds.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "data/dataset.h"
#include "mpi/mpi_communicator.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/engine.h"
#include "train/trainer.h"
#include "zero/comm_buckets.h"
#include "model/context_attention.h"
#include "zero/memory_plan.h"

namespace glm::test {
namespace {

// fp32 sums in another order (per-rank partials, reduce-scatter instead of all-reduce) move losses
// by ~1e-7 relative; 10 AdamW steps keep that well under the 1e-5.
constexpr double kTrajectoryTolerance = 1e-5;
constexpr int64_t kGlobalBatch = 12;
// Steps of a trajectory, evaluated halfway and at the end: 10 steps drop the loss by ~0.8.
constexpr int kSteps = 10;

TrainConfig zero_config() {
  TrainConfig t;
  ModelConfig& m = t.model;
  m = test::tiny_glm4();
  EXPECT_TRUE(m.finalize_and_validate().is_ok());
  t.datasets = {std::string(GLM_SOURCE_DIR) + "/data/sample/conversations.jsonl"};
  t.max_length = 256;
  t.max_steps = kSteps;
  t.learning_rate = 5e-3;
  t.warmup_steps = 2;
  t.weight_decay = 0.1;
  t.log_to_console = false;
  t.eval_steps = kSteps / 2;
  t.per_device_eval_batch_size = 3;
  return t;
}

// The 200 samples cut to their last 256 tokens (most have ~400): what ZeRO is checked on does not
// depend on length, and the CPU attention's cost grows with its square.
const Dataset& dataset() {
  static ByteTokenizer tokenizer;
  static Dataset d = load_dataset(zero_config().datasets, &tokenizer, 256, 272, false, Truncation::left).take();
  return d;
}

// A validation set: 10 samples held out of the sample data with the trainer's own split.
const Dataset& validation() {
  static Dataset v = [] {
    Dataset train = dataset(), held;
    EXPECT_TRUE(split_dataset(train, 0.05, 3, held).is_ok());
    return held;
  }();
  return v;
}

struct Reference {
  std::vector<double> losses;
  std::vector<double> eval_losses;    // after steps kSteps / 2 and kSteps
  std::vector<int64_t> eval_correct;  // argmax-correct validation tokens after steps kSteps / 2 and kSteps
  double checksum = 0;
};

// One process at stage 0, the global batch accumulated: what every trajectory is compared with.
Reference run_reference() {
  Reference r;
  r.losses.assign(kSteps, 0.0);
  r.eval_losses.assign(2, 0.0);
  r.eval_correct.assign(2, 0);
  TrainConfig single = zero_config();
  single.gradient_accumulation_steps = kGlobalBatch;
  MpiCommunicator self(MPI_COMM_SELF, std::chrono::seconds(120));
  auto backend = make_cpu_backend(DType::f32);
  auto s = train(single, dataset(), self, *backend, {}, &validation());
  EXPECT_TRUE(s.is_ok()) << s.status().message();
  if (!s.is_ok()) return r;
  r.losses = s.value().losses;
  r.checksum = s.value().parameter_checksum;
  EXPECT_EQ(s.value().eval_losses.size(), 2u);
  for (size_t i = 0; i < 2 && i < s.value().eval_losses.size(); ++i) r.eval_losses[i] = s.value().eval_losses[i].second;
  for (size_t i = 0; i < 2 && i < s.value().eval_correct.size(); ++i)
    r.eval_correct[i] = s.value().eval_correct[i].second;
  return r;
}

// ctest runs this suite in parts, one process each (tests/CMakeLists.txt), and computes the
// reference once for all of them: its fixture runs ReferenceRun.WrittenForTheOtherParts with
// GLM_TEST_ZERO_REFERENCE_OUT set, and the parts read that file from GLM_TEST_ZERO_REFERENCE.
// nlohmann::json writes doubles so that they read back to the same bits.
nlohmann::json reference_json(const Reference& r) {
  return {
      {"losses", r.losses}, {"eval_losses", r.eval_losses}, {"eval_correct", r.eval_correct}, {"checksum", r.checksum}};
}

std::optional<Reference> read_reference() {
  const char* path = std::getenv("GLM_TEST_ZERO_REFERENCE");
  if (path == nullptr) return std::nullopt;
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  EXPECT_TRUE(j.is_object()) << "GLM_TEST_ZERO_REFERENCE: " << path << " is not a reference run";
  if (!j.is_object()) return std::nullopt;
  Reference r;
  r.losses = j.at("losses").get<std::vector<double>>();
  r.eval_losses = j.at("eval_losses").get<std::vector<double>>();
  r.eval_correct = j.at("eval_correct").get<std::vector<int64_t>>();
  r.checksum = j.at("checksum").get<double>();
  EXPECT_EQ(r.losses.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(r.eval_losses.size(), 2u);
  EXPECT_EQ(r.eval_correct.size(), 2u);
  if (r.losses.size() != static_cast<size_t>(kSteps) || r.eval_losses.size() != 2 || r.eval_correct.size() != 2)
    return std::nullopt;
  return r;
}

TEST(ReferenceRun, WrittenForTheOtherParts) {
  const char* out = std::getenv("GLM_TEST_ZERO_REFERENCE_OUT");
  if (out == nullptr) GTEST_SKIP() << "only ctest's fixture test_zero_reference writes the reference";
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return;
  const Reference r = run_reference();
  ASSERT_FALSE(HasFailure());
  {
    std::ofstream file(out);
    file << reference_json(r).dump();
    ASSERT_TRUE(file.good()) << out;
  }
  ScopedEnv in("GLM_TEST_ZERO_REFERENCE", out);
  const std::optional<Reference> read = read_reference();
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->losses, r.losses) << "the parts read the same bits";
  EXPECT_EQ(read->eval_losses, r.eval_losses);
  EXPECT_EQ(read->eval_correct, r.eval_correct);
  EXPECT_EQ(read->checksum, r.checksum);
}

// The reference of this process: ctest's file, else computed on rank 0, broadcast to every rank.
const Reference& reference() {
  static Reference ref = [] {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    Reference r;
    r.losses.assign(kSteps, 0.0);
    r.eval_losses.assign(2, 0.0);
    r.eval_correct.assign(2, 0);
    if (rank == 0) {
      std::optional<Reference> read = read_reference();
      r = read ? *read : run_reference();
    }
    MPI_Bcast(r.losses.data(), kSteps, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Bcast(r.eval_losses.data(), 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Bcast(r.eval_correct.data(), 2, MPI_INT64_T, 0, MPI_COMM_WORLD);
    MPI_Bcast(&r.checksum, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return r;
  }();
  return ref;
}

class Zero : public ::testing::TestWithParam<std::tuple<int, bool, Recompute>> {};

TEST_P(Zero, SameTrajectoryAsOneProcess) {
  const auto [stage, accumulate, recompute] = GetParam();
  const Reference& ref = reference();
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  TrainConfig config = zero_config();
  config.zero_stage = stage;
  config.recompute = recompute;
  // Accumulation: one sample per micro-batch; otherwise the whole share in one micro-batch.
  const int64_t share = kGlobalBatch / comm.size();
  if (kGlobalBatch % comm.size() != 0) GTEST_SKIP() << "12 samples do not split over " << comm.size() << " ranks";
  // One rank: test_model proves recomputation exact (bit for bit); here it is about the collectives.
  if (recompute != Recompute::none && comm.size() == 1) GTEST_SKIP() << "recomputation at one rank: see test_model";
  config.per_device_train_batch_size = accumulate ? 1 : share;
  config.gradient_accumulation_steps = accumulate ? share : 1;
  auto backend = make_cpu_backend(DType::f32);
  auto r = train(config, dataset(), comm, *backend, {}, &validation());
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  // Evaluation during training spreads the validation set over the ranks: same losses.
  ASSERT_EQ(r.value().eval_losses.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(r.value().eval_losses[i].first, static_cast<int64_t>(kSteps / 2 * (i + 1)));
    EXPECT_NEAR(r.value().eval_losses[i].second, ref.eval_losses[i], kTrajectoryTolerance * ref.eval_losses[i]);
    // Token accuracy: counts summed over the ranks like the loss; argmaxes this far from a tie
    // do not move with the ~1e-7 reordering, so the counts match exactly.
    EXPECT_EQ(r.value().eval_correct[i].second, ref.eval_correct[i]) << "evaluation " << i;
  }
  EXPECT_GT(ref.eval_correct[1], 0) << "a trained model predicts some validation tokens";
  for (size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_NEAR(r.value().losses[i], ref.losses[i], kTrajectoryTolerance * ref.losses[i])
        << "stage " << stage << " step " << i + 1 << " world " << comm.size() << " recompute " << enum_name(recompute);
  EXPECT_NEAR(r.value().parameter_checksum, ref.checksum, kTrajectoryTolerance * ref.checksum);
  // Every rank ends with bit-identical parameters (the checksum is of the whole model at every stage).
  double mine = r.value().parameter_checksum, lo = 0, hi = 0;
  MPI_Allreduce(&mine, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&mine, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(lo, hi);
  EXPECT_LT(r.value().losses.back(), r.value().losses.front() - 0.5);
}

// stage2_accumulated_full: what ctest's parts filter on (tests/CMakeLists.txt).
std::string zero_case_name(const ::testing::TestParamInfo<Zero::ParamType>& info) {
  const auto [stage, accumulate, recompute] = info.param;
  return concat("stage", stage, accumulate ? "_accumulated" : "_window",
                recompute == Recompute::none ? "" : concat("_", enum_name(recompute)));
}

INSTANTIATE_TEST_SUITE_P(Stages, Zero,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(false, true),
                                            ::testing::Values(Recompute::none)),
                         zero_case_name);
// Recomputation under every stage (ZeRO-3 gathers each layer again for its recomputed forward).
INSTANTIATE_TEST_SUITE_P(RecomputeAccumulated, Zero,
                         ::testing::Combine(::testing::Values(1, 3), ::testing::Values(true),
                                            ::testing::Values(Recompute::selective, Recompute::full)),
                         zero_case_name);
INSTANTIATE_TEST_SUITE_P(RecomputeFull, Zero,
                         ::testing::Combine(::testing::Values(0, 2), ::testing::Values(false),
                                            ::testing::Values(Recompute::full)),
                         zero_case_name);

// Without clipping (--max_grad_norm 0) AdamW sums the gradient norm as it reads the gradients
// (no pass of its own). At every stage and world size the reported norms equal those of the
// separate pass (clipping at 1e9, which never scales), and the trajectory is the same bit for bit.
class FusedNorm : public ::testing::TestWithParam<int> {};

TEST_P(FusedNorm, EqualsTheSeparatePass) {
  const int stage = GetParam();
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  if (kGlobalBatch % comm.size() != 0) GTEST_SKIP() << "12 samples do not split over " << comm.size() << " ranks";
  TrainConfig config = zero_config();
  config.zero_stage = stage;
  config.max_steps = 6;
  config.eval_steps = 0;
  config.per_device_train_batch_size = kGlobalBatch / comm.size();
  auto run = [&](double max_grad_norm) {
    config.max_grad_norm = max_grad_norm;
    auto backend = make_cpu_backend(DType::f32);
    auto r = train(config, dataset(), comm, *backend, {}, nullptr);
    EXPECT_TRUE(r.is_ok()) << r.status().message();
    return r.is_ok() ? r.take() : TrainSummary{};
  };
  const TrainSummary separate = run(1e9), fused = run(0.0);
  ASSERT_EQ(separate.grad_norms.size(), 6u);
  ASSERT_EQ(fused.grad_norms.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_GT(fused.grad_norms[i], 0.0);
    EXPECT_NEAR(fused.grad_norms[i], separate.grad_norms[i], 1e-9 * separate.grad_norms[i]) << "step " << i + 1;
    EXPECT_EQ(fused.losses[i], separate.losses[i]) << "step " << i + 1;
  }
  EXPECT_EQ(fused.parameter_checksum, separate.parameter_checksum);
}

INSTANTIATE_TEST_SUITE_P(Stages, FusedNorm, ::testing::Values(0, 1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& p) { return concat("stage", p.param); });

// ZeRO-3 parameter persistence (--param_persistence_threshold, --model_persistence_threshold): the
// same trajectory as one process at stage 0, every rank ending with identical parameters.
// On this model's shapes (hidden 32): 100 keeps the norms and QKV biases whole, 3000 also the QKV,
// dense and down-projection weights (units then hold one or two tensors), a model budget of 5000
// stops part way, 1e5 (DeepSpeed's default) and 1e12 keep everything (every unit but the
// persistent one empty). With accumulation the persistent gradients are reduced per micro-batch;
// --reduce_bucket_size 1 makes every bucket one unit read in place (the unpacked path).
struct PersistenceCase {
  int64_t threshold, model_threshold;
  bool accumulate;
  int64_t reduce_bucket_size;
  bool overlap;
};

class Persistence : public ::testing::TestWithParam<PersistenceCase> {};

TEST_P(Persistence, SameTrajectoryAsOneProcess) {
  const PersistenceCase c = GetParam();
  const Reference& ref = reference();
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  TrainConfig config = zero_config();
  config.zero_stage = 3;
  config.zero_options.param_persistence_threshold = c.threshold;
  config.zero_options.model_persistence_threshold = c.model_threshold;
  config.zero_options.reduce_bucket_size = c.reduce_bucket_size;
  config.zero_options.overlap_comm = c.overlap;
  const int64_t share = kGlobalBatch / comm.size();
  config.per_device_train_batch_size = c.accumulate ? 1 : share;
  config.gradient_accumulation_steps = c.accumulate ? share : 1;
  auto backend = make_cpu_backend(DType::f32);
  auto r = train(config, dataset(), comm, *backend, {}, &validation());
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  ASSERT_EQ(r.value().eval_losses.size(), 2u);
  for (size_t i = 0; i < 2; ++i)
    EXPECT_NEAR(r.value().eval_losses[i].second, ref.eval_losses[i], kTrajectoryTolerance * ref.eval_losses[i]);
  for (size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_NEAR(r.value().losses[i], ref.losses[i], kTrajectoryTolerance * ref.losses[i])
        << "threshold " << c.threshold << " step " << i + 1 << " world " << comm.size();
  EXPECT_NEAR(r.value().parameter_checksum, ref.checksum, kTrajectoryTolerance * ref.checksum);
  double mine = r.value().parameter_checksum, lo = 0, hi = 0;
  MPI_Allreduce(&mine, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&mine, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(lo, hi);
}

constexpr int64_t kUnlimited = PersistencePolicy::kUnlimited;
INSTANTIATE_TEST_SUITE_P(Thresholds, Persistence,
                         ::testing::Values(PersistenceCase{0, kUnlimited, true, 1, true},
                                           PersistenceCase{100, kUnlimited, false, 500'000'000, true},
                                           PersistenceCase{3000, 5000, true, 1, true},
                                           PersistenceCase{ZeroOptions::kDeepSpeedParamPersistenceThreshold, kUnlimited,
                                                           false, 500'000'000, false},
                                           PersistenceCase{1'000'000'000'000, kUnlimited, true, 500'000'000, true}),
                         [](const ::testing::TestParamInfo<PersistenceCase>& p) {
                           return concat("threshold", p.param.threshold,
                                         p.param.accumulate ? "_accumulated" : "_window");
                         });

// Persistence changes where ZeRO-3 keeps tensors, not what a checkpoint holds: a checkpoint saved
// with one threshold resumes with another (and the reverse), at another stage, and on one rank, and
// export reads it (every unit covered exactly once).
TEST(Checkpoint, PersistenceThresholdMayChangeOnResume) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  const int rank = comm.rank(), size = comm.size();
  int tag = static_cast<int>(::getpid());
  MPI_Bcast(&tag, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("glm_persist_ckpt_" + std::to_string(tag))).string();
  TrainConfig base = zero_config();
  base.eval_steps = 0;
  base.max_steps = 8;
  base.save_steps = 4;
  base.per_device_train_batch_size = kGlobalBatch / size;
  base.zero_stage = 3;
  auto backend = make_cpu_backend(DType::f32);
  auto with = [&](TrainConfig c, int64_t threshold, const char* out) {
    c.zero_options.param_persistence_threshold = threshold;
    c.output_dir = dir + "/" + out;
    return c;
  };
  // Straight runs: threshold 3000 (checkpoint version 3, runs per unit) and 0 (version 2).
  auto persistent = train(with(base, 3000, "persistent"), dataset(), comm, *backend);
  ASSERT_TRUE(persistent.is_ok()) << persistent.status().message();
  auto partitioned = train(with(base, 0, "partitioned"), dataset(), comm, *backend);
  ASSERT_TRUE(partitioned.is_ok()) << partitioned.status().message();
  for (size_t i = 0; i < 8; ++i)
    EXPECT_NEAR(persistent.value().losses[i], partitioned.value().losses[i],
                kTrajectoryTolerance * partitioned.value().losses[i]);

  auto resume = [&](TrainConfig c, const char* from, Communicator& on) {
    c.resume_from_checkpoint = dir + "/" + from + "/checkpoint-4";
    c.output_dir += "-resumed";
    c.save_strategy = SaveStrategy::no;
    auto b = make_cpu_backend(DType::f32);
    return train(c, dataset(), on, *b);
  };
  auto expect_tail = [&](const Result<TrainSummary>& r, const TrainSummary& straight, bool bitwise, const char* what) {
    ASSERT_TRUE(r.is_ok()) << what << ": " << r.status().message();
    ASSERT_EQ(r.value().losses.size(), 4u) << what;
    for (size_t i = 0; i < 4; ++i) {
      if (bitwise) {
        EXPECT_EQ(r.value().losses[i], straight.losses[4 + i]) << what << " step " << 5 + i;
      } else {
        EXPECT_NEAR(r.value().losses[i], straight.losses[4 + i], kTrajectoryTolerance * straight.losses[4 + i])
            << what << " step " << 5 + i;
      }
    }
  };
  expect_tail(resume(with(base, 3000, "same"), "persistent", comm), persistent.value(), true, "same threshold");
  expect_tail(resume(with(base, 0, "to-none"), "persistent", comm), persistent.value(), false, "threshold 0");
  expect_tail(resume(with(base, 100, "from-none"), "partitioned", comm), partitioned.value(), false,
              "threshold 100 from a threshold-0 checkpoint");
  TrainConfig stage1 = with(base, ZeroOptions::kDeepSpeedParamPersistenceThreshold, "stage1");
  stage1.zero_stage = 1;  // the option has no effect below stage 3
  expect_tail(resume(stage1, "persistent", comm), persistent.value(), false, "stage 1");
  if (rank == 0 && size > 1) {  // one rank, the whole window accumulated, everything persistent
    MpiCommunicator self(MPI_COMM_SELF, std::chrono::seconds(120));
    TrainConfig one = with(base, ZeroOptions::kDeepSpeedParamPersistenceThreshold, "single");
    one.per_device_train_batch_size = 1;
    one.gradient_accumulation_steps = kGlobalBatch;
    expect_tail(resume(one, "persistent", self), persistent.value(), false, "one rank");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    // Export's reader: the same masters from either checkpoint (fp32 reordering apart).
    std::vector<std::vector<float>> masters[2];
    const char* names[2] = {"persistent", "partitioned"};
    for (int k = 0; k < 2; ++k) {
      auto info = read_checkpoint_info(dir + "/" + names[k] + "/checkpoint-4");
      ASSERT_TRUE(info.is_ok()) << info.status().message();
      EXPECT_EQ(info.value().world_size, size);
      Status read = read_checkpoint_masters(info.value(), [&](int, std::span<const float> v) {
        masters[k].emplace_back(v.begin(), v.end());
        return Status::ok();
      });
      ASSERT_TRUE(read.is_ok()) << read.message();
    }
    ASSERT_EQ(masters[0].size(), masters[1].size());
    for (size_t u = 0; u < masters[0].size(); ++u) {
      ASSERT_EQ(masters[0][u].size(), masters[1][u].size());
      for (size_t i = 0; i < masters[0][u].size(); ++i)
        ASSERT_NEAR(masters[0][u][i], masters[1][u][i], 1e-5) << "unit " << u << " element " << i;
    }
    std::ifstream meta(dir + "/persistent/checkpoint-4/meta.json");
    EXPECT_EQ(nlohmann::json::parse(meta)["version"], 3);
    std::ifstream plain(dir + "/partitioned/checkpoint-4/meta.json");
    EXPECT_EQ(nlohmann::json::parse(plain)["version"], 2);  // older glm_hpc reads it
    std::filesystem::remove_all(dir);
  }
}

// Checkpoints: a straight run saves halfway; resuming from there gives the second half bit for
// bit at the same world size and stage, and within fp32 reordering at another stage and on one
// rank (resharding: the slices are located by their place in each unit, not by rank).
TEST(Checkpoint, ResumesAtAnyStageAndWorldSize) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  const int rank = comm.rank(), size = comm.size();
  if (kGlobalBatch % size != 0) GTEST_SKIP() << "12 samples do not split over " << size << " ranks";
  int tag = static_cast<int>(::getpid());
  MPI_Bcast(&tag, 1, MPI_INT, 0, MPI_COMM_WORLD);  // one directory for every rank of this job
  const std::string dir = (std::filesystem::temp_directory_path() / ("glm_zero_ckpt_" + std::to_string(tag))).string();
  TrainConfig base = zero_config();
  base.eval_steps = 0;
  base.per_device_train_batch_size = kGlobalBatch / size;
  base.zero_stage = size > 1 ? 3 : 0;
  base.output_dir = dir;
  constexpr size_t half = kSteps / 2;
  base.save_steps = half;
  auto backend = make_cpu_backend(DType::f32);
  auto straight = train(base, dataset(), comm, *backend);
  ASSERT_TRUE(straight.is_ok()) << straight.status().message();
  ASSERT_EQ(straight.value().losses.size(), static_cast<size_t>(kSteps));

  auto resume = [&](TrainConfig c, Communicator& with, const char* out) {
    c.resume_from_checkpoint = dir + "/checkpoint-" + std::to_string(half);
    c.output_dir = dir + "/" + out;
    c.save_strategy = SaveStrategy::no;
    auto b = make_cpu_backend(DType::f32);
    return train(c, dataset(), with, *b);
  };
  auto same = resume(base, comm, "same");
  ASSERT_TRUE(same.is_ok()) << same.status().message();
  ASSERT_EQ(same.value().losses.size(), half);
  for (size_t i = 0; i < half; ++i)
    EXPECT_EQ(same.value().losses[i], straight.value().losses[half + i]) << "step " << half + 1 + i;

  TrainConfig stage1 = base;
  stage1.zero_stage = 1;
  auto other_stage = resume(stage1, comm, "stage1");
  ASSERT_TRUE(other_stage.is_ok()) << other_stage.status().message();
  for (size_t i = 0; i < half; ++i)
    EXPECT_NEAR(other_stage.value().losses[i], straight.value().losses[half + i],
                kTrajectoryTolerance * straight.value().losses[half + i]);

  if (rank == 0 && size > 1) {  // the same checkpoint on one rank: the whole window accumulated
    MpiCommunicator self(MPI_COMM_SELF, std::chrono::seconds(120));
    TrainConfig one = base;
    one.zero_stage = 2;
    one.per_device_train_batch_size = 1;
    one.gradient_accumulation_steps = kGlobalBatch;
    auto single = resume(one, self, "single");
    EXPECT_TRUE(single.is_ok()) << single.status().message();
    if (single.is_ok()) {
      for (size_t i = 0; i < half; ++i)
        EXPECT_NEAR(single.value().losses[i], straight.value().losses[half + i],
                    kTrajectoryTolerance * straight.value().losses[half + i]);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(dir);
}

// Model-state bytes per rank (fp32 CPU backend: parameters are the master weights):
// stage 0: 4P parameters, 4P gradients, 8P moments; 1: moments /N; 2: gradients /N too; 3: all /N.
// Deferred embedding rows at stage 0 over several ranks: each rank's batches draw their tokens from
// its own part of the vocabulary (and a part shared by every rank), so rows only another rank's
// tokens reach have a gradient here after the all-reduce: the step's rows must be the union over
// the ranks. Losses, evaluation and parameters bit-identical to updating every row every step.
TEST(DeferredEmbedding, StageZeroUnitesTheRanksTokens) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(60));
  const ModelConfig model = zero_config().model;
  const int rank = comm.rank();
  auto window = [&](int step) {
    const int32_t first = step % 2 == 0 ? 20 + 40 * rank : 0, span = step % 2 == 0 ? 30 : 15;
    std::vector<HostMicroBatch> w = {random_documents(span, 100 + static_cast<uint64_t>(10 * step + rank), {20, 9}, 2)};
    for (auto& b : w) {
      for (auto& t : b.tokens) t += first;
      for (auto& t : b.targets) t = t >= 0 ? t + first : t;
    }
    return w;
  };
  const HostMicroBatch held_out = random_documents(model.vocab_size, 200 + static_cast<uint64_t>(rank), {16}, 1);
  struct Trace {
    std::vector<double> losses, eval;
    std::vector<float> params;
    bool deferred = false;
  };
  auto run = [&](const char* defer) {
    auto backend = make_cpu_backend(DType::f32);
    EngineConfig ec;
    ec.model = model;
    ec.max_tokens = 64;
    ec.adam = AdamWOptions{0.9, 0.95, 1e-8, 0.1};
    ec.defer_embedding_rows = std::atoi(defer);
    auto e = TrainingEngine::create(ec, *backend, comm).take();
    Trace t;
    t.deferred = e->defers_embedding_rows();
    EXPECT_TRUE(e->initialize_parameters(5).is_ok());
    for (int s = 0; s < 7; ++s) {
      auto r = e->step(window(s), 3e-3);
      EXPECT_TRUE(r.is_ok()) << r.status().message();
      if (!r.is_ok()) return t;
      t.losses.push_back(r.value().loss);
      if (s == 3) t.eval.push_back(e->evaluate(held_out).value().loss_sum);  // collective
    }
    t.params = e->parameters().take();
    return t;
  };
  const Trace dense = run("0"), deferred = run("2");
  EXPECT_FALSE(dense.deferred);
  ASSERT_TRUE(deferred.deferred);
  ASSERT_EQ(deferred.losses.size(), 7u);
  EXPECT_EQ(deferred.losses, dense.losses);
  EXPECT_EQ(deferred.eval, dense.eval);
  EXPECT_EQ(deferred.params, dense.params);
  EXPECT_LT(dense.losses.back(), dense.losses.front());
}

TEST(ZeroMemory, FollowsTheFormulas) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(60));
  const int n = comm.size();
  const ModelConfig model = zero_config().model;
  for (int stage = 0; stage <= 3; ++stage) {
    auto backend = make_cpu_backend(DType::f32);
    const EngineConfig ec{.model = model, .max_tokens = 64, .adam = AdamWOptions{}, .zero_stage = stage};
    auto e = TrainingEngine::create(ec, *backend, comm).take();
    const double p = static_cast<double>(e->layout().total_numel());  // padded so it splits evenly
    const ZeroMemory m = e->memory();
    const double params = stage == 3 ? 4 * p / n : 4 * p;
    const double grads = stage == 0 ? 4 * p : (stage == 1 ? 4 * p + 4 * p / n : 4 * p / n);
    const double moments = stage == 0 ? 8 * p : 8 * p / n;
    EXPECT_EQ(static_cast<double>(m.parameter_bytes), params) << "stage " << stage;
    EXPECT_EQ(static_cast<double>(m.gradient_bytes), grads) << "stage " << stage;
    EXPECT_EQ(static_cast<double>(e->optimizer_bytes()), moments) << "stage " << stage;
  }
}

// ZeRO-3 with persistent tensors: the persistent unit whole on every rank, the other units 1/N;
// gradients and moments still 1/N of everything; the persistent gradients' buffer among the
// communication buffers. Exact in the layout's padded sizes, and within padding of
// 4 (P_persistent + (P - P_persistent) / N) for the parameters. The planner's rows follow.
TEST(ZeroMemory, PersistentTensorsAreWholeOnEveryRank) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(60));
  const int n = comm.size();
  const ModelConfig model = zero_config().model;
  for (int64_t threshold :
       {int64_t{0}, int64_t{100}, int64_t{3000}, ZeroOptions::kDeepSpeedParamPersistenceThreshold}) {
    ZeroOptions zero;
    zero.param_persistence_threshold = threshold;
    auto backend = make_cpu_backend(DType::f32);
    const EngineConfig ec{.model = model, .max_tokens = 64, .adam = AdamWOptions{}, .zero_stage = 3, .zero = zero};
    auto e = TrainingEngine::create(ec, *backend, comm).take();
    const ParamLayout& layout = e->layout();
    EXPECT_EQ(layout.persistent_unit() >= 0, threshold > 0);
    const int64_t expected_tensors = threshold == 0 ? 0 : (threshold == 100 ? 7 : (threshold == 3000 ? 13 : 17));
    EXPECT_EQ(layout.persistent_tensors(), expected_tensors) << threshold;
    int64_t partitioned = 0, whole = 0, shards = 0;
    for (int u = 0; u < static_cast<int>(layout.units().size()); ++u) {
      shards += layout.shard_numel(u);
      if (u == layout.persistent_unit()) {
        whole = layout.units()[static_cast<size_t>(u)].numel;
      } else {
        partitioned += layout.shard_numel(u);
      }
    }
    const ZeroMemory m = e->memory();
    EXPECT_EQ(m.parameter_bytes, 4 * (partitioned + whole)) << threshold;
    EXPECT_EQ(m.gradient_bytes, 4 * shards) << threshold;
    EXPECT_EQ(e->optimizer_bytes(), 8 * shards) << threshold;
    const ZeroBufferSizes buffers = zero_buffer_sizes(layout, 3, zero, DType::f32);
    EXPECT_EQ(buffers.persistent_grad_numel, whole);
    EXPECT_EQ(m.buffer_bytes, buffers.bytes()) << threshold;
    const double kept = static_cast<double>(layout.persistent_parameter_count());
    const double all = static_cast<double>(layout.parameter_count());
    const double padding =
        4.0 * ParamLayout::kAlignment *
        (static_cast<double>(layout.entries().size()) + static_cast<double>(layout.units().size()) * n);
    EXPECT_NEAR(static_cast<double>(m.parameter_bytes), 4 * (kept + (all - kept) / n), padding) << threshold;
    // The planner's bf16 rows, from the same layout and buffer sizes.
    MemoryPlanInput in;
    in.model = model;
    in.world_size = n;
    in.zero_stage = 3;
    in.zero_options = zero;
    const MemoryPlan plan = plan_cuda_memory(in);
    EXPECT_EQ(plan.rows[0].bytes, 2 * (partitioned + whole)) << threshold;
    EXPECT_EQ(plan.rows[1].bytes, 2 * shards) << threshold;
    EXPECT_EQ(plan.rows[2].bytes, 10 * shards) << threshold;  // moments + the master's low halves
    EXPECT_EQ(plan.rows[3].bytes, zero_buffer_sizes(layout, 3, zero, DType::bf16).bytes()) << threshold;
    // Below stage 3 the option changes nothing.
    in.zero_stage = 2;
    ZeroOptions none = zero;
    none.param_persistence_threshold = 0;
    MemoryPlanInput without = in;
    without.zero_options = none;
    EXPECT_EQ(plan_cuda_memory(in).total, plan_cuda_memory(without).total) << threshold;
  }
}

}  // namespace
}  // namespace glm::test

namespace glm::test {
namespace {

TEST(MemoryPlan, ActivationBytesMatchWhatTheModelAllocates) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) GTEST_SKIP();
  const ModelConfig c = zero_config().model;
  auto backend = make_cpu_backend(DType::f32);
  for (Recompute policy : {Recompute::none, Recompute::selective, Recompute::full}) {
    for (int64_t tokens : {1, 77, 512}) {
      auto model = Glm4Model::create(c, *backend, tokens, policy).take();
      EXPECT_EQ(model->activation_bytes(), Glm4Model::planned_activation_bytes(c, tokens, 4, 4, policy))
          << tokens << " " << enum_name(policy);
    }
  }
}

// GLM-4-9B-Chat's shapes (configs/glm4-9b-chat.cfg), cut to `layers`.
ModelConfig glm4_9b_shapes(int64_t layers) {
  ModelConfig m = glm4_9b_chat();
  m.num_hidden_layers = layers;
  EXPECT_TRUE(m.finalize_and_validate().is_ok());
  return m;
}

double plan_gib(const MemoryPlanInput& in) {
  return static_cast<double>(plan_cuda_memory(in).total) / (1024.0 * 1024 * 1024);
}

TEST(MemoryPlan, PredictsTheMeasuredH200Peak) {
  // benchmarks/RESULTS.md, memory plan against measured peaks: GLM-4-9B shapes cut to 12 layers, seq 4096, ZeRO-0, one
  // H200, split fp32 masters and the 2 GiB lm_head scratch: 57.1 GiB peak by nvidia-smi (58.9 with
  // a 4 GiB scratch; 65.7 with that and whole fp32 masters, which plan 2 bytes a parameter more).
  // The issue asks for predictions within 10%.
  MemoryPlanInput in;
  in.model = glm4_9b_shapes(12);
  in.micro_batch_tokens = 4096;
  EXPECT_NEAR(plan_gib(in), 57.1, 0.1 * 57.1);
  MemoryPlanInput whole = in;
  whole.split_master = false;
  EXPECT_NEAR(plan_gib(whole), 63.9, 0.1 * 63.9);  // 65.7 measured - 1.8 of scratch
  EXPECT_EQ(plan_cuda_memory(whole).total - plan_cuda_memory(in).total, 2 * ParamLayout(in.model, 1).total_numel());
  // Sharding divides the model states: ZeRO-3 on 2 GPUs holds about half of ZeRO-0's 16 P bytes.
  in.world_size = 2;
  in.zero_stage = 3;
  const auto sharded = plan_cuda_memory(in);
  EXPECT_LT(static_cast<double>(sharded.rows[0].bytes + sharded.rows[1].bytes + sharded.rows[2].bytes),
            0.51 * 16.0 * static_cast<double>(in.model.parameter_count()));
}

// Context parallelism: a GPU's activations are those of its share of the row, plus the gathered
// keys and values; with groups of 8 a 1M-token sequence of GLM-4-9B-Chat-1M (4 KV groups) fits on
// H200s for LoRA and for ZeRO-3 full fine-tuning, which one GPU cannot hold.
TEST(MemoryPlan, ContextParallelismFitsAMillionTokensOnEightH200s) {
  MemoryPlanInput in;
  in.model = glm4_9b_shapes(40);
  in.model.num_key_value_heads = 4;
  in.model.max_position_embeddings = int64_t{1} << 20;
  in.recompute = Recompute::full;
  in.micro_batch_tokens = int64_t{1} << 20;
  constexpr double kH200 = 140.4;
  auto activations = [](const MemoryPlan& p) {
    for (const auto& row : p.rows)
      if (row.what == "activations and backward scratch") return static_cast<double>(row.bytes);
    return 0.0;
  };
  const MemoryPlan one = plan_cuda_memory(in);
  EXPECT_GT(plan_gib(in), 4 * kH200) << "one GPU cannot hold a 1M-token sequence";
  in.world_size = in.context_parallel_size = 8;
  const MemoryPlan eight = plan_cuda_memory(in);
  EXPECT_NEAR(activations(eight) / activations(one), 1.0 / 8, 0.01) << "a share of the row";
  for (const bool lora : {true, false}) {
    MemoryPlanInput c = in;
    if (lora) {
      c.lora = LoraConfig{};
    } else {
      c.zero_stage = 3;
    }
    EXPECT_LT(plan_gib(c), kH200) << (lora ? "LoRA" : "ZeRO-3 full fine-tuning");
    EXPECT_GE(longest_fitting_tokens(c, kH200), int64_t{1} << 20);
    const std::string text = format_memory_plan(c, plan_cuda_memory(c), kH200);
    EXPECT_NE(text.find("groups of 8 GPUs share each row; this GPU holds 131072 of its tokens"), std::string::npos)
        << text;
  }
  in.context_parallel_size = 3;  // 2 x 3 chunks: the row is padded to a multiple of 6
  EXPECT_EQ(context_share_tokens(in.micro_batch_tokens, 3), 2 * ((in.micro_batch_tokens + 5) / 6));
}

TEST(MemoryPlan, PredictsTheMeasuredH200LoraPeaks) {
  // benchmarks/RESULTS.md, memory plan against measured peaks (lora_bench.sh): GLM-4-9B-Chat, seq 8192, micro-batch 1,
  // LoRA rank 8 / alpha 32 on all-linear with dropout 0.05, one H200, nvidia-smi peaks 62.0 GiB
  // (--recompute none) and 25.0 GiB (full) with the 2 GiB lm_head scratch (63.7 and 26.7 with
  // a 4 GiB scratch). Within 10%, as for full training.
  MemoryPlanInput in;
  in.model = glm4_9b_shapes(40);
  in.micro_batch_tokens = 8192;
  in.lora = LoraConfig{};  // rank 8, alpha 32, dropout 0.05, every linear: the bench's options
  for (const auto& [policy, measured] : {std::pair{Recompute::none, 62.0}, std::pair{Recompute::full, 25.0}}) {
    in.recompute = policy;
    EXPECT_NEAR(plan_gib(in), measured, 0.1 * measured) << enum_name(policy);
  }
}

// One row of a plan by name; 0 (and a failure) when it has none.
int64_t plan_row(const MemoryPlan& plan, const std::string& what) {
  for (const auto& r : plan.rows)
    if (r.what == what) return r.bytes;
  ADD_FAILURE() << "no plan row '" << what << "'";
  return 0;
}

// The tiny GLM-4 (hidden 32, FFN 64, 2 layers, q 32 and qkv 64 wide) with rank-4 adapters on every
// linear, counted by hand. Per layer, A [4, in] then Bt [4, out], each at a multiple of 64 elements
// (all are): query_key_value 4 x 32 + 4 x 64, dense 4 x 32 + 4 x 32, dense_h_to_4h 4 x 32 + 4 x 128,
// dense_4h_to_h 4 x 64 + 4 x 32 = 1664; two layers 3328 elements.
constexpr int64_t kTinyRank4Adapters = 3328;
// lora_activation_sizes at 64 tokens: u of 8 adapters 8 x 64 x 4, du 64 x 4, dropout(x) 64 x 64
// (the widest adapter input, dense_4h_to_h's FFN 64).
constexpr int64_t kTinyRank4Activations = 8 * 64 * 4 + 64 * 4 + 64 * 64;

LoraConfig tiny_lora(double dropout = 0.05) {
  LoraConfig l;
  l.rank = 4;
  l.dropout = dropout;
  return l;
}

TEST(MemoryPlan, LoraTermsAreTheHandCountedBytes) {
  MemoryPlanInput full;
  full.model = zero_config().model;
  full.micro_batch_tokens = 64;
  MemoryPlanInput in = full;
  in.lora = tiny_lora();
  EXPECT_EQ(LoraLayout(in.model, *in.lora).total_numel(), kTinyRank4Adapters);
  const ParamLayout layout(in.model, 1);
  MemoryPlan lora = plan_cuda_memory(in), plain = plan_cuda_memory(full);
  // The frozen base: bf16 parameters only, no gradients, no optimizer state, no buckets.
  EXPECT_EQ(plan_row(lora, "base parameters (bf16, frozen)"), 2 * layout.total_numel());
  EXPECT_EQ(plan_row(lora, "LoRA adapters + gradients (bf16, replicated)"), (2 + 2) * kTinyRank4Adapters);
  EXPECT_EQ(plan_row(lora, "LoRA optimizer: fp32 master + Adam moments"), (4 + 4 + 4) * kTinyRank4Adapters);
  EXPECT_EQ(plan_row(lora, "communication buffers"), 0);
  EXPECT_EQ(plan_row(lora, "LoRA activations: rank-r intermediates, dropout scratch"), 2 * kTinyRank4Activations);
  EXPECT_TRUE(std::none_of(lora.rows.begin(), lora.rows.end(), [](const MemoryPlanRow& r) {
    return r.what == "gradients (bf16)" || r.what.rfind("optimizer: ", 0) == 0;
  })) << "the frozen base has neither";
  // The base's activations, kernel scratch and runtime are full training's.
  for (const char* same :
       {"activations and backward scratch", "kernel scratch: logits chunk, attention, GEMM workspace",
        "CUDA context and libraries (calibrated)"})
    EXPECT_EQ(plan_row(lora, same), plan_row(plain, same)) << same;
  EXPECT_LT(lora.total, plain.total);
  // Full training on one GPU also keeps the embedding's deferred rows: a step per row and the step's rows.
  EXPECT_EQ(plan_row(plain, "optimizer: deferred embedding rows (row steps, step rows)"), 8 * in.model.vocab_size);
  EXPECT_EQ(plain.total - lora.total, 2 * layout.total_numel() + 10 * layout.total_numel() + 8 * in.model.vocab_size -
                                          16 * kTinyRank4Adapters - 2 * kTinyRank4Activations);
  in.lora->dropout = 0;  // no scratch: the adapters see x itself
  EXPECT_EQ(plan_row(plan_cuda_memory(in), "LoRA activations: rank-r intermediates"), 2 * (8 * 64 * 4 + 64 * 4));

  // Two GPUs at ZeRO-3: the base partitioned and gathered a unit at a time (two unit buffers, no
  // gradient buckets); the adapters stay whole, their gradients all-reduced in place (over two
  // ranks fp32 travels as bf16: effective_reduce_dtype); over three from an fp32 copy.
  for (MemoryPlanInput* p : {&in, &full}) {
    p->world_size = 2;
    p->zero_stage = 3;
  }
  lora = plan_cuda_memory(in);
  plain = plan_cuda_memory(full);
  const ParamLayout sharded(in.model, 2);
  int64_t shards = 0, largest = 0;
  for (int u = 0; u < static_cast<int>(sharded.units().size()); ++u) {
    shards += sharded.shard_numel(u);
    largest = std::max(largest, sharded.units()[static_cast<size_t>(u)].numel);
  }
  EXPECT_EQ(plan_row(lora, "base parameters (bf16, frozen)"), 2 * shards);
  EXPECT_EQ(plan_row(lora, "LoRA adapters + gradients (bf16, replicated)"), 4 * kTinyRank4Adapters);
  EXPECT_EQ(plan_row(lora, "communication buffers"), 2 * 2 * largest);
  EXPECT_LT(plan_row(lora, "communication buffers"), plan_row(plain, "communication buffers"));
  EXPECT_LT(lora.total, plain.total);
  in.world_size = 3;
  const ParamLayout three(in.model, 3);
  int64_t largest3 = 0;
  for (const ParamUnit& u : three.units()) largest3 = std::max(largest3, u.numel);
  EXPECT_EQ(plan_row(plan_cuda_memory(in), "communication buffers"), 2 * 2 * largest3 + 4 * kTinyRank4Adapters);
  in.zero_options.grad_reduce_dtype = DType::bf16;  // reduced in place
  EXPECT_EQ(plan_row(plan_cuda_memory(in), "communication buffers"), 2 * 2 * largest3);
}

// What a LoRA engine allocates on every rank at every stage is what the planner counts, in the
// CPU backend's fp32 (where the parameters are the master weights: two moments of optimizer state).
TEST(MemoryPlan, LoraEngineAllocatesWhatThePlannerCounts) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(60));
  const int n = comm.size();
  const ModelConfig model = zero_config().model;
  const LoraConfig lora = tiny_lora();
  for (int stage = 0; stage <= 3; ++stage) {
    for (DType reduce : {DType::f32, DType::bf16}) {
      ZeroOptions zero;
      zero.grad_reduce_dtype = reduce;
      auto backend = make_cpu_backend(DType::f32);
      const EngineConfig ec{
          .model = model, .max_tokens = 64, .adam = AdamWOptions{}, .zero_stage = stage, .zero = zero, .lora = lora};
      auto e = TrainingEngine::create(ec, *backend, comm).take();
      const std::string where = concat("stage ", stage, " reduce ", dtype_name(reduce));
      const LoraMemory m = e->lora_memory();
      EXPECT_EQ(m.parameter_bytes, 4 * kTinyRank4Adapters) << where;
      EXPECT_EQ(m.gradient_bytes, 4 * kTinyRank4Adapters) << where;
      EXPECT_EQ(m.optimizer_bytes, 8 * kTinyRank4Adapters) << where;
      EXPECT_EQ(e->optimizer_bytes(), m.optimizer_bytes) << "the frozen base has no optimizer state; " << where;
      // fp32 compute: only a bf16 reduction needs a copy of the gradients, and only between ranks.
      EXPECT_EQ(m.buffer_bytes, n > 1 && reduce == DType::bf16 ? 2 * kTinyRank4Adapters : 0) << where;
      EXPECT_EQ(m.activation_bytes, 4 * kTinyRank4Activations) << where;
      EXPECT_EQ(e->activation_bytes(), Glm4Model::planned_activation_bytes(model, 64, 4, 4) + m.activation_bytes)
          << where;
      // The frozen base: ZeRO keeps its parameters (partitioned at stage 3) and nothing else but
      // stage 3's two gathered units.
      const ParamLayout& layout = e->layout();
      int64_t shards = 0;
      for (int u = 0; u < static_cast<int>(layout.units().size()); ++u) shards += layout.shard_numel(u);
      const ZeroMemory base = e->memory();
      EXPECT_EQ(base.parameter_bytes, 4 * (stage == 3 ? shards : layout.total_numel())) << where;
      EXPECT_EQ(base.gradient_bytes, 0) << where;
      const ZeroBufferSizes sizes = zero_buffer_sizes(layout, stage, zero, DType::f32, /*frozen=*/true);
      EXPECT_EQ(base.buffer_bytes, sizes.bytes()) << where;
      EXPECT_EQ(sizes.bytes(), stage == 3 ? 2 * 4 * sizes.gathered_unit_numel : 0) << where;
      // The planner: the same layouts in bf16, with the CUDA backend's fp32 copy for an fp32 all-reduce
      // (none over two ranks, where fp32 travels as bf16: effective_reduce_dtype).
      MemoryPlanInput in;
      in.model = model;
      in.world_size = n;
      in.zero_stage = stage;
      in.micro_batch_tokens = 64;
      in.zero_options = zero;
      in.lora = lora;
      const MemoryPlan plan = plan_cuda_memory(in);
      EXPECT_EQ(plan_row(plan, "base parameters (bf16, frozen)"), base.parameter_bytes / 2) << where;
      EXPECT_EQ(plan_row(plan, "LoRA adapters + gradients (bf16, replicated)"),
                (m.parameter_bytes + m.gradient_bytes) / 2)
          << where;
      EXPECT_EQ(plan_row(plan, "communication buffers"),
                zero_buffer_sizes(layout, stage, zero, DType::bf16, true).bytes() +
                    (n > 2 && reduce == DType::f32 ? 4 * kTinyRank4Adapters : 0))
          << where;
      EXPECT_EQ(plan_row(plan, "LoRA activations: rank-r intermediates, dropout scratch"), m.activation_bytes / 2)
          << where;
    }
  }
}

}  // namespace
}  // namespace glm::test
