// A typed view of backend memory (host for the CPU backend, device for CUDA). Owns nothing.
#pragma once

#include <cstddef>
#include <cstdint>

namespace glm {

// i16: the low halves of split fp32 master weights (kernels/master_split.h).
enum class DType : uint8_t { f32, f64, bf16, i32, i16 };

constexpr size_t dtype_size(DType d) {
  return d == DType::f64 ? 8 : ((d == DType::bf16 || d == DType::i16) ? 2 : 4);
}
constexpr const char* dtype_name(DType d) {
  return d == DType::f32 ? "f32" : d == DType::f64 ? "f64" : d == DType::bf16 ? "bf16" : d == DType::i32 ? "i32" : "i16";
}

struct Tensor {
  void* data = nullptr;
  int64_t numel = 0;
  DType dtype = DType::f32;

  bool empty() const { return data == nullptr || numel == 0; }
  size_t bytes() const { return static_cast<size_t>(numel) * dtype_size(dtype); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  Tensor slice(int64_t offset, int64_t count) const {
    return Tensor{static_cast<char*>(data) + static_cast<size_t>(offset) * dtype_size(dtype), count, dtype};
  }
};

}  // namespace glm
