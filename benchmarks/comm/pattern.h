// Input data whose collective results are exact in bf16 and f32, and the host-side fill and check
// of bench_comm: every received element is compared with the value it must have, no tolerance.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "base/bf16.h"
#include "mpi/communicator.h"

namespace glm::bench {

// Element i of rank r's send buffer: a small integer in [1, max_value()], pseudo-random in i and r
// so that a block landing at the wrong offset or from the wrong rank is caught. max_value() times
// the world size is at most 256, so every sum over ranks is an integer that bf16 (8 significant
// bits) holds exactly, whatever order NCCL or MPI adds in. Never 0: the harness clears the
// receive buffer to zeros before the timed iterations, so a collective that wrote nothing fails.
class InputPattern {
 public:
  // world_size <= kMaxWorldSize (checked by the caller).
  explicit InputPattern(int world_size) {
    while (bits_ < 4 && (2 << bits_) * world_size <= 256) ++bits_;
  }
  static constexpr int kMaxWorldSize = 256;

  uint32_t max_value() const { return 1u << bits_; }
  uint32_t value(int rank, size_t i) const {
    if (bits_ == 0) return 1;
    // SplitMix64's finaliser of (i, rank); its top bits pick the value.
    uint64_t x =
        (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(rank) * 0xD1B54A32D192ED03ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    return 1 + static_cast<uint32_t>(x >> (64 - bits_));
  }

 private:
  int bits_ = 0;
};

// Small integers (<= 256) are exact in bf16: its bits are the top half of the float's.
inline uint16_t bf16_of_small_integer(uint32_t v) {
  const float f = static_cast<float>(v);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>(bits >> 16);
}
inline float float_of_bf16(uint16_t v) { return bf16_bits_to_float(v); }

// Runs body(begin, end) over [0, n) split across up to `threads` threads (one for small n).
template <typename Body>
void parallel_ranges(size_t n, int threads, Body&& body) {
  constexpr size_t kMinPerThread = size_t{1} << 20;
  const size_t parts = std::clamp<size_t>(n / kMinPerThread, 1, static_cast<size_t>(std::max(threads, 1)));
  if (parts == 1) {
    body(size_t{0}, n);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(parts);
  for (size_t p = 0; p < parts; ++p) pool.emplace_back([&, p] { body(n * p / parts, n * (p + 1) / parts); });
  for (auto& t : pool) t.join();
}

// Writes value(i) for i in [0, count) to host memory in `type` (bf16 or f32).
template <typename Value>
void fill_elements(void* out, CommType type, size_t count, int threads, Value&& value) {
  parallel_ranges(count, threads, [&](size_t begin, size_t end) {
    if (type == CommType::bf16) {
      auto* p = static_cast<uint16_t*>(out);
      for (size_t i = begin; i < end; ++i) p[i] = bf16_of_small_integer(value(i));
    } else {
      auto* p = static_cast<float*>(out);
      for (size_t i = begin; i < end; ++i) p[i] = static_cast<float>(value(i));
    }
  });
}

// The received elements that differ from what they must be: how many, and the first one.
struct Mismatch {
  size_t wrong = 0;
  size_t first_index = 0;
  double got = 0;
  double expected = 0;
};

// Compares count elements of `type` at `received` with expected(i), exactly (NaN never matches).
template <typename Expected>
Mismatch count_mismatches(const void* received, CommType type, size_t count, int threads, Expected&& expected) {
  Mismatch total;
  std::mutex mutex;
  parallel_ranges(count, threads, [&](size_t begin, size_t end) {
    Mismatch part;
    for (size_t i = begin; i < end; ++i) {
      const double want = static_cast<double>(expected(i));
      const double got = type == CommType::bf16 ? float_of_bf16(static_cast<const uint16_t*>(received)[i])
                                                : static_cast<const float*>(received)[i];
      if (got == want) continue;
      if (part.wrong == 0) part = Mismatch{0, i, got, want};
      ++part.wrong;
    }
    std::lock_guard<std::mutex> lock(mutex);
    if (part.wrong == 0) return;
    // Ranges finish in any order: keep the lowest first index.
    const size_t wrong = total.wrong + part.wrong;
    if (total.wrong == 0 || part.first_index < total.first_index) total = part;
    total.wrong = wrong;
  });
  return total;
}

}  // namespace glm::bench
