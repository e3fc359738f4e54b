// ZeRO communication buckets under mpirun -np N: bucket planning, the same trajectory at every
// --reduce_bucket_size / --allgather_bucket_size / --overlap_comm setting and stage (bf16
// reduction within its rounding), buffer bytes equal to the planner's rows, and
// --reduce_bucket_size auto (the knee of a measured or a bench_comm curve).
#include <gtest/gtest.h>
#include <mpi.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "data/dataset.h"
#include "mpi/mpi_communicator.h"
#include "train/engine.h"
#include "train/trainer.h"
#include "zero/bucket_autotune.h"
#include "zero/comm_buckets.h"
#include "zero/memory_plan.h"
#include "test_util.h"

namespace glm::test {
namespace {

// fp32 sums in another order (other bucket boundaries, all-reduce against reduce-scatter) move
// losses by ~1e-7 relative; 4 AdamW steps keep that far below this.
constexpr double kFp32Tolerance = 1e-5;
// bf16 gradients carry 8 mantissa bits (2^-9 relative rounding each); after 4 steps at lr 5e-3 the
// loss moves by well under a percent.
constexpr double kBf16Tolerance = 1e-2;
constexpr int64_t kGlobalBatch = 6;
constexpr int64_t kSteps = 4;

TrainConfig bucket_config() {
  TrainConfig t;
  ModelConfig& m = t.model;
  m = test::tiny_glm4();
  m.num_hidden_layers = 3;
  EXPECT_TRUE(m.finalize_and_validate().is_ok());
  t.datasets = {std::string(GLM_SOURCE_DIR) + "/data/sample/conversations.jsonl"};
  t.max_length = 256;
  t.max_steps = kSteps;
  t.learning_rate = 5e-3;
  t.warmup_steps = 1;
  t.weight_decay = 0.1;
  t.log_to_console = false;
  return t;
}

const Dataset& dataset() {
  static ByteTokenizer tokenizer;
  static Dataset d = load_dataset(bucket_config().datasets, &tokenizer, 256, 272).take();
  return d;
}

TEST(CommBuckets, CoalesceConsecutiveUnitsInIssueOrder) {
  const ModelConfig c = bucket_config().model;
  const ParamLayout layout(c, 3);
  const int units = static_cast<int>(layout.units().size());  // embedding, 3 layers, head
  ASSERT_EQ(units, 5);
  auto numel = [&](int u) { return layout.units()[static_cast<size_t>(u)].numel; };
  // One element: every unit alone, head first in backward order.
  auto tiny = plan_comm_buckets(layout, 1, true);
  ASSERT_EQ(tiny.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(tiny[static_cast<size_t>(i)].first, units - 1 - i);
    EXPECT_EQ(tiny[static_cast<size_t>(i)].last, units - 1 - i);
  }
  // Huge: one bucket of everything, whose shard range is this rank's whole shard buffer.
  auto huge = plan_comm_buckets(layout, int64_t{1} << 40, true);
  ASSERT_EQ(huge.size(), 1u);
  EXPECT_EQ(huge[0].first, 0);
  EXPECT_EQ(huge[0].last, units - 1);
  EXPECT_EQ(huge[0].numel, layout.total_numel());
  EXPECT_EQ(huge[0].shard_offset, 0);
  EXPECT_EQ(huge[0].shard_numel(3) * 3, huge[0].numel);
  // Exactly two layers fit (units: embedding and head 8832 elements each, layers 9408).
  const int64_t two_layers = numel(1) + numel(2);
  ASSERT_LE(numel(4) + numel(3), two_layers);
  ASSERT_GT(numel(4) + numel(3) + numel(2), two_layers);
  auto mid = plan_comm_buckets(layout, two_layers, true);
  ASSERT_EQ(mid.size(), 3u);
  EXPECT_EQ(mid[0].first, 3);  // head + layer 2
  EXPECT_EQ(mid[0].last, 4);
  EXPECT_EQ(mid[1].first, 1);  // layers 1 and 0
  EXPECT_EQ(mid[1].last, 2);
  EXPECT_EQ(mid[2].first, 0);  // the embedding
  EXPECT_EQ(mid[2].last, 0);
  EXPECT_EQ(mid[1].offset, layout.units()[1].offset);
  EXPECT_EQ(mid[1].numel, numel(1) + numel(2));
  EXPECT_EQ(mid[1].shard_offset, layout.shard_numel(0));
  EXPECT_EQ(mid[0].shard_offset, layout.shard_numel(0) + layout.shard_numel(1) + layout.shard_numel(2));
  // A unit larger than the bucket is a bucket of its own; smaller neighbours still coalesce.
  auto small = plan_comm_buckets(layout, numel(1) - 1, true);
  ASSERT_EQ(small.size(), 5u);
  // Forward order for the parameter all-gathers: embedding + layer 0, layers 1 + 2, head.
  auto forward = plan_comm_buckets(layout, two_layers, false);
  ASSERT_EQ(forward.size(), 3u);
  EXPECT_EQ(forward[0].first, 0);
  EXPECT_EQ(forward[0].last, 1);
  EXPECT_EQ(forward[1].first, 2);
  EXPECT_EQ(forward[1].last, 3);
  EXPECT_EQ(forward[2].first, 4);
}

// ZeRO-3's persistent unit is never coalesced: its gradient is complete only after the
// embedding's, and the optimizer updates it last, so it is the last bucket in either order.
TEST(CommBuckets, PersistentUnitIsALastBucketOfItsOwn) {
  const ModelConfig c = bucket_config().model;
  const ParamLayout layout(c, 3, PersistencePolicy{3000});
  ASSERT_EQ(layout.units().size(), 6u);  // embedding, 3 layers, head, persistent
  const int persistent = layout.persistent_unit();
  ASSERT_EQ(persistent, 5);
  int64_t shards_before = 0;
  for (int u = 0; u < persistent; ++u) shards_before += layout.shard_numel(u);
  for (bool backward : {true, false}) {
    auto huge = plan_comm_buckets(layout, int64_t{1} << 40, backward);
    ASSERT_EQ(huge.size(), 2u);
    EXPECT_EQ(huge[0].first, 0);
    EXPECT_EQ(huge[0].last, 4);
    EXPECT_EQ(huge[1].first, persistent);
    EXPECT_EQ(huge[1].last, persistent);
    EXPECT_EQ(huge[1].shard_offset, shards_before);
    EXPECT_EQ(huge[1].numel, layout.units()[static_cast<size_t>(persistent)].numel);
    auto tiny = plan_comm_buckets(layout, 1, backward);
    ASSERT_EQ(tiny.size(), 6u);
    EXPECT_EQ(tiny.back().first, persistent);
    EXPECT_EQ(tiny.front().first, backward ? 4 : 0);
  }
  // Backward writes the other buckets; the persistent gradients have a buffer of their own.
  ZeroOptions o;
  o.reduce_bucket_size = 1;
  const ZeroBufferSizes sizes = zero_buffer_sizes(layout, 3, o, DType::f32);
  int64_t largest = 0;
  for (int u = 0; u < persistent; ++u) largest = std::max(largest, layout.units()[static_cast<size_t>(u)].numel);
  EXPECT_EQ(sizes.grad_bucket_numel, largest);
  EXPECT_EQ(sizes.gathered_unit_numel, largest);
  EXPECT_EQ(sizes.persistent_grad_numel, layout.units()[static_cast<size_t>(persistent)].numel);
  EXPECT_EQ(sizes.reduce_recv_numel * 3, std::max(largest, layout.units()[static_cast<size_t>(persistent)].numel));
}

struct Setting {
  const char* name;
  int64_t reduce_bucket, allgather_bucket;
  bool overlap;
  DType reduce_dtype;
};

std::string describe(const Setting& s, int stage) { return concat(s.name, " at ZeRO-", stage); }

TrainSummary run(const TrainConfig& config, Communicator& comm) {
  auto backend = make_cpu_backend(DType::f32);
  auto r = train(config, dataset(), comm, *backend);
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return r.is_ok() ? r.value() : TrainSummary{};
}

// One sample per micro-batch, the global batch accumulated over each rank's share (stages 2-3
// then reduce every micro-batch).
TrainConfig accumulated_config(const Communicator& comm) {
  TrainConfig base = bucket_config();
  base.per_device_train_batch_size = 1;
  base.gradient_accumulation_steps = kGlobalBatch / comm.size();
  return base;
}

// The trajectory every setting is compared with: stage 0, one bucket per unit. Run once per process
// (every rank calls it first from the same test).
const TrainSummary& reference_run(Communicator& comm) {
  static const TrainSummary r = [&] {
    TrainConfig c = accumulated_config(comm);
    c.zero_options.reduce_bucket_size = 1;
    return run(c, comm);
  }();
  return r;
}

// Every stage and bucket setting gives the trajectory of stage 0 with one bucket per unit.
class ZeroBucketStages : public ::testing::TestWithParam<int> {};

TEST_P(ZeroBucketStages, SameTrajectoryAtEveryBucketSetting) {
  const int stage = GetParam();
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  if (kGlobalBatch % comm.size() != 0) GTEST_SKIP() << kGlobalBatch << " samples do not split over " << comm.size();
  const TrainConfig base = accumulated_config(comm);
  const ParamLayout layout(base.model, comm.size());
  const int64_t two_layers = layout.units()[1].numel + layout.units()[2].numel;
  const TrainSummary& reference = reference_run(comm);
  ASSERT_EQ(reference.losses.size(), static_cast<size_t>(kSteps));

  const Setting settings[] = {
      {"one bucket per unit", 1, 1, true, DType::f32},
      {"two layers per bucket", two_layers, two_layers, true, DType::f32},
      {"one huge bucket", int64_t{1} << 40, int64_t{1} << 40, true, DType::f32},
      {"two layers, overlap off", two_layers, two_layers, false, DType::f32},
      {"one bucket per unit, overlap off", 1, 1, false, DType::f32},
      {"two layers, bf16 reduction", two_layers, two_layers, true, DType::bf16},
  };
  for (const Setting& s : settings) {
    TrainConfig c = base;
    c.zero_stage = stage;
    c.zero_options.reduce_bucket_size = s.reduce_bucket;
    c.zero_options.allgather_bucket_size = s.allgather_bucket;
    c.zero_options.overlap_comm = s.overlap;
    c.zero_options.grad_reduce_dtype = s.reduce_dtype;
    const TrainSummary r = run(c, comm);
    ASSERT_EQ(r.losses.size(), static_cast<size_t>(kSteps)) << describe(s, stage);
    const double tolerance = s.reduce_dtype == DType::bf16 ? kBf16Tolerance : kFp32Tolerance;
    bool differs = false;
    for (size_t i = 0; i < r.losses.size(); ++i) {
      EXPECT_NEAR(r.losses[i], reference.losses[i], tolerance * reference.losses[i])
          << describe(s, stage) << " step " << i + 1 << " world " << comm.size();
      differs = differs || r.losses[i] != reference.losses[i];
    }
    EXPECT_NEAR(r.parameter_checksum, reference.parameter_checksum, tolerance * reference.parameter_checksum)
        << describe(s, stage);
    // bf16 rounding must show between ranks (one rank communicates nothing, so nothing is rounded).
    if (s.reduce_dtype == DType::bf16 && comm.size() > 1) {
      EXPECT_TRUE(differs) << describe(s, stage);
    }
    double mine = r.parameter_checksum, lo = 0, hi = 0;
    MPI_Allreduce(&mine, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&mine, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_EQ(lo, hi) << describe(s, stage) << ": ranks disagree on the parameters";
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroBucketStages, ::testing::Values(0, 1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& p) { return concat("stage", p.param); });

// ZeRO-3 with persistent tensors (--param_persistence_threshold 3000 here: norms, biases and the
// smaller weights) under the bucket settings that change how its gradients travel: in place or
// packed, serial, bf16.
TEST(ZeroBuckets, PersistentTensorsAtEveryBucketSetting) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  if (kGlobalBatch % comm.size() != 0) GTEST_SKIP() << kGlobalBatch << " samples do not split over " << comm.size();
  const TrainConfig base = accumulated_config(comm);
  const TrainSummary& reference = reference_run(comm);
  ASSERT_EQ(reference.losses.size(), static_cast<size_t>(kSteps));
  const Setting settings[] = {
      {"one bucket per unit", 1, 1, true, DType::f32},
      {"one huge bucket, overlap off", int64_t{1} << 40, int64_t{1} << 40, false, DType::f32},
      {"one bucket per unit, bf16 reduction", 1, 1, true, DType::bf16},
  };
  for (const Setting& s : settings) {
    TrainConfig c = base;
    c.zero_stage = 3;
    c.zero_options.param_persistence_threshold = 3000;
    c.zero_options.reduce_bucket_size = s.reduce_bucket;
    c.zero_options.allgather_bucket_size = s.allgather_bucket;
    c.zero_options.overlap_comm = s.overlap;
    c.zero_options.grad_reduce_dtype = s.reduce_dtype;
    const TrainSummary r = run(c, comm);
    ASSERT_EQ(r.losses.size(), static_cast<size_t>(kSteps)) << s.name;
    const double tolerance = s.reduce_dtype == DType::bf16 ? kBf16Tolerance : kFp32Tolerance;
    for (size_t i = 0; i < r.losses.size(); ++i)
      EXPECT_NEAR(r.losses[i], reference.losses[i], tolerance * reference.losses[i])
          << s.name << " step " << i + 1 << " world " << comm.size();
    double mine = r.parameter_checksum, lo = 0, hi = 0;
    MPI_Allreduce(&mine, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&mine, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_EQ(lo, hi) << s.name << ": ranks disagree on the parameters";
  }
}

// What ZeRO allocates for buckets is what the planner counts (zero_buffer_sizes), and bucket
// sizes move it the expected way.
TEST(ZeroBuckets, BufferBytesAreWhatThePlannerCounts) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(60));
  const ModelConfig model = bucket_config().model;
  const ParamLayout layout(model, comm.size());
  int64_t largest_unit = 0;
  for (const auto& u : layout.units()) largest_unit = std::max(largest_unit, u.numel);
  for (int stage = 0; stage <= 3; ++stage) {
    for (int64_t bucket : {int64_t{1}, int64_t{1} << 40}) {
      for (DType reduce : {DType::f32, DType::bf16}) {
        ZeroOptions o;
        o.reduce_bucket_size = bucket;
        o.allgather_bucket_size = bucket;
        o.grad_reduce_dtype = reduce;
        auto backend = make_cpu_backend(DType::f32);
        const EngineConfig ec{.model = model, .max_tokens = 64, .adam = AdamWOptions{}, .zero_stage = stage, .zero = o};
        auto e = TrainingEngine::create(ec, *backend, comm).take();
        const ZeroBufferSizes sizes = zero_buffer_sizes(layout, stage, o, DType::f32);
        EXPECT_EQ(e->memory().buffer_bytes, sizes.bytes()) << "stage " << stage << " bucket " << bucket;
        if (comm.size() == 1 || stage == 0) continue;
        // Stages 2-3 hold the largest bucket: a unit at one element per bucket, the model at 2^40.
        if (stage >= 2) {
          EXPECT_EQ(sizes.grad_bucket_numel, bucket == 1 ? largest_unit : layout.total_numel()) << stage;
        }
        // Buckets of any size are reduced where backward wrote them (multi-unit ones as a group of
        // per-unit collectives): a send copy only to convert to another reduce dtype.
        EXPECT_EQ(sizes.reduce_send_numel > 0, reduce != DType::f32) << stage;
      }
    }
  }
  // The planner adds the same bytes for the CUDA backend (bf16 compute, fp32 reduction).
  MemoryPlanInput in;
  in.model = model;
  in.world_size = 2;
  in.zero_stage = 2;
  in.micro_batch_tokens = 64;
  in.zero_options.reduce_bucket_size = int64_t{1} << 40;
  const ZeroBufferSizes expected = zero_buffer_sizes(ParamLayout(model, 2), 2, in.zero_options, DType::bf16);
  const MemoryPlan plan = plan_cuda_memory(in);
  bool found = false;
  for (const auto& row : plan.rows)
    if (row.what == "communication buffers") {
      EXPECT_EQ(row.bytes, expected.bytes());
      found = true;
    }
  EXPECT_TRUE(found);
}

TEST(BucketAutotune, KneeIsTheSmallestSizeAtNinetyPercentOfThePlateau) {
  std::vector<BandwidthPoint> curve = {
      {1 << 20, 0, 20.0}, {4 << 20, 0, 100.0}, {16 << 20, 0, 240.0}, {64 << 20, 0, 262.0}, {256 << 20, 0, 266.0}};
  EXPECT_EQ(bandwidth_knee(curve), 2u);  // 240 >= 0.9 x 266 = 239.4
  curve[2].busbw = 239.0;
  EXPECT_EQ(bandwidth_knee(curve), 3u);
  const BucketChoice c = choose_reduce_bucket_size(curve, 2, DType::f32, "test");
  EXPECT_EQ(c.elements, (int64_t{64} << 20) / 4);
  EXPECT_NE(c.explanation.find("16777216 elements (64 MiB of f32)"), std::string::npos) << c.explanation;
  EXPECT_NE(c.explanation.find("reduce_scatter"), std::string::npos) << c.explanation;
}

TEST(BucketAutotune, ReadsABenchCommJsonFile) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) GTEST_SKIP();
  const std::string path =
      (std::filesystem::temp_directory_path() / ("glm_comm_profile_" + std::to_string(::getpid()) + ".json")).string();
  {
    std::ofstream out(path);
    out << R"({"tool": "bench_comm", "rows": [
      {"collective": "reduce_scatter", "size": 4194304, "count": 1048576, "type": "f32", "time_us": 100, "algbw": 40, "busbw": 20, "wrong": 0},
      {"collective": "reduce_scatter", "size": 1048576, "count": 262144, "type": "f32", "time_us": 90, "algbw": 10, "busbw": 5, "wrong": 0},
      {"collective": "reduce_scatter", "size": 16777216, "count": 4194304, "type": "f32", "time_us": 200, "algbw": 80, "busbw": 40, "wrong": 0},
      {"collective": "all_reduce", "size": 1048576, "count": 262144, "type": "f32", "time_us": 50, "algbw": 20, "busbw": 20, "wrong": 0},
      {"collective": "reduce_scatter", "size": 16777216, "count": 8388608, "type": "bf16", "time_us": 100, "algbw": 160, "busbw": 80, "wrong": 0}]})";
  }
  auto curve = read_bandwidth_curve(path, 1, DType::f32);
  ASSERT_TRUE(curve.is_ok()) << curve.status().message();
  ASSERT_EQ(curve.value().size(), 3u);  // reduce_scatter f32 only, sorted by size
  EXPECT_EQ(curve.value()[0].bytes, 1048576);
  EXPECT_EQ(choose_reduce_bucket_size(curve.value(), 1, DType::f32, path).elements, 16777216 / 4);
  auto stage0 = read_bandwidth_curve(path, 0, DType::f32);  // all_reduce rows
  ASSERT_TRUE(stage0.is_ok());
  EXPECT_EQ(stage0.value().size(), 1u);
  auto missing = read_bandwidth_curve(path, 0, DType::bf16);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("no all_reduce rows of type bf16"), std::string::npos)
      << missing.status().message();
  {
    std::ofstream out(path, std::ios::trunc);
    out << R"({"rows": [{"collective": "reduce_scatter", "size": -4194304, "type": "f32", "time_us": 1, "busbw": 2}]})";
  }
  auto negative = read_bandwidth_curve(path, 1, DType::f32);
  ASSERT_FALSE(negative.is_ok());
  EXPECT_EQ(negative.status().exit_code(), 2);
  EXPECT_NE(negative.status().message().find(path + ": field 'rows[0].size' must be an integer >= 1, got -4194304"),
            std::string::npos)
      << negative.status().message();
  auto absent = read_bandwidth_curve(path + ".absent", 1, DType::f32);
  ASSERT_FALSE(absent.is_ok());
  EXPECT_NE(absent.status().message().find("cannot be read"), std::string::npos);
  // Sizes that are no byte count, 1e30 among them (past int64).
  for (const char* size : {"1e30", "-4", "0", "1.5", "\"4\""}) {
    std::ofstream(path, std::ios::trunc) << R"({"rows": [{"collective": "all_reduce", "type": "f32", "size": )" << size
                                         << R"(, "time_us": 1, "busbw": 1, "wrong": 0}]})";
    auto bad = read_bandwidth_curve(path, 0, DType::f32);
    ASSERT_FALSE(bad.is_ok()) << size;
    EXPECT_EQ(bad.status().exit_code(), 2);
    EXPECT_NE(bad.status().message().find(": field 'rows[0].size' must be an integer >= 1, got "), std::string::npos)
        << bad.status().message();
  }
  std::filesystem::remove(path);
}

// auto measures on the run's communicator: a size from the curve, the same on every rank.
TEST(BucketAutotune, AutoMeasuresWithTheRunsCommunicator) {
  MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
  TrainConfig c = bucket_config();
  c.zero_stage = 2;
  c.zero_options.reduce_bucket_size = ZeroOptions::kAutoBucketSize;
  auto backend = make_cpu_backend(DType::f32);
  auto z = resolve_zero_options(c, comm, comm, *backend);
  ASSERT_TRUE(z.is_ok()) << z.status().message();
  const int64_t chosen = z.value().reduce_bucket_size;
  if (comm.size() == 1) {
    EXPECT_EQ(chosen, ZeroOptions{}.reduce_bucket_size);
    return;
  }
  // Measured sizes: 64 KiB x 4^k up to 16 MiB of f32, rounded down to a multiple of the world size.
  bool on_curve = false;
  for (int64_t bytes = int64_t{64} << 10; bytes <= (int64_t{16} << 20); bytes *= 4)
    on_curve = on_curve || chosen == bytes / (4 * comm.size()) * comm.size();
  EXPECT_TRUE(on_curve) << chosen;
  int64_t lo = 0, hi = 0;
  MPI_Allreduce(&chosen, &lo, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&chosen, &hi, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(lo, hi);
}

}  // namespace
}  // namespace glm::test
