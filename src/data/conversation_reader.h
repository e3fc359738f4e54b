// Reads messages-style jsonl conversations ({"messages": [{"role", "content"}, ...]}), one per line.
#pragma once

#include <string>
#include <vector>

#include "data/chat_template.h"
#include "mpi/status.h"

namespace glm {

// Every problem is reported as file:line: reason; up to max_errors are listed in one user error.
Result<std::vector<Conversation>> read_conversations(const std::string& path, int max_errors = 20);

}  // namespace glm
