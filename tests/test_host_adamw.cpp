// The offloaded optimizer's host AdamW (kernels/cpu/host_adamw.h), its thread pool and the NUMA
// helpers that place both (base/numa.h): in the CPU backend's rounding it gives cpu::adamw's bits,
// in the CUDA kernel's the element function's (the GPU suite checks that against the kernel
// itself), for any thread count, odd sizes and both dtypes of gradients and working copies.
#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "base/bf16.h"
#include "base/numa.h"
#include "base/thread_pool.h"
#include "kernels/cpu/adamw_element.h"
#include "kernels/cpu/host_adamw.h"
#include "kernels/master_split.h"

namespace glm::test {
namespace {

using cpu::AdamWRounding;
using cpu::Bf16Rounding;

// Sizes around the chunk (kHostAdamWChunk = 65,536), below a vector, and odd.
const int64_t kSizes[] = {1, 7, 1000, cpu::kHostAdamWChunk - 1, cpu::kHostAdamWChunk + 1, 3 * cpu::kHostAdamWChunk + 5};

struct State {
  std::vector<float> master, m, v, g;
};

State random_state(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  State s;
  for (int64_t i = 0; i < n; ++i) {
    s.master.push_back(normal(gen) * 0.05f);
    s.m.push_back(normal(gen) * 1e-3f);
    s.v.push_back(unit(gen) * 1e-5f);
    s.g.push_back(normal(gen) * 1e-2f);
  }
  return s;
}

cpu::AdamWStep step_of(int64_t k) {
  cpu::AdamWStep s;
  s.lr = 3e-4;
  s.weight_decay = 0.1;
  s.grad_scale = 0.73;
  s.step = k;
  return s;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(ThreadPool, RunsEveryChunkOnceAtAnySize) {
  for (int threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (int64_t chunks : {0, 1, 3, 64, 1001}) {
      std::vector<std::atomic<int>> seen(static_cast<size_t>(chunks));
      pool.run(chunks, [&](int64_t c) { seen[static_cast<size_t>(c)].fetch_add(1); });
      for (int64_t c = 0; c < chunks; ++c) EXPECT_EQ(seen[static_cast<size_t>(c)].load(), 1) << chunks << " chunks";
    }
  }
}

// Workers given CPUs run on them only (the offloaded optimizer's on the GPU's NUMA node): here the
// one CPU this process is allowed first; the caller's thread, which also runs chunks, is left alone.
TEST(ThreadPool, WorkersRunOnTheCpusGiven) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  int first = 0;
  while (!CPU_ISSET(first, &allowed)) ++first;
  ThreadPool pool(3, {first});
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int> elsewhere{0}, by_workers{0};
  pool.run(400, [&](int64_t) {
    if (std::this_thread::get_id() == caller) return;
    by_workers.fetch_add(1);
    if (sched_getcpu() != first) elsewhere.fetch_add(1);
  });
  EXPECT_EQ(elsewhere.load(), 0) << "of " << by_workers.load() << " chunks run by the workers";
}

TEST(Numa, CpuListsAndTopology) {
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpu_list("5"), (std::vector<int>{5}));
  for (const char* bad : {"", "x", "3-1", "1,,2", "1-"}) EXPECT_TRUE(parse_cpu_list(bad).empty()) << bad;
  EXPECT_GE(numa_node_count(), 1);
  EXPECT_EQ(pci_numa_node("not-a-device"), -1);
  EXPECT_TRUE(numa_node_cpus(-1).empty());
  // Node 0's CPUs are ones this process may use; with one node, every one it may use.
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  const std::vector<int> node0 = numa_node_cpus(0);
  for (int c : node0) EXPECT_TRUE(CPU_ISSET(c, &allowed)) << c;
  if (numa_node_count() == 1 && !node0.empty()) {
    EXPECT_EQ(static_cast<int>(node0.size()), CPU_COUNT(&allowed));
  }
  // A preference on a one-node machine, or for no node, does nothing.
  EXPECT_FALSE(PreferNumaNode(-1).active());
  if (numa_node_count() == 1) {
    EXPECT_FALSE(PreferNumaNode(0).active());
  }
}

// The CPU backend's rounding: what cpu::adamw computes, bit for bit, at 1 and 3 threads, over
// three steps, with the working copy an f32 copy of the master.
TEST(HostAdamW, ReferenceRoundingIsCpuAdamWsBits) {
  for (const int64_t n : kSizes) {
    for (int threads : {1, 3}) {
      ThreadPool pool(threads);
      State want = random_state(n, 11), got = want;
      std::vector<float> param(static_cast<size_t>(n), -1.0f);
      for (int64_t k = 1; k <= 3; ++k) {
        cpu::adamw(want.master.data(), want.g.data(), want.m.data(), want.v.data(), n, step_of(k));
        cpu::HostAdamWArrays a;
        a.master = got.master.data();
        a.exp_avg = got.m.data();
        a.exp_avg_sq = got.v.data();
        a.grad_f32 = got.g.data();
        a.param_f32 = param.data();
        cpu::host_adamw(pool, a, n, step_of(k), AdamWRounding::reference, Bf16Rounding::nearest_even, false);
      }
      EXPECT_TRUE(same_bits(got.master, want.master)) << n << " elements, " << threads << " threads";
      EXPECT_TRUE(same_bits(got.m, want.m)) << n;
      EXPECT_TRUE(same_bits(got.v, want.v)) << n;
      EXPECT_TRUE(same_bits(param, want.master)) << n;
    }
  }
}

// The CUDA kernel's rounding, vectorised and threaded, against its element function one by one;
// bf16 gradients in, a bf16 working copy out in either rounding.
TEST(HostAdamW, FusedRoundingIsTheElementFunctionsBits) {
  for (const int64_t n : kSizes) {
    for (const Bf16Rounding bf16 : {Bf16Rounding::nearest_even, Bf16Rounding::split_high}) {
      ThreadPool pool(4);
      State want = random_state(n, 23), got = want;
      std::vector<uint16_t> grad(static_cast<size_t>(n)), param(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) grad[static_cast<size_t>(i)] = float_to_bf16_bits(want.g[static_cast<size_t>(i)]);
      const cpu::FusedAdamWConstants c(step_of(5));
      for (int64_t i = 0; i < n; ++i) {
        const auto j = static_cast<size_t>(i);
        cpu::fused_adamw_element(want.master[j], bf16_bits_to_float(grad[j]), want.m[j], want.v[j], c);
      }
      cpu::HostAdamWArrays a;
      a.master = got.master.data();
      a.exp_avg = got.m.data();
      a.exp_avg_sq = got.v.data();
      a.grad_bf16 = grad.data();
      a.param_bf16 = param.data();
      cpu::host_adamw(pool, a, n, step_of(5), AdamWRounding::fused, bf16, false);
      EXPECT_TRUE(same_bits(got.master, want.master)) << n;
      EXPECT_TRUE(same_bits(got.m, want.m)) << n;
      EXPECT_TRUE(same_bits(got.v, want.v)) << n;
      for (int64_t i = 0; i < n; ++i) {
        const auto j = static_cast<size_t>(i);
        uint16_t hi = float_to_bf16_bits(want.master[j]);
        int16_t lo;
        if (bf16 == Bf16Rounding::split_high) split_master(want.master[j], hi, lo);
        ASSERT_EQ(param[j], hi) << "element " << i << " of " << n;
      }
    }
  }
}

// The two roundings are the same AdamW: they differ by a few float ulps, not in what they compute.
TEST(HostAdamW, RoundingsAgreeToFloatPrecision) {
  const int64_t n = 10'001;
  ThreadPool pool(2);
  State ref = random_state(n, 5), fused = ref;
  for (auto* s : {&ref, &fused}) {
    cpu::HostAdamWArrays a;
    a.master = s->master.data();
    a.exp_avg = s->m.data();
    a.exp_avg_sq = s->v.data();
    a.grad_f32 = s->g.data();
    cpu::host_adamw(pool, a, n, step_of(2), s == &ref ? AdamWRounding::reference : AdamWRounding::fused,
                    Bf16Rounding::nearest_even, false);
  }
  for (int64_t i = 0; i < n; ++i) {
    const auto j = static_cast<size_t>(i);
    EXPECT_NEAR(fused.master[j], ref.master[j], 1e-6f * std::fabs(ref.master[j]) + 1e-9f) << i;
  }
}

// The gradient's sum of squares (as stored, before grad_scale) in double, the same at every thread
// count (chunks are summed in order).
TEST(HostAdamW, SumOfSquaresIsTheGradientsAndIndependentOfThreads) {
  const int64_t n = 3 * cpu::kHostAdamWChunk + 5;
  double want = 0;
  const State start = random_state(n, 9);
  for (const float g : start.g) want += static_cast<double>(g) * g;
  std::vector<double> sums;
  for (int threads : {1, 2, 7}) {
    ThreadPool pool(threads);
    State s = start;
    cpu::HostAdamWArrays a;
    a.master = s.master.data();
    a.exp_avg = s.m.data();
    a.exp_avg_sq = s.v.data();
    a.grad_f32 = s.g.data();
    sums.push_back(cpu::host_adamw(pool, a, n, step_of(1), AdamWRounding::fused, Bf16Rounding::nearest_even, true));
  }
  EXPECT_NEAR(sums[0], want, 1e-12 * want);
  EXPECT_EQ(sums[1], sums[0]);
  EXPECT_EQ(sums[2], sums[0]);
}

}  // namespace
}  // namespace glm::test
