// Learning-rate schedules with Hugging Face transformers' semantics (get_*_schedule_with_warmup).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "base/enum_names.h"

namespace glm {

// transformers' names; constant keeps the warmup as constant_with_warmup does (no warmup is warmup 0).
enum class LrSchedulerType { cosine, linear, constant };

template <>
struct EnumNames<LrSchedulerType> {
  static constexpr std::pair<LrSchedulerType, std::string_view> table[] = {
      {LrSchedulerType::cosine, "cosine"},
      {LrSchedulerType::linear, "linear"},
      {LrSchedulerType::constant, "constant_with_warmup"},
      {LrSchedulerType::constant, "constant"}};
};

struct LrSchedule {
  LrSchedulerType type = LrSchedulerType::cosine;
  double base_lr = 0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  // Learning rate used by optimizer step `step` (0-based): linear warmup from 0, then the decay.
  double at(int64_t step) const;
};

// warmup_steps > 0 wins; otherwise ceil(warmup_ratio * total_steps), as in transformers.
int64_t resolve_warmup_steps(int64_t warmup_steps, double warmup_ratio, int64_t total_steps);

}  // namespace glm
