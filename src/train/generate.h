// Text generation from a loaded model, the reference way: every step runs the model over the whole
// sequence so far (TrainingEngine::logits, the last row) and chooses the next token with
// model/sampler.h, or with num_beams > 1 runs model/beam_search.h over every running beam. Its cost
// grows with the square of the length; a decoder with a KV cache must give the same tokens.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "base/status.h"
#include "model/beam_search.h"
#include "model/sampler.h"
#include "train/engine.h"

namespace glm {

struct GenerationOptions {
  SamplingOptions sampling;
  BeamOptions beams;  // num_beams > 1: beam search (sampling's temperature > 0: beam sample)
  int64_t max_new_tokens = 512;
  // Generation ends once one of these is produced (it is not part of the reply): the chat
  // template's role tokens and <|endoftext|> for GLM-4 (generation_config.json's eos_token_id).
  std::vector<int32_t> stop_ids;
  // Prompt and reply together fit this many tokens (the engine's max_tokens).
  int64_t max_tokens = 0;
};

struct Generation {
  std::vector<int32_t> tokens;  // the reply, without the stop token
  bool stopped = false;         // ended by a stop token; else by max_new_tokens or max_tokens
  double seconds = 0;
  double first_token_seconds = 0;  // until the first token was chosen (the prefill), 0 when none was
  std::optional<float> beam_score;  // beam search: the reply's score (transformers' sequences_scores)
};

// A finished search's reply into g: the best hypothesis' tokens without its end token, whether it
// ended with one, and its score.
void take_best_beam(const BeamSearch& search, Generation& g);

// The most tokens a reply to a prompt of `prompt` tokens may have under `options`.
int64_t reply_limit(const GenerationOptions& options, int64_t prompt);

// The reply to `prompt`; `sequence` keys its random draws (sampler.h), so the same prompt under the
// same seed and sequence number gives the same reply. Every rank of the engine calls it alike.
Result<Generation> generate(TrainingEngine& engine, std::span<const int32_t> prompt, const GenerationOptions& options,
                            uint64_t sequence);

}  // namespace glm
