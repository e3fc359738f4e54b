// config.json of a Hugging Face model directory, both layouts (transformers glm, THUDM chatglm),
// read into the model configuration as import reads it.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "io/hf_import.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  glm::fuzz::abort_on_fatal();
  const auto dir = glm::fuzz::scratch_dir() / "model";
  std::filesystem::create_directories(dir);
  glm::fuzz::write_file(dir / "config.json", {reinterpret_cast<const char*>(data), size});
  glm::fuzz::expect_user_error(glm::read_hf_config(dir.string()).status());
  return 0;
}
