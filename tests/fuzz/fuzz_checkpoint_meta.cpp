// A checkpoint's meta.json (and the args.json beside it) read as export and resume read them: the
// checkpoint's description with its model configuration and LoRA settings, and the run's state.
// The input is meta.json, then optionally a NUL and args.json.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "train/checkpoint.h"
#include "train/checkpoint_meta.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  glm::fuzz::abort_on_fatal();
  const auto parts = glm::fuzz::split_input(data, size, 2);
  const auto dir = glm::fuzz::fresh_dir("run") / "checkpoint-10";
  std::filesystem::create_directories(dir);
  glm::fuzz::write_file(dir / "meta.json", parts[0]);
  if (parts.size() > 1) glm::fuzz::write_file(dir / "args.json", parts[1]);
  glm::fuzz::expect_user_error(glm::read_checkpoint_info(dir.string()).status());
  auto meta = glm::read_checkpoint_meta(dir);
  glm::fuzz::expect_user_error(meta.status());
  if (!meta.is_ok()) return 0;
  // What resume and export read next: the model configuration (from args.json when meta.json has
  // none) and, for a LoRA checkpoint, its adapter settings.
  nlohmann::json args = nlohmann::json::object();
  if (parts.size() > 1) {
    args = nlohmann::json::parse(parts[1], nullptr, /*allow_exceptions=*/false);
    if (args.is_discarded()) args = nlohmann::json::object();
  }
  auto config = glm::saved_model_config(meta.value(), args);
  glm::fuzz::expect_user_error(config.status());
  if (config.is_ok() && meta.value().train_type == glm::TrainType::lora)
    glm::fuzz::expect_user_error(glm::saved_lora(meta.value(), config.value()).status());
  return 0;
}
