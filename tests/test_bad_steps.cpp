// Surviving a bad step (train/bad_steps.h), under mpirun: a NaN written into one rank's gradient
// skips that step on every rank with the parameters and optimizer state as before it, training
// goes on, a resume through the skipped step is exact, and too many skips in a row stop the run
// with exit code 2, the last checkpoint intact. Plus the spike checks' arithmetic, and a rank slower
// than the others named a straggler in the log (train/run_health.h).
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "mpi/mpi_communicator.h"
#include "test_util.h"
#include "train/bad_steps.h"
#include "train/checkpoint.h"
#include "train/run_health.h"
#include "train/trainer.h"

namespace glm::test {
namespace {

namespace fs = std::filesystem;

// A directory every rank names alike (rank 0 makes it), removed when the test ends.
class SharedDir {
 public:
  SharedDir() {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    char name[256] = {};
    if (rank == 0) {
      std::string pattern = (fs::temp_directory_path() / "glm_bad_steps_XXXXXX").string();
      if (::mkdtemp(pattern.data()) != nullptr) std::snprintf(name, sizeof(name), "%s", pattern.c_str());
    }
    MPI_Bcast(name, sizeof(name), MPI_CHAR, 0, MPI_COMM_WORLD);
    path_ = name;
    rank_ = rank;
  }
  ~SharedDir() {
    MPI_Barrier(MPI_COMM_WORLD);
    std::error_code ignored;
    if (rank_ == 0) fs::remove_all(path_, ignored);
  }
  fs::path operator/(const std::string& child) const { return path_ / child; }

 private:
  fs::path path_;
  int rank_ = 0;
};

TrainConfig tiny(const fs::path& out) {
  TrainConfig t;
  t.model = test::tiny_glm4();
  t.model.intermediate_size = 48;
  EXPECT_TRUE(t.model.finalize_and_validate().is_ok());
  t.max_length = 128;
  t.max_steps = 5;
  t.per_device_train_batch_size = 2;
  t.learning_rate = 3e-3;
  t.log_to_console = false;
  t.output_dir = out.string();
  t.save_steps = 100;  // the last step only
  t.lr_scheduler_type = LrSchedulerType::constant;  // runs of other lengths share their first steps
  return t;
}

const Dataset& data() {
  static ByteTokenizer tokenizer;
  static Dataset d = load_dataset({std::string(GLM_SOURCE_DIR) + "/data/sample/conversations.jsonl"}, &tokenizer,
                                  128, 272, false, Truncation::left)
                         .take();
  return d;
}

Result<TrainSummary> run(const TrainConfig& c) {
  fs::create_directories(c.output_dir);  // as glm_hpc makes it before training
  MPI_Barrier(MPI_COMM_WORLD);
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  auto backend = make_cpu_backend(DType::f32);
  return train(c, data(), comm, *backend);
}

// The logging.jsonl records of skipped steps: step -> reason.
std::map<int64_t, std::string> skips_logged(const fs::path& out) {
  std::map<int64_t, std::string> skips;
  std::ifstream in(out / "logging.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("skipped")) skips[j["step"].get<int64_t>()] = j["skipped"].get<std::string>();
  }
  return skips;
}

struct Path {
  int stage;
  double max_grad_norm;
  double grad_norm_zscore;  // > 0 with max_grad_norm 0: the norm before the update without clipping
};

class NanGradient : public ::testing::TestWithParam<Path> {};

TEST_P(NanGradient, SkipsThatStepOnEveryRankAndTrainingGoesOn) {
  const Path p = GetParam();
  SharedDir dir;
  auto config = [&](const std::string& name, int64_t steps) {
    TrainConfig c = tiny(dir / name);
    c.zero_stage = p.stage;
    c.max_grad_norm = p.max_grad_norm;
    c.bad_steps.grad_norm_zscore = p.grad_norm_zscore;
    c.max_steps = steps;
    return c;
  };
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  // The last rank's gradient gets the NaN at step 3.
  TrainConfig faulty = config("faulty3", 3);
  faulty.gradient_fault = {3, world - 1, 1};
  auto skipped = run(faulty);
  ASSERT_TRUE(skipped.is_ok()) << skipped.status().message();
  EXPECT_EQ(skipped.value().skipped_steps, std::vector<int64_t>{3});
  auto two = run(config("clean2", 2));
  ASSERT_TRUE(two.is_ok()) << two.status().message();
  // Nothing of step 3 applied: bit-identical parameters.
  EXPECT_EQ(skipped.value().parameter_checksum, two.value().parameter_checksum);

  // Training goes on after it, and a resume from the skipped step's checkpoint is exact.
  TrainConfig longer = config("faulty5", 5);
  longer.gradient_fault = {3, world - 1, 1};
  longer.save_steps = 1;
  longer.log_to_console = true;  // rank 0's logging.jsonl
  auto five = run(longer);
  ASSERT_TRUE(five.is_ok()) << five.status().message();
  EXPECT_EQ(five.value().skipped_steps, std::vector<int64_t>{3});
  for (int64_t s : {3, 4}) EXPECT_TRUE(std::isfinite(five.value().losses[static_cast<size_t>(s)])) << s + 1;
  TrainConfig resumed = config("resumed", 5);
  resumed.resume_from_checkpoint = (dir / "faulty5" / "checkpoint-3").string();
  auto again = run(resumed);
  ASSERT_TRUE(again.is_ok()) << again.status().message();
  EXPECT_EQ(again.value().parameter_checksum, five.value().parameter_checksum);

  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    const auto logged = skips_logged(dir / "faulty5");
    ASSERT_EQ(logged.size(), 1u);
    // Rank 0's own norm is finite at ZeRO stage 0 (a replica of its own); it says another rank's was not.
    EXPECT_NE(logged.at(3).find("non-finite"), std::string::npos) << logged.at(3);
    if (p.stage == 0) {
      EXPECT_NE(logged.at(3).find("another rank"), std::string::npos) << logged.at(3);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, NanGradient,
                         ::testing::Values(Path{0, 1.0, 0}, Path{2, 1.0, 0}, Path{3, 0.0, 50.0}));

TEST(BadSteps, TooManyInARowStopTheRunWithTheLastCheckpointIntact) {
  SharedDir dir;
  TrainConfig c = tiny(dir / "stop");
  c.max_steps = 8;
  c.save_steps = 2;
  c.gradient_fault = {3, 0, 3};  // steps 3, 4 and 5 (the optimizer's step 3 each time)
  c.bad_steps.max_consecutive = 3;
  auto r = run(c);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().exit_code(), 2);
  EXPECT_NE(r.status().message().find("3 steps in a row skipped"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("checkpoint-4"), std::string::npos) << r.status().message();
  // checkpoint-4 holds step 4 (skipped, so the weights of step 2); nothing was saved at the stop.
  EXPECT_FALSE(fs::exists(dir / "stop" / "checkpoint-6"));
  TrainConfig resume = tiny(dir / "stop");
  resume.max_steps = 6;
  resume.resume_from_checkpoint = "latest";
  auto resumed = run(resume);
  ASSERT_TRUE(resumed.is_ok()) << resumed.status().message();
  EXPECT_TRUE(resumed.value().skipped_steps.empty());
}

TEST(BadSteps, SpikesAreMeasuredAgainstTheAppliedSteps) {
  BadStepGuard g(BadStepOptions{true, 4.0, 4.0, 3});
  EXPECT_EQ(g.check(2.0, 1.0), "");  // no history yet: nothing is a spike
  for (int i = 0; i < BadStepGuard::kMinHistory; ++i) g.record(2.0 + 0.01 * (i % 3), 1.0 + 0.01 * (i % 2), false);
  EXPECT_EQ(g.check(2.01, 1.005), "");
  EXPECT_NE(g.check(9.0, 1.0).find("loss spike"), std::string::npos);
  EXPECT_NE(g.check(2.0, 30.0).find("gradient norm spike"), std::string::npos);
  EXPECT_NE(g.check(NAN, 1.0).find("non-finite loss"), std::string::npos);
  EXPECT_NE(g.check(2.0, INFINITY).find("non-finite gradient norm"), std::string::npos);
  // Skipped values stay out of the windows; the run of skips is counted and reset by an applied step.
  g.record(9.0, 1.0, true);
  g.record(9.0, 1.0, true);
  EXPECT_EQ(g.consecutive_skips(), 2);
  EXPECT_FALSE(g.over_limit());
  EXPECT_NE(g.check(9.0, 1.0), "");
  g.record(2.0, 1.0, false);
  EXPECT_EQ(g.consecutive_skips(), 0);
  BadStepGuard off(BadStepOptions{false, 0, 0, 0});
  EXPECT_FALSE(off.active());
  EXPECT_EQ(off.check(NAN, NAN), "");
}

// One rank sleeping in every step: each log record names it the slowest, against the median of
// busy times that leave out waiting on collectives, and the third in a row names it a straggler.
TEST(Straggler, ASlowRankIsNamedAfterThreeSlowLogSteps) {
  SharedDir dir;
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  TrainConfig c = tiny(dir / "slow");
  c.max_steps = 5;
  c.logging_steps = 1;
  c.log_to_console = true;
  c.slow_rank = world - 1;
  c.slow_rank_seconds = 0.6;  // far over a step of the tiny model, even on a loaded machine
  auto done = run(c);
  ASSERT_TRUE(done.is_ok()) << done.status().message();
  if (rank != 0) return;
  std::ifstream in(dir / "slow" / "logging.jsonl");
  int records = 0;
  std::vector<int64_t> named;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;
    ++records;
    EXPECT_FALSE(j.contains("gpu_util")) << "no GPU on the CPU backend";
    ASSERT_TRUE(j.contains("slowest_rank")) << line;
    EXPECT_EQ(j["slowest_rank"].get<int>(), world - 1) << line;
    EXPECT_GT(j["slowest_busy_seconds"].get<double>(), 0.5) << line;
    EXPECT_GT(j["slowest_busy_seconds"].get<double>(), 1.1 * j["median_busy_seconds"].get<double>()) << line;
    if (j.contains("straggler")) {
      named.push_back(j["step"].get<int64_t>());
      EXPECT_NE(j["straggler"].get<std::string>().find(concat("rank ", world - 1, " (")), std::string::npos) << line;
    }
  }
  EXPECT_EQ(records, 5);
  EXPECT_EQ(named, std::vector<int64_t>{RunHealth::kStragglerIntervals});
}

}  // namespace
}  // namespace glm::test
