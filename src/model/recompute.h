// Activation recomputation policy: what the forward keeps for backward and what backward recomputes.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"

namespace glm {

enum class Recompute {
  none,       // every activation of every layer is kept
  selective,  // GEMM outputs, attention output and statistics kept; RMSNorm outputs and SwiGLU recomputed
  full,       // only each layer's input kept; the whole layer is recomputed before its backward
};

inline Result<Recompute> parse_recompute(std::string_view s) {
  if (s == "none") return Recompute::none;
  if (s == "selective") return Recompute::selective;
  if (s == "full") return Recompute::full;
  return GLM_USER_ERROR("recompute must be none, selective or full, got '", s, "'");
}

inline const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
  }
  return "?";
}

}  // namespace glm
