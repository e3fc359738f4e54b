// Choosing the next token from a row of logits, as transformers' generate() does: the repetition
// penalty over the tokens so far, then temperature, top-k and top-p (in that order), then a draw
// from the softmax of what is left; temperature 0 is greedy (ms-swift's convention, transformers'
// do_sample=False). Draws come from a counter-based stream (base/counter_rng.h): the same seed,
// sequence and step give the same token on any machine, whatever else is generated beside it.
#pragma once

#include <cstdint>
#include <span>

#include "base/status.h"

namespace glm {

struct SamplingOptions {
  double temperature = 1.0;         // 0: greedy (the highest logit, the lowest id on ties)
  int64_t top_k = 0;                // keep the k highest logits (ties with the k-th kept); 0: all
  double top_p = 1.0;               // keep the smallest set of highest logits whose probability is >= top_p
  double repetition_penalty = 1.0;  // > 1 discourages tokens already in the sequence (CTRL's rule)
  uint64_t seed = 42;

  // Each value in its range, named as the option that sets it.
  Status validate() const;
};

// transformers' logits processors and warpers on one row of scores, in place: the repetition
// penalty over `context`, then, when sampling (temperature > 0), temperature, top-k and top-p, which
// leave the removed tokens at -infinity and keep at least min_keep. Beam search (model/beam_search.h)
// applies them to log-probs, keeping one more than its end tokens (transformers' min_tokens_to_keep).
void process_scores(std::span<float> scores, std::span<const int32_t> context, const SamplingOptions& options,
                    int64_t min_keep = 1);

// The token chosen at generation step `step` of sequence `sequence` from logits (vocab entries),
// with the sequence's tokens so far (prompt and generated) in `context` for the repetition penalty.
// scratch: vocab floats the call may overwrite.
int32_t sample_token(std::span<const float> logits, std::span<const int32_t> context, const SamplingOptions& options,
                     uint64_t sequence, uint64_t step, std::span<float> scratch);

}  // namespace glm
