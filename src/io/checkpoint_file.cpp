// Checkpoint files (see checkpoint_file.h): HDF5 lays the file out, a writer thread puts the bytes
// on disk with O_DIRECT while the caller fills the next block; CRC32C per block, checked on read.
#include "io/checkpoint_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "base/errno_text.h"
#include "io/checkpoint_file_hdf5.h"
#include "io/crc32c.h"
#include "io/hdf5_handle.h"

namespace glm {
namespace {

static_assert(std::endian::native == std::endian::little, "checkpoint files store little-endian fp32 and uint32");

constexpr int64_t kAlign = 4096;  // O_DIRECT offsets, lengths and buffers; dataset starts in the file

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() {
    const int rc = fd_ >= 0 ? ::close(fd_) : 0;
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};

// Where each dataset and its checksums went.
struct Placement {
  int64_t data_offset = 0, data_bytes = 0, crc_offset = 0, blocks = 0;
};

int64_t blocks_of(int64_t bytes, int64_t block) { return (bytes + block - 1) / block; }

// HDF5's file driver leaves the system's reason in errno when a call below it failed (callers
// clear errno first): ": <strerror>", or nothing when there is none.
std::string system_reason() { return errno != 0 ? ": " + errno_text(errno) : std::string(); }

Status write_int64_attribute(hid_t where, const std::string& name, const std::vector<int64_t>& values,
                             const std::string& what) {
  const hsize_t n = values.size();
  H5Handle space(n == 1 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &n, nullptr), H5Sclose);
  H5Handle attr(H5Acreate2(where, name.c_str(), H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!space.ok() || !attr.ok() || H5Awrite(attr.get(), H5T_NATIVE_INT64, values.data()) < 0)
    return GLM_ERROR(ErrorKind::io, "cannot write the attribute ", name, " of ", what);
  return Status::ok();
}

// HDF5 writes the metadata; every dataset is contiguous, allocated now (at a 4 KiB-aligned offset when
// it is at least 4 KiB) and never filled, so its bytes are ours to write.
Result<std::vector<std::vector<Placement>>> lay_out(const std::string& path,
                                                    const std::vector<CheckpointFileGroup>& groups,
                                                    int64_t block_bytes) {
  H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  // Version-2 object headers and superblock carry checksums of their own (the metadata is checked too).
  if (!fapl.ok() || H5Pset_alignment(fapl.get(), kAlign, kAlign) < 0 ||
      H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST) < 0)
    return GLM_ERROR(ErrorKind::io, "HDF5 file properties failed for '", path, "'");
  H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (!dcpl.ok() || H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS) < 0 ||
      H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY) < 0 || H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER) < 0)
    return GLM_ERROR(ErrorKind::io, "HDF5 dataset properties failed for '", path, "'");
  errno = 0;
  H5Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
  if (!file.ok()) return GLM_ERROR(ErrorKind::io, "cannot create '", path, "'", system_reason());
  GLM_RETURN_IF_ERROR(write_int64_attribute(file.get(), kChecksumBlockAttribute, {block_bytes}, "'" + path + "'"));
  std::vector<std::vector<Placement>> placed(groups.size());
  auto create = [&](hid_t group, const std::string& name, hid_t type, int64_t count, const std::string& where,
                    int64_t& offset) -> Status {
    const hsize_t n = static_cast<hsize_t>(count);
    H5Handle space(H5Screate_simple(1, &n, nullptr), H5Sclose);
    errno = 0;
    H5Handle ds(H5Dcreate2(group, name.c_str(), type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), H5Dclose);
    if (!ds.ok())
      return GLM_ERROR(ErrorKind::io, "cannot create ", where, "/", name, " in '", path, "'",
                       errno != 0 ? system_reason() : " (disk full?)");
    const haddr_t at = H5Dget_offset(ds.get());
    if (at == HADDR_UNDEF) return GLM_ERROR(ErrorKind::io, where, "/", name, " in '", path, "' has no file offset");
    offset = static_cast<int64_t>(at);
    return Status::ok();
  };
  for (size_t g = 0; g < groups.size(); ++g) {
    const CheckpointFileGroup& spec = groups[g];
    H5Handle group(H5Gcreate2(file.get(), spec.name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    if (!group.ok()) return GLM_ERROR(ErrorKind::io, "cannot create group ", spec.name, " in '", path, "'");
    for (const auto& [name, values] : spec.attributes)
      GLM_RETURN_IF_ERROR(write_int64_attribute(group.get(), name, values, spec.name + " in '" + path + "'"));
    for (const auto& [name, count] : spec.datasets) {
      if (count <= 0)
        return GLM_INTERNAL_ERROR("checkpoint dataset ", spec.name, "/", name, " has ", count, " elements");
      Placement p;
      p.data_bytes = count * static_cast<int64_t>(sizeof(float));
      p.blocks = blocks_of(p.data_bytes, block_bytes);
      GLM_RETURN_IF_ERROR(create(group.get(), name, H5T_IEEE_F32LE, count, spec.name, p.data_offset));
      GLM_RETURN_IF_ERROR(create(group.get(), name + ".crc32c", H5T_STD_U32LE, p.blocks, spec.name, p.crc_offset));
      placed[g].push_back(p);
    }
  }
  errno = 0;
  if (!file.release())
    return GLM_ERROR(ErrorKind::io, "cannot close '", path, "' after laying it out",
                     errno != 0 ? system_reason() : " (disk full?)");
  return placed;
}

// Writes everything or returns the errno of the failing pwrite (ENOSPC for no progress).
int pwrite_all_errno(int fd, const void* data, int64_t bytes, int64_t offset, int64_t& failed_at) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, p, static_cast<size_t>(bytes), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      failed_at = offset;
      return n < 0 ? errno : ENOSPC;
    }
    p += n;
    bytes -= n;
    offset += n;
  }
  return 0;
}

Status write_error(const std::string& path, int64_t at, int err) {
  return GLM_ERROR(ErrorKind::io, "cannot write '", path, "' at byte ", at, ": ", std::strerror(err));
}

Status pwrite_all(int fd, const void* data, int64_t bytes, int64_t offset, const std::string& path) {
  int64_t at = 0;
  const int err = pwrite_all_errno(fd, data, bytes, offset, at);
  return err == 0 ? Status::ok() : write_error(path, at, err);
}

// Blocks travel from the caller (filled, checksummed) to the writer thread and back.
class BlockPipeline {
 public:
  struct Job {
    float* data = nullptr;
    int64_t offset = 0, bytes = 0;
  };

  BlockPipeline(const std::string& path, int buffered_fd, int direct_fd)
      : path_(path), fd_(buffered_fd), direct_fd_(direct_fd) {
    direct_ = direct_fd_ >= 0;
  }
  ~BlockPipeline() { finish(); }

  Status allocate(int count, int64_t bytes) {
    const size_t size = static_cast<size_t>((bytes + kAlign - 1) / kAlign * kAlign);
    for (int i = 0; i < count; ++i) {
      float* p = static_cast<float*>(std::aligned_alloc(kAlign, size));
      if (p == nullptr) return GLM_ERROR(ErrorKind::io, "cannot allocate ", size, " bytes of checkpoint buffers");
      owned_.emplace_back(p);
      free_.push_back(p);
    }
    thread_ = std::thread([this] { run(); });
    return Status::ok();
  }

  // A free buffer; waits while all are queued. Null after a write failed.
  float* acquire(double& stalled) {
    std::unique_lock lock(mutex_);
    const auto t = Clock::now();
    changed_.wait(lock, [&] { return !free_.empty() || !error_.is_ok(); });
    stalled += since(t);
    if (!error_.is_ok()) return nullptr;
    float* p = free_.back();
    free_.pop_back();
    return p;
  }
  void submit(Job job) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(job);
    }
    changed_.notify_all();
  }
  // Waits until every queued block is written; the first write error, if any.
  Status drain() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return (queue_.empty() && free_.size() == owned_.size()) || !error_.is_ok(); });
    return error_;
  }
  Status finish() {
    {
      std::lock_guard lock(mutex_);
      closing_ = true;
    }
    changed_.notify_all();
    if (thread_.joinable()) thread_.join();
    return error_;
  }
  bool direct() const { return direct_; }

 private:
  void run() {
    for (;;) {
      Job job;
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return !queue_.empty() || closing_; });
        if (queue_.empty() || !error_.is_ok()) return;
        job = queue_.front();
        queue_.pop_front();
      }
      Status s = write(job);
      {
        std::lock_guard lock(mutex_);
        free_.push_back(job.data);
        if (!s.is_ok() && error_.is_ok()) error_ = s;
      }
      changed_.notify_all();
    }
  }

  // The aligned prefix with O_DIRECT, the rest (a dataset's last partial 4 KiB) through the page cache.
  Status write(const Job& job) {
    int64_t direct_bytes = 0;
    if (direct_ && job.offset % kAlign == 0) {
      direct_bytes = job.bytes / kAlign * kAlign;
      if (direct_bytes > 0) {
        int64_t at = 0;
        const int err = pwrite_all_errno(direct_fd_, job.data, direct_bytes, job.offset, at);
        if (err == EINVAL) {  // the file system took O_DIRECT at open but not at write: the page cache then
          direct_ = false;
          direct_bytes = 0;
        } else if (err != 0) {
          return write_error(path_, at, err);
        }
      }
    }
    return pwrite_all(fd_, reinterpret_cast<const char*>(job.data) + direct_bytes, job.bytes - direct_bytes,
                      job.offset + direct_bytes, path_);
  }

  const std::string path_;
  const int fd_, direct_fd_;
  bool direct_ = false;  // touched by the writer thread only once running
  std::vector<std::unique_ptr<float, FreeDeleter>> owned_;
  std::vector<float*> free_;
  std::deque<Job> queue_;
  bool closing_ = false;
  Status error_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::thread thread_;
};

}  // namespace

Result<CheckpointFileStats> write_checkpoint_file(const std::string& path,
                                                  const std::vector<CheckpointFileGroup>& groups,
                                                  const CheckpointFileFill& fill,
                                                  const CheckpointFileOptions& options) {
  const int64_t block = options.checksum_block_bytes, io = options.io_block_bytes;
  if (block <= 0 || block % kAlign != 0 || io < block || io % block != 0 || options.buffers < 1)
    return GLM_INTERNAL_ERROR("checkpoint file blocks: checksum ", block, " bytes, I/O ", io, " bytes, ",
                              options.buffers, " buffers (I/O must be a multiple of the 4 KiB-aligned checksum block)");
  const auto started = Clock::now();
  quiet_hdf5();
  GLM_ASSIGN_OR_RETURN(const std::vector<std::vector<Placement>> placed, lay_out(path, groups, block));

  CheckpointFileStats stats;
  Fd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (fd.get() < 0) return GLM_ERROR(ErrorKind::io, "cannot open '", path, "' for writing: ", std::strerror(errno));
  Fd direct_fd(options.direct_io ? ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_DIRECT) : -1);
  int64_t largest = 0;
  for (const auto& g : placed)
    for (const Placement& p : g) largest = std::max(largest, p.data_bytes);
  {
    BlockPipeline pipeline(path, fd.get(), direct_fd.get());
    if (largest > 0)
      GLM_RETURN_IF_ERROR(
          pipeline.allocate(std::max(1, std::min<int>(options.buffers, static_cast<int>(blocks_of(largest, io)) + 1)),
                            std::min(io, largest)));
    std::vector<std::vector<std::vector<uint32_t>>> crcs(groups.size());
    for (size_t g = 0; g < groups.size(); ++g) {
      if (options.pause_before_group && *options.pause_before_group == g) {
        GLM_RETURN_IF_ERROR(pipeline.drain());
        if (options.at_pause) options.at_pause();
      }
      for (size_t d = 0; d < placed[g].size(); ++d) {
        const Placement& p = placed[g][d];
        std::vector<uint32_t>& sums = crcs[g].emplace_back(static_cast<size_t>(p.blocks));
        for (int64_t at = 0; at < p.data_bytes; at += io) {
          const int64_t bytes = std::min(io, p.data_bytes - at);
          float* buffer = pipeline.acquire(stats.stall_seconds);
          if (buffer == nullptr) return pipeline.finish();
          const auto t = Clock::now();
          GLM_RETURN_IF_ERROR(fill(g, d, at / 4, std::span<float>(buffer, static_cast<size_t>(bytes / 4))));
          stats.fill_seconds += since(t);
          for (int64_t b = 0; b < bytes; b += block)
            sums[static_cast<size_t>((at + b) / block)] =
                crc32c(reinterpret_cast<const char*>(buffer) + b, static_cast<size_t>(std::min(block, bytes - b)));
          pipeline.submit({buffer, p.data_offset + at, bytes});
        }
      }
    }
    GLM_RETURN_IF_ERROR(pipeline.finish());
    stats.direct = pipeline.direct() && largest >= kAlign;
    for (size_t g = 0; g < groups.size(); ++g)
      for (size_t d = 0; d < placed[g].size(); ++d) {
        const Placement& p = placed[g][d];
        GLM_RETURN_IF_ERROR(pwrite_all(fd.get(), crcs[g][d].data(), p.blocks * 4, p.crc_offset, path));
        stats.data_bytes += p.data_bytes;
      }
  }
  if (::fdatasync(fd.get()) != 0)
    return GLM_ERROR(ErrorKind::io, "fdatasync of '", path, "' failed: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return GLM_ERROR(ErrorKind::io, "cannot stat '", path, "'");
  stats.file_bytes = static_cast<int64_t>(st.st_size);
  if (direct_fd.release() != 0 || fd.release() != 0)
    return GLM_ERROR(ErrorKind::io, "closing '", path, "' failed: ", std::strerror(errno));
  stats.seconds = since(started);
  return stats;
}

}  // namespace glm
