// Status and Result<T>: how every fallible function reports failure up the stack.
#pragma once

#include <optional>
#include <sstream>
#include <string>
#include <utility>

namespace glm {

// What went wrong decides the exit code: bad user input exits 2; a stop that a signal asked for
// (base/stop_signal.h) exits kStoppedExitCode; everything else 1.
enum class ErrorKind { ok, user_input, io, comm, internal, stopped };

// EX_TEMPFAIL from sysexits.h ("try again later"): stopped by SIGTERM, SIGUSR1 or SIGINT with
// nothing half-written (after a checkpoint when training had begun). slurm/*.sh requeue on it.
inline constexpr int kStoppedExitCode = 75;

class Status {
 public:
  Status() = default;
  static Status ok() { return Status(); }
  static Status error(ErrorKind kind, std::string message, const char* file = nullptr, int line = 0);

  bool is_ok() const { return kind_ == ErrorKind::ok; }
  ErrorKind kind() const { return kind_; }
  // Valid UTF-8: user bytes quoted into it that are not are kept as \xNN (base/text.h).
  const std::string& message() const { return message_; }
  const std::string& location() const { return location_; }
  int exit_code() const {
    if (kind_ == ErrorKind::ok) return 0;
    if (kind_ == ErrorKind::user_input) return 2;
    return kind_ == ErrorKind::stopped ? kStoppedExitCode : 1;
  }
  // Prefixes context ("while reading X: ...") keeping kind and location.
  Status with_context(const std::string& context) const;

 private:
  ErrorKind kind_ = ErrorKind::ok;
  std::string message_;
  std::string location_;
};

template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}  // NOLINT
  bool is_ok() const { return status_.is_ok(); }
  const Status& status() const { return status_; }
  T& value() { return *value_; }
  const T& value() const { return *value_; }
  T take() { return std::move(*value_); }

 private:
  Status status_;
  std::optional<T> value_;
};

template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

}  // namespace glm

#define GLM_ERROR(kind, ...) ::glm::Status::error((kind), ::glm::concat(__VA_ARGS__), __FILE__, __LINE__)
#define GLM_USER_ERROR(...) GLM_ERROR(::glm::ErrorKind::user_input, __VA_ARGS__)
#define GLM_INTERNAL_ERROR(...) GLM_ERROR(::glm::ErrorKind::internal, __VA_ARGS__)

#define GLM_CONCAT_INNER(a, b) a##b
#define GLM_CONCAT(a, b) GLM_CONCAT_INNER(a, b)

#define GLM_RETURN_IF_ERROR(expr)                 \
  do {                                            \
    ::glm::Status glm_status_ = (expr);           \
    if (!glm_status_.is_ok()) return glm_status_; \
  } while (0)

// GLM_ASSIGN_OR_RETURN(auto x, make_x()); evaluates a Result<T>, returns its status on error.
#define GLM_ASSIGN_OR_RETURN(lhs, expr)                                                              \
  auto GLM_CONCAT(glm_result_, __LINE__) = (expr);                                                   \
  if (!GLM_CONCAT(glm_result_, __LINE__).is_ok()) return GLM_CONCAT(glm_result_, __LINE__).status(); \
  lhs = GLM_CONCAT(glm_result_, __LINE__).take()
