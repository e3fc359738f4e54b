// A tokenized dataset in memory: samples with targets, after length control.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/chat_template.h"
#include "data/tokenizer.h"
#include "mpi/status.h"

namespace glm {

struct DatasetReport {
  int64_t read = 0;
  int64_t deleted_too_long = 0;
  int64_t kept = 0;
  int64_t tokens = 0;
  int64_t target_tokens = 0;
  int64_t max_tokens = 0;
};

struct Dataset {
  std::vector<TokenizedSample> samples;
  DatasetReport report;
};

// Reads every file, renders with the chat template and deletes samples longer than max_length.
Result<Dataset> load_dataset(const std::vector<std::string>& paths, const Tokenizer& tokenizer, int64_t max_length);

}  // namespace glm
