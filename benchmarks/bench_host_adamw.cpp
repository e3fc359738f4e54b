// The offloaded optimizer's host AdamW (kernels/cpu/host_adamw.h) against the memory it streams:
// a threaded STREAM-like copy of fp32 arrays on the same pool is the ceiling measured in the same
// run. Rates count the bytes each loop must move: copy 8 per element (read + write), AdamW 28 with
// bf16 gradients and working copy (CUDA runs: master, exp_avg, exp_avg_sq read and written, the
// gradient read, the copy written) or 32 with f32 ones (the CPU backend). Prints a table and the
// ratio the offload issue asks for (at least 0.60). Usage:
//   bench_host_adamw [--elements N (default 2^27)] [--threads T (default: every core)] [--repeat R]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "base/bf16.h"
#include "base/thread_pool.h"
#include "kernels/cpu/host_adamw.h"

namespace {

using Clock = std::chrono::steady_clock;

double best_seconds(int repeat, const std::function<void()>& fn) {
  fn();  // first touch and warm-up
  double best = 1e30;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = int64_t{1} << 27;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int repeat = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--elements") n = std::atoll(argv[i + 1]);
    else if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else if (a == "--repeat") repeat = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "bench_host_adamw: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  glm::ThreadPool pool(threads);
  const auto un = static_cast<size_t>(n);
  std::vector<float> master(un), m(un), v(un), g32(un), p32(un), src(un), dst(un);
  std::vector<uint16_t> g16(un), p16(un);
  // Filled by the pool's threads in its chunks: pages land where those threads run.
  pool.run((n + glm::cpu::kHostAdamWChunk - 1) / glm::cpu::kHostAdamWChunk, [&](int64_t c) {
    const int64_t b = c * glm::cpu::kHostAdamWChunk, e = std::min(n, b + glm::cpu::kHostAdamWChunk);
    for (int64_t i = b; i < e; ++i) {
      const auto j = static_cast<size_t>(i);
      master[j] = 0.01f * static_cast<float>((i * 7919) % 1000 - 500) / 500.0f;
      m[j] = 1e-4f;
      v[j] = 1e-6f;
      g32[j] = 1e-3f * static_cast<float>((i * 104729) % 2001 - 1000) / 1000.0f;
      g16[j] = glm::float_to_bf16_bits(g32[j]);
      src[j] = g32[j];
    }
  });
  const int64_t chunks = (n + glm::cpu::kHostAdamWChunk - 1) / glm::cpu::kHostAdamWChunk;
  const double copy = best_seconds(repeat, [&] {
    pool.run(chunks, [&](int64_t c) {
      const int64_t b = c * glm::cpu::kHostAdamWChunk, k = std::min(glm::cpu::kHostAdamWChunk, n - b);
      std::memcpy(dst.data() + b, src.data() + b, static_cast<size_t>(k) * sizeof(float));
    });
  });
  glm::cpu::AdamWStep step;
  step.lr = 1e-4;
  step.weight_decay = 0.1;
  step.step = 10;
  auto adamw = [&](bool bf16) {
    glm::cpu::HostAdamWArrays a;
    a.master = master.data();
    a.exp_avg = m.data();
    a.exp_avg_sq = v.data();
    if (bf16) {
      a.grad_bf16 = g16.data();
      a.param_bf16 = p16.data();
    } else {
      a.grad_f32 = g32.data();
      a.param_f32 = p32.data();
    }
    return best_seconds(repeat, [&] {
      glm::cpu::host_adamw(pool, a, n, step, bf16 ? glm::cpu::AdamWRounding::fused : glm::cpu::AdamWRounding::reference,
                           glm::cpu::Bf16Rounding::split_high, false);
    });
  };
  const double bf16 = adamw(true), f32 = adamw(false);
  const double gb = 1e9, copy_rate = 8.0 * static_cast<double>(n) / copy / gb;
  std::printf("host AdamW, %lld elements, %d threads, best of %d\n", static_cast<long long>(n), threads, repeat);
  std::printf("%-34s %10s %10s %12s %8s\n", "loop", "ms", "GB/s", "Melem/s", "of copy");
  auto row = [&](const char* name, double s, double bytes) {
    const double rate = bytes * static_cast<double>(n) / s / gb;
    std::printf("%-34s %10.2f %10.1f %12.0f %8.2f\n", name, s * 1e3, rate, static_cast<double>(n) / s / 1e6,
                rate / copy_rate);
  };
  row("copy (STREAM-like, fp32)", copy, 8);
  row("AdamW, bf16 grad + copy (CUDA)", bf16, 28);
  row("AdamW, f32 grad + copy (CPU)", f32, 32);
  std::printf("ratio_bf16_of_copy %.3f (target >= 0.60)\n", 28.0 * static_cast<double>(n) / bf16 / gb / copy_rate);
  std::printf("adamw_melem_per_s %.1f\n", static_cast<double>(n) / bf16 / 1e6);
  return 0;
}
