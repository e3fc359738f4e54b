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

TokenizedSample ChatTemplate::render(const Conversation& conversation, LossScale scale) const {
  TokenizedSample s;
  const bool all = scale == LossScale::all;
  auto push = [&](int32_t id, bool target) {
    s.tokens.push_back(id);
    s.labels.push_back(target || all ? id : -1);
  };
  push(tokenizer_.special_id(SpecialToken::gmask), false);
  push(tokenizer_.special_id(SpecialToken::sop), false);
  int last_assistant = -1;
  for (size_t i = 0; i < conversation.messages.size(); ++i)
    if (conversation.messages[i].role == Role::assistant && !conversation.messages[i].content.empty())
      last_assistant = static_cast<int>(i);
  bool previous_trained = false;
  for (size_t i = 0; i < conversation.messages.size(); ++i) {
    const Message& m = conversation.messages[i];
    if (m.content.empty()) continue;
    // The role token that closes a trained turn is its trained terminator.
    push(tokenizer_.special_id(role_token(m.role)), previous_trained);
    bool trained =
        m.role == Role::assistant && (scale != LossScale::last_round || static_cast<int>(i) == last_assistant);
    if (m.loss) trained = *m.loss;
    for (int32_t id : tokenizer_.encode("\n" + m.content)) push(id, trained);
    previous_trained = trained;
  }
  if (previous_trained || (all && last_assistant >= 0)) push(tokenizer_.special_id(SpecialToken::user), true);
  return s;
}

std::optional<std::string> ChatTemplate::reference_answer(const Conversation& conversation) {
  if (conversation.messages.empty() || conversation.messages.back().role != Role::assistant) return std::nullopt;
  return conversation.messages.back().content;
}

std::vector<int32_t> ChatTemplate::generation_prompt(const Conversation& conversation) const {
  Conversation prompt = conversation;
  if (reference_answer(prompt)) prompt.messages.pop_back();
  for (Message& m : prompt.messages) m.loss = false;
  std::vector<int32_t> tokens = render(prompt).tokens;
  tokens.push_back(tokenizer_.special_id(SpecialToken::assistant));
  return tokens;
}

}  // namespace glm
