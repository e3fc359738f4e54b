// The prompts of glm_hpc infer --val_dataset: jsonl lines in the training formats (messages,
// sharegpt, alpaca), whose final assistant turn, when there is one, is the reference answer and
// not part of the prompt; or pre-tokenized {"input_ids": [...]} lines, the whole prompt as given.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "data/tokenizer.h"

namespace glm {

struct InferPrompt {
  std::string source;                    // file:line
  std::vector<int32_t> ids;              // what generation continues (the template's, ending in <|assistant|>)
  std::optional<std::string> reference;  // the final assistant turn's text, if any
  nlohmann::ordered_json messages;       // the prompt's messages ({"role", "content"}); null when pre-tokenized
  bool pretokenized = false;
};

// Every line of every file, in order. Bad lines (malformed JSON, unknown format or role, nothing to
// answer, an id outside the vocabulary, a conversation without a tokenizer) are collected and
// reported together as one user error, each with its file:line. `system` is prepended to
// conversations that have none.
Result<std::vector<InferPrompt>> read_infer_prompts(const std::vector<std::string>& paths, const Tokenizer* tokenizer,
                                                    int64_t vocab_size, const std::string& system);

}  // namespace glm
