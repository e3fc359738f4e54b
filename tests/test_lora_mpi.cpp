// Under mpirun -np N: LoRA training through train() gives the same loss trajectory at every world
// size and at ZeRO stages 0 and 3 (the frozen base partitioned) as one process, and every rank ends
// with identical adapters; the base's gradient and optimizer memory is zero.
#include <gtest/gtest.h>
#include <mpi.h>

#include "data/dataset.h"
#include "mpi/mpi_communicator.h"
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
  m.vocab_size = 272;
  m.hidden_size = 32;
  m.intermediate_size = 64;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = 8;
  m.max_position_embeddings = 512;
  m.rope_theta = 5e6;
  m.initializer_range = 0.2;  // a random base the adapters can move (the lm_head stays frozen)
  EXPECT_TRUE(m.finalize_and_validate().is_ok());
  t.datasets = {std::string(GLM_SOURCE_DIR) + "/data/sample/conversations.jsonl"};
  t.max_length = 512;
  t.max_steps = kSteps;
  t.learning_rate = 1e-2;
  t.warmup_steps = 1;
  t.weight_decay = 0.1;
  t.log_to_console = false;
  t.save_strategy = "no";
  t.train_type = "lora";
  t.lora.rank = 4;
  t.lora.alpha = 8;
  return t;
}

const Dataset& dataset() {
  static ByteTokenizer tokenizer;
  static Dataset d = load_dataset(lora_config().datasets, &tokenizer, 512, 272).take();
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

TEST(LoraWorld, CheckpointsAreRefusedClearly) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  TrainConfig config = lora_config();
  config.max_steps = 1;
  config.output_dir = "/tmp/glm_lora_refused";
  config.save_strategy = "steps";
  auto backend = make_cpu_backend(DType::f32);
  auto r = train(config, dataset(), comm, *backend);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().kind(), ErrorKind::user_input);
  EXPECT_NE(r.status().message().find("--save_strategy no"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace glm::test
