// Reads messages-style jsonl conversations ({"messages": [{"role", "content"}, ...]}), one per line.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/chat_template.h"
#include "mpi/status.h"

namespace glm {

// One {"messages": [...]} object; the message says what is wrong (no location).
Status parse_conversation(const nlohmann::json& j, Conversation& out);

// One line of any supported conversation format, detected by its keys:
//   messages      {"messages": [{"role", "content"}, ...]}                    (ms-swift)
//   sharegpt      {"conversations": [{"from", "value"}, ...], "system"?}        (from human/gpt/system/
//                 observation/function_call)
//   alpaca        {"instruction", "input"?, "output", "system"?, "history"?: [[query, answer], ...]}
Status parse_any_conversation(const nlohmann::json& j, Conversation& out);

// Every problem is reported as file:line: reason; up to max_errors are listed in one user error.
Result<std::vector<Conversation>> read_conversations(const std::string& path, int max_errors = 20);

}  // namespace glm
