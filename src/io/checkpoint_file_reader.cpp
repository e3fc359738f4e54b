// Reading checkpoint files (see checkpoint_file.h): groups, int64 attributes and fp32 ranges, each
// checksum block verified against its CRC32C (older files: HDF5's Fletcher-32).
#include <algorithm>
#include <utility>
#include <vector>

#include "base/input_path.h"
#include "io/checkpoint_file.h"
#include "io/checkpoint_file_hdf5.h"
#include "io/crc32c.h"
#include "io/hdf5_handle.h"

namespace glm {

Result<std::optional<int64_t>> checksum_block_bytes(hid_t file, const std::string& path) {
  const htri_t has = H5Aexists(file, kChecksumBlockAttribute);
  if (has < 0) return GLM_USER_ERROR(path, ": the root attributes cannot be read (truncated or corrupt)");
  if (has == 0) return std::optional<int64_t>();
  int64_t bytes = 0;
  H5Handle attr(H5Aopen(file, kChecksumBlockAttribute, H5P_DEFAULT), H5Aclose);
  if (!attr.ok() || H5Aread(attr.get(), H5T_NATIVE_INT64, &bytes) < 0)
    return GLM_USER_ERROR(path, ": the attribute ", kChecksumBlockAttribute, " cannot be read (corrupt)");
  if (bytes <= 0 || bytes % 4 != 0)
    return GLM_USER_ERROR(path, ": attribute ", kChecksumBlockAttribute, " is ", bytes,
                          ", not a positive multiple of 4");
  return std::optional<int64_t>(bytes);
}

namespace {

// Elements [first, first + count) of a 1-D dataset into out; false when HDF5 cannot read them.
template <typename T>
bool read_slab(hid_t ds, hid_t type, int64_t first, int64_t count, T* out) {
  H5Handle space(H5Dget_space(ds), H5Sclose);
  const hsize_t start = static_cast<hsize_t>(first), n = static_cast<hsize_t>(count);
  if (!space.ok() || H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, &start, nullptr, &n, nullptr) < 0) return false;
  H5Handle mem(H5Screate_simple(1, &n, nullptr), H5Sclose);
  return mem.ok() && H5Dread(ds, type, mem.get(), space.get(), H5P_DEFAULT, out) >= 0;
}

Result<int64_t> length_of(hid_t ds, const std::string& where) {
  H5Handle space(H5Dget_space(ds), H5Sclose);
  hsize_t n = 0;
  if (!space.ok() || H5Sget_simple_extent_ndims(space.get()) != 1 ||
      H5Sget_simple_extent_dims(space.get(), &n, nullptr) < 0)
    return GLM_USER_ERROR(where, " is not a 1-D dataset");
  return static_cast<int64_t>(n);
}

}  // namespace

Status read_checked_range(hid_t group, const std::string& group_name, const char* dataset, const std::string& path,
                          std::optional<int64_t> block_bytes, int64_t first, std::span<float> out) {
  const std::string where = path + ": " + group_name + "/" + dataset;
  H5Handle ds(H5Dopen2(group, dataset, H5P_DEFAULT), H5Dclose);
  if (!ds.ok()) return GLM_USER_ERROR(where, " is missing");
  GLM_ASSIGN_OR_RETURN(const int64_t length, length_of(ds.get(), where));
  const int64_t count = static_cast<int64_t>(out.size());
  if (first < 0 || first + count > length)
    return GLM_USER_ERROR(where, " is shorter than its attributes say (", length, " elements, [", first, ", ",
                          first + count, ") wanted)");
  if (count == 0) return Status::ok();
  if (!block_bytes) {  // an older file: chunks with Fletcher-32, checked by HDF5
    if (!read_slab(ds.get(), H5T_NATIVE_FLOAT, first, count, out.data()))
      return GLM_USER_ERROR(where, " cannot be read (truncated or corrupt: its checksum does not match)");
    return Status::ok();
  }
  const int64_t per_block = *block_bytes / 4;
  const int64_t b0 = first / per_block, b1 = (first + count + per_block - 1) / per_block;
  const int64_t lo = b0 * per_block, hi = std::min(length, b1 * per_block);
  const std::string crc_name = std::string(dataset) + ".crc32c";
  H5Handle sums_ds(H5Dopen2(group, crc_name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!sums_ds.ok()) return GLM_USER_ERROR(where, " has no checksums (", group_name, "/", crc_name, " is missing)");
  GLM_ASSIGN_OR_RETURN(const int64_t sums_length, length_of(sums_ds.get(), where + ".crc32c"));
  if (sums_length != (length + per_block - 1) / per_block)
    return GLM_USER_ERROR(where, ".crc32c holds ", sums_length, " checksums for ", (length + per_block - 1) / per_block,
                          " blocks");
  std::vector<uint32_t> sums(static_cast<size_t>(b1 - b0));
  if (!read_slab(sums_ds.get(), H5T_NATIVE_UINT32, b0, b1 - b0, sums.data()))
    return GLM_USER_ERROR(where, ".crc32c cannot be read (truncated or corrupt)");
  // Aligned whole blocks land in place; otherwise through a scratch copy of the covering blocks.
  std::vector<float> scratch;
  float* blocks = out.data();
  if (lo != first || hi != first + count) {
    scratch.resize(static_cast<size_t>(hi - lo));
    blocks = scratch.data();
  }
  if (!read_slab(ds.get(), H5T_NATIVE_FLOAT, lo, hi - lo, blocks))
    return GLM_USER_ERROR(where, " cannot be read (truncated or corrupt)");
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t begin = b * per_block, end = std::min(length, begin + per_block);
    const uint32_t got = crc32c(blocks + (begin - lo), static_cast<size_t>(end - begin) * 4);
    if (got != sums[static_cast<size_t>(b - b0)])
      return GLM_USER_ERROR(where, " is corrupt: elements [", begin, ", ", end, ") fail their CRC32C checksum (stored ",
                            sums[static_cast<size_t>(b - b0)], ", computed ", got, ")");
  }
  if (blocks != out.data()) std::copy(blocks + (first - lo), blocks + (first - lo) + count, out.begin());
  return Status::ok();
}

CheckpointGroupReader::CheckpointGroupReader(std::unique_ptr<H5Handle> group, std::string name, std::string path,
                                             std::optional<int64_t> block_bytes)
    : group_(std::move(group)), name_(std::move(name)), path_(std::move(path)), block_bytes_(block_bytes) {}
CheckpointGroupReader::CheckpointGroupReader(CheckpointGroupReader&&) noexcept = default;
CheckpointGroupReader& CheckpointGroupReader::operator=(CheckpointGroupReader&&) noexcept = default;
CheckpointGroupReader::~CheckpointGroupReader() = default;

bool CheckpointGroupReader::has_attribute(const std::string& name) const {
  return H5Aexists(group_->get(), name.c_str()) > 0;
}

std::optional<std::vector<int64_t>> CheckpointGroupReader::int64_attribute(const std::string& name) const {
  H5Handle attr(H5Aopen(group_->get(), name.c_str(), H5P_DEFAULT), H5Aclose);
  H5Handle space(attr.ok() ? H5Aget_space(attr.get()) : -1, H5Sclose);
  const hssize_t n = space.ok() ? H5Sget_simple_extent_npoints(space.get()) : -1;
  if (n <= 0) return std::nullopt;
  std::vector<int64_t> values(static_cast<size_t>(n));
  if (H5Aread(attr.get(), H5T_NATIVE_INT64, values.data()) < 0) return std::nullopt;
  return values;
}

Status CheckpointGroupReader::read(const char* dataset, int64_t first, std::span<float> out) const {
  return read_checked_range(group_->get(), name_, dataset, path_, block_bytes_, first, out);
}

CheckpointFileReader::CheckpointFileReader(std::unique_ptr<H5Handle> file, std::string path,
                                           std::optional<int64_t> block_bytes)
    : file_(std::move(file)), path_(std::move(path)), block_bytes_(block_bytes) {}
CheckpointFileReader::CheckpointFileReader(CheckpointFileReader&&) noexcept = default;
CheckpointFileReader& CheckpointFileReader::operator=(CheckpointFileReader&&) noexcept = default;
CheckpointFileReader::~CheckpointFileReader() = default;

Result<CheckpointFileReader> CheckpointFileReader::open(const std::string& path) {
  GLM_RETURN_IF_ERROR(check_input_path(path));
  quiet_hdf5();
  auto file = std::make_unique<H5Handle>(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file->ok()) return GLM_USER_ERROR(path, " is not a readable HDF5 file (truncated or corrupt)");
  GLM_ASSIGN_OR_RETURN(const std::optional<int64_t> block_bytes, checksum_block_bytes(file->get(), path));
  return CheckpointFileReader(std::move(file), path, block_bytes);
}

Result<CheckpointGroupReader> CheckpointFileReader::group(const std::string& name) const {
  auto group = std::make_unique<H5Handle>(H5Gopen2(file_->get(), name.c_str(), H5P_DEFAULT), H5Gclose);
  if (!group->ok()) return GLM_USER_ERROR(path_, ": group ", name, " is missing");
  return CheckpointGroupReader(std::move(group), name, path_, block_bytes_);
}

}  // namespace glm
