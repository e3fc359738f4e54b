// Under mpirun -np N (2-4): training with --context_parallel_size C (every C consecutive ranks
// sharing each row, the data spread over N / C data-parallel ranks) follows the same loss and
// gradient-norm trajectory as one process with the same global batch (relative difference < 1e-5,
// fp32 sums in another order), at ZeRO 0 and 3, packed and unpacked, full and LoRA, and its
// evaluation gives the same loss; a checkpoint saved at C resumes without it and at another C.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "data/dataset.h"
#include "data/tokenizer.h"
#include "mpi/mpi_communicator.h"
#include "test_util.h"
#include "train/trainer.h"

namespace glm::test {
namespace {

constexpr double kTolerance = 1e-5;
constexpr int64_t kGlobalBatch = 12;
constexpr int kSteps = 4;

TrainConfig base_config() {
  TrainConfig t;
  t.model = test::tiny_glm4();
  EXPECT_TRUE(t.model.finalize_and_validate().is_ok());
  t.max_length = 128;
  t.max_steps = kSteps;
  t.learning_rate = 5e-3;
  t.warmup_steps = 1;
  t.weight_decay = 0.1;
  t.log_to_console = false;
  t.per_device_eval_batch_size = 3;
  return t;
}

// The sample conversations cut to their last 128 tokens: rows of several documents whose lengths
// split unevenly over the chunks (padding included).
const Dataset& dataset() {
  static ByteTokenizer tokenizer;
  static Dataset d = load_dataset({std::string(GLM_SOURCE_DIR) + "/data/sample/conversations.jsonl"}, &tokenizer, 128,
                                  272, false, Truncation::left)
                         .take();
  return d;
}

const Dataset& validation() {
  static Dataset v = [] {
    Dataset train = dataset(), held;
    EXPECT_TRUE(split_dataset(train, 0.05, 3, held).is_ok());
    return held;
  }();
  return v;
}

struct Case {
  int context = 2;
  int stage = 0;
  bool packing = false;
  bool lora = false;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return concat("cp", c.context, "_stage", c.stage, c.packing ? "_packed" : "", c.lora ? "_lora" : "");
}

TrainConfig case_config(const Case& c) {
  TrainConfig t = base_config();
  t.zero_stage = c.stage;
  t.packing = c.packing;
  if (c.lora) {
    t.train_type = TrainType::lora;
    t.lora.dropout = 0.0;  // dropout masks are drawn per rank's tokens: exactness needs none
  }
  return t;
}

void expect_same_trajectory(const TrainSummary& got, const TrainSummary& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], kTolerance * want.losses[i]) << what << " step " << i + 1;
    EXPECT_NEAR(got.grad_norms[i], want.grad_norms[i], kTolerance * want.grad_norms[i]) << what << " step " << i + 1;
  }
  ASSERT_EQ(got.eval_losses.size(), want.eval_losses.size()) << what;
  for (size_t i = 0; i < want.eval_losses.size(); ++i)
    EXPECT_NEAR(got.eval_losses[i].second, want.eval_losses[i].second, kTolerance * want.eval_losses[i].second)
        << what << " evaluation " << i;
}

class ContextParallel : public ::testing::TestWithParam<Case> {};

TEST_P(ContextParallel, SameTrajectoryAsOneProcess) {
  const Case& c = GetParam();
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  if (comm.size() % c.context != 0)
    GTEST_SKIP() << "--context_parallel_size " << c.context << " does not divide " << comm.size() << " ranks";
  const int data_ranks = comm.size() / c.context;
  if (kGlobalBatch % data_ranks != 0) GTEST_SKIP();
  TrainConfig t = case_config(c);
  t.context_parallel_size = c.context;
  t.per_device_train_batch_size = kGlobalBatch / data_ranks;  // every rank's share of a row in one micro-batch
  t.eval_steps = kSteps;
  auto backend = make_cpu_backend(DType::f32);
  auto r = train(t, dataset(), comm, *backend, {}, &validation());
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  if (comm.rank() == 0) {  // one process, the global batch accumulated one unit per micro-batch
    const TrainSummary want = [&] {
      TrainConfig one = case_config(c);
      one.gradient_accumulation_steps = kGlobalBatch;
      one.eval_steps = kSteps;
      MpiCommunicator self(MPI_COMM_SELF, std::chrono::seconds(120));
      auto b = make_cpu_backend(DType::f32);
      auto s = train(one, dataset(), self, *b, {}, &validation());
      EXPECT_TRUE(s.is_ok()) << s.status().message();
      return s.is_ok() ? s.take() : TrainSummary{};
    }();
    expect_same_trajectory(r.value(), want, case_name({c, 0}));
    EXPECT_LT(r.value().losses.back(), r.value().losses.front()) << "it trains";
  }
  // Every rank holds the same parameters at the end.
  double checksum = r.value().parameter_checksum, low = checksum, high = checksum;
  MPI_Allreduce(MPI_IN_PLACE, &low, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &high, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(low, high);
}

INSTANTIATE_TEST_SUITE_P(Groups, ContextParallel,
                         ::testing::Values(Case{2, 0}, Case{2, 3}, Case{2, 0, true}, Case{2, 3, false, true},
                                           Case{3, 0}, Case{3, 3}, Case{4, 0}, Case{4, 3, true}),
                         case_name);

// A checkpoint saved with groups of 2 resumes with groups of 4 and without context parallelism (4
// data-parallel ranks): the same following losses, the data continuing at the same sample.
TEST(ContextParallelCheckpoint, ResumesAtAnotherGroupSize) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  if (comm.size() != 4) GTEST_SKIP() << "groups of 1, 2 and 4 need 4 ranks";
  int tag = static_cast<int>(::getpid());
  MPI_Bcast(&tag, 1, MPI_INT, 0, MPI_COMM_WORLD);  // one directory for every rank of this job
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("glm_context_ckpt_" + std::to_string(tag))).string();
  auto run = [&](int context, const std::string& out, const std::string& resume) {
    TrainConfig t = base_config();
    t.context_parallel_size = context;
    t.per_device_train_batch_size = kGlobalBatch / (comm.size() / context);
    t.zero_stage = 3;
    t.output_dir = out;
    t.save_steps = kSteps / 2;
    t.resume_from_checkpoint = resume;
    auto backend = make_cpu_backend(DType::f32);
    return train(t, dataset(), comm, *backend);
  };
  auto straight = run(2, dir, "");
  ASSERT_TRUE(straight.is_ok()) << straight.status().message();
  ASSERT_EQ(straight.value().losses.size(), static_cast<size_t>(kSteps));
  const std::string checkpoint = dir + "/checkpoint-" + std::to_string(kSteps / 2);
  for (int context : {4, 1}) {
    auto resumed = run(context, dir + "/cp" + std::to_string(context), checkpoint);
    ASSERT_TRUE(resumed.is_ok()) << resumed.status().message();
    ASSERT_EQ(resumed.value().losses.size(), static_cast<size_t>(kSteps / 2));
    for (size_t i = 0; i < resumed.value().losses.size(); ++i) {
      const double want = straight.value().losses[kSteps / 2 + i];
      EXPECT_NEAR(resumed.value().losses[i], want, kTolerance * want) << "context " << context << " step " << i;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (comm.rank() == 0) std::filesystem::remove_all(dir);
}

// A row that cannot go to the group's ranks is refused with the rule, not a hang.
TEST(ContextParallelOptions, SizeMustDivideTheWorld) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  TrainConfig t = base_config();
  t.context_parallel_size = comm.size() + 1;
  auto backend = make_cpu_backend(DType::f32);
  auto r = train(t, dataset(), comm, *backend, {}, nullptr);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().exit_code(), 2);
  EXPECT_NE(r.status().message().find("--context_parallel_size " + std::to_string(comm.size() + 1) +
                                      " must divide the world size " + std::to_string(comm.size())),
            std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace glm::test
