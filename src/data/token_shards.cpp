// Token shard files: writing (temporary names, then renames; prepared.json last) and validated
// read-only memory maps.
#include "data/token_shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "base/json_fields.h"
#include "base/json_text.h"
#include "base/scope_exit.h"
#include "base/stop_signal.h"
#include "base/errno_text.h"
#include "base/temp_names.h"

namespace glm {
namespace {

static_assert(std::endian::native == std::endian::little, "token shards are little-endian files read in place");

namespace fs = std::filesystem;
constexpr char kMagic[8] = {'G', 'L', 'M', 'T', 'O', 'K', 'S', 'H'};
constexpr uint32_t kVersion = 1;
constexpr int64_t kHeaderBytes = 64;
constexpr const char* kManifest = "prepared.json";
constexpr const char* kFormat = "glm_hpc token shards";

struct ShardHeader {
  char magic[8];
  uint32_t version;
  uint32_t header_bytes;
  int64_t vocab_size;
  int64_t samples;
  int64_t tokens;
  uint64_t checksum;
  int64_t reserved[2];
};
static_assert(sizeof(ShardHeader) == kHeaderBytes);

// 64-bit FNV-1a over little-endian 8-byte words (the payload is always a whole number of words).
class WordHash {
 public:
  void update(const void* data, size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    while (bytes > 0) {
      const size_t take = std::min(bytes, sizeof(pending_) - pending_bytes_);
      std::memcpy(pending_ + pending_bytes_, p, take);
      pending_bytes_ += take;
      p += take;
      bytes -= take;
      if (pending_bytes_ == sizeof(pending_)) {
        uint64_t word;
        std::memcpy(&word, pending_, sizeof word);
        mix(word);
        pending_bytes_ = 0;
      }
    }
  }
  // Whole words in place: the fast path of validation.
  void update_words(const uint64_t* words, size_t count) {
    for (size_t i = 0; i < count; ++i) mix(words[i]);
  }
  uint64_t value() const { return hash_; }

 private:
  void mix(uint64_t word) { hash_ = (hash_ ^ word) * 0x100000001b3ULL; }
  uint64_t hash_ = 0xcbf29ce484222325ULL;
  unsigned char pending_[8] = {};
  size_t pending_bytes_ = 0;
};

std::string shard_name(size_t k) {
  char name[32];
  std::snprintf(name, sizeof name, "shard_%05zu.bin", k);
  return name;
}

nlohmann::json report_to_json(const DatasetReport& r) {
  return {{"read", r.read},
          {"deleted_too_long", r.deleted_too_long},
          {"truncated", r.truncated},
          {"deleted_no_target", r.deleted_no_target},
          {"skipped_bad", r.skipped_bad},
          {"skipped_reasons", r.skipped_reasons},
          {"max_length", r.max_length},
          {"truncation_strategy", enum_name(r.truncation)},
          {"lengths", r.lengths}};
}

// Writes samples [first, end) as one shard file at `tmp` (the caller renames it to final_path).
Status write_shard(const Dataset& dataset, int64_t first, int64_t end, int64_t vocab_size, const std::string& tmp,
                   const fs::path& final_path) {
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) return GLM_USER_ERROR("cannot write '", final_path.string(), "': ", errno_text(errno));
  ShardHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kVersion;
  h.header_bytes = static_cast<uint32_t>(kHeaderBytes);
  h.vocab_size = vocab_size;
  h.samples = end - first;
  std::vector<int64_t> offsets = {0};
  for (int64_t i = first; i < end; ++i) offsets.push_back(offsets.back() + dataset.sample(i).size());
  h.tokens = offsets.back();
  out.write(reinterpret_cast<const char*>(&h), sizeof h);  // the checksum follows at the end
  WordHash hash;
  auto put = [&](const void* data, size_t bytes) {
    hash.update(data, bytes);
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  };
  put(offsets.data(), offsets.size() * sizeof(int64_t));
  for (int64_t i = first; i < end; ++i) {
    if (stop_signal() != 0) return stopped_status(concat("while writing '", final_path.string(), "'"));
    const SampleView s = dataset.sample(i);
    put(s.tokens.data(), s.tokens.size_bytes());
  }
  for (int64_t i = first; i < end; ++i) {
    if (stop_signal() != 0) return stopped_status(concat("while writing '", final_path.string(), "'"));
    const SampleView s = dataset.sample(i);
    put(s.labels.data(), s.labels.size_bytes());
  }
  h.checksum = hash.value();
  out.seekp(0);
  out.write(reinterpret_cast<const char*>(&h), sizeof h);
  if (!out.flush()) return GLM_ERROR(ErrorKind::io, "cannot write '", final_path.string(), "': ", errno_text(errno));
  return Status::ok();
}

Status replace_file(const std::string& from, const fs::path& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  if (ec) return GLM_ERROR(ErrorKind::io, "cannot rename '", from, "' to '", to.string(), "': ", ec.message());
  return Status::ok();
}

// Empty but for the lock of the run writing it (base/temp_names.h).
bool holds_only_lock(const fs::path& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().filename() != kDirectoryLockFile) return false;
  return !ec;
}

Result<nlohmann::json> read_manifest(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return GLM_USER_ERROR("cannot open '", path.string(), "'");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    return GLM_USER_ERROR("'", path.string(), "' is not valid JSON (", e.what(), ")");
  }
}

}  // namespace

bool is_token_shards_file(std::string_view name) {
  if (name == kManifest) return true;
  // shard_name's pattern: shard_<5 or more digits>.bin
  constexpr std::string_view kPrefix = "shard_", kSuffix = ".bin";
  if (!name.starts_with(kPrefix) || !name.ends_with(kSuffix)) return false;
  const std::string_view digits = name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  return digits.size() >= 5 && std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
}

uint64_t token_shard_checksum(const void* payload, size_t bytes) {
  WordHash hash;
  hash.update(payload, bytes);
  return hash.value();
}

bool is_prepared_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(fs::path(path) / kManifest, ec);
}

Status write_token_shards(const Dataset& dataset, int64_t vocab_size, const PrepareInfo& info, const std::string& dir,
                          int64_t max_shard_tokens) {
  if (max_shard_tokens < 1) return GLM_INTERNAL_ERROR("max_shard_tokens must be positive");
  const fs::path root(dir);
  std::error_code ec;
  if (fs::exists(root, ec)) {
    if (!fs::is_directory(root, ec)) return GLM_USER_ERROR("--output_dir '", dir, "' exists and is not a directory");
    if (!holds_only_lock(root) && !is_prepared_dir(dir))
      return GLM_USER_ERROR("--output_dir '", dir,
                            "' holds files that glm_hpc prepare did not write: give a new or empty directory");
  }
  fs::create_directories(root, ec);
  if (ec) return GLM_USER_ERROR("cannot create --output_dir '", dir, "': ", ec.message());

  // Shards of whole samples, each at most max_shard_tokens tokens (or one longer sample).
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int64_t i = 0, first = 0, tokens = 0; i < dataset.size(); ++i) {
    const int64_t n = dataset.sample(i).size();
    if (i > first && tokens + n > max_shard_tokens) {
      ranges.emplace_back(first, i);
      first = i;
      tokens = 0;
    }
    tokens += n;
    if (i + 1 == dataset.size()) ranges.emplace_back(first, i + 1);
  }
  // Every temporary is removed on every way out (an error, an exception) but the complete one.
  std::vector<std::string> temporaries;
  ScopeExit remove_temporaries([&] {
    std::error_code ignored;
    for (const auto& t : temporaries) fs::remove(t, ignored);
  });
  nlohmann::json shards = nlohmann::json::array();
  int64_t total_tokens = 0;
  for (size_t k = 0; k < ranges.size(); ++k) {
    temporaries.push_back(temp_path_for(root / shard_name(k)).string());
    GLM_RETURN_IF_ERROR(
        write_shard(dataset, ranges[k].first, ranges[k].second, vocab_size, temporaries.back(), root / shard_name(k)));
    int64_t tokens = 0;
    for (int64_t i = ranges[k].first; i < ranges[k].second; ++i) tokens += dataset.sample(i).size();
    total_tokens += tokens;
    shards.push_back({{"file", shard_name(k)}, {"samples", ranges[k].second - ranges[k].first}, {"tokens", tokens}});
  }
  nlohmann::json manifest = {{"format", kFormat},
                             {"version", kVersion},
                             {"vocab_size", vocab_size},
                             {"samples", dataset.size()},
                             {"tokens", total_tokens},
                             {"shards", shards},
                             {"prepared_from",
                              {{"dataset", info.datasets},
                               {"max_length", info.max_length},
                               {"truncation_strategy", enum_name(info.truncation)},
                               {"loss_scale", enum_name(info.loss_scale)},
                               {"system", info.system},
                               {"tokenizer", info.tokenizer},
                               {"tokenizer_hash", info.tokenizer_hash}}},
                             {"report", report_to_json(dataset.report)}};
  // The manifest is written before anything is replaced, so a failure leaves an earlier preparation whole.
  const fs::path manifest_path = root / kManifest;
  const std::string manifest_tmp = temp_path_for(manifest_path).string();
  temporaries.push_back(manifest_tmp);
  {
    std::ofstream out(manifest_tmp, std::ios::trunc);
    if (!out) return GLM_USER_ERROR("cannot write '", manifest_path.string(), "': ", errno_text(errno));
    out << json_text(manifest) << '\n';  // one line: the lengths array holds one number per sample read
    if (!out.flush())
      return GLM_ERROR(ErrorKind::io, "cannot write '", manifest_path.string(), "': ", errno_text(errno));
  }
  // An earlier preparation stops being loadable first, so an interruption leaves no mixed state.
  std::vector<std::string> old_files;
  if (is_prepared_dir(dir)) {
    auto old = read_manifest(root / kManifest);
    if (old.is_ok() && old.value().contains("shards") && old.value()["shards"].is_array())
      for (const auto& s : old.value()["shards"])
        if (s.contains("file") && s["file"].is_string()) old_files.push_back(s["file"].get<std::string>());
    fs::remove(root / kManifest, ec);
    if (ec) return GLM_ERROR(ErrorKind::io, "cannot remove the old '", (root / kManifest).string(), "'");
  }
  for (size_t k = 0; k < ranges.size(); ++k) GLM_RETURN_IF_ERROR(replace_file(temporaries[k], root / shard_name(k)));
  for (const auto& f : old_files) {
    bool current = false;
    for (size_t k = 0; k < ranges.size(); ++k) current |= f == shard_name(k);
    if (!current && fs::path(f).filename() == f) fs::remove(root / f, ec);
  }
  GLM_RETURN_IF_ERROR(replace_file(manifest_tmp, manifest_path));
  remove_temporaries.release();
  return Status::ok();
}

Result<std::unique_ptr<MappedShard>> MappedShard::open(const std::string& path, int64_t vocab_size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return GLM_USER_ERROR("cannot open token shard '", path, "': ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return GLM_USER_ERROR("cannot stat token shard '", path, "'");
  }
  const auto bytes = static_cast<int64_t>(st.st_size);
  if (bytes < kHeaderBytes) {
    ::close(fd);
    return GLM_USER_ERROR("token shard '", path, "' is truncated: ", bytes, " bytes, less than its ", kHeaderBytes,
                          "-byte header");
  }
  void* base = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file
  if (base == MAP_FAILED) return GLM_USER_ERROR("cannot memory-map token shard '", path, "': ", std::strerror(errno));
  std::unique_ptr<MappedShard> shard(new MappedShard());
  shard->base_ = base;
  shard->bytes_ = static_cast<size_t>(bytes);

  ShardHeader h;
  std::memcpy(&h, base, sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0)
    return GLM_USER_ERROR("'", path, "' is not a glm_hpc token shard (wrong magic)");
  if (h.version != kVersion)
    return GLM_USER_ERROR("token shard '", path, "' has format version ", h.version, "; this glm_hpc reads version ",
                          kVersion);
  if (h.header_bytes != kHeaderBytes || h.samples < 0 || h.tokens < 0 || h.vocab_size < 1 || h.samples > bytes / 8 ||
      h.tokens > bytes / 8)
    return GLM_USER_ERROR("token shard '", path, "' has a corrupt header");
  const int64_t expected = kHeaderBytes + 8 * (h.samples + 1) + 8 * h.tokens;
  if (bytes < expected)
    return GLM_USER_ERROR("token shard '", path, "' is truncated: ", bytes, " bytes, its header promises ", expected);
  if (bytes > expected)
    return GLM_USER_ERROR("token shard '", path, "' has ", bytes - expected, " bytes after its data (", bytes,
                          " bytes, its header promises ", expected, ")");
  if (h.vocab_size > vocab_size)
    return GLM_USER_ERROR("token shard '", path, "' was prepared for vocab_size ", h.vocab_size, ", above the model's ",
                          vocab_size);
  const auto* payload = static_cast<const unsigned char*>(base) + kHeaderBytes;
  WordHash hash;
  hash.update_words(reinterpret_cast<const uint64_t*>(payload), static_cast<size_t>((expected - kHeaderBytes) / 8));
  if (hash.value() != h.checksum)
    return GLM_USER_ERROR("token shard '", path, "' is corrupt: its checksum does not match its contents");
  shard->vocab_size_ = h.vocab_size;
  shard->offsets_ = {reinterpret_cast<const int64_t*>(payload), static_cast<size_t>(h.samples + 1)};
  const auto* tokens = reinterpret_cast<const int32_t*>(payload + 8 * (h.samples + 1));
  shard->tokens_ = {tokens, static_cast<size_t>(h.tokens)};
  shard->labels_ = {tokens + h.tokens, static_cast<size_t>(h.tokens)};
  // A matching checksum does not make the values sane (a foreign writer, a bug): check them all.
  const auto& offsets = shard->offsets_;
  if (offsets.front() != 0 || offsets.back() != h.tokens)
    return GLM_USER_ERROR("token shard '", path, "' has sample offsets that do not span its ", h.tokens, " tokens");
  for (int64_t i = 0; i < h.samples; ++i)
    if (offsets[static_cast<size_t>(i) + 1] <= offsets[static_cast<size_t>(i)])
      return GLM_USER_ERROR("token shard '", path, "': sample ", i, " is empty or has decreasing offsets");
  for (int64_t t = 0; t < h.tokens; ++t) {
    const int32_t token = shard->tokens_[static_cast<size_t>(t)], label = shard->labels_[static_cast<size_t>(t)];
    if (token < 0 || token >= h.vocab_size || label < -1 || label >= h.vocab_size)
      return GLM_USER_ERROR("token shard '", path, "': token ", t, " (id ", token, ", label ", label,
                            ") is outside the vocabulary of ", h.vocab_size);
  }
  return shard;
}

MappedShard::~MappedShard() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

SampleView MappedShard::sample(int64_t i) const {
  const auto begin = static_cast<size_t>(offsets_[static_cast<size_t>(i)]);
  const auto end = static_cast<size_t>(offsets_[static_cast<size_t>(i) + 1]);
  return {tokens_.subspan(begin, end - begin), labels_.subspan(begin, end - begin)};
}

MappedShards::MappedShards(std::vector<std::unique_ptr<MappedShard>> shards) : shards_(std::move(shards)) {
  first_.push_back(0);
  for (const auto& s : shards_) first_.push_back(first_.back() + s->samples());
}

SampleView MappedShards::sample(int64_t i) const {
  // The shard k with first_[k] <= i < first_[k + 1].
  const auto k = static_cast<size_t>(std::upper_bound(first_.begin(), first_.end(), i) - first_.begin()) - 1;
  return shards_[k]->sample(i - first_[k]);
}

namespace {

// prepared_from against this run's tokenizer: ids mean nothing without theirs, the same numbers from
// another one are other text.
Status check_prepared_tokenizer(const JsonFields& from, const std::string& dir, const Tokenizer& tokenizer) {
  if (!from.has("tokenizer_hash"))
    return GLM_USER_ERROR("'", dir, "' does not record the content hash of the tokenizer that made it (an older ",
                          "glm_hpc prepared it): prepare it again");
  GLM_ASSIGN_OR_RETURN(const std::string hash, from.string("tokenizer_hash"));
  GLM_ASSIGN_OR_RETURN(const std::string made_by, from.string_or("tokenizer", ""));
  if (!hash.empty() && hash != tokenizer.content_hash())
    return GLM_USER_ERROR("'", dir, "' was tokenized with ", made_by, " (", hash, ") but this run's tokenizer is ",
                          tokenizer.source(), " (", tokenizer.content_hash(),
                          "): prepare it again with this tokenizer, or train with --tokenizer ", made_by);
  return Status::ok();
}

// Every shard the manifest lists, mapped and checked against its entry's counts.
Result<std::vector<std::unique_ptr<MappedShard>>> open_listed_shards(const JsonFields& m, const fs::path& root,
                                                                     int64_t vocab_size) {
  GLM_ASSIGN_OR_RETURN(const std::vector<JsonFields> list, m.objects("shards"));
  if (list.empty()) return GLM_USER_ERROR("'", m.file(), "' lists no shards");
  std::vector<std::unique_ptr<MappedShard>> shards;
  for (const JsonFields& entry : list) {
    GLM_ASSIGN_OR_RETURN(const std::string file, entry.string("file"));
    if (fs::path(file).filename() != file)
      return GLM_USER_ERROR("'", m.file(), "' names a shard outside its directory: '", file, "'");
    GLM_ASSIGN_OR_RETURN(const int64_t samples, entry.integer("samples", 0));
    GLM_ASSIGN_OR_RETURN(const int64_t tokens, entry.integer("tokens", 0));
    GLM_ASSIGN_OR_RETURN(auto shard, MappedShard::open((root / file).string(), vocab_size));
    if (shard->samples() != samples || shard->tokens() != tokens)
      return GLM_USER_ERROR("token shard '", (root / file).string(), "' holds ", shard->samples(), " samples and ",
                            shard->tokens(), " tokens; '", m.file(), "' says ", samples, " and ", tokens);
    shards.push_back(std::move(shard));
  }
  return shards;
}

// The length report prepare printed, as training prints it again.
Status read_prepared_report(const JsonFields& m, DatasetReport& report) {
  GLM_ASSIGN_OR_RETURN(const JsonFields r, m.object("report"));
  const std::pair<const char*, int64_t*> counts[] = {{"read", &report.read},
                                                     {"deleted_too_long", &report.deleted_too_long},
                                                     {"truncated", &report.truncated},
                                                     {"deleted_no_target", &report.deleted_no_target},
                                                     {"skipped_bad", &report.skipped_bad},
                                                     {"max_length", &report.max_length}};
  for (const auto& [field, target] : counts) {
    GLM_ASSIGN_OR_RETURN(*target, r.integer(field, 0));
  }
  GLM_ASSIGN_OR_RETURN(report.skipped_reasons, r.string("skipped_reasons"));
  GLM_ASSIGN_OR_RETURN(const std::string truncation_name, r.string("truncation_strategy"));
  const auto truncation = enum_from_name<Truncation>(truncation_name);
  if (!truncation) return r.error("truncation_strategy", concat("is not ", enum_choices<Truncation>()));
  report.truncation = *truncation;
  GLM_ASSIGN_OR_RETURN(report.lengths, r.integers("lengths", 0));
  return Status::ok();
}

}  // namespace

Result<Dataset> load_prepared(const std::string& dir, int64_t vocab_size, const Tokenizer* tokenizer) {
  const fs::path root(dir);
  const std::string manifest_path = (root / kManifest).string();
  GLM_ASSIGN_OR_RETURN(nlohmann::json json, read_manifest(root / kManifest));
  if (!json.is_object() || json.value("format", "") != kFormat)
    return GLM_USER_ERROR("'", manifest_path, "' is not a glm_hpc prepare manifest (\"format\" is not \"", kFormat,
                          "\")");
  GLM_ASSIGN_OR_RETURN(const JsonFields m, JsonFields::of(json, manifest_path));
  if (m.raw("version") != kVersion)
    return GLM_USER_ERROR("'", manifest_path, "' has version ", json_excerpt(m.raw("version")), "; this glm_hpc reads ",
                          kVersion);
  GLM_ASSIGN_OR_RETURN(const JsonFields from, m.object("prepared_from"));
  if (tokenizer != nullptr) GLM_RETURN_IF_ERROR(check_prepared_tokenizer(from, dir, *tokenizer));
  GLM_ASSIGN_OR_RETURN(const int64_t prepared_vocab, m.integer("vocab_size", 1));
  if (prepared_vocab > vocab_size)
    return GLM_USER_ERROR("'", dir, "' was prepared for vocab_size ", prepared_vocab, ", above the model's ",
                          vocab_size);
  GLM_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<MappedShard>> shards, open_listed_shards(m, root, vocab_size));
  Dataset d;
  GLM_RETURN_IF_ERROR(read_prepared_report(m, d.report));
  GLM_ASSIGN_OR_RETURN(const std::vector<std::string> sources, from.strings("dataset"));
  std::string files;
  for (const std::string& f : sources) files += (files.empty() ? "" : " ") + f;
  GLM_ASSIGN_OR_RETURN(const std::string loss_scale, from.string("loss_scale"));
  GLM_ASSIGN_OR_RETURN(const std::string system, from.string("system"));
  d.prepared = concat(dir, " (prepared from ", files, ", loss_scale ", loss_scale,
                      system.empty() ? "" : ", with a default system prompt", ")");
  d.mapped = std::make_shared<MappedShards>(std::move(shards));
  for (int64_t i = 0; i < d.size(); ++i) {
    const SampleView s = d.sample(i);
    d.report.tokens += s.size();
    d.report.target_tokens += s.target_count();
    d.report.max_tokens = std::max(d.report.max_tokens, s.size());
  }
  d.report.kept = d.size();
  if (d.report.kept == 0) return GLM_USER_ERROR("'", dir, "' holds no samples");
  return d;
}

}  // namespace glm
