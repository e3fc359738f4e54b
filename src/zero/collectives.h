// What the ZeRO pieces share about collectives: the element type of a dtype on the wire, and the
// host time spent waiting for requests (exposed communication).
#pragma once

#include <chrono>
#include <memory>

#include "base/tensor.h"
#include "mpi/communicator.h"

namespace glm {

// i16 (split masters' low halves) is never communicated.
inline Result<CommType> comm_type(DType d) {
  switch (d) {
    case DType::f64:
      return CommType::f64;
    case DType::bf16:
      return CommType::bf16;
    case DType::i32:
      return CommType::i32;
    case DType::f32:
      return CommType::f32;
    case DType::i16:
      break;
  }
  return GLM_INTERNAL_ERROR("no collective type for dtype ", static_cast<int>(d));
}

class CommWaits {
 public:
  // Waits for request (if any) and releases it; the wait's time is counted.
  Status wait(std::unique_ptr<CommRequest>& request) {
    if (!request) return Status::ok();
    const auto start = std::chrono::steady_clock::now();
    Status s = request->wait();
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    request.reset();
    return s;
  }
  // Seconds waited since the last take().
  double take() {
    const double s = seconds_;
    seconds_ = 0;
    return s;
  }

 private:
  double seconds_ = 0;
};

}  // namespace glm
