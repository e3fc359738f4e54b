// Parses one conversation record (messages, sharegpt or alpaca) into messages; dataset.cpp reads the files.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/chat_template.h"
#include "base/status.h"

namespace glm {

// What a conversation is read for: a training sample needs an assistant turn; a prompt
// (glm_hpc infer) ends with a user or tool turn, optionally followed by a reference answer.
enum class ConversationUse { training, prompt };

// One {"messages": [...]} object; the message says what is wrong (no location).
Status parse_conversation(const nlohmann::json& j, Conversation& out, ConversationUse use = ConversationUse::training);

// One line of any supported conversation format, detected by its keys:
//   messages      {"messages": [{"role", "content"}, ...]}                    (ms-swift)
//   sharegpt      {"conversations": [{"from", "value"}, ...], "system"?}        (from human/gpt/system/
//                 observation/function_call)
//   alpaca        {"instruction", "input"?, "output", "system"?, "history"?: [[query, answer], ...]}
Status parse_any_conversation(const nlohmann::json& j, Conversation& out,
                              ConversationUse use = ConversationUse::training);

}  // namespace glm
