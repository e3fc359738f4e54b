// transformers' logits processors and warpers on one row, then a counter-based draw (sampler.h).
#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "base/counter_rng.h"

namespace glm {

Status SamplingOptions::validate() const {
  if (!std::isfinite(temperature) || temperature < 0)
    return GLM_USER_ERROR("--temperature must be a finite number >= 0 (0: greedy), got ", temperature);
  if (top_k < 0) return GLM_USER_ERROR("--top_k must be >= 0 (0: no limit), got ", top_k);
  if (!(top_p > 0 && top_p <= 1)) return GLM_USER_ERROR("--top_p must be in (0, 1], got ", top_p);
  if (!std::isfinite(repetition_penalty) || repetition_penalty <= 0)
    return GLM_USER_ERROR("--repetition_penalty must be a finite number > 0 (1: none), got ", repetition_penalty);
  return Status::ok();
}

namespace {

constexpr float kRemoved = -std::numeric_limits<float>::infinity();

// CTRL's penalty: a logit of a token already in the sequence is divided by the penalty when
// positive, multiplied when negative (each token once, however often it occurred).
void penalize_repetitions(std::span<float> scores, std::span<const int32_t> context, double penalty) {
  if (penalty == 1.0) return;
  std::vector<int32_t> seen(context.begin(), context.end());
  std::sort(seen.begin(), seen.end());
  seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
  for (const int32_t t : seen) {
    if (t < 0 || static_cast<size_t>(t) >= scores.size()) continue;
    float& s = scores[static_cast<size_t>(t)];
    s = static_cast<float>(s < 0 ? s * penalty : s / penalty);
  }
}

// Everything below the k-th highest score removed (ties with it stay); at least min_keep stay.
void keep_top_k(std::span<float> scores, int64_t k, int64_t min_keep) {
  if (k <= 0) return;
  k = std::max(k, min_keep);
  if (static_cast<size_t>(k) >= scores.size()) return;
  std::vector<float> sorted(scores.begin(), scores.end());
  std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<float>());
  const float kth = sorted[static_cast<size_t>(k - 1)];
  for (float& s : scores)
    if (s < kth) s = kRemoved;
}

// From the lowest score up, the tokens whose cumulative probability is <= 1 - p removed; the
// min_keep highest always stay. Equal scores are ordered by id, as a stable sort leaves them.
void keep_top_p(std::span<float> scores, double p, int64_t min_keep) {
  if (p >= 1.0) return;
  std::vector<int32_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return scores[a] < scores[b]; });
  const float top = scores[static_cast<size_t>(order.back())];
  double total = 0;
  for (const float s : scores) total += std::exp(static_cast<double>(s) - top);
  double cumulative = 0;
  for (size_t i = 0; i + static_cast<size_t>(std::max<int64_t>(min_keep, 1)) < order.size(); ++i) {
    float& s = scores[static_cast<size_t>(order[i])];
    cumulative += std::exp(static_cast<double>(s) - top) / total;
    if (cumulative > 1.0 - p) break;
    s = kRemoved;
  }
}

int32_t argmax(std::span<const float> scores) {
  return static_cast<int32_t>(std::max_element(scores.begin(), scores.end()) - scores.begin());
}

}  // namespace

void process_scores(std::span<float> scores, std::span<const int32_t> context, const SamplingOptions& options,
                    int64_t min_keep) {
  penalize_repetitions(scores, context, options.repetition_penalty);
  if (options.temperature == 0) return;
  for (float& s : scores) s = static_cast<float>(s / options.temperature);
  keep_top_k(scores, options.top_k, min_keep);
  keep_top_p(scores, options.top_p, min_keep);
}

int32_t sample_token(std::span<const float> logits, std::span<const int32_t> context, const SamplingOptions& options,
                     uint64_t sequence, uint64_t step, std::span<float> scratch) {
  std::span<float> scores = scratch.first(logits.size());
  std::copy(logits.begin(), logits.end(), scores.begin());
  process_scores(scores, context, options);
  if (options.temperature == 0) return argmax(scores);
  // The draw: the first token whose cumulative probability (in id order) reaches u.
  const float top = scores[static_cast<size_t>(argmax(scores))];
  double total = 0;
  for (const float s : scores) total += std::exp(static_cast<double>(s) - top);
  const double u = counter_uniform(splitmix64_mix(options.seed ^ splitmix64_mix(sequence)), step) * total;
  double cumulative = 0;
  int32_t last = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    if (scores[i] == kRemoved) continue;
    cumulative += std::exp(static_cast<double>(scores[i]) - top);
    last = static_cast<int32_t>(i);
    if (cumulative >= u) return last;
  }
  return last;  // rounding left u a hair above the total
}

}  // namespace glm
