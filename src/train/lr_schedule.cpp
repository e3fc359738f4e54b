// LR schedule arithmetic.
#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace glm {

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps)
    return base_lr * static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup_steps));
  if (type == LrSchedulerType::constant) return base_lr;
  const double progress =
      static_cast<double>(step - warmup_steps) / static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  if (type == LrSchedulerType::linear) return base_lr * std::max(0.0, 1.0 - progress);
  return base_lr * std::max(0.0, 0.5 * (1.0 + std::cos(std::numbers::pi * progress)));
}

int64_t resolve_warmup_steps(int64_t warmup_steps, double warmup_ratio, int64_t total_steps) {
  if (warmup_steps > 0) return warmup_steps;
  return static_cast<int64_t>(std::ceil(warmup_ratio * static_cast<double>(total_steps)));
}

}  // namespace glm
