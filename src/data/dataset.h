// A tokenized dataset in memory: samples with labels, after length control.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/chat_template.h"
#include "data/tokenizer.h"
#include "mpi/status.h"

namespace glm {

// What happens to a sample longer than max_length (ms-swift's truncation_strategy).
enum class Truncation { remove, left, right };  // delete it, keep its last / first max_length tokens

struct DatasetReport {
  int64_t read = 0;
  int64_t deleted_too_long = 0;
  int64_t truncated = 0;
  int64_t deleted_no_target = 0;  // truncation cut every trained token
  std::vector<int64_t> lengths;   // token length of every read sample, before length control
  // "p50 / p90 / p99 / max" of the lengths, and the mean trained tokens per kept sample.
  std::string length_summary() const;
  int64_t kept = 0;
  int64_t tokens = 0;
  int64_t target_tokens = 0;
  int64_t max_tokens = 0;
  int64_t skipped_bad = 0;      // --on_bad_sample skip
  std::string skipped_reasons;  // the first few, one per line with file:line
};

struct Dataset {
  std::vector<TokenizedSample> samples;
  DatasetReport report;
};

// Reads jsonl files whose lines are either conversations ({"messages": [...]}, rendered with the
// GLM-4 chat template) or pre-tokenized samples ({"input_ids": [...], "labels": [...]}, labels
// -100 = no loss, labels defaulting to input_ids). Token ids must be below vocab_size. Samples
// longer than max_length (> 0) are deleted and counted. Every bad line is reported as file:line.
// Without a tokenizer (null), conversation lines are errors that say why.
// skip_bad (--on_bad_sample skip): bad lines are dropped and counted instead of failing the load.
// How conversations become samples: trained turns (--loss_scale) and a default system prompt
// (--system) for conversations without one.
struct ConversationOptions {
  LossScale loss_scale = LossScale::assistant;
  std::string system;
};

Result<Dataset> load_dataset(const std::vector<std::string>& paths, const Tokenizer* tokenizer, int64_t max_length,
                             int64_t vocab_size, bool skip_bad = false, Truncation truncation = Truncation::remove,
                             const ConversationOptions& conversation = {});

// Moves a seeded share `ratio` of the samples (at least one) from `train` into `validation`; both
// must keep at least one sample. Reports are recomputed.
Status split_dataset(Dataset& train, double ratio, uint64_t seed, Dataset& validation);

// One pre-tokenized line's object.
Status parse_pretokenized(const nlohmann::json& j, int64_t vocab_size, TokenizedSample& out);

}  // namespace glm
