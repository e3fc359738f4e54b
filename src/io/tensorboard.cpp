// TensorBoard event files (see tensorboard.h).
#include "io/tensorboard.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "io/crc32c.h"
#include "io/durable_file.h"
#ifdef GLM_TENSORBOARD
#include "tensorboard_event.pb.h"
#endif

namespace glm {

namespace fs = std::filesystem;

bool tensorboard_available() {
#ifdef GLM_TENSORBOARD
  return true;
#else
  return false;
#endif
}

struct TensorBoardWriter::File {
  std::ofstream out;
};

TensorBoardWriter::~TensorBoardWriter() = default;

#ifndef GLM_TENSORBOARD

Result<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::open(const std::string&, int64_t) {
  return GLM_USER_ERROR("--report_to tensorboard: this glm_hpc was built without protobuf (install libprotobuf-dev "
                        "and protobuf-compiler and build again); --report_to none writes logging.jsonl alone");
}
Status TensorBoardWriter::scalar(const std::string&, int64_t, double) { return Status::ok(); }
Status TensorBoardWriter::text(const std::string&, int64_t, const std::string&) { return Status::ok(); }
Status TensorBoardWriter::flush() { return Status::ok(); }
Status TensorBoardWriter::write(const std::string&) { return Status::ok(); }

#else

namespace {

static_assert(std::endian::native == std::endian::little, "TFRecord lengths and CRCs are little-endian");

uint32_t masked_crc(const void* data, size_t bytes) {
  const uint32_t crc = crc32c(data, bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

bool is_event_file(const fs::path& p) { return p.filename().string().find(".tfevents.") != std::string::npos; }

// A file's records, each checked against its CRCs; a torn or damaged tail (a run killed while
// writing) ends the list there.
std::vector<std::string> read_records(const fs::path& path) {
  std::vector<std::string> records;
  std::ifstream in(path, std::ios::binary);
  for (;;) {
    char header[12];
    if (!in.read(header, sizeof(header))) break;
    uint64_t length = 0;
    uint32_t length_crc = 0;
    std::memcpy(&length, header, 8);
    std::memcpy(&length_crc, header + 8, 4);
    if (length_crc != masked_crc(header, 8) || length > (uint64_t{1} << 30)) break;
    std::string data(static_cast<size_t>(length), '\0');
    uint32_t data_crc = 0;
    if (!in.read(data.data(), static_cast<std::streamsize>(length)) ||
        !in.read(reinterpret_cast<char*>(&data_crc), 4) || data_crc != masked_crc(data.data(), data.size()))
      break;
    records.push_back(std::move(data));
  }
  return records;
}

std::string framed(const std::string& data) {
  std::string out(12, '\0');
  const uint64_t length = data.size();
  std::memcpy(out.data(), &length, 8);
  const uint32_t length_crc = masked_crc(out.data(), 8);
  std::memcpy(out.data() + 8, &length_crc, 4);
  out += data;
  const uint32_t data_crc = masked_crc(data.data(), data.size());
  out.append(reinterpret_cast<const char*>(&data_crc), 4);
  return out;
}

std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "localhost";
  return host;
}

}  // namespace

Result<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::open(const std::string& dir, int64_t resumed_step) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return GLM_USER_ERROR("cannot create the TensorBoard directory '", dir, "': ", ec.message());
  std::vector<fs::path> earlier;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (is_event_file(it->path())) earlier.push_back(it->path());
  if (ec) return GLM_USER_ERROR("cannot list the TensorBoard directory '", dir, "': ", ec.message());
  std::sort(earlier.begin(), earlier.end());
  std::unique_ptr<TensorBoardWriter> w(new TensorBoardWriter());
  const double now = wall_seconds();
  w->path_ = (fs::path(dir) / concat("events.out.tfevents.", static_cast<int64_t>(now), ".", host_name(), ".",
                                     static_cast<int64_t>(::getpid())))
                 .string();
  w->file_ = std::make_unique<File>();
  w->file_->out.open(w->path_, std::ios::binary | std::ios::trunc);
  if (!w->file_->out) return GLM_FILE_ERROR("cannot create", w->path_, errno);
  tensorboard::Event version;
  version.set_wall_time(now);
  version.set_file_version("brain.Event:2");
  GLM_RETURN_IF_ERROR(w->write(version.SerializeAsString()));
  // The earlier files' records up to the resumed step, then the files go.
  for (const fs::path& file : earlier) {
    if (resumed_step <= 0) break;
    for (const std::string& record : read_records(file)) {
      tensorboard::Event e;
      if (e.ParseFromString(record) && e.has_summary() && e.step() <= resumed_step) GLM_RETURN_IF_ERROR(w->write(record));
    }
  }
  GLM_RETURN_IF_ERROR(w->flush());
  for (const fs::path& file : earlier) {
    if (file == fs::path(w->path_)) continue;
    fs::remove(file, ec);
    if (ec) return GLM_USER_ERROR("cannot remove the earlier TensorBoard file '", file.string(), "': ", ec.message());
  }
  return w;
}

Status TensorBoardWriter::scalar(const std::string& tag, int64_t step, double value) {
  tensorboard::Event e;
  e.set_wall_time(wall_seconds());
  e.set_step(step);
  tensorboard::Summary::Value* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  return write(e.SerializeAsString());
}

Status TensorBoardWriter::text(const std::string& tag, int64_t step, const std::string& markdown) {
  tensorboard::Event e;
  e.set_wall_time(wall_seconds());
  e.set_step(step);
  tensorboard::Summary::Value* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  tensorboard::TensorProto* t = v->mutable_tensor();
  t->set_dtype(tensorboard::DT_STRING);
  t->add_string_val(markdown);
  return write(e.SerializeAsString());
}

Status TensorBoardWriter::write(const std::string& record) {
  const std::string bytes = framed(record);
  file_->out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!file_->out) return GLM_FILE_ERROR("cannot write", path_, errno);
  return Status::ok();
}

Status TensorBoardWriter::flush() {
  file_->out.flush();
  if (!file_->out) return GLM_FILE_ERROR("cannot write", path_, errno);
  return Status::ok();
}

#endif

}  // namespace glm
