// Activation recomputation policy: what the forward keeps for backward and what backward recomputes.
#pragma once

#include <string_view>
#include <utility>

#include "base/enum_names.h"

namespace glm {

enum class Recompute {
  none,       // every activation of every layer is kept
  selective,  // GEMM outputs, attention output and statistics kept; RMSNorm outputs and SwiGLU recomputed
  full,       // only each layer's input kept; the whole layer is recomputed before its backward
};

template <>
struct EnumNames<Recompute> {
  static constexpr std::pair<Recompute, std::string_view> table[] = {
      {Recompute::none, "none"}, {Recompute::selective, "selective"}, {Recompute::full, "full"}};
};

}  // namespace glm
