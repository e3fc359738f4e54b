// model.safetensors.index.json of a sharded checkpoint, beside two valid shards: the weight map
// checked against the shards it names.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "fuzz_util.h"
#include "io/safetensors.h"

namespace {

// Two small shards as write_sharded_safetensors lays them out, written once.
const std::filesystem::path& checkpoint_dir() {
  static const std::filesystem::path dir = [] {
    const auto d = glm::fuzz::fresh_dir("sharded");
    const std::vector<float> a(6, 1.0f), b(4, 2.0f);
    const std::vector<uint16_t> c(3, 0x3f80);
    if (!glm::write_safetensors(
             (d / "model-00001-of-00002.safetensors").string(),
             {{"a.weight", glm::StDType::F32, {2, 3}, a.data()}, {"c.bias", glm::StDType::BF16, {3}, c.data()}})
             .is_ok() ||
        !glm::write_safetensors((d / "model-00002-of-00002.safetensors").string(),
                                {{"b.weight", glm::StDType::F32, {4}, b.data()}})
             .is_ok())
      std::abort();
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  glm::fuzz::abort_on_fatal();
  const auto& dir = checkpoint_dir();
  glm::fuzz::write_file(dir / "model.safetensors.index.json", {reinterpret_cast<const char*>(data), size});
  auto checkpoint = glm::SafetensorsCheckpoint::open(dir.string());
  glm::fuzz::expect_user_error(checkpoint.status());
  if (!checkpoint.is_ok()) return 0;
  for (const std::string& name : checkpoint.value().names())
    if (checkpoint.value().find(name).info == nullptr) std::abort();
  return 0;
}
