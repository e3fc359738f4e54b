// Generation by recomputing the whole sequence at every step (see generate.h).
#include "train/generate.h"

#include <algorithm>
#include <chrono>

namespace glm {

Result<Generation> generate(TrainingEngine& engine, std::span<const int32_t> prompt, const GenerationOptions& options,
                            uint64_t sequence) {
  GLM_RETURN_IF_ERROR(options.sampling.validate());
  if (prompt.empty()) return GLM_USER_ERROR("an empty prompt: generation continues a sequence of at least one token");
  if (options.max_tokens > 0 && static_cast<int64_t>(prompt.size()) >= options.max_tokens)
    return GLM_USER_ERROR("a prompt of ", prompt.size(), " tokens leaves no room for a reply within ",
                          options.max_tokens, " tokens (--max_length)");
  const auto start = std::chrono::steady_clock::now();
  Generation g;
  HostMicroBatch batch;
  batch.tokens.assign(prompt.begin(), prompt.end());
  std::vector<float> logits, scratch;
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    if (options.max_tokens > 0 && batch.size() >= options.max_tokens) break;
    // One document; no targets (logits need none).
    const size_t n = batch.tokens.size();
    batch.targets.assign(n, -1);
    batch.positions.resize(n);
    for (size_t t = 0; t < n; ++t) batch.positions[t] = static_cast<int32_t>(t);
    batch.doc_start.assign(n, 0);
    batch.target_count = 0;
    GLM_RETURN_IF_ERROR(engine.logits(batch, logits, /*last_row_only=*/true));
    scratch.resize(logits.size());
    const int32_t next = sample_token(logits, batch.tokens, options.sampling, sequence, static_cast<uint64_t>(step),
                                      scratch);
    if (step == 0)
      g.first_token_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), next) != options.stop_ids.end()) {
      g.stopped = true;
      break;
    }
    g.tokens.push_back(next);
    batch.tokens.push_back(next);
  }
  g.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return g;
}

}  // namespace glm
