// Under mpirun -np N: LoRA training through train() gives the same loss trajectory at every world
// size and at ZeRO stages 0 and 3 (the frozen base partitioned) as one process, and every rank ends
// with identical adapters; the base's gradient and optimizer memory is zero. LoRA checkpoints:
// resume is bitwise the straight run (with the default dropout: the masks are keyed on the global
// step), and checkpoints of another LoRA configuration, base or train_type are refused naming the
// field; another --lora_dropout resumes.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "mpi/mpi_communicator.h"
#include "test_util.h"
#include "train/trainer.h"

namespace glm::test {
namespace {

// fp32 sums in another order (per-rank partial gradients all-reduced) move losses by ~1e-7.
constexpr double kTrajectoryTolerance = 1e-5;
constexpr int64_t kGlobalBatch = 12;
constexpr int64_t kSteps = 8;

TrainConfig lora_config() {
  TrainConfig t;
  ModelConfig& m = t.model;
  m = test::tiny_glm4();
  m.initializer_range = 0.2;  // a random base the adapters can move (the lm_head stays frozen)
  EXPECT_TRUE(m.finalize_and_validate().is_ok());
  t.datasets = {std::string(GLM_SOURCE_DIR) + "/data/sample/conversations.jsonl"};
  t.max_length = 256;
  t.max_steps = kSteps;
  t.learning_rate = 1e-2;
  t.warmup_steps = 1;
  t.weight_decay = 0.1;
  t.log_to_console = false;
  t.save_strategy = SaveStrategy::no;
  t.train_type = TrainType::lora;
  t.lora.rank = 4;
  t.lora.alpha = 8;
  return t;
}

// The 200 samples cut to their last 256 tokens (most have ~400): what is checked does not depend on
// length, and the CPU attention's cost grows with its square.
const Dataset& dataset() {
  static ByteTokenizer tokenizer;
  static Dataset d = load_dataset(lora_config().datasets, &tokenizer, 256, 272, false, Truncation::left).take();
  return d;
}

struct Reference {
  std::vector<double> losses = std::vector<double>(kSteps, 0.0);
  double checksum = 0;
};

const Reference& reference() {
  static Reference ref = [] {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    Reference r;
    if (rank == 0) {
      TrainConfig single = lora_config();
      single.gradient_accumulation_steps = kGlobalBatch;
      single.lora.dropout = 0;  // as LoraWorld
      MpiCommunicator self(MPI_COMM_SELF, std::chrono::seconds(120));
      auto backend = make_cpu_backend(DType::f32);
      auto s = train(single, dataset(), self, *backend);
      EXPECT_TRUE(s.is_ok()) << s.status().message();
      if (s.is_ok()) {
        r.losses = s.value().losses;
        r.checksum = s.value().parameter_checksum;
      }
    }
    MPI_Bcast(r.losses.data(), kSteps, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Bcast(&r.checksum, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return r;
  }();
  return ref;
}

class LoraWorld : public ::testing::TestWithParam<std::tuple<int, Recompute>> {};

TEST_P(LoraWorld, SameTrajectoryAsOneProcess) {
  const auto [stage, recompute] = GetParam();
  const Reference& ref = reference();
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  if (kGlobalBatch % comm.size() != 0) GTEST_SKIP() << "12 samples do not split over " << comm.size() << " ranks";
  TrainConfig config = lora_config();
  config.zero_stage = stage;
  config.recompute = recompute;
  config.per_device_train_batch_size = kGlobalBatch / comm.size();
  // Dropout masks are keyed by (step, micro-batch, rank): another split of the global batch draws
  // other masks, so world-size invariance holds without dropout only.
  config.lora.dropout = 0;
  auto backend = make_cpu_backend(DType::f32);
  auto r = train(config, dataset(), comm, *backend);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  ASSERT_EQ(r.value().losses.size(), static_cast<size_t>(kSteps));
  for (size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_NEAR(r.value().losses[i], ref.losses[i], kTrajectoryTolerance * ref.losses[i])
        << "stage " << stage << " step " << i + 1 << " world " << comm.size();
  EXPECT_NEAR(r.value().parameter_checksum, ref.checksum, kTrajectoryTolerance * ref.checksum);
  // Replicated adapters: every rank ends with bit-identical parameters.
  double mine = r.value().parameter_checksum, lo = 0, hi = 0;
  MPI_Allreduce(&mine, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&mine, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(lo, hi);
  EXPECT_LT(r.value().losses.back(), r.value().losses.front() - 0.3) << "the adapters learn";
}

INSTANTIATE_TEST_SUITE_P(Stages, LoraWorld,
                         ::testing::Values(std::tuple{0, Recompute::none}, std::tuple{3, Recompute::none},
                                           std::tuple{3, Recompute::full}));

// A directory every rank agrees on (rank 0's pid), fresh.
std::string shared_dir(const std::string& name) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  long pid = rank == 0 ? static_cast<long>(::getpid()) : 0;
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("glm_lora_ckpt_" + std::to_string(pid) + "_np" + std::to_string(size)) / name;
  if (rank == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return dir.string();
}

Result<TrainSummary> run(TrainConfig config, Communicator& comm) {
  auto backend = make_cpu_backend(DType::f32);
  return train(config, dataset(), comm, *backend);
}

// 6 LoRA steps at ZeRO stage `stage` saving at step 3, into dir; returns the straight run.
TrainSummary straight_with_checkpoint(const std::string& dir, int stage, Communicator& comm) {
  TrainConfig config = lora_config();
  config.zero_stage = stage;
  config.max_steps = 6;
  config.per_device_train_batch_size = kGlobalBatch / comm.size();
  config.output_dir = dir;
  config.save_strategy = SaveStrategy::steps;
  config.save_steps = 3;
  auto r = run(config, comm);
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return r.is_ok() ? r.take() : TrainSummary{};
}

class LoraResume : public ::testing::TestWithParam<int> {};

// 6 steps straight == 3 steps, save, resume, 3 steps: bitwise on the CPU (adapters, Adam moments,
// step count, schedule and data position restored; the base re-initialised from its seed).
TEST_P(LoraResume, ResumedRunEqualsTheStraightOneBitwise) {
  const int stage = GetParam();
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  if (kGlobalBatch % comm.size() != 0) GTEST_SKIP() << "12 samples do not split over " << comm.size() << " ranks";
  const std::string dir = shared_dir("stage" + std::to_string(stage));
  const TrainSummary straight = straight_with_checkpoint(dir, stage, comm);
  ASSERT_EQ(straight.losses.size(), 6u);
  const std::filesystem::path ckpt = std::filesystem::path(dir) / "checkpoint-3";
  // Only what is trained: the adapters' state in one file, no rank files of the base.
  EXPECT_TRUE(std::filesystem::exists(ckpt / "adapters.h5"));
  EXPECT_TRUE(std::filesystem::exists(ckpt / "COMPLETE"));
  EXPECT_FALSE(std::filesystem::exists(ckpt / "rank_00000.h5"));
  std::ifstream in(ckpt / "meta.json");
  const nlohmann::json meta = nlohmann::json::parse(in, nullptr, false);
  ASSERT_TRUE(meta.is_object());
  EXPECT_EQ(meta["train_type"], "lora");
  EXPECT_EQ(meta["lora"]["rank"], 4);
  EXPECT_EQ(meta["lora"]["alpha"], 8.0);
  EXPECT_EQ(meta["lora"]["dropout"], 0.05) << "the default, under which this test runs";
  EXPECT_EQ(meta["lora"]["targets"].size(), 4u);
  EXPECT_EQ(meta["base"]["random_init_seed"], lora_config().seed);
  EXPECT_GT(meta["base"]["sum_squares"].get<double>(), 0.0);

  for (const std::string& spec : {ckpt.string(), std::string("latest")}) {
    TrainConfig config = lora_config();
    config.zero_stage = stage;
    config.max_steps = spec == "latest" ? 9 : 6;  // latest is checkpoint-6: 3 more steps of a 9-step run
    config.per_device_train_batch_size = kGlobalBatch / comm.size();
    config.output_dir = dir;
    config.save_strategy = SaveStrategy::no;
    config.resume_from_checkpoint = spec;
    auto resumed = run(config, comm);
    ASSERT_TRUE(resumed.is_ok()) << resumed.status().message();
    ASSERT_EQ(resumed.value().losses.size(), 3u);
    if (spec == "latest") continue;  // another schedule length: nothing to compare with
    for (size_t i = 0; i < 3; ++i)
      EXPECT_EQ(resumed.value().losses[i], straight.losses[3 + i]) << "step " << 4 + i << " stage " << stage;
    EXPECT_EQ(resumed.value().parameter_checksum, straight.parameter_checksum);
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, LoraResume, ::testing::Values(0, 3));

// Resuming must fail before training, alike on every rank, with a message containing `needle`.
void expect_refused(const std::string& checkpoint, const std::string& needle,
                    const std::function<void(TrainConfig&)>& change) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  TrainConfig config = lora_config();
  config.max_steps = 6;
  config.per_device_train_batch_size = kGlobalBatch / comm.size();
  config.save_strategy = SaveStrategy::no;
  config.resume_from_checkpoint = checkpoint;
  change(config);
  auto r = run(config, comm);
  ASSERT_FALSE(r.is_ok()) << "expected: " << needle;
  EXPECT_EQ(r.status().kind(), ErrorKind::user_input) << r.status().message();
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
}

TEST(LoraCheckpoint, AnotherLoraConfigurationOrBaseIsRefused) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  if (kGlobalBatch % comm.size() != 0) GTEST_SKIP();
  const std::string dir = shared_dir("mismatch");
  straight_with_checkpoint(dir, 0, comm);
  const std::string ckpt = dir + "/checkpoint-3";
  expect_refused(ckpt, "lora.rank is 4, this run's (--lora_rank) is 8", [](TrainConfig& c) { c.lora.rank = 8; });
  expect_refused(ckpt, "lora.alpha", [](TrainConfig& c) { c.lora.alpha = 16; });
  expect_refused(ckpt, "lora.targets", [](TrainConfig& c) { c.lora.targets = {LoraTarget::dense}; });
  // The order of --target_modules does not matter.
  {
    TrainConfig c = lora_config();
    c.max_steps = 6;
    c.per_device_train_batch_size = kGlobalBatch / comm.size();
    c.save_strategy = SaveStrategy::no;
    c.resume_from_checkpoint = ckpt;
    c.lora.targets = {LoraTarget::dense_4h_to_h, LoraTarget::dense, LoraTarget::query_key_value,
                      LoraTarget::dense_h_to_4h};
    auto r = run(c, comm);
    EXPECT_TRUE(r.is_ok()) << r.status().message();
  }
  // Another --lora_dropout resumes (as in HF/ms-swift): it changes no adapter shape or value.
  {
    TrainConfig c = lora_config();
    c.max_steps = 6;
    c.per_device_train_batch_size = kGlobalBatch / comm.size();
    c.save_strategy = SaveStrategy::no;
    c.resume_from_checkpoint = ckpt;
    c.lora.dropout = 0.1;
    auto r = run(c, comm);
    EXPECT_TRUE(r.is_ok()) << r.status().message();
  }
  // Another random base (the seed) and another base of the same seed (its weights' fingerprint).
  expect_refused(ckpt, "random init with seed", [](TrainConfig& c) { c.seed = 7; });
  expect_refused(ckpt, "base.sum_squares", [](TrainConfig& c) { c.model.initializer_range = 0.1; });
  expect_refused(ckpt, "--model_id_or_path", [](TrainConfig& c) { c.base_model = "/models/glm-4-9b-chat"; });
  // A LoRA checkpoint given to full training.
  expect_refused(ckpt, "train_type is lora, this run's --train_type is full",
                 [](TrainConfig& c) { c.train_type = TrainType::full; });
  // Another model shape.
  expect_refused(ckpt, "hidden_size", [](TrainConfig& c) {
    c.model.hidden_size = 64;
    c.model.num_attention_heads = 8;
    ASSERT_TRUE(c.model.finalize_and_validate().is_ok());
  });
}

TEST(LoraCheckpoint, FullTrainingCheckpointIsRefused) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  if (kGlobalBatch % comm.size() != 0) GTEST_SKIP();
  const std::string dir = shared_dir("full");
  TrainConfig full = lora_config();
  full.train_type = TrainType::full;
  full.max_steps = 1;
  full.per_device_train_batch_size = kGlobalBatch / comm.size();
  full.output_dir = dir;
  full.save_strategy = SaveStrategy::steps;
  full.save_steps = 1;
  auto r = run(full, comm);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  expect_refused(dir + "/checkpoint-1", "train_type is full, this run's --train_type is lora", [](TrainConfig&) {});
}

}  // namespace
}  // namespace glm::test
