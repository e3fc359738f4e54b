// The HDF5-level readers behind io/checkpoint_file.h's CheckpointFileReader, for code that holds
// HDF5 identifiers itself (io/ and tests that build or damage files by hand).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "base/status.h"

namespace glm {

// Root attribute of files with block checksums: the bytes each CRC32C covers.
inline constexpr const char* kChecksumBlockAttribute = "checksum_block_bytes";

// Whether an open file carries block checksums (written by write_checkpoint_file) or not (older
// files: chunked datasets with HDF5's Fletcher-32, which H5Dread checks itself).
Result<std::optional<int64_t>> checksum_block_bytes(hid_t file, const std::string& path);

// Reads elements [first, first + out.size()) of the fp32 dataset group/name. With block_bytes, every
// checksum block overlapping the range is read whole and verified. Errors name `path`, the group
// and the dataset (user errors: the file is damaged).
Status read_checked_range(hid_t group, const std::string& group_name, const char* dataset, const std::string& path,
                          std::optional<int64_t> block_bytes, int64_t first, std::span<float> out);

}  // namespace glm
