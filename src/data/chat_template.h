// GLM-4 chat template (GLM4_SPEC.md 6.1) with assistant-only loss targets (6.2 recommendation).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace glm {

enum class Role { system, user, assistant, observation };

struct Message {
  Role role = Role::user;
  std::string content;
};

struct Conversation {
  std::vector<Message> messages;
  std::string source;  // file:line, for messages about this sample
};

// tokens and, per token, whether it is a trained target (predicted from the previous position).
struct TokenizedSample {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> target_mask;
  int64_t target_count() const;
};

class ChatTemplate {
 public:
  explicit ChatTemplate(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  // [gMASK]<sop> then <|role|>\ncontent per non-empty message; after a final assistant turn the
  // terminator <|user|> is appended. Targets: "\n" + content of every assistant turn and the one
  // token that follows it.
  TokenizedSample render(const Conversation& conversation) const;

 private:
  const Tokenizer& tokenizer_;
};

}  // namespace glm
