// transformers' beam search for one prompt (see beam_search.h).
#include "model/beam_search.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "base/counter_rng.h"
#include "kernels/cpu/cpu_ops.h"

namespace glm {

Status BeamOptions::validate() const {
  if (num_beams < 1) return GLM_USER_ERROR("--num_beams must be >= 1 (1: no beam search), got ", num_beams);
  if (!std::isfinite(length_penalty))
    return GLM_USER_ERROR("--length_penalty must be a finite number, got ", length_penalty);
  return Status::ok();
}

BeamSearch::BeamSearch(std::span<const int32_t> prompt, int64_t max_new, const SamplingOptions& sampling,
                       const BeamOptions& beams, std::span<const int32_t> stop_ids, uint64_t sequence)
    : prompt_(prompt.begin(), prompt.end()),
      max_new_(max_new),
      sampling_(sampling),
      options_(beams),
      stop_ids_(stop_ids.begin(), stop_ids.end()),
      sequence_(sequence),
      running_(1) {
  done_ = max_new_ < 1;
}

bool BeamSearch::is_stop(int32_t token) const {
  return std::find(stop_ids_.begin(), stop_ids_.end(), token) != stop_ids_.end();
}

void BeamSearch::collect(size_t b, std::span<float> scores, size_t keep, size_t vocab,
                         std::span<const int32_t> tokens) {
  // A min-heap (by key, then the later token first out) of the best `keep` of the row.
  const auto worse = [](const Candidate& x, const Candidate& y) {
    return x.key > y.key || (x.key == y.key && x.token < y.token);
  };
  const size_t first = candidates_.size();
  const bool sampling = sampling_.temperature > 0;
  const uint64_t draws = splitmix64_mix(sampling_.seed ^ splitmix64_mix(sequence_ ^ 0x6265616d73ULL));
  const float base = running_[b].score;
  for (size_t t = 0; t < scores.size(); ++t) {
    if (scores[t] == -std::numeric_limits<float>::infinity()) continue;
    const int32_t token = tokens.empty() ? static_cast<int32_t>(t) : tokens[t];
    Candidate c{.score = scores[t] + base, .key = 0, .beam = static_cast<int32_t>(b), .token = token};
    c.key = c.score;
    if (sampling) {  // Gumbel-top-k: the k largest perturbed scores are k draws without replacement
      const double u = counter_uniform(draws ^ splitmix64_mix(static_cast<uint64_t>(steps_)),
                                       static_cast<uint64_t>(b) * vocab + static_cast<uint64_t>(token));
      c.key = static_cast<float>(static_cast<double>(c.score) - std::log(-std::log(u)));
    }
    if (candidates_.size() - first < keep) {
      candidates_.push_back(c);
      std::push_heap(candidates_.begin() + static_cast<std::ptrdiff_t>(first), candidates_.end(), worse);
    } else if (worse(c, candidates_[first])) {
      std::pop_heap(candidates_.begin() + static_cast<std::ptrdiff_t>(first), candidates_.end(), worse);
      candidates_.back() = c;
      std::push_heap(candidates_.begin() + static_cast<std::ptrdiff_t>(first), candidates_.end(), worse);
    }
  }
}

size_t BeamSearch::per_beam(size_t stop_ids) { return std::max<size_t>(2, 1 + stop_ids); }

size_t BeamSearch::candidates(const BeamOptions& beams, size_t stop_ids) {
  return per_beam(stop_ids) * static_cast<size_t>(beams.num_beams);
}

void BeamSearch::step(std::span<const float> logits, int64_t vocab) {
  if (done_) return;
  const size_t v = static_cast<size_t>(vocab), keep = candidates(options_, stop_ids_.size());
  candidates_.clear();
  for (size_t b = 0; b < running_.size(); ++b) {
    const std::span<const float> row = logits.subspan(b * v, v);
    scores_.assign(row.begin(), row.end());
    // log-softmax, as transformers takes it before the processors (and as step_top() from the same statistics)
    const cpu::SoftmaxStatistics st = cpu::softmax_statistics(scores_.data(), static_cast<int64_t>(scores_.size()));
    for (float& s : scores_) s = (s - st.max) - st.log_sum;
    context_.clear();
    if (sampling_.repetition_penalty != 1.0) {
      context_.assign(prompt_.begin(), prompt_.end());
      context_.insert(context_.end(), running_[b].tokens.begin(), running_[b].tokens.end());
    }
    process_scores(scores_, context_, sampling_, min_keep());
    collect(b, scores_, keep, v);
  }
  choose();
}

void BeamSearch::step_top(std::span<const float> stats, std::span<const float> top, std::span<const int32_t> tokens,
                          int64_t k, int64_t vocab) {
  if (done_) return;
  const size_t width = static_cast<size_t>(k), keep = candidates(options_, stop_ids_.size());
  const bool sampling = sampling_.temperature > 0;
  candidates_.clear();
  for (size_t b = 0; b < running_.size(); ++b) {
    // The log-probabilities of the row's best, as step() computes them from the whole row.
    sparse_.clear();
    for (size_t j = 0; j < width && (sampling || j < keep); ++j) {
      const int32_t token = tokens[b * width + j];
      if (token < 0) break;
      sparse_.emplace_back(token, (top[b * width + j] - stats[2 * b]) - stats[2 * b + 1]);
    }
    if (!sampling) {  // they are the candidates
      for (const auto& [token, log_prob] : sparse_) {
        const float score = log_prob + running_[b].score;
        candidates_.push_back({.score = score, .key = score, .beam = static_cast<int32_t>(b), .token = token});
      }
      continue;
    }
    // The warpers over them in token order (their ties fall as over the whole row), then the draws.
    std::sort(sparse_.begin(), sparse_.end());
    scores_.resize(sparse_.size());
    tokens_.resize(sparse_.size());
    for (size_t i = 0; i < sparse_.size(); ++i) std::tie(tokens_[i], scores_[i]) = sparse_[i];
    process_scores(scores_, {}, sampling_, min_keep());
    collect(b, scores_, keep, static_cast<size_t>(vocab), tokens_);
  }
  choose();
}

void BeamSearch::choose() {
  const size_t beams = static_cast<size_t>(options_.num_beams), keep = candidates(options_, stop_ids_.size());
  // The best `keep` over all beams, best first (equal keys: the lower beam, then the lower token).
  std::sort(candidates_.begin(), candidates_.end(), [](const Candidate& x, const Candidate& y) {
    return x.key > y.key || (x.key == y.key && (x.beam < y.beam || (x.beam == y.beam && x.token < y.token)));
  });
  if (candidates_.size() > keep) candidates_.resize(keep);

  const int64_t length = steps_ + 1;
  const auto ends = [&](const Candidate& c) { return is_stop(c.token) || length >= max_new_; };
  const auto penalized = [&](float score, int64_t n) {
    return score / static_cast<float>(std::pow(static_cast<double>(n), options_.length_penalty));
  };
  // Finished hypotheses: the ending candidates among the first num_beams, while they may still
  // matter (transformers scores the others -1e9 in its merge).
  const bool full = finished_.size() == beams;
  if (improvable_ && !(full && options_.early_stopping == EarlyStopping::when_full)) {
    for (size_t i = 0; i < std::min(beams, candidates_.size()); ++i) {
      const Candidate& c = candidates_[i];
      if (!ends(c)) continue;
      BeamHypothesis h{.tokens = running_[static_cast<size_t>(c.beam)].tokens,
                       .score = penalized(c.score, length),
                       .stopped = is_stop(c.token)};
      h.tokens.push_back(c.token);
      const auto at = std::upper_bound(finished_.begin(), finished_.end(), h.score,
                                       [](float s, const BeamHypothesis& f) { return s > f.score; });
      finished_.insert(at, std::move(h));
      if (finished_.size() > beams) finished_.pop_back();
    }
  }
  // The running beams: the num_beams best candidates by score that do not end.
  std::vector<size_t> order(candidates_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return candidates_[x].score > candidates_[y].score; });
  std::vector<Beam> next;
  parents_.clear();
  for (const size_t i : order) {
    const Candidate& c = candidates_[i];
    if (next.size() == beams) break;
    if (ends(c)) continue;
    Beam beam{.tokens = running_[static_cast<size_t>(c.beam)].tokens, .score = c.score};
    beam.tokens.push_back(c.token);
    next.push_back(std::move(beam));
    parents_.push_back(static_cast<size_t>(c.beam));
  }
  running_ = std::move(next);
  steps_ = length;
  if (running_.empty()) {
    done_ = true;
    return;
  }
  // Can the best running beam still beat the worst of num_beams finished hypotheses?
  const bool longest = options_.early_stopping == EarlyStopping::never && options_.length_penalty > 0;
  if (finished_.size() == beams)
    improvable_ = improvable_ && penalized(running_[0].score, longest ? max_new_ : steps_) > finished_.back().score;
  done_ = !improvable_ || (finished_.size() == beams && options_.early_stopping == EarlyStopping::when_full);
}

BeamHypothesis BeamSearch::best() const {
  if (!finished_.empty()) return finished_.front();
  BeamHypothesis h;
  if (running_.empty()) return h;
  h.tokens = running_[0].tokens;
  h.score = running_[0].score /
            static_cast<float>(std::pow(static_cast<double>(std::max<int64_t>(steps_, 1)), options_.length_penalty));
  return h;
}

}  // namespace glm
