// The per-step agreement on the stop flag.
#include "train/preemption.h"

#include <cstdint>

namespace glm {

Result<int> agree_on_preemption(Communicator& comm) {
  const int32_t mine = stop_signal();
  int32_t agreed = 0;
  GLM_RETURN_IF_ERROR(comm.all_reduce(&mine, &agreed, 1, CommType::i32, ReduceOp::max));
  return static_cast<int>(agreed);
}

}  // namespace glm
