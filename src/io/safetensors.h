// safetensors files (GLM4_SPEC.md 4.4): a memory-mapped reader that validates the whole header,
// a reader for sharded checkpoints (model.safetensors.index.json), and an atomic writer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"

namespace glm {

enum class StDType { BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64, F8_E4M3, F8_E5M2 };
size_t st_dtype_size(StDType d);
const char* st_dtype_name(StDType d);

struct StTensorInfo {
  std::string name;
  StDType dtype = StDType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // relative to the data section
  int64_t numel() const;
};

// A read-only memory map of one file (RAII).
class MappedFile {
 public:
  static Result<std::shared_ptr<MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::span<const std::byte> bytes() const { return {static_cast<const std::byte*>(data_), size_}; }

 private:
  MappedFile() = default;
  void* data_ = nullptr;
  size_t size_ = 0;
};

class SafetensorsFile {
 public:
  // Validates the header completely: a damaged file is an error naming the file and the field.
  static Result<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<StTensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const StTensorInfo* find(const std::string& name) const;
  std::span<const std::byte> data(const StTensorInfo& t) const;

 private:
  std::string path_;
  std::shared_ptr<MappedFile> map_;
  size_t data_offset_ = 0;
  std::vector<StTensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Converts a floating-point tensor (F32, F16, BF16, F64) to f32; out.size() must equal numel.
Status read_as_f32(const SafetensorsFile& file, const StTensorInfo& t, std::span<float> out);

// All tensors of a checkpoint directory: model.safetensors, or the shards named by
// model.safetensors.index.json (every listed shard must exist and hold its tensors).
class SafetensorsCheckpoint {
 public:
  static Result<SafetensorsCheckpoint> open(const std::string& dir);
  struct Located {
    const SafetensorsFile* file = nullptr;
    const StTensorInfo* info = nullptr;
  };
  Located find(const std::string& name) const;  // file == nullptr when absent
  std::vector<std::string> names() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, std::pair<size_t, const StTensorInfo*>> where_;
};

struct StTensorView {
  std::string name;
  StDType dtype = StDType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // numel x st_dtype_size(dtype) bytes
};

// Writes one file (header padded to 8 bytes, data 8-byte aligned), via a temporary file renamed
// into place, so a crash never leaves a half-written file under the final name.
Status write_safetensors(const std::string& path, const std::vector<StTensorView>& tensors,
                         const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// Writes model.safetensors, or shards of at most max_shard_bytes (tensors are never split) named
// model-0000i-of-0000n.safetensors with model.safetensors.index.json, as transformers does.
Status write_sharded_safetensors(const std::string& dir, const std::vector<StTensorView>& tensors,
                                 uint64_t max_shard_bytes);

struct StTensorSpec {
  std::string name;
  StDType dtype = StDType::F32;
  std::vector<int64_t> shape;
  uint64_t bytes() const;
};

// write_sharded_safetensors one tensor at a time, so a model is never in memory whole (export of
// GLM-4-9B): the shards are planned from the specs, the tensors then arrive in the same order.
// Each file is written under a temporary name and renamed once complete.
class SafetensorsShardWriter {
 public:
  static Result<SafetensorsShardWriter> create(const std::string& dir, std::vector<StTensorSpec> tensors,
                                               uint64_t max_shard_bytes);
  // The next tensor in the order of create(); data holds its bytes() bytes.
  Status write(const std::string& name, const void* data);
  // After the last tensor: closes the last file and writes the index when sharded.
  Status finish();
  // The files written (shards, then the index when sharded) and the tensor bytes (index total_size).
  const std::vector<std::string>& files() const { return files_; }
  uint64_t total_bytes() const { return total_bytes_; }

 private:
  Status close_shard();

  std::string dir_;
  std::vector<StTensorSpec> tensors_;
  std::vector<size_t> shard_of_;  // per tensor
  std::vector<std::string> shard_names_;
  std::vector<std::string> files_;
  uint64_t total_bytes_ = 0;
  size_t next_ = 0;
  int open_shard_ = -1;
  std::string open_tmp_;  // the open shard's temporary name
  std::unique_ptr<std::ofstream> out_;
};

}  // namespace glm
