// CRC32C (Castagnoli, the iSCSI/ext4/RocksDB checksum): checkpoint shards store one per block of
// data so that a flipped or lost byte is found on load, naming the dataset and the block.
#pragma once

#include <cstddef>
#include <cstdint>

namespace glm {

// crc32c(data) continuing from `crc` (0 to start); "123456789" gives 0xE3069283. SSE4.2's crc32
// instruction where the CPU has it (three interleaved streams, ~20 GB/s), else slicing-by-8 tables.
uint32_t crc32c(const void* data, size_t bytes, uint32_t crc = 0);
// The portable table version (what crc32c() falls back on), for testing the fast path against.
uint32_t crc32c_portable(const void* data, size_t bytes, uint32_t crc = 0);

}  // namespace glm
