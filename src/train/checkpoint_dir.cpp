// The checkpoint directory protocol (see checkpoint_dir.h): naming, atomic publication, latest,
// pruning, and resolving "latest" or a directory to a complete checkpoint.
#include "train/checkpoint_dir.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

#include "base/json_text.h"
#include "base/temp_names.h"
#include "io/durable_file.h"
#include "train/checkpoint.h"

namespace glm {
namespace {

namespace fs = std::filesystem;

int64_t step_of(const fs::path& dir) { return checkpoint_step_of(dir.filename().string()); }

// Complete checkpoints of output_dir, oldest first.
std::vector<fs::path> complete_checkpoints(const fs::path& output_dir) {
  std::vector<fs::path> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(output_dir, ec)) {
    if (entry.is_directory() && step_of(entry.path()) >= 0 && fs::exists(entry.path() / "COMPLETE"))
      found.push_back(entry.path());
  }
  std::sort(found.begin(), found.end(), [](const fs::path& a, const fs::path& b) { return step_of(a) < step_of(b); });
  return found;
}

// meta.json, the run's args.json and the COMPLETE marker, durable with the directory entry.
Status write_checkpoint_contents(const fs::path& tmp, const fs::path& output_dir, const nlohmann::json& meta) {
  GLM_RETURN_IF_ERROR(write_file_durably(tmp / "meta.json", json_text(meta, 2) + "\n"));
  if (fs::exists(output_dir / "args.json")) {  // the run's options travel with its checkpoints (export reads them)
    std::ifstream in(output_dir / "args.json", std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    if (!in) return GLM_ERROR(ErrorKind::io, "cannot read '", (output_dir / "args.json").string(), "'");
    GLM_RETURN_IF_ERROR(write_file_durably(tmp / "args.json", text.str()));
  }
  GLM_RETURN_IF_ERROR(write_file_durably(tmp / "COMPLETE", std::to_string(meta["step"].get<int64_t>()) + "\n"));
  return fsync_path(tmp);
}

Status rename_into_place(const fs::path& tmp, const fs::path& final_dir) {
  std::error_code ec;
  if (fs::exists(final_dir)) {  // a rerun into the same output_dir: replace, never half
    const fs::path old = aside_path_for(final_dir);
    fs::rename(final_dir, old, ec);
    if (ec)
      return GLM_ERROR(ErrorKind::io, "cannot move the previous '", final_dir.string(), "' aside: ", ec.message());
    fs::rename(tmp, final_dir, ec);
    std::error_code ignored;  // what a failure here leaves, the next run holding the directory removes
    if (ec)
      fs::rename(old, final_dir, ignored);  // the previous one stays published
    else
      fs::remove_all(old, ignored);
  } else {
    fs::rename(tmp, final_dir, ec);
  }
  if (ec)
    return GLM_ERROR(ErrorKind::io, "cannot rename '", tmp.string(), "' to '", final_dir.string(), "': ", ec.message());
  return Status::ok();
}

// Oldest first, never the newest nor the best; the best counts toward the limit (so a limit of 1
// keeps 2 while the best is older), as in Hugging Face's Trainer._sorted_checkpoints.
Status prune_checkpoints(const fs::path& output_dir, const fs::path& newest, int64_t save_total_limit,
                         const std::string& best_checkpoint) {
  const std::vector<fs::path> all = complete_checkpoints(output_dir);
  auto kept = [&](const fs::path& p) {
    return p == newest || (!best_checkpoint.empty() && p.filename() == best_checkpoint);
  };
  const int64_t protected_count = std::count_if(all.begin(), all.end(), kept);
  int64_t excess = static_cast<int64_t>(all.size()) - std::max(save_total_limit, protected_count);
  std::error_code ec;
  for (size_t i = 0; i < all.size() && excess > 0; ++i) {
    if (kept(all[i])) continue;
    fs::remove_all(all[i], ec);
    if (ec) return GLM_ERROR(ErrorKind::io, "cannot remove the old checkpoint '", all[i].string(), "': ", ec.message());
    --excess;
  }
  return Status::ok();
}

}  // namespace

fs::path checkpoint_dir_path(const fs::path& output_dir, int64_t step) {
  return output_dir / ("checkpoint-" + std::to_string(step));
}

int64_t checkpoint_step_of(std::string_view name) {
  constexpr std::string_view kPrefix = "checkpoint-";
  if (!name.starts_with(kPrefix) || name.size() == kPrefix.size() || name.size() > kPrefix.size() + 18) return -1;
  int64_t step = 0;
  for (const char c : name.substr(kPrefix.size())) {
    if (c < '0' || c > '9') return -1;
    step = step * 10 + (c - '0');
  }
  return step;
}

Status make_checkpoint_temp_dir(const fs::path& tmp) {
  std::error_code ec;
  fs::create_directories(tmp, ec);  // and the output directory, for a first save
  if (ec) return GLM_FILE_ERROR("cannot create", tmp, ec.value());
  return Status::ok();
}

Status publish_checkpoint(const fs::path& tmp, const fs::path& final_dir, const fs::path& output_dir,
                          const nlohmann::json& meta, int64_t save_total_limit, const std::string& best_checkpoint) {
  GLM_RETURN_IF_ERROR(write_checkpoint_contents(tmp, output_dir, meta));
  GLM_RETURN_IF_ERROR(rename_into_place(tmp, final_dir));
  GLM_RETURN_IF_ERROR(fsync_path(output_dir));
  GLM_RETURN_IF_ERROR(write_file_durably(output_dir / "latest", final_dir.filename().string() + "\n"));
  if (save_total_limit > 0) return prune_checkpoints(output_dir, final_dir, save_total_limit, best_checkpoint);
  return Status::ok();
}

Result<std::string> resolve_checkpoint(const std::string& spec, const std::string& output_dir,
                                       const std::string& option) {
  fs::path dir(spec);
  if (spec == "latest") {
    const fs::path out(output_dir);
    std::ifstream in(out / "latest");
    std::string name;
    if (in >> name && fs::exists(out / name / "COMPLETE")) {
      dir = out / name;
    } else {
      // latest is written after the rename; if it is missing or stale, the newest complete one.
      const auto all = complete_checkpoints(out);
      if (all.empty()) return GLM_USER_ERROR(option, " latest: no complete checkpoint in '", output_dir, "'");
      dir = all.back();
    }
  }
  if (!fs::is_directory(dir)) return GLM_USER_ERROR(option, ": '", dir.string(), "' is not a directory");
  if (!fs::exists(dir / "COMPLETE"))
    return GLM_USER_ERROR("checkpoint '", dir.string(),
                          "' is incomplete (no COMPLETE marker: its save was interrupted)");
  return dir.string();
}

}  // namespace glm
