// Durable writes through unique temporaries, and the removal of what failed writers left.
#include "io/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "base/errno_text.h"
#include "base/temp_names.h"

namespace glm {

namespace fs = std::filesystem;

Status file_error(const char* file, int line, std::string_view what, const fs::path& path, int err) {
  return Status::error(ErrorKind::io, concat(what, " '", path.string(), "': ", errno_text(err)), file, line);
}

Status fsync_path(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return GLM_FILE_ERROR("cannot open to sync", path, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return GLM_FILE_ERROR("cannot sync", path, err);
  return Status::ok();
}

namespace {

// write(2) until done; the errno of the failing call (ENOSPC when the disk took no byte).
int write_all(int fd, std::string_view bytes) {
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return ENOSPC;
    p += n;
    left -= static_cast<size_t>(n);
  }
  return 0;
}

// bytes into the new file tmp, synced and closed; failures name path, the file the user knows.
Status write_synced(const fs::path& tmp, const fs::path& path, std::string_view bytes) {
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) return GLM_FILE_ERROR("cannot write", path, errno);
  int err = write_all(fd, bytes);
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  // NFS reports a full server at close.
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) return GLM_FILE_ERROR("cannot write", path, err);
  return Status::ok();
}

}  // namespace

Status write_file_durably(const fs::path& path, std::string_view bytes) {
  const fs::path tmp = temp_path_for(path);
  Status wrote = write_synced(tmp, path, bytes);
  if (wrote.is_ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    wrote = GLM_FILE_ERROR(concat("cannot rename '", tmp.string(), "' to"), path, err);
  }
  if (!wrote.is_ok()) ::unlink(tmp.c_str());
  return wrote;
}

std::string TemporaryCleanup::describe(const fs::path& dir) const {
  auto list = [](const std::vector<std::string>& names) {
    constexpr size_t kShown = 8;
    std::string text;
    for (size_t i = 0; i < names.size() && i < kShown; ++i) text += concat(i == 0 ? "" : ", ", names[i]);
    if (names.size() > kShown) text += concat(" and ", names.size() - kShown, " more");
    return text;
  };
  std::string text;
  if (!removed.empty()) text = concat("removed what earlier runs left in ", dir.string(), ": ", list(removed));
  if (!restored.empty())
    text += concat(text.empty() ? "" : "; ", "restored in ", dir.string(),
                   " what an interrupted replacement had moved aside: ", list(restored));
  return text;
}

Result<TemporaryCleanup> remove_stale_temporaries(const fs::path& dir,
                                                  const std::function<bool(std::string_view target)>& ours) {
  TemporaryCleanup done;
  std::error_code ec;
  std::vector<std::pair<fs::path, std::string>> found;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const auto target = temp_target_of(name);
    if (target && ours(*target)) found.emplace_back(entry.path(), *target);
  }
  if (ec) return GLM_FILE_ERROR("cannot list", dir, ec.value());
  std::sort(found.begin(), found.end());
  constexpr std::string_view kAside = ".old";
  for (const auto& [path, target] : found) {
    const bool aside = target.size() > kAside.size() && target.ends_with(kAside);
    const fs::path original = dir / target.substr(0, target.size() - kAside.size());
    const bool directory = fs::is_directory(fs::symlink_status(path, ec));
    const std::string shown = concat(path.filename().string(), directory ? " (directory)" : "");
    if (aside && !fs::exists(fs::symlink_status(original, ec))) {
      fs::rename(path, original, ec);
      if (ec) return GLM_FILE_ERROR(concat("cannot rename '", path.string(), "' back to"), original, ec.value());
      done.restored.push_back(concat(shown, " as ", original.filename().string()));
      continue;
    }
    fs::remove_all(path, ec);
    if (ec) return GLM_FILE_ERROR("cannot remove the stale temporary", path, ec.value());
    done.removed.push_back(shown);
  }
  return done;
}

}  // namespace glm
