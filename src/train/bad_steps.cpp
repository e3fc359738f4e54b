// Bad-step checks (see bad_steps.h).
#include "train/bad_steps.h"

#include <cmath>
#include <cstdio>

namespace glm {

double BadStepGuard::zscore(const std::deque<double>& window, double x) {
  if (static_cast<int>(window.size()) < kMinHistory) return 0;
  double mean = 0;
  for (const double v : window) mean += v;
  mean /= static_cast<double>(window.size());
  double var = 0;
  for (const double v : window) var += (v - mean) * (v - mean);
  const double sd = std::sqrt(var / static_cast<double>(window.size()));
  return sd > 0 ? (x - mean) / sd : 0;
}

std::string BadStepGuard::check(double loss, double grad_norm) const {
  char text[160];
  if (options_.nonfinite && (!std::isfinite(loss) || !std::isfinite(grad_norm))) {
    std::snprintf(text, sizeof(text), "non-finite %s (loss %g, gradient norm %g)",
                  std::isfinite(loss) ? "gradient norm" : "loss", loss, grad_norm);
    return text;
  }
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) return "";  // not ours to skip: the engine fails the step
  if (options_.loss_zscore > 0) {
    const double z = zscore(losses_, loss);
    if (z > options_.loss_zscore) {
      std::snprintf(text, sizeof(text), "loss spike (%g, z-score %.1f over the last %zu steps > --skip_loss_zscore %g)",
                    loss, z, losses_.size(), options_.loss_zscore);
      return text;
    }
  }
  if (options_.grad_norm_zscore > 0) {
    const double z = zscore(norms_, grad_norm);
    if (z > options_.grad_norm_zscore) {
      std::snprintf(text, sizeof(text),
                    "gradient norm spike (%g, z-score %.1f over the last %zu steps > --skip_grad_norm_zscore %g)",
                    grad_norm, z, norms_.size(), options_.grad_norm_zscore);
      return text;
    }
  }
  return "";
}

void BadStepGuard::record(double loss, double grad_norm, bool skipped) {
  if (skipped) {
    ++consecutive_;
    return;
  }
  consecutive_ = 0;
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) return;
  losses_.push_back(loss);
  norms_.push_back(grad_norm);
  if (static_cast<int>(losses_.size()) > kWindow) losses_.pop_front();
  if (static_cast<int>(norms_.size()) > kWindow) norms_.pop_front();
}

}  // namespace glm
