// Cache keys, lookup and atomic insertion of tokenized datasets.
#include "data/dataset_cache.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "base/scope_exit.h"
#include "base/temp_names.h"
#include "data/content_hash.h"
#include "data/token_shards.h"

namespace glm {
namespace {

namespace fs = std::filesystem;

// The binary's size and modification time: the chat template and the readers are code, and a
// rebuilt glm_hpc may tokenize differently.
std::string binary_identity() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "unknown binary";
  const auto size = fs::file_size(exe, ec);
  const auto time = fs::last_write_time(exe, ec).time_since_epoch().count();
  return ec ? "unknown binary" : concat(exe.string(), " ", size, " ", time);
}

// The hash naming the cache entry, or an empty string when a file cannot be hashed (load_dataset
// then reports it); a stop by signal while hashing is returned.
Result<std::string> cache_key(const std::vector<std::string>& paths, const DatasetLoadOptions& o) {
  ContentHash h;
  h.field("glm_hpc dataset cache 1").field(binary_identity());
  h.field(o.tokenizer != nullptr ? o.tokenizer->content_hash() : "no tokenizer");
  h.field(std::to_string(o.max_length)).field(std::to_string(o.vocab_size)).field(o.skip_bad ? "skip" : "error");
  h.field(std::to_string(static_cast<int>(o.truncation)));
  h.field(std::to_string(static_cast<int>(o.conversation.loss_scale))).field(o.conversation.system);
  for (const auto& path : paths) {
    auto file = hash_file(path);
    if (!file.is_ok()) {
      if (file.status().kind() == ErrorKind::stopped) return file.status();
      return std::string();
    }
    h.field(file.value());
  }
  return h.hex().substr(std::string("fnv1a64:").size());
}

std::string joined(const std::vector<std::string>& paths) {
  std::string out;
  for (const auto& p : paths) out += (out.empty() ? "" : " ") + p;
  return out;
}

}  // namespace

std::string default_dataset_cache_dir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0')
    return (fs::path(xdg) / "glm_hpc" / "datasets").string();
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0')
    return (fs::path(home) / ".cache" / "glm_hpc" / "datasets").string();
  return "";
}

Result<CachedDataset> load_dataset_cached(const std::string& cache_dir, bool write,
                                          const std::vector<std::string>& paths, const DatasetLoadOptions& o) {
  auto plain = [&]() -> Result<Dataset> {
    return load_dataset(paths, o.tokenizer, o.max_length, o.vocab_size, o.skip_bad, o.truncation, o.conversation);
  };
  bool jsonl = !cache_dir.empty() && !paths.empty();
  for (const auto& p : paths) jsonl = jsonl && !is_prepared_dir(p);
  std::string key;
  if (jsonl) {
    GLM_ASSIGN_OR_RETURN(key, cache_key(paths, o));
  }
  CachedDataset out;
  if (key.empty()) {
    GLM_ASSIGN_OR_RETURN(out.dataset, plain());
    return out;
  }
  const fs::path entry = fs::path(cache_dir) / key;
  bool damaged = false;
  if (is_prepared_dir(entry.string())) {
    auto hit = load_dataset({entry.string()}, o.tokenizer, o.max_length, o.vocab_size);
    if (hit.is_ok()) {
      out.dataset = hit.take();
      out.dataset.prepared.clear();  // the note says where it came from
      out.dataset.files = paths;
      out.note = concat("glm_hpc: tokenization cache: read ", entry.string(), " (", joined(paths),
                        " tokenized earlier with this tokenizer and these options; --dataset_cache false tokenizes "
                        "again)");
      return out;
    }
    if (hit.status().kind() == ErrorKind::stopped) return hit.status();  // not damaged: interrupted
    damaged = true;
    out.note =
        concat("glm_hpc: tokenization cache: ignoring the damaged ", entry.string(), " (", hit.status().message(), ")");
  }
  GLM_ASSIGN_OR_RETURN(out.dataset, plain());
  if (!write) return out;
  std::error_code ec;
  if (damaged) fs::remove_all(entry, ec);
  const fs::path tmp = temp_path_for(entry);  // jobs on several hosts may share the cache
  // Gone on every way out: renamed into place, or removed after an error or an exception.
  ScopeExit remove_tmp([&] {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
  });
  PrepareInfo info;
  info.datasets = paths;
  info.max_length = o.max_length;
  info.truncation = o.truncation;
  info.loss_scale = o.conversation.loss_scale;
  info.system = o.conversation.system;
  if (o.tokenizer != nullptr) {
    info.tokenizer = o.tokenizer->source();
    info.tokenizer_hash = o.tokenizer->content_hash();
  }
  Status wrote = write_token_shards(out.dataset, o.vocab_size, info, tmp.string());
  if (wrote.kind() == ErrorKind::stopped) return wrote;  // the guard removes the temporary entry
  if (wrote.is_ok()) {
    fs::rename(tmp, entry, ec);  // fails when another job stored the same entry first: keep theirs
    if (ec && !is_prepared_dir(entry.string()))
      wrote = GLM_ERROR(ErrorKind::io, "cannot rename '", tmp.string(), "' to '", entry.string(), "': ", ec.message());
  }
  const std::string line = wrote.is_ok() ? concat("glm_hpc: tokenization cache: wrote ", entry.string())
                                         : concat("glm_hpc: tokenization cache: not written (", wrote.message(), ")");
  out.note += (out.note.empty() ? "" : "\n") + line;
  return out;
}

}  // namespace glm
