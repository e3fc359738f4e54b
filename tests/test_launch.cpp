// Cluster launch under mpirun -np N: the local rank comes from MPI (not from launcher variables),
// more ranks on a host than GPUs is a user error, and preemption: a signal on one rank stops every
// rank after the same step with a checkpoint, and resuming from latest continues bit for bit.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "data/dataset.h"
#include "mpi/mpi_communicator.h"
#include "mpi/runtime.h"
#include "test_util.h"
#include "train/engine.h"
#include "train/preemption.h"
#include "train/trainer.h"

namespace glm::test {
namespace {

TEST(ProcessInfo, LocalRankComesFromMpiNotLauncherVariables) {
  // What mpirun, srun and torchrun set: glm_hpc must not need any of them.
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_LOCALID",
                           "SLURM_NTASKS_PER_NODE", "LOCAL_RANK", "MPI_LOCALRANKID", "PMI_RANK"})
    ASSERT_EQ(::unsetenv(name), 0);
  auto found = discover_process_info(MPI_COMM_WORLD);
  ASSERT_TRUE(found.is_ok()) << found.status().message();
  const ProcessInfo& info = found.value();
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(info.rank, rank);
  EXPECT_EQ(info.world_size, size);
  // One host here: every rank is local, in rank order.
  EXPECT_EQ(info.local_size, size);
  EXPECT_EQ(info.local_rank, rank);
  char host[256] = {0};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  EXPECT_EQ(info.host, host);
  // Local ranks 0..n-1 each once: their sum over the ranks is n(n-1)/2.
  int sum = 0;
  MPI_Allreduce(&info.local_rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(sum, size * (size - 1) / 2);
}

TEST(ProcessInfo, MoreRanksThanGpusOnAHostIsAUserError) {
  ProcessInfo info;
  info.host = "node7";
  info.local_size = 4;
  EXPECT_TRUE(check_one_rank_per_gpu(info, 4).is_ok());
  EXPECT_TRUE(check_one_rank_per_gpu(info, 8).is_ok());
  EXPECT_TRUE(check_one_rank_per_gpu(info, 0).is_ok()) << "no GPU: the CPU backend, any rank count";
  const Status s = check_one_rank_per_gpu(info, 2);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.exit_code(), 2);
  EXPECT_NE(s.message().find("4 ranks on host node7 but 2 visible GPU(s)"), std::string::npos) << s.message();
}

TrainConfig tiny_config() {
  TrainConfig t;
  ModelConfig& m = t.model;
  m = test::tiny_glm4();
  EXPECT_TRUE(m.finalize_and_validate().is_ok());
  t.max_length = 512;
  t.max_steps = 6;
  t.per_device_train_batch_size = 2;
  t.learning_rate = 5e-3;
  t.warmup_steps = 1;
  t.log_to_console = false;
  t.save_steps = 4;
  return t;
}

const Dataset& dataset() {
  static ByteTokenizer tokenizer;
  static Dataset d =
      load_dataset({std::string(GLM_SOURCE_DIR) + "/data/sample/conversations.jsonl"}, &tokenizer, 512, 272).take();
  return d;
}

// One directory for every rank of this job.
std::string shared_directory(const char* name) {
  int tag = static_cast<int>(::getpid());
  MPI_Bcast(&tag, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return (std::filesystem::temp_directory_path() / (std::string(name) + std::to_string(tag))).string();
}

TEST(Preemption, EveryRankAgreesOnTheSignalOfOne) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(60));
  ASSERT_TRUE(install_stop_handlers().is_ok());
  clear_stop_signal();
  auto none = agree_on_preemption(comm);
  ASSERT_TRUE(none.is_ok()) << none.status().message();
  EXPECT_EQ(none.value(), 0);
  // SIGTERM (what scancel and the time limit send) on the last rank only.
  if (comm.rank() == comm.size() - 1) {
    ASSERT_EQ(std::raise(SIGTERM), 0);
  }
  EXPECT_EQ(stop_signal(), comm.rank() == comm.size() - 1 ? SIGTERM : 0);
  auto agreed = agree_on_preemption(comm);
  ASSERT_TRUE(agreed.is_ok()) << agreed.status().message();
  EXPECT_EQ(agreed.value(), SIGTERM);
  EXPECT_EQ(signal_name(agreed.value()), "SIGTERM");
  clear_stop_signal();
  EXPECT_EQ(stop_signal(), 0);
}

// SIGUSR1 on the last rank before training (as when it arrives during start-up): every rank stops
// after step 1 with checkpoint-1 (not a save step) and latest; resuming from latest gives steps
// 2-6 bit for bit as a run that was never stopped.
TEST(Preemption, StopsEveryRankAtOneStepWithACheckpointAndResumes) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  const std::string dir = shared_directory("glm_preemption_");
  ASSERT_TRUE(install_stop_handlers().is_ok());
  clear_stop_signal();

  TrainConfig straight_config = tiny_config();
  auto backend = make_cpu_backend(DType::f32);
  auto straight = train(straight_config, dataset(), comm, *backend);
  ASSERT_TRUE(straight.is_ok()) << straight.status().message();
  ASSERT_EQ(straight.value().losses.size(), 6u);
  EXPECT_EQ(straight.value().preempted_by, 0);

  TrainConfig c = tiny_config();
  c.output_dir = dir;
  if (comm.rank() == comm.size() - 1) {
    ASSERT_EQ(std::raise(SIGUSR1), 0);
  }
  auto stopped = train(c, dataset(), comm, *make_cpu_backend(DType::f32));
  ASSERT_TRUE(stopped.is_ok()) << stopped.status().message();
  EXPECT_EQ(stopped.value().preempted_by, SIGUSR1);
  EXPECT_EQ(stopped.value().steps, 1);
  EXPECT_EQ(stopped.value().losses[0], straight.value().losses[0]);
  EXPECT_TRUE(std::filesystem::exists(dir + "/checkpoint-1/COMPLETE"));
  std::ifstream latest(dir + "/latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "checkpoint-1");
  clear_stop_signal();

  c.resume_from_checkpoint = "latest";
  auto resumed = train(c, dataset(), comm, *make_cpu_backend(DType::f32));
  ASSERT_TRUE(resumed.is_ok()) << resumed.status().message();
  EXPECT_EQ(resumed.value().preempted_by, 0);
  ASSERT_EQ(resumed.value().losses.size(), 5u);
  for (size_t i = 0; i < 5; ++i)
    EXPECT_EQ(resumed.value().losses[i], straight.value().losses[1 + i]) << "step " << 2 + i;
  EXPECT_EQ(resumed.value().parameter_checksum, straight.value().parameter_checksum);
  MPI_Barrier(MPI_COMM_WORLD);
  if (comm.rank() == 0) std::filesystem::remove_all(dir);
}

// A stop asked of one rank during evaluation: every rank leaves at the same batch with a stopped
// status (none waits in a collective for a peer that left), exit code 75.
TEST(Preemption, EvaluationStopsOnEveryRankAlike) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(60));
  clear_stop_signal();
  Dataset few;
  few.samples.assign(dataset().samples.begin(), dataset().samples.begin() + 12);
  few.report = dataset().report;
  auto backend = make_cpu_backend(DType::f32);
  auto engine = TrainingEngine::create(
      {.model = tiny_config().model, .max_tokens = 2 * few.report.max_tokens, .max_grad_norm = 0.0}, *backend, comm);
  ASSERT_TRUE(engine.is_ok()) << engine.status().message();
  ASSERT_TRUE(engine.value()->initialize_parameters(3).is_ok());
  auto whole = evaluate_dataset(*engine.value(), few, 2, comm);
  ASSERT_TRUE(whole.is_ok()) << whole.status().message();
  EXPECT_GT(whole.value().targets, 0);
  if (comm.rank() == comm.size() - 1) request_stop(SIGTERM);
  auto stopped = evaluate_dataset(*engine.value(), few, 2, comm);
  clear_stop_signal();
  ASSERT_FALSE(stopped.is_ok());
  EXPECT_EQ(stopped.status().kind(), ErrorKind::stopped);
  EXPECT_EQ(stopped.status().exit_code(), kPreemptedExitCode);
  EXPECT_NE(stopped.status().message().find("stopped by SIGTERM during evaluation, after 0 of 12 samples"), std::string::npos)
      << stopped.status().message();
}

// The agreement before exiting: a stop alone exits 75 on every rank; a real failure on any rank wins.
TEST(Preemption, AStopExitsWithItsCodeUnlessARankFailed) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const Status stop = Status::error(ErrorKind::stopped, "stopped by SIGTERM while tokenizing");
  AgreedStatus alone = agree_on_status(rank == size - 1 ? stop : Status::ok(), MPI_COMM_WORLD);
  EXPECT_EQ(alone.status.kind(), ErrorKind::stopped);
  EXPECT_EQ(alone.status.exit_code(), 75);
  EXPECT_EQ(alone.report_here, rank == size - 1);
  const Status bad = GLM_USER_ERROR("bad input");
  AgreedStatus mixed = agree_on_status(rank == 0 ? bad : stop, MPI_COMM_WORLD);
  EXPECT_EQ(mixed.status.exit_code(), 2);
}

}  // namespace
}  // namespace glm::test
