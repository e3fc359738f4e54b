// A model.safetensors file (header and data) read as import reads it: the checkpoint directory
// opened, every tensor found by name and its floating-point data converted to f32.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  glm::fuzz::abort_on_fatal();
  const auto dir = glm::fuzz::fresh_dir("model");
  glm::fuzz::write_file(dir / "model.safetensors", {reinterpret_cast<const char*>(data), size});
  auto checkpoint = glm::SafetensorsCheckpoint::open(dir.string());
  glm::fuzz::expect_user_error(checkpoint.status());
  if (!checkpoint.is_ok()) return 0;
  std::vector<float> values;
  for (const std::string& name : checkpoint.value().names()) {
    const auto found = checkpoint.value().find(name);
    if (found.file == nullptr || found.info->name != name) std::abort();
    const glm::StTensorInfo& t = *found.info;
    if (found.file->data(t).size() != static_cast<size_t>(t.numel()) * glm::st_dtype_size(t.dtype)) std::abort();
    values.assign(static_cast<size_t>(t.numel()), 0.0f);
    glm::fuzz::expect_user_error(glm::read_as_f32(*found.file, t, values));
  }
  return 0;
}
