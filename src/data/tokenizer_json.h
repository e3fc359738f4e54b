// Hugging Face tokenizer.json (the `tokenizers` library's format, shipped by GLM-4's -hf
// repositories) read as the tiktoken ranks it encodes: a byte-level BPE whose vocabulary spells
// each token's bytes with GPT-2's byte-to-unicode map, merges in rank order, GLM-4's
// pre-tokenization regex, and the 14 special tokens right after the ranks. Files that are not that
// (another model type, regex or special-token layout, merges out of rank order, which tiktoken's
// lowest-rank-first merging would not reproduce) are refused, naming what differs.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace glm {

// The tokens' bytes in rank order (id order).
Result<std::vector<std::string>> read_tokenizer_json_ranks(const std::string& path);

}  // namespace glm
