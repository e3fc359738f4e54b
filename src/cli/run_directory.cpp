// Which directory each command holds, what it may remove there at start, and run_status.json.
#include "cli/run_directory.h"

#include <unistd.h>

#include <functional>

#include "base/temp_names.h"
#include "cli/prepare.h"
#include "data/token_shards.h"
#include "io/durable_file.h"
#include "train/checkpoint_dir.h"

namespace glm {
namespace {

namespace fs = std::filesystem;

constexpr const char* kRunStatusFile = "run_status.json";

// The names train writes in its output directory (temporaries of these are its own).
bool written_by_train(std::string_view name) {
  constexpr std::string_view kAside = ".old";
  if (name.ends_with(kAside)) name.remove_suffix(kAside.size());
  return name == "args.json" || name == "latest" || name == "logging.jsonl" || name == kRunStatusFile ||
         checkpoint_step_of(name) >= 0;
}

}  // namespace

Result<std::unique_ptr<RunDirectory>> claim_run_directory(const CliOptions& options) {
  const std::string& command = options.command;
  fs::path dir, lock_file;
  std::string option, shown;
  std::function<bool(std::string_view)> ours;
  if ((command == "train" || (command == "prepare" && prepare_writes_shards(options))) &&
      !options.train.output_dir.empty()) {
    option = "--output_dir";
    shown = options.train.output_dir;
    dir = fs::path(options.train.output_dir);
    lock_file = dir / kDirectoryLockFile;
    if (command == "train")
      ours = written_by_train;
    else
      ours = is_token_shards_file;
  } else if (command == "export" && !options.save_dir.empty()) {
    option = "--save_dir";
    shown = options.save_dir;
    fs::path save = fs::path(options.save_dir).lexically_normal();
    if (save.filename().empty()) save = save.parent_path();  // a trailing slash
    dir = save.has_parent_path() ? save.parent_path() : fs::path(".");
    const std::string name = save.filename().string();
    lock_file = dir / concat(".", name, kDirectoryLockFile);
    ours = [name](std::string_view target) { return target == name || target == name + ".old"; };
  } else {
    return std::unique_ptr<RunDirectory>();
  }
  std::unique_ptr<RunDirectory> claimed(new RunDirectory());
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    return GLM_USER_ERROR(option, " '", shown, "' exists and is not a directory");
  claimed->created_ = fs::create_directories(dir, ec);
  if (ec) return GLM_USER_ERROR("cannot create ", option, " '", dir.string(), "': ", ec.message());
  claimed->dir_ = dir;
  claimed->records_status_ = command == "train";
  auto lock = DirectoryLock::acquire(lock_file, option, shown, command);
  if (!lock.is_ok()) {
    claimed->release();
    return lock.status();
  }
  claimed->lock_ = lock.take();
  if (!claimed->lock_->takeover_note().empty())
    claimed->report_ += "glm_hpc: " + claimed->lock_->takeover_note() + "\n";
  GLM_ASSIGN_OR_RETURN(const TemporaryCleanup cleaned, remove_stale_temporaries(dir, ours));
  if (!cleaned.empty()) claimed->report_ += "glm_hpc: " + cleaned.describe(dir) + "\n";
  if (claimed->records_status_) {
    char host[256] = {0};
    ::gethostname(host, sizeof(host) - 1);
    GLM_RETURN_IF_ERROR(
        claimed->record_status({{"status", "running"}, {"exit_code", nullptr}, {"host", host}, {"pid", ::getpid()}}));
  }
  return claimed;
}

Status RunDirectory::record_status(const nlohmann::json& fields) {
  if (!records_status_) return Status::ok();
  return write_run_status(dir_, fields);
}

void RunDirectory::release() {
  if (lock_) lock_->release();
  lock_.reset();
  std::error_code ec;
  if (created_ && fs::is_empty(dir_, ec)) fs::remove(dir_, ec);
  created_ = false;
}

RunDirectory::~RunDirectory() { release(); }

Status write_run_status(const fs::path& output_dir, const nlohmann::json& fields) {
  GLM_RETURN_IF_ERROR(write_file_durably(output_dir / kRunStatusFile, fields.dump(2) + "\n"));
  return fsync_path(output_dir);
}

}  // namespace glm
