// A --comm_profile file (bench_comm --json output) read as --reduce_bucket_size auto reads it, for
// every ZeRO stage's collective and both reduction dtypes, and the bucket size chosen from it.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "fuzz_util.h"
#include "zero/bucket_autotune.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  glm::fuzz::abort_on_fatal();
  const std::string path = (glm::fuzz::scratch_dir() / "comm_profile.json").string();
  glm::fuzz::write_file(path, {reinterpret_cast<const char*>(data), size});
  for (const int stage : {0, 2})
    for (const glm::DType reduce : {glm::DType::f32, glm::DType::bf16}) {
      auto curve = glm::read_bandwidth_curve(path, stage, reduce);
      glm::fuzz::expect_user_error(curve.status());
      if (!curve.is_ok()) continue;
      if (glm::choose_reduce_bucket_size(curve.value(), stage, reduce, path).elements < 1) std::abort();
    }
  return 0;
}
