// jsonl reader with per-line validation; nothing is silently dropped.
#include "data/conversation_reader.h"

#include <nlohmann/json.hpp>

namespace glm {
Status parse_conversation(const nlohmann::json& j, Conversation& out, ConversationUse use) {
  if (!j.is_object()) return GLM_USER_ERROR("expected a JSON object");
  auto it = j.find("messages");
  if (it == j.end()) return GLM_USER_ERROR("missing field \"messages\"");
  if (!it->is_array() || it->empty()) return GLM_USER_ERROR("\"messages\" must be a non-empty array");
  bool has_assistant = false;
  for (size_t i = 0; i < it->size(); ++i) {
    const auto& m = (*it)[i];
    if (!m.is_object()) return GLM_USER_ERROR("messages[", i, "] is not an object");
    auto role = m.find("role");
    auto content = m.find("content");
    if (role == m.end() || !role->is_string()) return GLM_USER_ERROR("messages[", i, "] has no string \"role\"");
    if (content == m.end() || !content->is_string())
      return GLM_USER_ERROR("messages[", i, "] has no string \"content\"");
    const std::string r = role->get<std::string>();
    Message msg;
    if (r == "system")
      msg.role = Role::system;
    else if (r == "user")
      msg.role = Role::user;
    else if (r == "assistant")
      msg.role = Role::assistant;
    else if (r == "tool" || r == "observation")
      msg.role = Role::observation;
    else
      return GLM_USER_ERROR("messages[", i, "] has unknown role \"", r,
                            "\" (expected system, user, assistant, tool or observation)");
    msg.content = content->get<std::string>();
    if (auto loss = m.find("loss"); loss != m.end() && !loss->is_null()) {
      if (!loss->is_boolean()) return GLM_USER_ERROR("messages[", i, "] has a non-boolean \"loss\"");
      msg.loss = loss->get<bool>();
    }
    if (msg.content.empty()) return GLM_USER_ERROR("messages[", i, "] has empty content");
    has_assistant |= msg.role == Role::assistant;
    out.messages.push_back(std::move(msg));
  }
  if (use == ConversationUse::training && !has_assistant)
    return GLM_USER_ERROR("no assistant message: the sample has nothing to train on");
  if (use == ConversationUse::prompt) {
    size_t n = out.messages.size();
    if (out.messages.back().role == Role::assistant) --n;  // the reference answer
    if (n == 0 || (out.messages[n - 1].role != Role::user && out.messages[n - 1].role != Role::observation))
      return GLM_USER_ERROR("nothing to answer: a prompt ends with a user (or tool) message, optionally followed by ",
                            "the reference assistant answer");
  }
  return Status::ok();
}

namespace {

Result<std::string> string_field(const nlohmann::json& j, const char* key, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return GLM_USER_ERROR("missing field \"", key, "\"");
    return std::string();
  }
  if (!it->is_string()) return GLM_USER_ERROR("field \"", key, "\" must be a string");
  return it->get<std::string>();
}

// ShareGPT turns become messages, then the messages rules apply.
Status parse_sharegpt(const nlohmann::json& j, Conversation& out, ConversationUse use) {
  const auto& turns = j["conversations"];
  if (!turns.is_array() || turns.empty()) return GLM_USER_ERROR("\"conversations\" must be a non-empty array");
  nlohmann::json messages = nlohmann::json::array();
  GLM_ASSIGN_OR_RETURN(std::string system, string_field(j, "system", false));
  if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  for (size_t i = 0; i < turns.size(); ++i) {
    const auto& t = turns[i];
    if (!t.is_object() || !t.contains("from") || !t["from"].is_string() || !t.contains("value") ||
        !t["value"].is_string())
      return GLM_USER_ERROR("conversations[", i, "] needs string \"from\" and \"value\"");
    const std::string from = t["from"].get<std::string>();
    std::string role;
    if (from == "human" || from == "user")
      role = "user";
    else if (from == "gpt" || from == "assistant" || from == "function_call")
      role = "assistant";
    else if (from == "system")
      role = "system";
    else if (from == "observation" || from == "tool")
      role = "observation";
    else
      return GLM_USER_ERROR("conversations[", i, "] has unknown \"from\": \"", from,
                            "\" (expected human, gpt, system, observation or function_call)");
    messages.push_back({{"role", role}, {"content", t["value"]}});
  }
  return parse_conversation(nlohmann::json{{"messages", messages}}, out, use);
}

// Alpaca: history pairs, then instruction (+ "\n" + input) as the user turn and output as the answer.
Status parse_alpaca(const nlohmann::json& j, Conversation& out, ConversationUse use) {
  GLM_ASSIGN_OR_RETURN(std::string instruction, string_field(j, "instruction", true));
  GLM_ASSIGN_OR_RETURN(std::string input, string_field(j, "input", false));
  GLM_ASSIGN_OR_RETURN(std::string output, string_field(j, "output", use == ConversationUse::training));
  GLM_ASSIGN_OR_RETURN(std::string system, string_field(j, "system", false));
  nlohmann::json messages = nlohmann::json::array();
  if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  if (j.contains("history") && !j["history"].is_null()) {
    const auto& h = j["history"];
    if (!h.is_array()) return GLM_USER_ERROR("\"history\" must be an array of [query, answer] pairs");
    for (size_t i = 0; i < h.size(); ++i) {
      if (!h[i].is_array() || h[i].size() != 2 || !h[i][0].is_string() || !h[i][1].is_string())
        return GLM_USER_ERROR("history[", i, "] must be a [query, answer] pair of strings");
      messages.push_back({{"role", "user"}, {"content", h[i][0]}});
      messages.push_back({{"role", "assistant"}, {"content", h[i][1]}});
    }
  }
  messages.push_back({{"role", "user"}, {"content", input.empty() ? instruction : instruction + "\n" + input}});
  if (!output.empty() || use == ConversationUse::training) messages.push_back({{"role", "assistant"}, {"content", output}});
  return parse_conversation(nlohmann::json{{"messages", messages}}, out, use);
}

}  // namespace

Status parse_any_conversation(const nlohmann::json& j, Conversation& out, ConversationUse use) {
  if (!j.is_object()) return GLM_USER_ERROR("expected a JSON object");
  if (j.contains("messages")) return parse_conversation(j, out, use);
  if (j.contains("conversations")) return parse_sharegpt(j, out, use);
  if (j.contains("instruction")) return parse_alpaca(j, out, use);
  return GLM_USER_ERROR("unknown sample format: expected \"messages\", \"conversations\" (sharegpt), ",
                        "\"instruction\"/\"output\" (alpaca) or \"input_ids\" (pre-tokenized)");
}

}  // namespace glm
