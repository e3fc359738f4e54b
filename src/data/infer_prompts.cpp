// Prompt files of glm_hpc infer (see infer_prompts.h).
#include "data/infer_prompts.h"

#include <fstream>

#include "base/input_path.h"
#include "data/chat_template.h"
#include "data/conversation_reader.h"

namespace glm {
namespace {

constexpr int kMaxListedErrors = 20;

const char* role_text(Role r) {
  switch (r) {
    case Role::system:
      return "system";
    case Role::user:
      return "user";
    case Role::assistant:
      return "assistant";
    case Role::observation:
      return "tool";
  }
  return "user";
}

Status parse_prompt(const std::string& line, const Tokenizer* tokenizer, int64_t vocab_size,
                    const std::string& system, InferPrompt& out) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    return GLM_USER_ERROR("malformed JSON (", e.what(), ")");
  }
  if (j.is_object() && j.contains("input_ids")) {
    const nlohmann::json& ids = j["input_ids"];
    if (!ids.is_array() || ids.empty()) return GLM_USER_ERROR("\"input_ids\" must be a non-empty array of integers");
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!ids[i].is_number_integer() || ids[i].get<int64_t>() < 0 || ids[i].get<int64_t>() >= vocab_size)
        return GLM_USER_ERROR("input_ids[", i, "] = ", ids[i].dump(), " is not a token id below vocab_size ",
                              vocab_size);
      out.ids.push_back(ids[i].get<int32_t>());
    }
    out.pretokenized = true;
    return Status::ok();
  }
  if (tokenizer == nullptr)
    return GLM_USER_ERROR("a conversation needs a tokenizer, and this model has none (no tokenizer.model beside ",
                          "it): give --tokenizer FILE, or pre-tokenized {\"input_ids\": [...]} lines");
  Conversation c;
  GLM_RETURN_IF_ERROR(parse_any_conversation(j, c, ConversationUse::prompt));
  if (c.messages.front().role != Role::system && !system.empty())
    c.messages.insert(c.messages.begin(), Message{Role::system, system});
  out.reference = ChatTemplate::reference_answer(c);
  if (out.reference) c.messages.pop_back();
  out.messages = nlohmann::ordered_json::array();
  for (const Message& m : c.messages) out.messages.push_back({{"role", role_text(m.role)}, {"content", m.content}});
  out.ids = ChatTemplate(*tokenizer).generation_prompt(c);
  for (const int32_t id : out.ids)
    if (id >= vocab_size)
      return GLM_USER_ERROR("token id ", id, " of the chat template exceeds the model's vocab_size ", vocab_size);
  return Status::ok();
}

}  // namespace

Result<std::vector<InferPrompt>> read_infer_prompts(const std::vector<std::string>& paths, const Tokenizer* tokenizer,
                                                    int64_t vocab_size, const std::string& system) {
  std::vector<InferPrompt> prompts;
  for (const std::string& path : paths) {
    GLM_RETURN_IF_ERROR(check_input_path(path, InputKind::file).with_context("--val_dataset"));
    std::ifstream in(path, std::ios::binary);
    if (!in) return GLM_USER_ERROR("cannot open --val_dataset '", path, "'");
    std::string line, errors;
    int64_t line_no = 0, error_count = 0, in_file = 0;
    while (std::getline(in, line)) {
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos) continue;
      InferPrompt p;
      p.source = concat(path, ":", line_no);
      const Status s = parse_prompt(line, tokenizer, vocab_size, system, p);
      if (!s.is_ok()) {
        if (error_count++ < kMaxListedErrors) errors += concat("\n  ", p.source, ": ", s.message());
        continue;
      }
      ++in_file;
      prompts.push_back(std::move(p));
    }
    if (in.bad()) return GLM_USER_ERROR("error reading --val_dataset '", path, "'");
    if (error_count > 0)
      return GLM_USER_ERROR(
          error_count, " bad prompt(s) in '", path, "'", errors,
          error_count > kMaxListedErrors ? concat("\n  ... and ", error_count - kMaxListedErrors, " more") : "");
    if (in_file == 0) return GLM_USER_ERROR("--val_dataset '", path, "' holds no prompts");
  }
  return prompts;
}

}  // namespace glm
