// CRC32C: slicing-by-8 tables, and on x86 with SSE4.2 three independent crc32 streams over thirds of
// each 24 KiB stride joined by carry-less "shift" tables (the crc32 instruction has 3 cycles of
// latency and 1 of throughput, so one stream runs at a third of the unit's rate).
#include "io/crc32c.h"

#include <array>
#include <cstring>

namespace glm {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

struct Tables {
  std::array<std::array<uint32_t, 256>, 8> slice{};
  Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (kPoly & (0u - (c & 1u)));
      slice[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (size_t t = 1; t < 8; ++t) slice[t][i] = (slice[t - 1][i] >> 8) ^ slice[0][slice[t - 1][i] & 0xFF];
  }
};
const Tables& tables() {
  static const Tables t;
  return t;
}

// The raw register update (no pre/post inversion).
uint32_t update_portable(uint32_t crc, const unsigned char* p, size_t n) {
  const auto& t = tables().slice;
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    word ^= crc;
    crc = t[7][word & 0xFF] ^ t[6][(word >> 8) & 0xFF] ^ t[5][(word >> 16) & 0xFF] ^ t[4][(word >> 24) & 0xFF] ^
          t[3][(word >> 32) & 0xFF] ^ t[2][(word >> 40) & 0xFF] ^ t[1][(word >> 48) & 0xFF] ^ t[0][word >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFF];
  return crc;
}

#if defined(__x86_64__)
// Multiplying a CRC register by x^(8*len) mod P, as a table per byte of the register: what the
// register of stream A becomes after `len` more bytes of zeros, so A, B, C combine by xor.
struct ShiftTable {
  std::array<std::array<uint32_t, 256>, 4> byte{};
  explicit ShiftTable(size_t len) {
    // x^(8*len) applied to each single-bit register value, then tables per byte by linearity.
    std::array<uint32_t, 32> bit{};
    for (int b = 0; b < 32; ++b) {
      uint32_t c = 1u << b;
      for (size_t i = 0; i < len; ++i) c = (c >> 8) ^ tables().slice[0][c & 0xFF];
      bit[static_cast<size_t>(b)] = c;
    }
    for (size_t k = 0; k < 4; ++k)
      for (uint32_t v = 0; v < 256; ++v) {
        uint32_t c = 0;
        for (int b = 0; b < 8; ++b)
          if (v & (1u << b)) c ^= bit[k * 8 + static_cast<size_t>(b)];
        byte[k][v] = c;
      }
  }
  uint32_t operator()(uint32_t crc) const {
    return byte[0][crc & 0xFF] ^ byte[1][(crc >> 8) & 0xFF] ^ byte[2][(crc >> 16) & 0xFF] ^ byte[3][crc >> 24];
  }
};

constexpr size_t kStream = 8192;  // bytes per stream per stride

__attribute__((target("sse4.2"))) uint32_t update_sse42(uint32_t crc, const unsigned char* p, size_t n) {
  static const ShiftTable shift(kStream);
  while (n >= 3 * kStream) {
    uint64_t a = crc, b = 0, c = 0;
    for (size_t i = 0; i < kStream; i += 8) {
      uint64_t wa, wb, wc;
      std::memcpy(&wa, p + i, 8);
      std::memcpy(&wb, p + kStream + i, 8);
      std::memcpy(&wc, p + 2 * kStream + i, 8);
      a = __builtin_ia32_crc32di(a, wa);
      b = __builtin_ia32_crc32di(b, wb);
      c = __builtin_ia32_crc32di(c, wc);
    }
    // crc(A|B|C) = shift(shift(A) ^ B) ^ C for raw registers.
    crc = shift(shift(static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b)) ^ static_cast<uint32_t>(c);
    p += 3 * kStream;
    n -= 3 * kStream;
  }
  uint64_t r = crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    r = __builtin_ia32_crc32di(r, w);
  }
  crc = static_cast<uint32_t>(r);
  for (; n > 0; --n) crc = __builtin_ia32_crc32qi(crc, *p++);
  return crc;
}

bool have_sse42() {
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
}
#endif

}  // namespace

uint32_t crc32c_portable(const void* data, size_t bytes, uint32_t crc) {
  return ~update_portable(~crc, static_cast<const unsigned char*>(data), bytes);
}

uint32_t crc32c(const void* data, size_t bytes, uint32_t crc) {
#if defined(__x86_64__)
  if (have_sse42()) return ~update_sse42(~crc, static_cast<const unsigned char*>(data), bytes);
#endif
  return crc32c_portable(data, bytes, crc);
}

}  // namespace glm
