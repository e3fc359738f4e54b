// What the libFuzzer targets share: a private scratch directory for parsers that take a path, the
// input split into the files of a directory, and the fatal path turned into an abort.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "mpi/fatal.h"

namespace glm::fuzz {

// A directory of this process under $TMPDIR, created on first use. libFuzzer stops without running
// atexit handlers, so run_fuzz_target.sh points TMPDIR into the build directory and empties it.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::filesystem::path d = std::filesystem::path(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") /
                              ("glm_fuzz_" + std::to_string(::getpid()));
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

// A subdirectory of the scratch directory, emptied: each input starts from nothing left by the last.
inline std::filesystem::path fresh_dir(const std::string& name) {
  const std::filesystem::path d = scratch_dir() / name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

inline void write_file(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) std::abort();  // the harness itself failed: not a finding in the parser
}

// The input as up to `parts` pieces separated by NUL bytes (the last piece keeps any further NULs),
// so one input can hold the several files of a directory; fewer pieces when it has fewer NULs.
inline std::vector<std::string_view> split_input(const uint8_t* data, size_t size, size_t parts) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> out;
  while (out.size() + 1 < parts) {
    const size_t nul = rest.find('\0');
    if (nul == std::string_view::npos) break;
    out.push_back(rest.substr(0, nul));
    rest.remove_prefix(nul + 1);
  }
  out.push_back(rest);
  return out;
}

// A parser refusing a bad file must say so as a user error (exit 2, DESIGN.md decision 5) or an
// I/O error; an internal error means bad input reached a check meant for the program's own bugs.
inline void expect_user_error(const Status& s) {
  if (!s.is_ok() && s.kind() != ErrorKind::user_input && s.kind() != ErrorKind::io) std::abort();
}

// glm's fatal path ends the process with _Exit, which libFuzzer does not see as a crash (no input
// saved); an abort is.
inline void abort_on_fatal() {
  static const bool once = [] {
    register_abort_hook([] { std::abort(); });
    return true;
  }();
  (void)once;
}

}  // namespace glm::fuzz
