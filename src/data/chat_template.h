// GLM-4 chat template (GLM4_SPEC.md 6.1) with assistant-only loss targets (6.2 recommendation).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/enum_names.h"
#include "data/tokenizer.h"

namespace glm {

enum class Role { system, user, assistant, observation };

struct Message {
  Message() = default;
  Message(Role r, std::string c, std::optional<bool> l = std::nullopt) : role(r), content(std::move(c)), loss(l) {}
  Role role = Role::user;
  std::string content;
  std::optional<bool> loss;  // ms-swift's per-message "loss": overrides whether the turn is trained
};

// Which turns are trained (ms-swift's --loss_scale): every assistant turn (default), only the last
// one (last_round), or every token of the conversation (all).
enum class LossScale { assistant, last_round, all };

template <>
struct EnumNames<LossScale> {
  static constexpr std::pair<LossScale, std::string_view> table[] = {
      {LossScale::assistant, "default"}, {LossScale::last_round, "last_round"}, {LossScale::all, "all"}};
};

struct Conversation {
  std::vector<Message> messages;
  std::string source;  // file:line, for messages about this sample
};

// tokens and labels in the transformers convention: labels[t] is the token the model must produce
// at position t (predicted from position t - 1), or -1 where there is no loss (-100 in jsonl).
// Usually labels[t] is tokens[t] or -1, but pre-tokenized data may set other labels.
struct TokenizedSample {
  std::vector<int32_t> tokens;
  std::vector<int32_t> labels;
  int64_t target_count() const;  // labels >= 0 after the first position
};

class ChatTemplate {
 public:
  explicit ChatTemplate(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  // [gMASK]<sop> then <|role|>\ncontent per non-empty message; after a final assistant turn the
  // terminator <|user|> is appended. Targets: "\n" + content of every assistant turn and the one
  // token that follows it.
  TokenizedSample render(const Conversation& conversation, LossScale scale = LossScale::assistant) const;
  // What generation continues (transformers' add_generation_prompt): the conversation without a
  // final assistant turn, rendered as above, then <|assistant|>; the model writes "\n" + its reply
  // and ends it with a role token (<|user|>, <|observation|>) or <|endoftext|>.
  std::vector<int32_t> generation_prompt(const Conversation& conversation) const;
  // That final assistant turn's text (a reference answer), or nullopt where the conversation has none.
  static std::optional<std::string> reference_answer(const Conversation& conversation);

 private:
  const Tokenizer& tokenizer_;
};

}  // namespace glm
