// Under mpirun -np N (1-4): --offload_optimizer cpu changes where the optimizer state lives and who
// updates it, and --offload_param cpu where ZeRO-3's parameter shards live, never what is computed. At ZeRO stages 1-3 an offloaded run gives the losses, gradient
// norms, evaluation and final parameters of the same run on the backend bit for bit (the CPU
// backend's rounding, kernels/cpu/adamw_element.h), also without clipping (the update sums the
// norm); its state is host memory of the sizes the shards say; and a checkpoint of either resumes
// in the other with the uninterrupted run's bits.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "mpi/mpi_communicator.h"
#include "test_util.h"
#include "train/engine.h"
#include "train/trainer.h"
#include "zero/zero_options.h"

namespace glm::test {
namespace {

constexpr int64_t kGlobalBatch = 12;
constexpr int kSteps = 6;

TrainConfig offload_config(int world, int stage) {
  TrainConfig t;
  t.model = tiny_glm4();
  EXPECT_TRUE(t.model.finalize_and_validate().is_ok());
  t.datasets = {std::string(GLM_SOURCE_DIR) + "/data/sample/conversations.jsonl"};
  t.max_length = 128;
  t.max_steps = kSteps;
  t.learning_rate = 5e-3;
  t.warmup_steps = 2;
  t.weight_decay = 0.1;
  t.log_to_console = false;
  t.per_device_train_batch_size = kGlobalBatch / world;
  t.zero_stage = stage;
  t.eval_steps = kSteps / 2;
  t.per_device_eval_batch_size = 2;
  return t;
}

TrainConfig offloaded(TrainConfig t, int threads) {
  t.offload_optimizer = OffloadDevice::cpu;
  t.offload_threads = threads;
  return t;
}

// A directory under the temp root named after rank 0's pid: the same on every rank of this job.
std::string job_temp_dir(const std::string& prefix) {
  int tag = static_cast<int>(::getpid());
  MPI_Bcast(&tag, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return (std::filesystem::temp_directory_path() / (prefix + std::to_string(tag))).string();
}

// The tiny model's engine at a ZeRO stage, AdamW with weight decay 0.1.
EngineConfig tiny_engine(int64_t max_tokens, int stage) {
  EngineConfig ec;
  ec.model = tiny_glm4();
  EXPECT_TRUE(ec.model.finalize_and_validate().is_ok());
  ec.max_tokens = max_tokens;
  ec.adam = AdamWOptions{0.9, 0.999, 1e-8, 0.1};
  ec.zero_stage = stage;
  return ec;
}

const Dataset& dataset() {
  static ByteTokenizer tokenizer;
  static Dataset d =
      load_dataset(offload_config(1, 1).datasets, &tokenizer, 128, 272, false, Truncation::left).take();
  return d;
}

const Dataset& validation() {
  static Dataset v = [] {
    Dataset train = dataset(), held;
    EXPECT_TRUE(split_dataset(train, 0.03, 3, held).is_ok());
    return held;
  }();
  return v;
}

Result<TrainSummary> run(const TrainConfig& c, Communicator& comm) {
  auto backend = make_cpu_backend(DType::f32);
  return train(c, dataset(), comm, *backend, {}, &validation());
}

void expect_same_run(const TrainSummary& got, const TrainSummary& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_EQ(got.losses[i], want.losses[i]) << what << ", step " << i + 1;
    EXPECT_EQ(got.grad_norms[i], want.grad_norms[i]) << what << ", step " << i + 1;
  }
  ASSERT_EQ(got.eval_losses.size(), want.eval_losses.size()) << what;
  for (size_t i = 0; i < want.eval_losses.size(); ++i)
    EXPECT_EQ(got.eval_losses[i].second, want.eval_losses[i].second) << what << ", evaluation " << i;
  EXPECT_EQ(got.parameter_checksum, want.parameter_checksum) << what;
}

class Offload : public ::testing::TestWithParam<int> {};

TEST_P(Offload, SameBitsAsTheBackendsOwnUpdate) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  const int stage = GetParam(), size = comm.size();
  if (kGlobalBatch % size != 0) GTEST_SKIP() << "12 samples do not split over " << size << " ranks";
  const TrainConfig base = offload_config(size, stage);
  auto device = run(base, comm);
  ASSERT_TRUE(device.is_ok()) << device.status().message();
  for (int threads : {1, 3}) {
    auto host = run(offloaded(base, threads), comm);
    ASSERT_TRUE(host.is_ok()) << host.status().message();
    expect_same_run(host.value(), device.value(), "stage " + std::to_string(stage) + ", " + std::to_string(threads) +
                                                      " threads");
  }
}

// Without clipping the norm is summed by the update itself: on the host, per chunk, then added to
// the backend's accumulator. The run is the same; the norm is the same sum in another order.
TEST_P(Offload, FusedNormWithoutClipping) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  const int stage = GetParam(), size = comm.size();
  if (kGlobalBatch % size != 0) GTEST_SKIP() << "12 samples do not split over " << size << " ranks";
  TrainConfig base = offload_config(size, stage);
  base.max_grad_norm = 0;
  base.max_steps = 3;
  base.eval_steps = 0;
  auto device = run(base, comm);
  auto host = run(offloaded(base, 2), comm);
  ASSERT_TRUE(device.is_ok()) << device.status().message();
  ASSERT_TRUE(host.is_ok()) << host.status().message();
  ASSERT_EQ(host.value().losses.size(), device.value().losses.size());
  for (size_t i = 0; i < device.value().losses.size(); ++i) {
    EXPECT_EQ(host.value().losses[i], device.value().losses[i]) << "step " << i + 1;
    EXPECT_NEAR(host.value().grad_norms[i], device.value().grad_norms[i], 1e-12 * device.value().grad_norms[i]);
  }
  EXPECT_EQ(host.value().parameter_checksum, device.value().parameter_checksum);
}

// ZeRO-3's parameter shards in host memory: the host update writes them in place and each gather
// uploads this rank's shard first; losses, norms, evaluation and parameters are the bits of the run
// with the shards on the backend, with and without persistent tensors (kept on the backend).
TEST(OffloadParams, SameBitsAsShardsOnTheBackend) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  const int size = comm.size();
  if (kGlobalBatch % size != 0) GTEST_SKIP() << "12 samples do not split over " << size << " ranks";
  for (const int64_t persistence : {int64_t{0}, int64_t{2000}}) {
    TrainConfig base = offloaded(offload_config(size, 3), 2);
    base.zero_options.param_persistence_threshold = persistence;
    auto shards_on_backend = run(base, comm);
    ASSERT_TRUE(shards_on_backend.is_ok()) << shards_on_backend.status().message();
    // Every unit's shard on the host, and (--offload_param_ratio) some of them.
    for (const double ratio : {1.0, 0.4}) {
      TrainConfig params = base;
      params.offload_param = OffloadDevice::cpu;
      params.zero_options.offload_param_ratio = ratio;
      auto shards_on_host = run(params, comm);
      ASSERT_TRUE(shards_on_host.is_ok()) << shards_on_host.status().message();
      expect_same_run(shards_on_host.value(), shards_on_backend.value(),
                      "persistence threshold " + std::to_string(persistence) + ", ratio " + std::to_string(ratio));
    }
  }
}

// --offload_param_ratio: the offloaded units hold the ratio's share of the shards to within half
// the largest unit, interleaved with the resident ones (so at every prefix); never the persistent
// unit.
TEST(OffloadParams, RatioPicksAnEvenlySpreadShare) {
  ModelConfig c = tiny_glm4();
  c.num_hidden_layers = 8;
  ASSERT_TRUE(c.finalize_and_validate().is_ok());
  for (const int64_t persistence : {int64_t{0}, int64_t{2000}}) {
    const ParamLayout layout(c, 3, PersistencePolicy{persistence});
    int64_t total = 0, largest = 0;
    for (int u = 0; u < static_cast<int>(layout.units().size()); ++u) {
      if (u == layout.persistent_unit()) continue;
      total += layout.shard_numel(u);
      largest = std::max(largest, layout.shard_numel(u));
    }
    for (const double ratio : {1.0, 0.75, 0.5, 0.3, 0.05}) {
      const std::vector<bool> host = offloaded_param_units(layout, ratio);
      ASSERT_EQ(host.size(), layout.units().size());
      int64_t offloaded = 0;
      for (size_t u = 0; u < host.size(); ++u) {
        if (!host[u]) continue;
        EXPECT_NE(static_cast<int>(u), layout.persistent_unit());
        offloaded += layout.shard_numel(static_cast<int>(u));
      }
      const std::string what = "ratio " + std::to_string(ratio) + ", persistence " + std::to_string(persistence);
      EXPECT_LE(std::abs(static_cast<double>(offloaded) - ratio * static_cast<double>(total)), 0.5 * largest) << what;
      if (ratio == 1.0) {
        EXPECT_EQ(offloaded, total) << what;
      }
      // Interleaved: every prefix of the units in forward order holds the ratio's share of its
      // elements on the host to within half the largest unit.
      int64_t seen = 0, on_host = 0;
      for (size_t u = 0; u < host.size(); ++u) {
        if (static_cast<int>(u) == layout.persistent_unit()) continue;
        seen += layout.shard_numel(static_cast<int>(u));
        on_host += host[u] ? layout.shard_numel(static_cast<int>(u)) : 0;
        EXPECT_LE(std::abs(static_cast<double>(on_host) - ratio * static_cast<double>(seen)), 0.5 * largest)
            << what << ", units 0-" << u;
      }
    }
  }
}

// The shards are host memory (none of them in backend memory but the persistent tensors), their
// initialisation and writes from outside (import) land there, and parameter offload is refused
// below ZeRO-3 and without the optimizer offloaded.
TEST(OffloadParams, ShardsAreHostMemoryAndWritesReachThem) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  auto backend = make_cpu_backend(DType::f32);
  EngineConfig ec = tiny_engine(256, 3);
  ec.zero.param_persistence_threshold = 2000;
  ec.offload = OffloadConfig{true, true, 2};
  auto device = TrainingEngine::create(ec, *backend, comm);
  ec.zero.offload_params = true;
  auto host = TrainingEngine::create(ec, *backend, comm);
  ASSERT_TRUE(device.is_ok()) << device.status().message();
  ASSERT_TRUE(host.is_ok()) << host.status().message();
  const ZeroMemory on_device = device.value()->memory(), on_host = host.value()->memory();
  EXPECT_EQ(on_host.host_parameter_bytes + on_host.parameter_bytes, on_device.parameter_bytes);
  EXPECT_GT(on_host.host_parameter_bytes, 0);
  const int persistent = host.value()->layout().persistent_unit();
  ASSERT_GE(persistent, 0) << "the threshold keeps the norms whole";
  EXPECT_EQ(on_host.parameter_bytes,
            static_cast<int64_t>(sizeof(float)) * host.value()->layout().units()[static_cast<size_t>(persistent)].numel);
  // Initialisation, then one tensor written from outside, then a step: the same on both.
  // A tensor of the first layer's partitioned ones: it spans several ranks' shards.
  int entry = 0;
  const ParamLayout& layout = host.value()->layout();
  while (layout.entry(entry).unit != layout.layer_unit(0) || layout.entry(entry).numel <= 2000) ++entry;
  const ParamEntry& e = layout.entry(entry);
  std::vector<float> values(static_cast<size_t>(e.numel));
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.01f * static_cast<float>(static_cast<int>(i % 37) - 18);
  for (auto* engine : {device.value().get(), host.value().get()}) {
    ASSERT_TRUE(engine->initialize_parameters(9).is_ok());
    ASSERT_TRUE(engine->set_parameter(entry, values).is_ok());
    ASSERT_TRUE(engine->parameters_updated().is_ok());
  }
  const std::vector<HostMicroBatch> window = {random_documents(ec.model.vocab_size, 300 + comm.rank(), {70, 50}, 3)};
  for (int s = 0; s < 2; ++s) {
    auto d = device.value()->step(window, 3e-3);
    auto h = host.value()->step(window, 3e-3);
    ASSERT_TRUE(d.is_ok()) << d.status().message();
    ASSERT_TRUE(h.is_ok()) << h.status().message();
    EXPECT_EQ(h.value().loss, d.value().loss) << "step " << s + 1;
    EXPECT_EQ(h.value().grad_norm, d.value().grad_norm) << "step " << s + 1;
  }
  // Half of the shards resident: the two stores add up to the same bytes.
  ec.zero.offload_param_ratio = 0.5;
  auto half = TrainingEngine::create(ec, *backend, comm);
  ASSERT_TRUE(half.is_ok()) << half.status().message();
  const ZeroMemory on_both = half.value()->memory();
  EXPECT_EQ(on_both.host_parameter_bytes + on_both.parameter_bytes, on_device.parameter_bytes);
  EXPECT_GT(on_both.host_parameter_bytes, 0);
  EXPECT_GT(on_both.parameter_bytes, on_host.parameter_bytes);
  ec.offload = OffloadConfig{};
  auto no_optimizer_offload = TrainingEngine::create(ec, *backend, comm);
  ASSERT_FALSE(no_optimizer_offload.is_ok());
  EXPECT_NE(no_optimizer_offload.status().message().find("--offload_optimizer cpu"), std::string::npos);
  ec.offload = OffloadConfig{true, true, 1};
  ec.zero_stage = 2;
  auto stage2 = TrainingEngine::create(ec, *backend, comm);
  ASSERT_FALSE(stage2.is_ok());
  EXPECT_NE(stage2.status().message().find("--zero_stage 3"), std::string::npos) << stage2.status().message();
}

// --offload_delayed_update: step k's forward and backward see the parameters of update k - 2 (the
// host update of step k - 1 lands after step k's backward). So, bit for bit: step 2 of a delayed
// run equals a fresh run's first step on step 2's batch (both at the initial parameters), and step
// 3 equals the second step of an undelayed run fed step 1's and step 3's batches (both after update
// 1 alone). At ZeRO-2 and at ZeRO-3 with the parameter shards on the host; clipping on and off.
TEST(OffloadDelayed, GradientsAreTakenOneUpdateLate) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  auto backend = make_cpu_backend(DType::f32);
  const int rank = comm.rank();
  const std::vector<HostMicroBatch> w1 = {random_documents(tiny_glm4().vocab_size, 400 + rank, {90, 40}, 3)};
  const std::vector<HostMicroBatch> w2 = {random_documents(tiny_glm4().vocab_size, 500 + rank, {70, 60}, 3)};
  const std::vector<HostMicroBatch> w3 = {random_documents(tiny_glm4().vocab_size, 600 + rank, {120}, 4)};
  for (const int stage : {2, 3})
    for (const double clip : {1.0, 0.0}) {
      const std::string what = "stage " + std::to_string(stage) + (clip > 0 ? ", clipping" : ", no clipping");
      auto engine = [&](bool delayed) {
        EngineConfig ec = tiny_engine(256, stage);
        ec.max_grad_norm = clip;
        ec.zero.offload_params = stage == 3;
        ec.offload = OffloadConfig{true, true, 2};
        ec.offload.delayed_update = delayed;
        auto e = TrainingEngine::create(ec, *backend, comm).take();
        EXPECT_TRUE(e->initialize_parameters(21).is_ok());
        return e;
      };
      auto delayed = engine(true), plain = engine(false), fresh = engine(false);
      auto step = [&](TrainingEngine& e, const std::vector<HostMicroBatch>& w) {
        auto r = e.step(w, 4e-3);
        EXPECT_TRUE(r.is_ok()) << what << ": " << r.status().message();
        return r.is_ok() ? r.value() : StepResult{};
      };
      const StepResult d1 = step(*delayed, w1), d2 = step(*delayed, w2), d3 = step(*delayed, w3);
      const StepResult p1 = step(*plain, w1), p3 = step(*plain, w3), f2 = step(*fresh, w2);
      // Without clipping the undelayed update sums the norm itself, in another order.
      auto same_norm = [&](double got, double want, const char* which) {
        if (clip > 0)
          EXPECT_EQ(got, want) << what << ", " << which;
        else
          EXPECT_NEAR(got, want, 1e-12 * want) << what << ", " << which;
      };
      EXPECT_EQ(d1.loss, p1.loss) << what;
      same_norm(d1.grad_norm, p1.grad_norm, "step 1");
      EXPECT_EQ(d2.loss, f2.loss) << what << ": step 2 at the initial parameters";
      same_norm(d2.grad_norm, f2.grad_norm, "step 2");
      EXPECT_EQ(d3.loss, p3.loss) << what << ": step 3 after update 1 alone";
      same_norm(d3.grad_norm, p3.grad_norm, "step 3");
      // Settling lands the pending update: three updates against the undelayed run's two.
      auto checksum = delayed->parameter_checksum();
      ASSERT_TRUE(checksum.is_ok()) << checksum.status().message();
      EXPECT_NE(checksum.value(), plain->parameter_checksum().take()) << what;
    }
}

// A delayed run's checkpoint lands the pending update first; resuming from it gives the rest of
// the uninterrupted run bit for bit.
TEST(OffloadDelayed, CheckpointResumesTheUninterruptedRun) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  const int size = comm.size();
  if (kGlobalBatch % size != 0) GTEST_SKIP() << "12 samples do not split over " << size << " ranks";
  const std::string dir = job_temp_dir("glm_delayed_");
  TrainConfig first = offloaded(offload_config(size, 2), 2);
  first.offload_delayed_update = true;
  first.offload_delayed_update_after = 1;  // the first step at once, the rest delayed
  first.eval_steps = 0;
  constexpr size_t half = kSteps / 2;
  first.save_steps = half;
  first.output_dir = dir + "/straight";
  auto straight = run(first, comm);
  ASSERT_TRUE(straight.is_ok()) << straight.status().message();
  TrainConfig second = first;
  second.resume_from_checkpoint = first.output_dir + "/checkpoint-" + std::to_string(half);
  second.output_dir = dir + "/resumed";
  second.save_strategy = SaveStrategy::no;
  auto resumed = run(second, comm);
  ASSERT_TRUE(resumed.is_ok()) << resumed.status().message();
  ASSERT_EQ(resumed.value().losses.size(), half);
  for (size_t i = 0; i < half; ++i)
    EXPECT_EQ(resumed.value().losses[i], straight.value().losses[half + i]) << "step " << half + 1 + i;
  EXPECT_EQ(resumed.value().parameter_checksum, straight.value().parameter_checksum);
  MPI_Barrier(MPI_COMM_WORLD);
  if (comm.rank() == 0) std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Stages, Offload, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& i) { return "stage" + std::to_string(i.param); });

// The state lives on the host: nothing of it in backend memory, 12 bytes an owned element (fp32
// master and two moments) plus the staging slots in host memory.
TEST(OffloadMemory, StateIsHostMemoryOfTheShardsSize) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  auto backend = make_cpu_backend(DType::f32);
  EngineConfig ec;
  ec.model = tiny_glm4();
  ASSERT_TRUE(ec.model.finalize_and_validate().is_ok());
  ec.max_tokens = 64;
  ec.adam = AdamWOptions{};
  ec.zero_stage = 2;
  ec.offload = OffloadConfig{true, true, 2};
  auto host = TrainingEngine::create(ec, *backend, comm);
  ASSERT_TRUE(host.is_ok()) << host.status().message();
  int64_t owned = 0;
  for (size_t u = 0; u < host.value()->layout().units().size(); ++u) {
    const TrainingEngine::OptimizerShard s = host.value()->optimizer_shard(static_cast<int>(u));
    EXPECT_TRUE(s.host);
    owned += s.master.numel;
  }
  EXPECT_EQ(host.value()->optimizer_bytes(), 0);
  EXPECT_EQ(host.value()->host_optimizer_bytes(),
            12 * owned + 2 * OptimizerOffload::kStagingSlots * OffloadConfig{}.staging_elements *
                             static_cast<int64_t>(sizeof(float)));
  ec.offload = OffloadConfig{};
  auto device = TrainingEngine::create(ec, *backend, comm);
  ASSERT_TRUE(device.is_ok()) << device.status().message();
  EXPECT_EQ(device.value()->host_optimizer_bytes(), 0);
  EXPECT_EQ(device.value()->optimizer_bytes(), 8 * owned);  // the CPU backend's master is the parameters
  ec.zero_stage = 0;
  ec.offload = OffloadConfig{true, true, 1};
  auto refused = TrainingEngine::create(ec, *backend, comm);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("--zero_stage 1, 2 or 3"), std::string::npos) << refused.status().message();
}

// One micro-batch a step at ZeRO-2 and 3 (ZeroOptions::offload_grads, what the trainer sets at
// --gradient_accumulation_steps 1): each reduced bucket goes straight to the gradient shards in host
// memory, backward filling the other bucket buffer meanwhile at one rank, and the norm comes from
// squares summed bucket by bucket. Small buckets make many of them. The norm is the same sum in
// another order (to 1e-12); a clipping threshold far above it keeps the norm pass without letting
// its last bits reach a clip factor, so losses and parameters equal the backend's update bit for
// bit. Nothing of the gradients stays in backend memory; a step of two micro-batches is refused.
TEST(OffloadGrads, ReducedBucketsGoStraightToHostMemory) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  auto backend = make_cpu_backend(DType::f32);
  for (const int stage : {2, 3}) {
    EngineConfig ec = tiny_engine(512, stage);
    ec.max_grad_norm = 1e6;
    ec.zero.reduce_bucket_size = 5000;
    ec.offload = OffloadConfig{true, true, 2, 777};
    auto device = TrainingEngine::create(ec, *backend, comm);
    ec.zero.offload_grads = true;
    auto host = TrainingEngine::create(ec, *backend, comm);
    ASSERT_TRUE(device.is_ok()) << device.status().message();
    ASSERT_TRUE(host.is_ok()) << host.status().message();
    const ZeroMemory on_device = device.value()->memory(), on_host = host.value()->memory();
    EXPECT_EQ(on_host.gradient_bytes, 0) << "stage " << stage;
    EXPECT_EQ(on_host.host_gradient_bytes, on_device.gradient_bytes) << "stage " << stage;
    ASSERT_TRUE(device.value()->initialize_parameters(5).is_ok());
    ASSERT_TRUE(host.value()->initialize_parameters(5).is_ok());
    for (int s = 0; s < 3; ++s) {
      const std::vector<HostMicroBatch> window = {
          random_documents(ec.model.vocab_size, 100 + 10 * s + comm.rank(), {90, 40}, 3)};
      auto d = device.value()->step(window, 3e-3);
      auto h = host.value()->step(window, 3e-3);
      ASSERT_TRUE(d.is_ok()) << d.status().message();
      ASSERT_TRUE(h.is_ok()) << h.status().message();
      EXPECT_EQ(h.value().loss, d.value().loss) << "stage " << stage << ", step " << s + 1;
      EXPECT_NEAR(h.value().grad_norm, d.value().grad_norm, 1e-12 * d.value().grad_norm)
          << "stage " << stage << ", step " << s + 1;
    }
    auto dp = device.value()->parameter_checksum();
    auto hp = host.value()->parameter_checksum();
    ASSERT_TRUE(dp.is_ok() && hp.is_ok());
    EXPECT_EQ(hp.value(), dp.value()) << "stage " << stage;
    const std::vector<HostMicroBatch> two = {random_documents(ec.model.vocab_size, 7, {60}, 3),
                                             random_documents(ec.model.vocab_size, 8, {60}, 3)};
    auto refused = host.value()->step(two, 3e-3);
    ASSERT_FALSE(refused.is_ok());
    EXPECT_NE(refused.status().message().find("one micro-batch a step"), std::string::npos)
        << refused.status().message();
  }
}

// Staging slots far smaller than a unit: every unit's update runs as many chunks whose copies overlap
// the host's work, with chunk edges inside decay ranges; the engine's losses, gradient norms and
// parameters equal the backend's update bit for bit (ZeRO-2; one rank's shards at several ranks).
TEST(OffloadEngine, ChunkedStagingGivesTheSameBits) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  auto backend = make_cpu_backend(DType::f32);
  EngineConfig ec = tiny_engine(512, 2);
  auto device = TrainingEngine::create(ec, *backend, comm);
  ec.offload = OffloadConfig{true, true, 2, 777};
  auto host = TrainingEngine::create(ec, *backend, comm);
  ASSERT_TRUE(device.is_ok()) << device.status().message();
  ASSERT_TRUE(host.is_ok()) << host.status().message();
  ASSERT_GT(host.value()->layout().units()[1].numel / comm.size(), 3 * 777) << "a layer spans several chunks";
  ASSERT_TRUE(device.value()->initialize_parameters(5).is_ok());
  ASSERT_TRUE(host.value()->initialize_parameters(5).is_ok());
  const std::vector<HostMicroBatch> window = {random_documents(ec.model.vocab_size, 100 + comm.rank(), {90, 40}, 3),
                                              random_documents(ec.model.vocab_size, 200 + comm.rank(), {130}, 4)};
  for (int s = 0; s < 3; ++s) {
    auto d = device.value()->step(window, 3e-3);
    auto h = host.value()->step(window, 3e-3);
    ASSERT_TRUE(d.is_ok()) << d.status().message();
    ASSERT_TRUE(h.is_ok()) << h.status().message();
    EXPECT_EQ(h.value().loss, d.value().loss) << "step " << s + 1;
    EXPECT_EQ(h.value().grad_norm, d.value().grad_norm) << "step " << s + 1;
  }
  auto dp = device.value()->parameters();
  auto hp = host.value()->parameters();
  ASSERT_TRUE(dp.is_ok() && hp.is_ok());
  EXPECT_EQ(hp.value(), dp.value());
}

// A checkpoint saved halfway by an offloaded run resumes on the backend, and the reverse, with the
// second half of the uninterrupted run bit for bit: the files hold the same fp32 state either way.
TEST(OffloadCheckpoint, ResumesWithAndWithoutOffload) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  const int size = comm.size();
  if (kGlobalBatch % size != 0) GTEST_SKIP() << "12 samples do not split over " << size << " ranks";
  const std::string dir = job_temp_dir("glm_offload_");
  TrainConfig base = offload_config(size, size > 1 ? 3 : 2);
  base.eval_steps = 0;
  constexpr size_t half = kSteps / 2;
  base.save_steps = half;
  auto with_params = [](TrainConfig t) {
    t.offload_param = OffloadDevice::cpu;
    return offloaded(t, 2);
  };
  for (const bool saved_offloaded : {true, false}) {
    // At ZeRO-3 "offloaded" is both offloads: the parameter shards as well as the optimizer.
    auto offload = [&](const TrainConfig& t) { return t.zero_stage == 3 ? with_params(t) : offloaded(t, 2); };
    TrainConfig first = saved_offloaded ? offload(base) : base;
    first.output_dir = dir + (saved_offloaded ? "/host" : "/device");
    auto straight = run(first, comm);
    ASSERT_TRUE(straight.is_ok()) << straight.status().message();
    TrainConfig second = saved_offloaded ? base : offload(base);
    second.resume_from_checkpoint = first.output_dir + "/checkpoint-" + std::to_string(half);
    second.output_dir = first.output_dir + "-resumed";
    second.save_strategy = SaveStrategy::no;
    auto resumed = run(second, comm);
    ASSERT_TRUE(resumed.is_ok()) << resumed.status().message();
    ASSERT_EQ(resumed.value().losses.size(), half);
    for (size_t i = 0; i < half; ++i)
      EXPECT_EQ(resumed.value().losses[i], straight.value().losses[half + i])
          << (saved_offloaded ? "offloaded" : "on the backend") << " checkpoint, step " << half + 1 + i;
    EXPECT_EQ(resumed.value().parameter_checksum, straight.value().parameter_checksum);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (comm.rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace glm::test
