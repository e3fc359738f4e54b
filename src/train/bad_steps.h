// Surviving a bad step: a non-finite loss or gradient norm, or a spike of either (a z-score over a
// moving window of the accepted steps, as llm.c's -sl/-sg and Megatron's spiky-loss check), skips
// that step's update on every rank instead of ending the run (TrainingEngine::step's StepFilter);
// --max_skipped_steps consecutive skips end it, with the last checkpoint as it was.
#pragma once

#include <cstdint>
#include <deque>
#include <string>

namespace glm {

struct BadStepOptions {
  bool nonfinite = true;          // --skip_nonfinite_steps
  double loss_zscore = 0;         // --skip_loss_zscore: > 0 skips a loss this many deviations over the mean
  double grad_norm_zscore = 0;    // --skip_grad_norm_zscore: the same for the gradient norm
  int64_t max_consecutive = 10;   // --max_skipped_steps
};

// A test hook (TrainConfig::gradient_fault, EngineConfig::gradient_fault): NaN written into one
// element of `rank`'s reduced gradient before the norm of the tries at optimizer steps at, ...,
// while `times` lasts (a skipped step is tried again at the same optimizer step). at 0: never.
struct GradientFault {
  int64_t at = 0;
  int rank = 0;
  int times = 1;
};

class BadStepGuard {
 public:
  static constexpr int kWindow = 128;      // accepted steps the spike checks compare against
  static constexpr int kMinHistory = 16;   // before as many, no step is a spike

  explicit BadStepGuard(const BadStepOptions& options) : options_(options) {}
  bool active() const { return options_.nonfinite || spikes(); }
  // The spike checks need the norm before the update even without clipping.
  bool spikes() const { return options_.loss_zscore > 0 || options_.grad_norm_zscore > 0; }
  // Why a step of this loss and norm is skipped, or empty.
  std::string check(double loss, double grad_norm) const;
  // After each step: an accepted one joins the windows; a skipped one counts towards the limit.
  void record(double loss, double grad_norm, bool skipped);
  int64_t consecutive_skips() const { return consecutive_; }
  bool over_limit() const { return options_.max_consecutive > 0 && consecutive_ >= options_.max_consecutive; }
  const BadStepOptions& options() const { return options_; }

 private:
  // How many deviations x is above the window's mean; 0 with too short or constant a history.
  static double zscore(const std::deque<double>& window, double x);
  BadStepOptions options_;
  std::deque<double> losses_, norms_;
  int64_t consecutive_ = 0;
};

}  // namespace glm
