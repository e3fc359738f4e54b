// Learning a byte-level BPE rank file (tiktoken format, as GLM-4's tokenizer.model) from text:
// how data/sample/tokenizer.model, the tokenizer of the embedded tiny configuration, is made.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace glm {

// The tokens of a rank file in rank order: the 256 single bytes (rank = byte value), then one
// token per merge, each the concatenation of two earlier tokens. `texts` are pre-tokenized with
// GLM-4's regex; merges never cross a piece. Each step merges the most frequent adjacent pair
// (ties: the smallest pair of ids), until `ranks` tokens exist or no pair occurs twice. The result
// depends only on the multiset of texts, so it is reproducible byte for byte.
Result<std::vector<std::string>> learn_bpe_tokens(const std::vector<std::string>& texts, int32_t ranks);

// "<base64 of the token's bytes> <rank>\n" per token, as tiktoken writes rank files.
std::string format_rank_file(const std::vector<std::string>& tokens);

// The texts the chat template encodes for every conversation of these jsonl files (any supported
// format): "\n" + content per message. Bad lines are errors naming file:line.
Result<std::vector<std::string>> conversation_texts(const std::vector<std::string>& paths);

}  // namespace glm
