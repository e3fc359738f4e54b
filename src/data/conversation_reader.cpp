// jsonl reader with per-line validation; nothing is silently dropped.
#include "data/conversation_reader.h"

#include <fstream>
#include <nlohmann/json.hpp>

namespace glm {
namespace {

Status parse_line(const std::string& line, Conversation& out) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    return GLM_USER_ERROR("malformed JSON (", e.what(), ")");
  }
  return parse_conversation(j, out);
}

}  // namespace

Status parse_conversation(const nlohmann::json& j, Conversation& out) {
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
    if (msg.content.empty()) return GLM_USER_ERROR("messages[", i, "] has empty content");
    has_assistant |= msg.role == Role::assistant;
    out.messages.push_back(std::move(msg));
  }
  if (!has_assistant) return GLM_USER_ERROR("no assistant message: the sample has nothing to train on");
  return Status::ok();
}

Result<std::vector<Conversation>> read_conversations(const std::string& path, int max_errors) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return GLM_USER_ERROR("cannot open dataset file '", path, "'");
  std::vector<Conversation> conversations;
  std::string line, errors;
  int error_count = 0;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    Conversation c;
    c.source = concat(path, ":", line_no);
    Status s = parse_line(line, c);
    if (!s.is_ok()) {
      if (error_count < max_errors) errors += concat("\n  ", c.source, ": ", s.message());
      ++error_count;
      continue;
    }
    conversations.push_back(std::move(c));
  }
  if (in.bad()) return GLM_USER_ERROR("error reading dataset file '", path, "'");
  if (error_count > 0)
    return GLM_USER_ERROR(error_count, " bad sample(s) in '", path, "'", errors,
                          error_count > max_errors ? concat("\n  ... and ", error_count - max_errors, " more") : "");
  if (conversations.empty()) return GLM_USER_ERROR("dataset file '", path, "' holds no conversations");
  return conversations;
}

}  // namespace glm
