// Beam search for one prompt, as transformers' generate(num_beams > 1) defines it (transformers 5's
// vectorized GenerationMixin._beam_search, one prompt): every step scores each running beam's next
// token by its log-probability (log-softmax of the logits, then the repetition penalty, and when
// sampling temperature, top-k and top-p) plus the beam's score so far; the best
// max(2, 1 + stop ids) x num_beams of those candidates over all beams are kept (drawn without
// replacement in proportion to their probability when sampling, transformers' beam sample). Of them,
// those that end (a stop id, or the longest reply) and are among the first num_beams become finished
// hypotheses scored by sum of log-probs / generated length^length_penalty (the end token counted);
// the num_beams best that do not end run on. Search ends when no running beam can beat the worst of
// num_beams finished hypotheses (early_stopping: the heuristic, all num_beams finished, or the
// length bound), or when every candidate ends. The reply is the best finished hypothesis.
//
// The search holds tokens and scores only: the caller runs the model on each running beam's last
// token (train/cached_generator.h shares the prompt's and common prefixes' KV cache rows between
// beams; train/generate.h recomputes every beam's whole sequence) and hands the logits to step().
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "base/enum_names.h"
#include "base/status.h"
#include "model/sampler.h"

namespace glm {

// transformers' early_stopping: false (a running beam may go on while its score over the current
// length still beats the worst finished one), true (stop once num_beams hypotheses have finished),
// "never" (go on while its score could still win at the longest length a positive length_penalty
// favours).
enum class EarlyStopping { heuristic, when_full, never };
template <>
struct EnumNames<EarlyStopping> {
  static constexpr std::pair<EarlyStopping, std::string_view> table[] = {
      {EarlyStopping::heuristic, "false"}, {EarlyStopping::when_full, "true"}, {EarlyStopping::never, "never"}};
};

struct BeamOptions {
  int64_t num_beams = 1;        // 1: no beam search
  double length_penalty = 1.0;  // exponent of the length that divides a finished hypothesis' score
  EarlyStopping early_stopping = EarlyStopping::heuristic;

  // Each value in its range, named as the option that sets it.
  Status validate() const;
};

// A finished hypothesis, or the reply of a search.
struct BeamHypothesis {
  std::vector<int32_t> tokens;  // the generated tokens, the end token (if any) included
  float score = 0;              // transformers' sequences_scores
  bool stopped = false;         // its last token is a stop id
};

class BeamSearch {
 public:
  // max_new: the most tokens a reply may have (generation's max_new_tokens, within max_tokens);
  // stop_ids end a hypothesis; `sequence` keys the draws when sampling (as sampler.h).
  BeamSearch(std::span<const int32_t> prompt, int64_t max_new, const SamplingOptions& sampling,
             const BeamOptions& beams, std::span<const int32_t> stop_ids, uint64_t sequence);

  bool done() const { return done_; }
  size_t running() const { return running_.size(); }
  // Running beam b's reply so far: its last token (none before the first step) is the one the next
  // forward feeds.
  std::span<const int32_t> reply(size_t b) const { return running_[b].tokens; }
  // Steps taken (tokens in each running reply).
  int64_t steps() const { return steps_; }

  // One step from the logits (`vocab` floats each, running() rows, in beam order) of every running
  // beam's last token (of the prompt's, at the first step). Afterwards running beam b extends the
  // beam that was parents()[b] before the step by one token.
  void step(std::span<const float> logits, int64_t vocab);
  // The same step from each running beam's row statistics (its maximum and log of the sum of
  // exp(x - maximum): 2 a beam) and its k largest logits and their tokens, best first
  // (Backend::top_k_rows), of rows of `vocab`. Enough without a repetition penalty where k >=
  // candidates(...) and, when sampling, top_k is set and k >= top_k: the candidates, or what top-k
  // leaves of a row (its ties with the k-th largest beyond the k aside), are among them.
  void step_top(std::span<const float> stats, std::span<const float> top, std::span<const int32_t> tokens, int64_t k,
                int64_t vocab);
  // Candidates a step keeps: max(2, 1 + stop ids) x num_beams.
  static size_t candidates(const BeamOptions& beams, size_t stop_ids);
  const std::vector<size_t>& parents() const { return parents_; }

  // The best finished hypothesis (the best running beam if none has finished, which only a search
  // ended before its end can leave).
  BeamHypothesis best() const;

 private:
  struct Beam {
    std::vector<int32_t> tokens;
    float score = 0;
  };
  struct Candidate {
    float score = 0;  // the beam's score plus the token's processed log-probability
    float key = 0;    // what ranks the candidates: the score, or the score perturbed for a draw
    int32_t beam = 0, token = 0;
  };
  bool is_stop(int32_t token) const;
  // The rest of a step, from its candidates: the best kept, hypotheses finished, beams chosen.
  void choose();
  // The best `keep` candidates of running beam b's processed scores, by key, into candidates_:
  // scores[i] is token tokens[i] (token i where tokens is empty) of a row of `vocab`.
  void collect(size_t b, std::span<float> scores, size_t keep, size_t vocab, std::span<const int32_t> tokens = {});
  // A beam's share of the candidates, max(2, 1 + stop ids): also the tokens the top-k and top-p
  // warpers keep at least, one that does not end among them (transformers' min_tokens_to_keep).
  static size_t per_beam(size_t stop_ids);
  int64_t min_keep() const { return static_cast<int64_t>(per_beam(stop_ids_.size())); }

  std::vector<int32_t> prompt_;
  int64_t max_new_ = 0;
  SamplingOptions sampling_;
  BeamOptions options_;
  std::vector<int32_t> stop_ids_;
  uint64_t sequence_ = 0;
  std::vector<Beam> running_;
  std::vector<BeamHypothesis> finished_;  // best first, at most num_beams
  std::vector<size_t> parents_;
  int64_t steps_ = 0;
  bool improvable_ = true;  // transformers' is_early_stop_heuristic_unsatisfied
  bool done_ = false;
  std::vector<float> scores_;
  std::vector<int32_t> context_, tokens_;
  std::vector<std::pair<int32_t, float>> sparse_;
  std::vector<Candidate> candidates_;
};

}  // namespace glm
