// Generation by recomputing the whole sequence at every step (see generate.h).
#include "train/generate.h"

#include <algorithm>
#include <chrono>

namespace glm {

namespace {

// The logits of the last token of one sequence, recomputing all of it.
Status last_logits(TrainingEngine& engine, std::span<const int32_t> tokens, HostMicroBatch& batch,
                   std::vector<float>& logits) {
  const size_t n = tokens.size();
  batch.tokens.assign(tokens.begin(), tokens.end());
  batch.targets.assign(n, -1);  // one document; no targets (logits need none)
  batch.positions.resize(n);
  for (size_t t = 0; t < n; ++t) batch.positions[t] = static_cast<int32_t>(t);
  batch.doc_start.assign(n, 0);
  batch.target_count = 0;
  return engine.logits(batch, logits, /*last_row_only=*/true);
}

Result<Generation> beam_generate(TrainingEngine& engine, std::span<const int32_t> prompt,
                                 const GenerationOptions& options, uint64_t sequence) {
  const auto start = std::chrono::steady_clock::now();
  BeamSearch search(prompt, reply_limit(options, static_cast<int64_t>(prompt.size())), options.sampling, options.beams,
                    options.stop_ids, sequence);
  HostMicroBatch batch;
  std::vector<int32_t> tokens;
  std::vector<float> row, rows;
  Generation g;
  while (!search.done()) {
    rows.clear();
    for (size_t b = 0; b < search.running(); ++b) {
      tokens.assign(prompt.begin(), prompt.end());
      tokens.insert(tokens.end(), search.reply(b).begin(), search.reply(b).end());
      GLM_RETURN_IF_ERROR(last_logits(engine, tokens, batch, row));
      rows.insert(rows.end(), row.begin(), row.end());
    }
    search.step(rows, engine.config().vocab_size);
    if (search.steps() == 1)
      g.first_token_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  take_best_beam(search, g);
  g.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return g;
}

}  // namespace

void take_best_beam(const BeamSearch& search, Generation& g) {
  BeamHypothesis best = search.best();
  g.stopped = best.stopped;
  if (best.stopped) best.tokens.pop_back();
  g.tokens = std::move(best.tokens);
  g.beam_score = best.score;
}

int64_t reply_limit(const GenerationOptions& options, int64_t prompt) {
  return options.max_tokens > 0 ? std::min(options.max_new_tokens, options.max_tokens - prompt)
                                : options.max_new_tokens;
}

Result<Generation> generate(TrainingEngine& engine, std::span<const int32_t> prompt, const GenerationOptions& options,
                            uint64_t sequence) {
  GLM_RETURN_IF_ERROR(options.sampling.validate());
  GLM_RETURN_IF_ERROR(options.beams.validate());
  if (prompt.empty()) return GLM_USER_ERROR("an empty prompt: generation continues a sequence of at least one token");
  if (options.max_tokens > 0 && static_cast<int64_t>(prompt.size()) >= options.max_tokens)
    return GLM_USER_ERROR("a prompt of ", prompt.size(), " tokens leaves no room for a reply within ",
                          options.max_tokens, " tokens (--max_length)");
  if (options.beams.num_beams > 1) return beam_generate(engine, prompt, options, sequence);
  const auto start = std::chrono::steady_clock::now();
  Generation g;
  HostMicroBatch batch;
  std::vector<int32_t> tokens(prompt.begin(), prompt.end());
  std::vector<float> logits, scratch;
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    if (options.max_tokens > 0 && static_cast<int64_t>(tokens.size()) >= options.max_tokens) break;
    GLM_RETURN_IF_ERROR(last_logits(engine, tokens, batch, logits));
    scratch.resize(logits.size());
    const int32_t next = sample_token(logits, tokens, options.sampling, sequence, static_cast<uint64_t>(step), scratch);
    if (step == 0)
      g.first_token_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), next) != options.stop_ids.end()) {
      g.stopped = true;
      break;
    }
    g.tokens.push_back(next);
    tokens.push_back(next);
  }
  g.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return g;
}

}  // namespace glm
