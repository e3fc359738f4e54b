#include "io/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <fstream>

namespace glm {

namespace fs = std::filesystem;

Status fsync_path(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return GLM_ERROR(ErrorKind::io, "cannot open '", path.string(), "' to sync it");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return GLM_ERROR(ErrorKind::io, "fsync of '", path.string(), "' failed");
  return Status::ok();
}

Status write_file_durably(const fs::path& path, std::string_view bytes) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return GLM_ERROR(ErrorKind::io, "cannot write '", tmp.string(), "'");
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) return GLM_ERROR(ErrorKind::io, "error writing '", tmp.string(), "'");
  }
  GLM_RETURN_IF_ERROR(fsync_path(tmp));
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return GLM_ERROR(ErrorKind::io, "cannot rename '", tmp.string(), "' to '", path.string(), "': ", ec.message());
  return Status::ok();
}

}  // namespace glm
