// Checkpoint-file write rates against the disk, one table: the same bytes (3 fp32 datasets per unit,
// like a rank's master/exp_avg/exp_avg_sq) written by the version-1 layout (chunked + Fletcher-32,
// buffered, fsync), contiguous HDF5 buffered + fsync, io/checkpoint_file through the page cache and
// with O_DIRECT, and a dd-like loop of 64 MiB O_DIRECT pwrites (the reference). Each file is deleted
// after. Usage: bench_checkpoint_io [--dir D] [--gib G] [--units U] [--repeat R]
#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "io/checkpoint_file.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Shape {
  int units = 40;
  int64_t per_dataset = 0;  // elements
};

bool sync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return false;
  const bool ok = ::fsync(fd) == 0;
  ::close(fd);
  return ok;
}

// HDF5 H5Dwrite of every dataset (chunked + Fletcher-32 when `fletcher`), then fsync.
bool write_hdf5(const std::string& path, const Shape& s, const std::vector<float>& host, bool fletcher) {
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (file < 0) return false;
  const hsize_t n = static_cast<hsize_t>(s.per_dataset), chunk = std::min<hsize_t>(n, hsize_t{1} << 20);
  const hid_t plist = H5Pcreate(H5P_DATASET_CREATE);
  if (fletcher) {
    H5Pset_chunk(plist, 1, &chunk);
    H5Pset_fletcher32(plist);
  }
  const hid_t space = H5Screate_simple(1, &n, nullptr);
  bool ok = true;
  for (int u = 0; u < s.units && ok; ++u) {
    const std::string g = "unit_" + std::to_string(u);
    const hid_t group = H5Gcreate2(file, g.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    for (const char* name : {"master", "exp_avg", "exp_avg_sq"}) {
      const hid_t ds = H5Dcreate2(group, name, H5T_IEEE_F32LE, space, H5P_DEFAULT, plist, H5P_DEFAULT);
      ok = ok && ds >= 0 && H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, host.data()) >= 0;
      H5Dclose(ds);
    }
    H5Gclose(group);
  }
  H5Sclose(space);
  H5Pclose(plist);
  ok = H5Fclose(file) >= 0 && ok;
  return ok && sync_file(path);
}

bool write_checked(const std::string& path, const Shape& s, const std::vector<float>& host, bool direct) {
  std::vector<glm::CheckpointFileGroup> groups(static_cast<size_t>(s.units));
  for (int u = 0; u < s.units; ++u) {
    groups[static_cast<size_t>(u)].name = "unit_" + std::to_string(u);
    for (const char* name : {"master", "exp_avg", "exp_avg_sq"})
      groups[static_cast<size_t>(u)].datasets.emplace_back(name, s.per_dataset);
  }
  glm::CheckpointFileOptions o;
  o.direct_io = direct;
  auto fill = [&](size_t, size_t, int64_t first, std::span<float> dst) {
    std::memcpy(dst.data(), host.data() + first, dst.size_bytes());  // a download's host copy
    return glm::Status::ok();
  };
  auto r = glm::write_checkpoint_file(path, groups, fill, o);
  if (!r.is_ok()) std::fprintf(stderr, "error: %s\n", r.status().message().c_str());
  return r.is_ok();
}

// What `dd bs=64M oflag=direct` does, plus the fdatasync a checkpoint needs.
bool write_dd_like(const std::string& path, int64_t bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
  if (fd < 0) return false;
  const size_t block = size_t{64} << 20;
  void* buf = std::aligned_alloc(4096, block);
  std::memset(buf, 1, block);
  bool ok = true;
  for (int64_t at = 0; at < bytes && ok; at += static_cast<int64_t>(block))
    ok = ::pwrite(fd, buf, block, at) == static_cast<ssize_t>(block);
  ok = ok && ::fdatasync(fd) == 0;
  ::close(fd);
  std::free(buf);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/tmp/bench_checkpoint_io";
  double gib = 1.0;
  Shape shape;
  int repeat = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--dir")
      dir = argv[i + 1];
    else if (a == "--gib")
      gib = std::atof(argv[i + 1]);
    else if (a == "--units")
      shape.units = std::atoi(argv[i + 1]);
    else if (a == "--repeat")
      repeat = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--dir D] [--gib G] [--units U] [--repeat R]\n", argv[0]);
      return 2;
    }
  }
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  std::error_code ec;
  fs::create_directories(dir, ec);
  const int64_t total = static_cast<int64_t>(gib * (1 << 30));
  shape.per_dataset = std::max<int64_t>(1, total / (3 * 4 * shape.units));
  const int64_t bytes = shape.per_dataset * 3 * 4 * shape.units;
  std::vector<float> host(static_cast<size_t>(shape.per_dataset));
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i % 9973) * 0.25f;
  const std::string path = dir + "/bench.h5";
  struct Way {
    const char* name;
    std::function<bool()> run;
  };
  const std::vector<Way> ways = {
      {"dd-like O_DIRECT 64M+fdatasync", [&] { return write_dd_like(path, bytes); }},
      {"v1 chunked+Fletcher32, fsync", [&] { return write_hdf5(path, shape, host, true); }},
      {"HDF5 contiguous, fsync", [&] { return write_hdf5(path, shape, host, false); }},
      {"checkpoint_file page cache", [&] { return write_checked(path, shape, host, false); }},
      {"checkpoint_file O_DIRECT", [&] { return write_checked(path, shape, host, true); }},
  };
  std::printf("%.2f GB per write, %d units x 3 datasets, best of %d, in %s\n", bytes / 1e9, shape.units, repeat,
              dir.c_str());
  std::printf("%-32s %9s %7s %7s\n", "way", "seconds", "GB/s", "of dd");
  double dd_rate = 0;
  for (const Way& w : ways) {
    double best = 1e30;
    for (int r = 0; r < repeat; ++r) {
      fs::remove(path, ec);
      ::sync();
      const auto t = Clock::now();
      if (!w.run()) {
        std::fprintf(stderr, "error: %s failed writing %s\n", w.name, path.c_str());
        return 1;
      }
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t).count());
    }
    const double rate = bytes / best / 1e9;
    if (dd_rate == 0) dd_rate = rate;
    std::printf("%-32s %9.2f %7.2f %6.0f%%\n", w.name, best, rate, 100 * rate / dd_rate);
  }
  fs::remove(path, ec);
  return 0;
}
