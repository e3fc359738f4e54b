// One rank's checkpoint file: HDF5 for the layout (groups, attributes, contiguous fp32 datasets at
// 4 KiB-aligned offsets, allocated up front), the bytes written by us: large blocks with O_DIRECT
// from aligned buffers on a background thread while the caller fills the next block (GPU->host
// copies overlap the disk), one fdatasync at the end. Each dataset `name` has a sibling uint32
// dataset `name.crc32c` with the CRC32C of every checksum block (the root attribute
// checksum_block_bytes says how large); readers verify every block they touch.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace glm {

struct CheckpointFileGroup {
  std::string name;
  std::vector<std::pair<std::string, std::vector<int64_t>>> attributes;  // int64 arrays
  std::vector<std::pair<std::string, int64_t>> datasets;                 // fp32 element counts (> 0)
};

struct CheckpointFileOptions {
  int64_t io_block_bytes = int64_t{64} << 20;       // one write; a multiple of checksum_block_bytes
  int64_t checksum_block_bytes = int64_t{8} << 20;  // one CRC32C; a multiple of 4096
  int buffers = 4;                                  // host blocks in flight (io_block_bytes each)
  bool direct_io = true;                            // O_DIRECT where the file system takes it
  // Fault tests: before filling this group the writer finishes every queued write and calls at_pause.
  std::optional<size_t> pause_before_group;
  std::function<void()> at_pause;
};

struct CheckpointFileStats {
  int64_t file_bytes = 0;
  int64_t data_bytes = 0;
  bool direct = false;       // the data went through O_DIRECT (else buffered: tmpfs and the like)
  double fill_seconds = 0;   // in the caller's fill (GPU->host copies), overlapped with writing
  double stall_seconds = 0;  // the caller waited for a free buffer (the disk was the bottleneck)
  double seconds = 0;        // the whole file, layout to fdatasync
};

// fill(group, dataset, first element, destination) copies that many elements of the dataset;
// it runs on the calling thread (the one that owns the GPU context), in file order.
using CheckpointFileFill = std::function<Status(size_t group, size_t dataset, int64_t first, std::span<float> dst)>;

Result<CheckpointFileStats> write_checkpoint_file(const std::string& path,
                                                  const std::vector<CheckpointFileGroup>& groups,
                                                  const CheckpointFileFill& fill,
                                                  const CheckpointFileOptions& options = {});

class H5Handle;

// One group of an open checkpoint file: its int64 attributes and its fp32 datasets, read checked.
class CheckpointGroupReader {
 public:
  CheckpointGroupReader(CheckpointGroupReader&&) noexcept;
  CheckpointGroupReader& operator=(CheckpointGroupReader&&) noexcept;
  ~CheckpointGroupReader();

  bool has_attribute(const std::string& name) const;
  // The attribute's values; nullopt when it is missing, holds no element or cannot be read.
  std::optional<std::vector<int64_t>> int64_attribute(const std::string& name) const;
  // Elements [first, first + out.size()) of the fp32 dataset, every checksum block it touches
  // verified (older files: HDF5's Fletcher-32). Errors are user errors naming the file, group and
  // dataset.
  Status read(const char* dataset, int64_t first, std::span<float> out) const;

 private:
  friend class CheckpointFileReader;
  CheckpointGroupReader(std::unique_ptr<H5Handle> group, std::string name, std::string path,
                        std::optional<int64_t> block_bytes);
  std::unique_ptr<H5Handle> group_;
  std::string name_, path_;
  std::optional<int64_t> block_bytes_;
};

// A checkpoint file opened for reading: written by write_checkpoint_file, or an older one with
// chunked Fletcher-32 datasets.
class CheckpointFileReader {
 public:
  // User errors: a file that does not open ("<path> is not a readable HDF5 file (truncated or
  // corrupt)") or whose checksum attribute is damaged.
  static Result<CheckpointFileReader> open(const std::string& path);
  CheckpointFileReader(CheckpointFileReader&&) noexcept;
  CheckpointFileReader& operator=(CheckpointFileReader&&) noexcept;
  ~CheckpointFileReader();

  // A user error "<path>: group <name> is missing" when it is.
  Result<CheckpointGroupReader> group(const std::string& name) const;
  const std::string& path() const { return path_; }

 private:
  CheckpointFileReader(std::unique_ptr<H5Handle> file, std::string path, std::optional<int64_t> block_bytes);
  std::unique_ptr<H5Handle> file_;
  std::string path_;
  std::optional<int64_t> block_bytes_;
};

}  // namespace glm
