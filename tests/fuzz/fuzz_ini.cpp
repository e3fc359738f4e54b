// An INI config file as `glm_hpc train --config FILE` reads it: the line scan, Boost's parse, and the
// validation of every value it sets.
#include <cstddef>
#include <cstdint>

#include "cli/options.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  glm::fuzz::abort_on_fatal();
  const std::string path = (glm::fuzz::scratch_dir() / "config.cfg").string();
  glm::fuzz::write_file(path, {reinterpret_cast<const char*>(data), size});
  const char* argv[] = {"glm_hpc", "train", "--config", path.c_str()};
  glm::fuzz::expect_user_error(glm::parse_options(4, argv).status());
  return 0;
}
