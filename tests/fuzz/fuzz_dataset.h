// What the dataset targets share: the sample tokenizer, and the checks every sample of a loaded
// dataset must pass, since the trainer indexes embeddings and logits with them unchecked.
#pragma once

#include <cstdlib>
#include <memory>

#include "data/dataset.h"
#include "data/tokenizer.h"

namespace glm::fuzz {

inline const Tokenizer& sample_tokenizer() {
  static const std::unique_ptr<Tokenizer> t = [] {
    auto loaded = load_tokenizer(GLM_SOURCE_DIR "/data/sample/tokenizer.model");
    if (!loaded.is_ok()) std::abort();
    return loaded.take();
  }();
  return *t;
}

// max_length 0: no length control to check.
inline void check_samples(const Dataset& d, int64_t vocab_size, int64_t max_length = 0) {
  if (d.size() != d.report.kept || d.size() < 1) std::abort();
  for (int64_t i = 0; i < d.size(); ++i) {
    const SampleView s = d.sample(i);
    if (s.tokens.size() != s.labels.size() || s.tokens.empty()) std::abort();
    if (max_length > 0 && s.size() > max_length) std::abort();
    for (size_t t = 0; t < s.tokens.size(); ++t)
      if (s.tokens[t] < 0 || s.tokens[t] >= vocab_size || s.labels[t] < -1 || s.labels[t] >= vocab_size) std::abort();
  }
  (void)d.report.describe();
}

}  // namespace glm::fuzz
