// Dataset loading: read, render, length control.
#include "data/dataset.h"

#include "data/conversation_reader.h"

namespace glm {

Result<Dataset> load_dataset(const std::vector<std::string>& paths, const Tokenizer& tokenizer, int64_t max_length) {
  if (paths.empty()) return GLM_USER_ERROR("no --dataset given");
  Dataset d;
  ChatTemplate chat(tokenizer);
  for (const auto& path : paths) {
    GLM_ASSIGN_OR_RETURN(auto conversations, read_conversations(path));
    for (const auto& c : conversations) {
      ++d.report.read;
      TokenizedSample s = chat.render(c);
      if (static_cast<int64_t>(s.tokens.size()) > max_length) {
        ++d.report.deleted_too_long;
        continue;
      }
      d.report.tokens += static_cast<int64_t>(s.tokens.size());
      d.report.target_tokens += s.target_count();
      d.report.max_tokens = std::max<int64_t>(d.report.max_tokens, static_cast<int64_t>(s.tokens.size()));
      d.samples.push_back(std::move(s));
    }
  }
  d.report.kept = static_cast<int64_t>(d.samples.size());
  if (d.samples.empty())
    return GLM_USER_ERROR("every one of the ", d.report.read, " samples is longer than --max_length ", max_length,
                          " tokens; nothing to train on");
  return d;
}

}  // namespace glm
