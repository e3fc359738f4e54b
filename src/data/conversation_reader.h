// Parses one conversation record (messages, sharegpt or alpaca) into messages; dataset.cpp reads the files.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/chat_template.h"
#include "base/status.h"

namespace glm {

// One {"messages": [...]} object; the message says what is wrong (no location).
Status parse_conversation(const nlohmann::json& j, Conversation& out);

// One line of any supported conversation format, detected by its keys:
//   messages      {"messages": [{"role", "content"}, ...]}                    (ms-swift)
//   sharegpt      {"conversations": [{"from", "value"}, ...], "system"?}        (from human/gpt/system/
//                 observation/function_call)
//   alpaca        {"instruction", "input"?, "output", "system"?, "history"?: [[query, answer], ...]}
Status parse_any_conversation(const nlohmann::json& j, Conversation& out);

}  // namespace glm
