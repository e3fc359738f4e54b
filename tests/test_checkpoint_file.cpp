// Checkpoint files (io/checkpoint_file.h) and CRC32C: bytes round-trip at every block boundary with
// O_DIRECT and without, a flipped byte fails exactly the checksum block that holds it (naming the
// dataset), older Fletcher-32 files still read, and write/fill failures come back as errors.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "io/checkpoint_file.h"
#include "io/checkpoint_file_hdf5.h"
#include "io/crc32c.h"
#include "test_util.h"

namespace glm::test {
namespace {

namespace fs = std::filesystem;

// This process's scratch directory, removed when the test program ends.
fs::path scratch_root() { return fs::temp_directory_path() / ("glm_ckpt_file_tests_" + std::to_string(::getpid())); }
[[maybe_unused]] const ::testing::Environment* const kRemoveScratch =
    ::testing::AddGlobalTestEnvironment(new RemoveDirectoryAtEnd(scratch_root()));

fs::path scratch(const std::string& name) {
  const fs::path dir = scratch_root();
  fs::create_directories(dir);
  return dir / name;
}

// Exact values per (group, dataset, element), so any misplaced block shows.
float value_at(size_t g, size_t d, int64_t i) { return static_cast<float>(g * 1000003 + d * 100003 + i) * 0.5f; }

// Small blocks so that a few thousand elements cross many checksum and I/O blocks.
CheckpointFileOptions small_blocks(bool direct) {
  CheckpointFileOptions o;
  o.checksum_block_bytes = 4096;  // 1024 floats
  o.io_block_bytes = 3 * 4096;
  o.buffers = 2;
  o.direct_io = direct;
  return o;
}

std::vector<CheckpointFileGroup> layout() {
  return {{"g0", {{"begin_count", {0, 5000}}}, {{"a", 5000}, {"b", 1}}},
          {"g1", {{"begin_count", {7, 3}}}, {}},
          {"g2", {{"begin_count", {1, 2}}}, {{"a", 1024}, {"b", 3 * 3072 + 7}, {"c", 1023}}}};
}

Status fill_values(size_t g, size_t d, int64_t first, std::span<float> dst) {
  for (size_t i = 0; i < dst.size(); ++i) dst[i] = value_at(g, d, first + static_cast<int64_t>(i));
  return Status::ok();
}

struct OpenFile {
  explicit OpenFile(const fs::path& p) : id(H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)) {}
  ~OpenFile() {
    if (id >= 0) H5Fclose(id);
  }
  hid_t id;
};

Status read(const fs::path& path, const std::string& group, const char* dataset, int64_t first,
            std::vector<float>& out) {
  OpenFile f(path);
  if (f.id < 0) return GLM_USER_ERROR(path.string(), " does not open");
  auto block = checksum_block_bytes(f.id, path.string());
  if (!block.is_ok()) return block.status();
  const hid_t g = H5Gopen2(f.id, group.c_str(), H5P_DEFAULT);
  Status s = read_checked_range(g, group, dataset, path.string(), block.value(), first, out);
  H5Gclose(g);
  return s;
}

int64_t dataset_offset(const fs::path& path, const char* name) {
  OpenFile f(path);
  const hid_t ds = H5Dopen2(f.id, name, H5P_DEFAULT);
  const haddr_t at = H5Dget_offset(ds);
  H5Dclose(ds);
  return at == HADDR_UNDEF ? -1 : static_cast<int64_t>(at);
}

void flip_byte(const fs::path& path, int64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  char c = 0;
  f.seekg(at);
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(at);
  f.write(&c, 1);
}

TEST(Crc32c, KnownValuesAndTheFastPathAgreesWithTheTables) {
  const std::string digits = "123456789";
  EXPECT_EQ(crc32c(digits.data(), digits.size()), 0xE3069283u);
  EXPECT_EQ(crc32c_portable(digits.data(), digits.size()), 0xE3069283u);
  const std::vector<unsigned char> zeros(32, 0), ones(32, 0xFF);
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  std::vector<unsigned char> bytes(100000);
  std::mt19937 rng(7);
  for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  // Lengths around the 3 x 8 KiB stride of the interleaved path, at odd starting addresses.
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{24575}, size_t{24576}, size_t{24577}, size_t{49152 + 13},
                   size_t{99990}}) {
    EXPECT_EQ(crc32c(bytes.data() + 3, n), crc32c_portable(bytes.data() + 3, n)) << n;
    const size_t half = n / 2;  // continuing from a partial CRC equals one pass
    EXPECT_EQ(crc32c(bytes.data() + 3 + half, n - half, crc32c(bytes.data() + 3, half)),
              crc32c_portable(bytes.data() + 3, n))
        << n;
  }
}

TEST(CheckpointFile, EveryRangeReadsBackWithAndWithoutDirectIo) {
  for (bool direct : {true, false}) {
    const fs::path path = scratch(direct ? "direct.h5" : "buffered.h5");
    auto stats = write_checkpoint_file(path.string(), layout(), fill_values, small_blocks(direct));
    ASSERT_TRUE(stats.is_ok()) << stats.status().message();
    EXPECT_EQ(stats.value().data_bytes, 4 * (5000 + 1 + 1024 + 3 * 3072 + 7 + 1023));
    EXPECT_EQ(stats.value().file_bytes, static_cast<int64_t>(fs::file_size(path)));
    if (!direct) {
      EXPECT_FALSE(stats.value().direct);
    }
    // Each dataset 4 KiB-aligned when it is at least 4 KiB (O_DIRECT writes it in place).
    EXPECT_EQ(dataset_offset(path, "g0/a") % 4096, 0);
    EXPECT_EQ(dataset_offset(path, "g2/b") % 4096, 0);
    const std::vector<CheckpointFileGroup> groups = layout();
    for (size_t g = 0; g < groups.size(); ++g) {
      for (size_t d = 0; d < groups[g].datasets.size(); ++d) {
        const auto& [name, count] = groups[g].datasets[d];
        // Whole, one element, and ranges starting/ending on and beside block boundaries.
        const std::vector<std::pair<int64_t, int64_t>> ranges = {{0, count},   {count - 1, count}, {0, 1},
                                                                 {1023, 1025}, {1024, 2048},       {5, count - 3}};
        for (auto [lo, hi] : ranges) {
          lo = std::clamp<int64_t>(lo, 0, count);
          hi = std::clamp<int64_t>(hi, lo, count);
          std::vector<float> got(static_cast<size_t>(hi - lo));
          Status s = read(path, groups[g].name, name.c_str(), lo, got);
          ASSERT_TRUE(s.is_ok()) << s.message();
          for (int64_t i = lo; i < hi; ++i)
            ASSERT_EQ(got[static_cast<size_t>(i - lo)], value_at(g, d, i)) << groups[g].name << "/" << name << " " << i;
        }
      }
    }
    std::vector<float> beyond(2);
    Status s = read(path, "g0", "b", 0, beyond);
    ASSERT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find("g0/b is shorter than its attributes say"), std::string::npos) << s.message();
  }
}

TEST(CheckpointFile, AFlippedByteFailsOnlyItsBlockNamingTheDataset) {
  const fs::path path = scratch("flipped.h5");
  ASSERT_TRUE(write_checkpoint_file(path.string(), layout(), fill_values, small_blocks(true)).is_ok());
  // Element 2100 of g2/b sits in its third checksum block (elements [2048, 3072)).
  flip_byte(path, dataset_offset(path, "g2/b") + 2100 * 4 + 1);
  std::vector<float> got(10);
  Status s = read(path, "g2", "b", 2095, got);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.exit_code(), 2);
  EXPECT_NE(s.message().find(path.string() + ": g2/b is corrupt: elements [2048, 3072) fail their CRC32C"),
            std::string::npos)
      << s.message();
  got.assign(2048, 0);  // the blocks before it still read
  EXPECT_TRUE(read(path, "g2", "b", 0, got).is_ok());
  got.assign(3000, 0);
  EXPECT_TRUE(read(path, "g2", "b", 3072, got).is_ok());
  // A damaged checksum is a mismatch too.
  const fs::path sums = scratch("flipped_sums.h5");
  ASSERT_TRUE(write_checkpoint_file(sums.string(), layout(), fill_values, small_blocks(true)).is_ok());
  flip_byte(sums, dataset_offset(sums, "g0/a.crc32c") + 4);  // block 1's checksum
  got.assign(1, 0);
  EXPECT_TRUE(read(sums, "g0", "a", 0, got).is_ok());
  s = read(sums, "g0", "a", 1500, got);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("g0/a is corrupt: elements [1024, 2048)"), std::string::npos) << s.message();
}

TEST(CheckpointFile, OlderFletcherFilesStillRead) {
  const fs::path path = scratch("fletcher.h5");
  {
    const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const hid_t g = H5Gcreate2(f, "unit_00000", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    const hsize_t n = 3000, chunk = 1000;
    const hid_t plist = H5Pcreate(H5P_DATASET_CREATE);
    ASSERT_GE(H5Pset_chunk(plist, 1, &chunk), 0);
    ASSERT_GE(H5Pset_fletcher32(plist), 0);
    const hid_t space = H5Screate_simple(1, &n, nullptr);
    const hid_t ds = H5Dcreate2(g, "master", H5T_IEEE_F32LE, space, H5P_DEFAULT, plist, H5P_DEFAULT);
    std::vector<float> v(n);
    std::iota(v.begin(), v.end(), 1.0f);
    ASSERT_GE(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0);
    H5Dclose(ds);
    H5Sclose(space);
    H5Pclose(plist);
    H5Gclose(g);
    H5Fclose(f);
  }
  {
    OpenFile f(path);
    auto block = checksum_block_bytes(f.id, path.string());
    ASSERT_TRUE(block.is_ok());
    EXPECT_FALSE(block.value().has_value());
  }
  std::vector<float> got(5);
  ASSERT_TRUE(read(path, "unit_00000", "master", 2995, got).is_ok());
  EXPECT_EQ(got[4], 3000.0f);
}

TEST(CheckpointFile, FillErrorsAndThePauseHook) {
  const fs::path path = scratch("fails.h5");
  auto failing = [](size_t g, size_t d, int64_t first, std::span<float> dst) -> Status {
    if (g == 2 && d == 1 && first > 0) return GLM_ERROR(ErrorKind::io, "download failed");
    return fill_values(g, d, first, dst);
  };
  auto r = write_checkpoint_file(path.string(), layout(), failing, small_blocks(true));
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "download failed");

  // When the pause comes, every earlier group's bytes are in the file and no later group was filled.
  CheckpointFileOptions o = small_blocks(true);
  o.pause_before_group = 2;
  bool paused = false, later_filled = false;
  o.at_pause = [&] {
    paused = true;
    std::vector<float> got(5000);
    std::ifstream in(path, std::ios::binary);
    in.seekg(dataset_offset(path, "g0/a"));
    in.read(reinterpret_cast<char*>(got.data()), 5000 * 4);
    for (int64_t i = 0; i < 5000; ++i) ASSERT_EQ(got[static_cast<size_t>(i)], value_at(0, 0, i)) << i;
    EXPECT_FALSE(later_filled);
  };
  auto watch = [&](size_t g, size_t d, int64_t first, std::span<float> dst) {
    later_filled = later_filled || g >= 2;
    return fill_values(g, d, first, dst);
  };
  ASSERT_TRUE(write_checkpoint_file(path.string(), layout(), watch, o).is_ok());
  EXPECT_TRUE(paused);

  const fs::path nowhere = scratch("no_such_dir") / "x.h5";
  auto missing = write_checkpoint_file(nowhere.string(), layout(), fill_values, small_blocks(true));
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("cannot create '" + nowhere.string() + "'"), std::string::npos);
}

}  // namespace
}  // namespace glm::test
