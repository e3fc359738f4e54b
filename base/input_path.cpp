// stat(2) of an input path: what it is, before anything opens it.
#include "base/input_path.h"

#include <sys/stat.h>

#include <cerrno>

namespace glm {
namespace {

const char* kind_text(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

Status check_input_path(const std::string& path, InputKind kind) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status::ok();  // missing or unreadable: the reader says which
  const bool file = S_ISREG(st.st_mode), directory = S_ISDIR(st.st_mode);
  const bool ok = kind == InputKind::file ? file : kind == InputKind::directory ? directory : file || directory;
  if (ok) return Status::ok();
  const char* expected = kind == InputKind::file        ? "a regular file"
                         : kind == InputKind::directory ? "a directory"
                                                        : "a regular file or a directory";
  return GLM_USER_ERROR("'", path, "' is ", kind_text(st.st_mode), ", not ", expected);
}

Status check_input_file_size(const std::string& path, int64_t max_bytes, const std::string& bound_reason) {
  GLM_RETURN_IF_ERROR(check_input_path(path, InputKind::file));
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status::ok();
  if (static_cast<int64_t>(st.st_size) > max_bytes)
    return GLM_USER_ERROR("'", path, "' is ", static_cast<int64_t>(st.st_size), " bytes, more than the ", max_bytes,
                          " bytes ", bound_reason);
  return Status::ok();
}

}  // namespace glm
