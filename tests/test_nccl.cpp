// NCCL under mpirun, one GPU per rank (skipped when the host has fewer GPUs than ranks): every
// collective against MPI on the same random data, odd sizes included; ZeRO stages 0-3 over NCCL
// against one GPU doing the whole batch; a peer that never joins a collective is detected by the
// watchdog within the deadline instead of hanging.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "data/sharded_loader.h"
#include "model/backend.h"
#include "mpi/local_communicator.h"
#include "mpi/mpi_communicator.h"
#include "mpi/nccl_communicator.h"
#include "test_util.h"
#include "train/engine.h"

namespace glm::test {
namespace {

// bf16 keeps 8 bits of mantissa; sums of two or more values may round differently in NCCL's and
// our MPI operator's order: a few ulps.
constexpr double kBf16SumTolerance = 2e-2;
constexpr double kFloatSumTolerance = 1e-6;
// Training in bf16 over 2 GPUs vs 1 GPU: gradient sums in another order; 10 steps stay close.
constexpr double kBf16TrajectoryTolerance = 3e-2;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

#define REQUIRE_GPU_PER_RANK()                                                                              \
  do {                                                                                                      \
    if (cuda_device_count() < world_size())                                                                 \
      GTEST_SKIP() << world_size() << " ranks need as many GPUs, " << cuda_device_count() << " visible"; \
  } while (0)

struct Fixture {
  std::unique_ptr<Backend> gpu;
  std::unique_ptr<MpiCommunicator> mpi;
  std::unique_ptr<Communicator> nccl;
};

Fixture make_fixture(double timeout_seconds = 60) {
  Fixture f;
  f.gpu = make_cuda_backend(world_rank() % cuda_device_count()).take();
  f.mpi = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, std::chrono::seconds(60));
  auto n = make_nccl_communicator(MPI_COMM_WORLD, world_rank() % cuda_device_count(), f.gpu->native_stream(),
                                  std::chrono::duration<double>(timeout_seconds));
  EXPECT_TRUE(n.is_ok()) << n.status().message();
  // All ranks go on only if every rank has its communicator, or none does (no rank left waiting).
  int ok = n.is_ok() ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (all_ok == 1) f.nccl = n.take();
  return f;
}

DType dtype_of(CommType t) {
  switch (t) {
    case CommType::f64: return DType::f64;
    case CommType::bf16: return DType::bf16;
    case CommType::i32: return DType::i32;
    default: return DType::f32;
  }
}

// Random bytes of `count` elements: small integers for i32, normals for floats (bf16 by rounding).
std::vector<uint8_t> random_elements(CommType t, size_t count, uint64_t seed) {
  SplitMix64 rng(seed);
  std::vector<uint8_t> bytes(count * comm_type_size(t));
  for (size_t i = 0; i < count; ++i) {
    const double u = rng.uniform() * 2 - 1;
    if (t == CommType::i32) {
      const int32_t v = static_cast<int32_t>(rng.next() % 2001) - 1000;
      std::memcpy(&bytes[i * 4], &v, 4);
    } else if (t == CommType::f64) {
      std::memcpy(&bytes[i * 8], &u, 8);
    } else if (t == CommType::f32) {
      const float v = static_cast<float>(u);
      std::memcpy(&bytes[i * 4], &v, 4);
    } else {
      const float v = static_cast<float>(u);
      uint32_t b;
      std::memcpy(&b, &v, 4);
      const uint16_t h = static_cast<uint16_t>((b + 0x7fff + ((b >> 16) & 1)) >> 16);
      std::memcpy(&bytes[i * 2], &h, 2);
    }
  }
  return bytes;
}

double element(CommType t, const std::vector<uint8_t>& bytes, size_t i) {
  switch (t) {
    case CommType::i32: {
      int32_t v;
      std::memcpy(&v, &bytes[i * 4], 4);
      return v;
    }
    case CommType::f64: {
      double v;
      std::memcpy(&v, &bytes[i * 8], 8);
      return v;
    }
    case CommType::f32: {
      float v;
      std::memcpy(&v, &bytes[i * 4], 4);
      return v;
    }
    default: {
      uint16_t h;
      std::memcpy(&h, &bytes[i * 2], 2);
      const uint32_t b = static_cast<uint32_t>(h) << 16;
      float v;
      std::memcpy(&v, &b, 4);
      return v;
    }
  }
}

void expect_close(CommType t, const std::vector<uint8_t>& ours, const std::vector<uint8_t>& ref, const char* what) {
  ASSERT_EQ(ours.size(), ref.size()) << what;
  const size_t n = ours.size() / comm_type_size(t);
  const double tol = t == CommType::bf16 ? kBf16SumTolerance : (t == CommType::i32 ? 0.0 : kFloatSumTolerance);
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const double a = element(t, ours, i), b = element(t, ref, i);
    if (std::fabs(a - b) > tol * (1 + std::fabs(b))) ++bad;
  }
  EXPECT_EQ(bad, 0u) << what << " " << comm_type_name(t) << " x " << n;
}

// effective_reduce_dtype() carries fp32 reductions of bf16 gradients over two ranks as bf16: the
// fp32 sum of two bf16 values, rounded to bf16 (what the fp32 path hands the optimizer), must be
// what NCCL's bf16 sum gives, bit for bit. Operands span 2^-60 to 2^60 with both signs, so that
// many fp32 sums are inexact (exponents more than 16 apart) and many land on bf16 ties.
uint16_t bf16_rne(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return static_cast<uint16_t>((b + 0x7fff + ((b >> 16) & 1)) >> 16);
}
float bf16_value(uint16_t h) {
  const uint32_t b = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST(Nccl, TwoRankBf16SumIsTheFp32SumRounded) {
  REQUIRE_GPU_PER_RANK();
  if (world_size() != 2) GTEST_SKIP() << "the two-rank equivalence";
  Fixture f = make_fixture();
  ASSERT_NE(f.nccl, nullptr);
  constexpr size_t kCount = size_t{1} << 22;
  SplitMix64 rng(1234 + static_cast<uint64_t>(world_rank()));
  std::vector<uint16_t> mine(kCount);
  for (auto& h : mine) {
    const uint64_t r = rng.next();
    const uint16_t exponent = static_cast<uint16_t>(127 - 60 + (r % 121));
    h = static_cast<uint16_t>(((r >> 8) & 1) << 15 | exponent << 7 | ((r >> 16) & 0x7f));
  }
  std::vector<uint16_t> both(2 * kCount);
  MPI_Allgather(mine.data(), static_cast<int>(kCount), MPI_UINT16_T, both.data(), static_cast<int>(kCount),
                MPI_UINT16_T, MPI_COMM_WORLD);
  std::vector<uint16_t> expected(kCount);
  for (size_t i = 0; i < kCount; ++i)
    expected[i] = bf16_rne(bf16_value(both[i]) + bf16_value(both[kCount + i]));  // fp32 sum, then bf16
  Buffer send = f.gpu->allocate(static_cast<int64_t>(kCount), DType::bf16).take();
  Buffer recv = f.gpu->allocate(static_cast<int64_t>(kCount), DType::bf16).take();
  ASSERT_TRUE(f.gpu->upload(send.tensor(), mine.data()).is_ok());
  ASSERT_TRUE(f.nccl->start_all_reduce(send.tensor().data, recv.tensor().data, kCount, CommType::bf16, ReduceOp::sum)
                  ->wait()
                  .is_ok());
  std::vector<uint16_t> got(kCount);
  ASSERT_TRUE(f.gpu->download(got.data(), recv.tensor()).is_ok());
  size_t differ = 0;
  for (size_t i = 0; i < kCount; ++i) differ += got[i] != expected[i];
  EXPECT_EQ(differ, 0u) << "all-reduce elements whose bf16 sum is not the rounded fp32 sum, of " << kCount;
  // Reduce-scatter: this rank's half.
  const size_t half = kCount / 2;
  ASSERT_TRUE(f.nccl->start_reduce_scatter(send.tensor().data, recv.tensor().data, half, CommType::bf16, ReduceOp::sum)
                  ->wait()
                  .is_ok());
  ASSERT_TRUE(f.gpu->download(got.data(), recv.slice(0, static_cast<int64_t>(half))).is_ok());
  differ = 0;
  for (size_t i = 0; i < half; ++i) differ += got[i] != expected[static_cast<size_t>(world_rank()) * half + i];
  EXPECT_EQ(differ, 0u) << "reduce-scatter elements whose bf16 sum is not the rounded fp32 sum, of " << half;
}

TEST(Nccl, EveryCollectiveMatchesMpi) {
  REQUIRE_GPU_PER_RANK();
  Fixture f = make_fixture();
  ASSERT_TRUE(f.nccl);
  const int rank = world_rank(), size = world_size();
  for (CommType t : {CommType::f32, CommType::bf16, CommType::f64, CommType::i32}) {
    for (size_t count : {size_t{1}, size_t{7}, size_t{4099}, size_t{1000003}}) {
      const size_t es = comm_type_size(t);
      const std::vector<uint8_t> mine = random_elements(t, count * size, 1000 * rank + count);
      Buffer send = f.gpu->allocate(static_cast<int64_t>(count * size), dtype_of(t)).take();
      Buffer recv = f.gpu->allocate(static_cast<int64_t>(count * size), dtype_of(t)).take();
      auto run_device = [&](const std::function<Status()>& op, size_t out_count) {
        EXPECT_TRUE(f.gpu->upload(send.tensor(), mine.data()).is_ok());
        std::vector<uint8_t> poison(count * size * es, 0xA5);
        EXPECT_TRUE(f.gpu->upload(recv.tensor(), poison.data()).is_ok());  // outputs poisoned first
        Status s = op();
        EXPECT_TRUE(s.is_ok()) << s.message();
        std::vector<uint8_t> out(count * size * es);
        EXPECT_TRUE(f.gpu->download(out.data(), recv.tensor()).is_ok());
        out.resize(out_count * es);
        return out;
      };
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
        std::vector<uint8_t> ref(count * es);
        ASSERT_TRUE(f.mpi->all_reduce(mine.data(), ref.data(), count, t, op).is_ok());
        auto ours = run_device([&] { return f.nccl->all_reduce(send.tensor().data, recv.tensor().data, count, t, op); },
                               count);
        expect_close(t, ours, ref, op == ReduceOp::sum ? "all_reduce sum" : "all_reduce max");
      }
      {
        std::vector<uint8_t> ref(count * es);
        ASSERT_TRUE(f.mpi->reduce_scatter(mine.data(), ref.data(), count, t, ReduceOp::sum).is_ok());
        auto ours = run_device(
            [&] { return f.nccl->reduce_scatter(send.tensor().data, recv.tensor().data, count, t, ReduceOp::sum); },
            count);
        expect_close(t, ours, ref, "reduce_scatter");
      }
      {
        std::vector<uint8_t> ref(count * size * es);
        ASSERT_TRUE(f.mpi->all_gather(mine.data(), ref.data(), count, t).is_ok());
        auto ours =
            run_device([&] { return f.nccl->all_gather(send.tensor().data, recv.tensor().data, count, t); }, count * size);
        expect_close(t, ours, ref, "all_gather");
      }
      {
        // Broadcast in place from the last rank.
        std::vector<uint8_t> ref = mine;
        ASSERT_TRUE(f.mpi->broadcast(ref.data(), count, t, size - 1).is_ok());
        ref.resize(count * es);
        auto ours = run_device(
            [&] {
              GLM_RETURN_IF_ERROR(f.gpu->convert(recv.tensor(), send.tensor()));
              return f.nccl->broadcast(recv.tensor().data, count, t, size - 1);
            },
            count);
        expect_close(t, ours, ref, "broadcast");
      }
    }
  }
  EXPECT_TRUE(f.nccl->barrier().is_ok());
}

ModelConfig small_model() {
  ModelConfig c;
  c.vocab_size = 300;
  c.hidden_size = 128;
  c.intermediate_size = 320;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.max_position_embeddings = 1024;
  c.rope_theta = 5e6;
  EXPECT_TRUE(c.finalize_and_validate().is_ok());
  return c;
}

HostMicroBatch random_batch(const ModelConfig& c, uint64_t seed) {
  return random_documents(c.vocab_size, seed, {61, 150, 9}, 4);
}

// The losses of `steps` steps of one GPU training on all of `batches` each step, from parameters of
// `seed`: computed on rank 0 and broadcast to every rank (EXPECT only there: the others wait in the
// broadcast).
std::vector<double> one_gpu_losses(const ModelConfig& c, const std::vector<HostMicroBatch>& batches,
                                   const AdamWOptions& adam, uint64_t seed, int steps) {
  std::vector<double> losses(static_cast<size_t>(steps), 0.0);
  if (world_rank() == 0) {
    auto gpu = make_cuda_backend(0).take();
    LocalCommunicator self;
    auto e = TrainingEngine::create({.model = c, .max_tokens = 512, .adam = adam}, *gpu, self).take();
    EXPECT_TRUE(e->initialize_parameters(seed).is_ok());
    for (int s = 0; s < steps; ++s) {
      auto r = e->step(batches, 2e-3);
      EXPECT_TRUE(r.is_ok()) << r.status().message();
      if (!r.is_ok()) break;
      losses[static_cast<size_t>(s)] = r.value().loss;
    }
  }
  MPI_Bcast(losses.data(), steps, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  return losses;
}

class NcclZero : public ::testing::TestWithParam<std::tuple<int, Recompute>> {};

// The global window of 4 micro-batches (one per rank beyond 4 ranks, so 8 at 8): one GPU does them
// all; over N ranks, rank r does r, r+N, ...
TEST_P(NcclZero, SameTrajectoryAsOneGpu) {
  REQUIRE_GPU_PER_RANK();
  const auto [stage, recompute] = GetParam();
  const int rank = world_rank(), size = world_size();
  const int window = std::max(4, size);
  const ModelConfig c = small_model();
  std::vector<HostMicroBatch> global;
  for (int m = 0; m < window; ++m) global.push_back(random_batch(c, 17 + m));
  if (window % size != 0) GTEST_SKIP() << window << " micro-batches do not split over " << size << " ranks";
  AdamWOptions adam{0.9, 0.999, 1e-8, 0.1};
  constexpr int kSteps = 10;

  const std::vector<double> ref = one_gpu_losses(c, global, adam, 3, kSteps);

  Fixture f = make_fixture();
  ASSERT_TRUE(f.nccl);
  std::vector<HostMicroBatch> mine;
  for (int m = rank; m < window; m += size) mine.push_back(global[static_cast<size_t>(m)]);
  const EngineConfig ec{.model = c, .max_tokens = 512, .adam = adam, .zero_stage = stage, .recompute = recompute};
  auto e = TrainingEngine::create(ec, *f.gpu, *f.mpi, f.nccl.get()).take();
  ASSERT_TRUE(e->initialize_parameters(3).is_ok());
  for (int s = 0; s < kSteps; ++s) {
    auto r = e->step(mine, 2e-3);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_NEAR(r.value().loss, ref[static_cast<size_t>(s)], kBf16TrajectoryTolerance * ref[static_cast<size_t>(s)])
        << "stage " << stage << " step " << s + 1;
    EXPECT_GE(r.value().exposed_comm_seconds, 0.0);
  }
  // Every rank holds the same parameters afterwards.
  auto sum = e->parameter_checksum();
  ASSERT_TRUE(sum.is_ok()) << sum.status().message();
  double mine_sum = sum.value(), lo = 0, hi = 0;
  MPI_Allreduce(&mine_sum, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&mine_sum, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(lo, hi);
}

INSTANTIATE_TEST_SUITE_P(Stages, NcclZero,
                         ::testing::Values(std::make_tuple(0, Recompute::none), std::make_tuple(1, Recompute::none),
                                           std::make_tuple(2, Recompute::selective),
                                           std::make_tuple(3, Recompute::none), std::make_tuple(3, Recompute::full)));

// Context parallelism over NCCL: the ranks share every row (--context_parallel_size = the world),
// each runs its queries against the row's keys and values gathered from the group, and training
// follows one GPU holding whole rows, at ZeRO 0 and 3 and with full recomputation.
class NcclContextParallel : public ::testing::TestWithParam<std::tuple<int, Recompute>> {};

TEST_P(NcclContextParallel, SameTrajectoryAsOneGpu) {
  REQUIRE_GPU_PER_RANK();
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks";
  const auto [stage, recompute] = GetParam();
  const ModelConfig c = small_model();
  std::vector<HostMicroBatch> rows;
  for (int m = 0; m < 3; ++m) rows.push_back(random_batch(c, 41 + m));
  AdamWOptions adam{0.9, 0.999, 1e-8, 0.1};
  constexpr int kSteps = 8;
  const std::vector<double> ref = one_gpu_losses(c, rows, adam, 5, kSteps);

  Fixture f = make_fixture();
  ASSERT_TRUE(f.nccl);
  const EngineConfig ec{.model = c,
                        .max_tokens = 512,
                        .adam = adam,
                        .zero_stage = stage,
                        .recompute = recompute,
                        .context_parallel_size = world_size()};
  auto made = TrainingEngine::create(ec, *f.gpu, *f.mpi, f.nccl.get());
  ASSERT_TRUE(made.is_ok()) << made.status().message();
  auto e = made.take();
  ASSERT_TRUE(e->initialize_parameters(5).is_ok());
  for (int s = 0; s < kSteps; ++s) {
    auto r = e->step(rows, 2e-3);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_NEAR(r.value().loss, ref[static_cast<size_t>(s)], kBf16TrajectoryTolerance * ref[static_cast<size_t>(s)])
        << "stage " << stage << " step " << s + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, NcclContextParallel,
                         ::testing::Values(std::make_tuple(0, Recompute::none), std::make_tuple(3, Recompute::full)));

// Last: rank 0 starts an all-reduce that rank 1 never joins. NCCL connects lazily, so the
// collective fails either while being enqueued (connection setup needs the peer) or in flight
// (the watchdog); either way at the deadline, with a message naming the operation. No hang.
// Rank-divergent code uses EXPECT only, so both ranks always reach the closing barrier.
TEST(Nccl, MissingPeerIsDetectedAtTheDeadline) {
  REQUIRE_GPU_PER_RANK();
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks";
  Fixture f = make_fixture(/*timeout_seconds=*/3);
  ASSERT_TRUE(f.nccl);  // agreed on every rank by make_fixture
  Buffer x = f.gpu->allocate(1024, DType::f32).take();
  const auto start = std::chrono::steady_clock::now();
  if (world_rank() == 0) {
    Status s = f.nccl->start_all_reduce(x.tensor().data, x.tensor().data, 1024, CommType::f32, ReduceOp::sum)->wait();
    if (s.is_ok()) {
      (void)f.gpu->synchronize();  // returns once the watchdog aborted the stuck collective
      auto late = f.nccl->take_device_exposed_seconds();
      s = late.status();
    }
    EXPECT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find("all_reduce(1024 x f32)"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("within 3 s"), std::string::npos) << s.message();
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(waited, 30.0);
    EXPECT_GE(waited, 2.5);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace glm::test
