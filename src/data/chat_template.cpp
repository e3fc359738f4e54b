// Rendering of a conversation into tokens and targets.
#include "data/chat_template.h"

namespace glm {

int64_t TokenizedSample::target_count() const {
  int64_t n = 0;
  for (size_t t = 1; t < labels.size(); ++t) n += labels[t] >= 0 ? 1 : 0;
  return n;
}

namespace {
SpecialToken role_token(Role r) {
  switch (r) {
    case Role::system:
      return SpecialToken::system;
    case Role::user:
      return SpecialToken::user;
    case Role::assistant:
      return SpecialToken::assistant;
    case Role::observation:
      return SpecialToken::observation;
  }
  return SpecialToken::user;
}
}  // namespace

TokenizedSample ChatTemplate::render(const Conversation& conversation) const {
  TokenizedSample s;
  auto push = [&](int32_t id, bool target) {
    s.tokens.push_back(id);
    s.labels.push_back(target ? id : -1);
  };
  push(tokenizer_.special_id(SpecialToken::gmask), false);
  push(tokenizer_.special_id(SpecialToken::sop), false);
  bool previous_was_assistant = false;
  for (const Message& m : conversation.messages) {
    if (m.content.empty()) continue;
    // The role token that closes an assistant turn is its trained terminator.
    push(tokenizer_.special_id(role_token(m.role)), previous_was_assistant);
    const bool trained = m.role == Role::assistant;
    for (int32_t id : tokenizer_.encode("\n" + m.content)) push(id, trained);
    previous_was_assistant = trained;
  }
  if (previous_was_assistant) push(tokenizer_.special_id(SpecialToken::user), true);
  return s;
}

}  // namespace glm
