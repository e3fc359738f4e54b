// safetensors reading (mmap, full header validation) and writing (atomic).
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "base/input_path.h"
#include "base/temp_names.h"
#include "io/durable_file.h"

namespace glm {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit

struct DTypeName {
  StDType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeName kDTypes[] = {
    {StDType::BOOL, "BOOL", 1}, {StDType::U8, "U8", 1},           {StDType::I8, "I8", 1},
    {StDType::I16, "I16", 2},   {StDType::U16, "U16", 2},         {StDType::F16, "F16", 2},
    {StDType::BF16, "BF16", 2}, {StDType::I32, "I32", 4},         {StDType::U32, "U32", 4},
    {StDType::F32, "F32", 4},   {StDType::F64, "F64", 8},         {StDType::I64, "I64", 8},
    {StDType::U64, "U64", 8},   {StDType::F8_E4M3, "F8_E4M3", 1}, {StDType::F8_E5M2, "F8_E5M2", 1}};

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

Status header_error(const std::string& path, const std::string& what) {
  return GLM_USER_ERROR("safetensors file '", path, "': ", what);
}

}  // namespace

size_t st_dtype_size(StDType d) {
  for (const auto& t : kDTypes)
    if (t.dtype == d) return t.size;
  return 0;
}

const char* st_dtype_name(StDType d) {
  for (const auto& t : kDTypes)
    if (t.dtype == d) return t.name;
  return "?";
}

int64_t StTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

Result<std::shared_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  GLM_RETURN_IF_ERROR(check_input_path(path));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return GLM_USER_ERROR("cannot open '", path, "': ", std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return GLM_USER_ERROR("cannot stat '", path, "': ", std::strerror(e));
  }
  std::shared_ptr<MappedFile> m(new MappedFile());
  m->size_ = static_cast<size_t>(st.st_size);
  if (m->size_ > 0) {
    m->data_ = mmap(nullptr, m->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m->data_ == MAP_FAILED) {
      const int e = errno;
      m->data_ = nullptr;
      ::close(fd);
      return GLM_ERROR(ErrorKind::io, "cannot memory-map '", path, "': ", std::strerror(e));
    }
  }
  ::close(fd);
  return m;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) munmap(data_, size_);
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  GLM_ASSIGN_OR_RETURN(f.map_, MappedFile::open(path));
  const auto bytes = f.map_->bytes();
  if (bytes.size() < 8) return header_error(path, concat("file of ", bytes.size(), " bytes is too short"));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  if (header_len > kMaxHeaderBytes) return header_error(path, concat("header length ", header_len, " is too large"));
  if (header_len > bytes.size() - 8)
    return header_error(path, concat("header length ", header_len, " exceeds the file size ", bytes.size()));
  const char* header = reinterpret_cast<const char*>(bytes.data() + 8);
  if (header_len == 0 || header[0] != '{') return header_error(path, "header does not start with '{'");
  f.data_offset_ = 8 + static_cast<size_t>(header_len);
  const uint64_t data_size = bytes.size() - f.data_offset_;

  // Duplicate names are invalid, but a JSON parser keeps the last one silently: catch them here.
  std::set<std::string> seen;
  std::string duplicate;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header, header + header_len,
                              [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
                                if (depth == 1 && event == nlohmann::json::parse_event_t::key) {
                                  const auto key = parsed.get<std::string>();
                                  if (!seen.insert(key).second && duplicate.empty()) duplicate = key;
                                }
                                return true;
                              });
  } catch (const nlohmann::json::exception& e) {
    return header_error(path, concat("header is not valid JSON (", e.what(), ")"));
  }
  if (!duplicate.empty()) return header_error(path, concat("tensor '", duplicate, "' appears twice"));
  if (!j.is_object()) return header_error(path, "header is not a JSON object");

  for (auto& [name, entry] : j.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return header_error(path, "__metadata__ is not an object");
      for (auto& [k, v] : entry.items()) {
        if (!v.is_string()) return header_error(path, concat("__metadata__ value of '", k, "' is not a string"));
        f.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = concat("tensor '", name, "': ");
    if (!entry.is_object()) return header_error(path, where + "entry is not an object");
    auto dt = entry.find("dtype");
    auto shape = entry.find("shape");
    auto offsets = entry.find("data_offsets");
    if (dt == entry.end() || !dt->is_string()) return header_error(path, where + "missing string \"dtype\"");
    if (shape == entry.end() || !shape->is_array()) return header_error(path, where + "missing array \"shape\"");
    if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
        !(*offsets)[1].is_number_unsigned())
      return header_error(path, where + "\"data_offsets\" must be two unsigned integers");
    StTensorInfo t;
    t.name = name;
    const std::string dname = dt->get<std::string>();
    const DTypeName* found = nullptr;
    for (const auto& d : kDTypes)
      if (dname == d.name) found = &d;
    if (found == nullptr) return header_error(path, where + "unknown dtype '" + dname + "'");
    t.dtype = found->dtype;
    uint64_t numel = 1;
    for (const auto& s : *shape) {
      if (!s.is_number_unsigned()) return header_error(path, where + "shape entries must be non-negative integers");
      const uint64_t d = s.get<uint64_t>();
      if (d != 0 && numel > UINT64_MAX / 8 / d) return header_error(path, where + "shape overflows");
      numel *= d;
      t.shape.push_back(static_cast<int64_t>(d));
    }
    t.begin = (*offsets)[0].get<uint64_t>();
    t.end = (*offsets)[1].get<uint64_t>();
    if (t.begin > t.end || t.end > data_size)
      return header_error(path, where + concat("data_offsets [", t.begin, ", ", t.end, ") outside the ", data_size,
                                               "-byte data section"));
    if (t.end - t.begin != numel * found->size)
      return header_error(path, where + concat("shape and dtype need ", numel * found->size, " bytes but data_offsets ",
                                               "span ", t.end - t.begin));
    f.tensors_.push_back(std::move(t));
  }
  // The data section must be covered exactly: no overlaps, no holes.
  std::vector<const StTensorInfo*> order;
  for (const auto& t : f.tensors_) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](auto* a, auto* b) { return std::tie(a->begin, a->end) < std::tie(b->begin, b->end); });
  uint64_t cursor = 0;
  for (const auto* t : order) {
    if (t->begin < cursor)
      return header_error(path, concat("tensor '", t->name, "' overlaps the tensor before it in the data section"));
    if (t->begin > cursor) return header_error(path, concat("unused bytes before tensor '", t->name, "'"));
    cursor = t->end;
  }
  if (cursor != data_size)
    return header_error(path, concat("data section has ", data_size - cursor, " bytes beyond the last tensor"));
  for (size_t i = 0; i < f.tensors_.size(); ++i) f.index_[f.tensors_[i].name] = i;
  return f;
}

const StTensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::span<const std::byte> SafetensorsFile::data(const StTensorInfo& t) const {
  return map_->bytes().subspan(data_offset_ + t.begin, t.end - t.begin);
}

Status read_as_f32(const SafetensorsFile& file, const StTensorInfo& t, std::span<float> out) {
  const int64_t n = t.numel();
  if (static_cast<int64_t>(out.size()) != n)
    return GLM_INTERNAL_ERROR("read_as_f32: ", out.size(), " slots for ", n, " elements of '", t.name, "'");
  if (n == 0) return Status::ok();  // an empty tensor: nothing to copy (memcpy's pointers must not be null)
  const std::byte* src = file.data(t).data();
  switch (t.dtype) {
    case StDType::F32:
      std::memcpy(out.data(), src, static_cast<size_t>(n) * 4);
      break;
    case StDType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, src + 2 * i, 2);
        const uint32_t bits = static_cast<uint32_t>(v) << 16;
        std::memcpy(&out[static_cast<size_t>(i)], &bits, 4);
      }
      break;
    case StDType::F16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, src + 2 * i, 2);
        out[static_cast<size_t>(i)] = half_to_float(v);
      }
      break;
    case StDType::F64:
      for (int64_t i = 0; i < n; ++i) {
        double v;
        std::memcpy(&v, src + 8 * i, 8);
        out[static_cast<size_t>(i)] = static_cast<float>(v);
      }
      break;
    default:
      return GLM_USER_ERROR("tensor '", t.name, "' in '", file.path(), "' has dtype ", st_dtype_name(t.dtype),
                            "; expected F32, BF16, F16 or F64");
  }
  return Status::ok();
}

Result<SafetensorsCheckpoint> SafetensorsCheckpoint::open(const std::string& dir) {
  namespace fs = std::filesystem;
  SafetensorsCheckpoint c;
  c.dir_ = dir;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single = fs::path(dir) / "model.safetensors";
  std::map<std::string, std::string> expected;  // tensor -> shard file, from the index
  std::vector<std::string> shard_files;
  if (fs::exists(index_path)) {
    GLM_RETURN_IF_ERROR(check_input_path(index_path.string()));
    nlohmann::json j;
    try {
      std::ifstream in(index_path);
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      return GLM_USER_ERROR("'", index_path.string(), "' is not valid JSON (", e.what(), ")");
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      return GLM_USER_ERROR("'", index_path.string(), "' has no \"weight_map\" object");
    std::set<std::string> files;
    for (auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string())
        return GLM_USER_ERROR("'", index_path.string(), "': weight_map[\"", name, "\"] is not a string");
      expected[name] = file.get<std::string>();
      files.insert(file.get<std::string>());
    }
    shard_files.assign(files.begin(), files.end());
  } else if (fs::exists(single)) {
    shard_files.push_back("model.safetensors");
  } else {
    return GLM_USER_ERROR("'", dir, "' holds neither model.safetensors nor model.safetensors.index.json");
  }
  for (const auto& name : shard_files) {
    if (name.find('/') != std::string::npos || name == "..")
      return GLM_USER_ERROR("'", index_path.string(), "' names a shard outside the directory: '", name, "'");
    GLM_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open((fs::path(dir) / name).string()));
    c.files_.push_back(std::move(f));
  }
  for (size_t i = 0; i < c.files_.size(); ++i) {
    for (const auto& t : c.files_[i].tensors()) {
      if (c.where_.count(t.name)) return GLM_USER_ERROR("tensor '", t.name, "' appears in two shards of '", dir, "'");
      c.where_[t.name] = {i, &t};
    }
  }
  for (const auto& [name, file] : expected) {
    auto it = c.where_.find(name);
    if (it == c.where_.end())
      return GLM_USER_ERROR("index of '", dir, "' places tensor '", name, "' in '", file, "', which does not hold it");
  }
  return c;
}

SafetensorsCheckpoint::Located SafetensorsCheckpoint::find(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) return {};
  return {&files_[it->second.first], it->second.second};
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> n;
  for (const auto& [name, where] : where_) n.push_back(name);
  return n;
}

namespace {

uint64_t byte_size(StDType dtype, const std::vector<int64_t>& shape) {
  uint64_t numel = 1;
  for (int64_t s : shape) numel *= static_cast<uint64_t>(s);
  return numel * st_dtype_size(dtype);
}

// The 8-byte length and the JSON header, padded with spaces so the data starts 8-byte aligned.
Result<std::string> make_header(const std::vector<StTensorSpec>& tensors,
                                const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::set<std::string> names;
  for (const auto& t : tensors) {
    if (!names.insert(t.name).second) return GLM_INTERNAL_ERROR("tensor '", t.name, "' written twice");
    const uint64_t bytes = t.bytes();
    header[t.name] = {
        {"dtype", st_dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t len = text.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((len >> (8 * i)) & 0xff);
  return out + text;
}

Status rename_into_place(const std::string& tmp, const std::string& path) {
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return GLM_ERROR(ErrorKind::io, "cannot rename '", tmp, "' to '", path, "': ", ec.message());
  return Status::ok();
}

}  // namespace

uint64_t StTensorSpec::bytes() const { return byte_size(dtype, shape); }

Status write_safetensors(const std::string& path, const std::vector<StTensorView>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  std::vector<StTensorSpec> specs;
  for (const auto& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  GLM_ASSIGN_OR_RETURN(const std::string header, make_header(specs, metadata));
  const std::string tmp = temp_path_for(path).string();
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return GLM_FILE_ERROR("cannot write", path, errno);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    for (const auto& t : tensors)
      out.write(static_cast<const char*>(t.data), static_cast<std::streamsize>(byte_size(t.dtype, t.shape)));
    out.flush();
    if (!out) {
      const int err = errno;
      out.close();
      ::unlink(tmp.c_str());
      return GLM_FILE_ERROR("cannot write", path, err);
    }
  }
  return rename_into_place(tmp, path);
}

Status write_sharded_safetensors(const std::string& dir, const std::vector<StTensorView>& tensors,
                                 uint64_t max_shard_bytes) {
  std::vector<StTensorSpec> specs;
  for (const auto& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  GLM_ASSIGN_OR_RETURN(SafetensorsShardWriter writer, SafetensorsShardWriter::create(dir, specs, max_shard_bytes));
  for (const auto& t : tensors) GLM_RETURN_IF_ERROR(writer.write(t.name, t.data));
  return writer.finish();
}

Result<SafetensorsShardWriter> SafetensorsShardWriter::create(const std::string& dir, std::vector<StTensorSpec> tensors,
                                                              uint64_t max_shard_bytes) {
  SafetensorsShardWriter w;
  w.dir_ = dir;
  // transformers' rule: a tensor that would overflow a non-empty shard starts the next one; a
  // tensor larger than the limit gets a shard of its own.
  size_t shards = 0, in_shard = 0;
  uint64_t current = 0;
  for (const auto& t : tensors) {
    const uint64_t bytes = t.bytes();
    if (shards == 0 || (in_shard > 0 && current + bytes > max_shard_bytes)) {
      ++shards;
      in_shard = 0;
      current = 0;
    }
    w.shard_of_.push_back(shards - 1);
    ++in_shard;
    current += bytes;
    w.total_bytes_ += bytes;
  }
  if (shards <= 1) {
    w.shard_names_ = {"model.safetensors"};
  } else {
    for (size_t i = 0; i < shards; ++i) {
      char name[64];
      std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, shards);
      w.shard_names_.push_back(name);
    }
  }
  w.tensors_ = std::move(tensors);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return GLM_ERROR(ErrorKind::io, "cannot create '", dir, "': ", ec.message());
  return w;
}

Status SafetensorsShardWriter::close_shard() {
  if (open_shard_ < 0) return Status::ok();
  const std::string path = dir_ + "/" + shard_names_[static_cast<size_t>(open_shard_)];
  out_->flush();
  const bool ok = static_cast<bool>(*out_);
  const int err = errno;
  out_.reset();
  if (!ok) return GLM_FILE_ERROR("cannot write", path, err);
  GLM_RETURN_IF_ERROR(rename_into_place(open_tmp_, path));
  files_.push_back(shard_names_[static_cast<size_t>(open_shard_)]);
  open_shard_ = -1;
  return Status::ok();
}

Status SafetensorsShardWriter::write(const std::string& name, const void* data) {
  if (next_ >= tensors_.size() || tensors_[next_].name != name)
    return GLM_INTERNAL_ERROR("SafetensorsShardWriter: got '", name, "', expected ",
                              next_ < tensors_.size() ? "'" + tensors_[next_].name + "'" : "no more tensors");
  const size_t shard = shard_of_[next_];
  if (open_shard_ != static_cast<int>(shard)) {
    GLM_RETURN_IF_ERROR(close_shard());
    std::vector<StTensorSpec> mine;
    for (size_t i = next_; i < tensors_.size() && shard_of_[i] == shard; ++i) mine.push_back(tensors_[i]);
    GLM_ASSIGN_OR_RETURN(const std::string header, make_header(mine, {{"format", "pt"}}));
    const std::string path = dir_ + "/" + shard_names_[shard];
    open_tmp_ = temp_path_for(path).string();
    out_ = std::make_unique<std::ofstream>(open_tmp_, std::ios::binary | std::ios::trunc);
    if (!*out_) return GLM_FILE_ERROR("cannot write", path, errno);
    out_->write(header.data(), static_cast<std::streamsize>(header.size()));
    open_shard_ = static_cast<int>(shard);
  }
  out_->write(static_cast<const char*>(data), static_cast<std::streamsize>(tensors_[next_].bytes()));
  if (!*out_) return GLM_FILE_ERROR("cannot write", dir_ + "/" + shard_names_[shard], errno);
  ++next_;
  return Status::ok();
}

Status SafetensorsShardWriter::finish() {
  if (next_ != tensors_.size())
    return GLM_INTERNAL_ERROR("SafetensorsShardWriter: ", tensors_.size() - next_, " tensors were never written");
  if (tensors_.empty()) {  // an empty model.safetensors, as the reference writes for no tensors
    GLM_RETURN_IF_ERROR(write_safetensors(dir_ + "/model.safetensors", {}));
    files_.push_back("model.safetensors");
    return Status::ok();
  }
  GLM_RETURN_IF_ERROR(close_shard());
  if (shard_names_.size() == 1) return Status::ok();
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t i = 0; i < tensors_.size(); ++i) weight_map[tensors_[i].name] = shard_names_[shard_of_[i]];
  nlohmann::ordered_json index = {{"metadata", {{"total_size", total_bytes_}}}, {"weight_map", weight_map}};
  const std::string path = dir_ + "/model.safetensors.index.json";
  GLM_RETURN_IF_ERROR(write_file_durably(path, index.dump(2) + "\n"));
  files_.push_back("model.safetensors.index.json");
  return Status::ok();
}

}  // namespace glm
