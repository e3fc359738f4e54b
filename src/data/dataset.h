// A tokenized dataset: samples with labels after length control, in memory (read from jsonl) or
// memory-mapped from prepared token shards (token_shards.h).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/enum_names.h"
#include "base/status.h"
#include "data/chat_template.h"
#include "data/tokenizer.h"

namespace glm {

// What happens to a sample longer than max_length (ms-swift's truncation_strategy).
enum class Truncation { remove, left, right };  // delete it, keep its last / first max_length tokens

template <>
struct EnumNames<Truncation> {
  static constexpr std::pair<Truncation, std::string_view> table[] = {
      {Truncation::remove, "delete"}, {Truncation::left, "left"}, {Truncation::right, "right"}};
};

// A line that cannot become a sample (--on_bad_sample): error lists every one with file:line and
// fails the load; skip drops them and counts them in the report.
enum class OnBadSample { error, skip };

template <>
struct EnumNames<OnBadSample> {
  static constexpr std::pair<OnBadSample, std::string_view> table[] = {{OnBadSample::error, "error"},
                                                                       {OnBadSample::skip, "skip"}};
};

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
  // The length control that was applied (at prepare time for prepared shards).
  int64_t max_length = 0;
  Truncation truncation = Truncation::remove;
  // The line train and prepare print at start: samples kept of read, what length control did,
  // tokens, trained tokens and length_summary().
  std::string describe() const;
};

// A sample's tokens and labels wherever they live: a TokenizedSample or a mapped shard.
struct SampleView {
  SampleView() = default;
  SampleView(const TokenizedSample& s) : tokens(s.tokens), labels(s.labels) {}  // implicit: a sample is a view
  SampleView(std::span<const int32_t> t, std::span<const int32_t> l) : tokens(t), labels(l) {}
  std::span<const int32_t> tokens, labels;
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  int64_t target_count() const;  // labels >= 0 after the first position
};

// The file (index into Dataset::files) and 1-based line a sample was read from.
struct SampleSource {
  int32_t file = 0;
  int64_t line = 0;
};

class MappedShards;

struct Dataset {
  std::vector<TokenizedSample> samples;  // read from jsonl or built in code
  // Or prepared shards (samples then empty): the mapped samples mapped_selection lists, in its
  // order (a validation split), or all of them when it is empty.
  std::shared_ptr<const MappedShards> mapped;
  std::vector<int64_t> mapped_selection;
  int64_t size() const;
  SampleView sample(int64_t i) const;
  DatasetReport report;
  std::string prepared;  // for mapped samples: the prepared directory and what prepared it, else ""
  // Parallel to samples when read by load_dataset; empty for datasets built in code.
  std::vector<SampleSource> sources;
  std::vector<std::string> files;
  // "file:line" of sample i, or "" when unknown.
  std::string source_of(size_t i) const;
};

// Reads one directory written by glm_hpc prepare (token_shards.h: memory-mapped, its length
// control already applied, refused if a sample exceeds max_length or another tokenizer than
// `tokenizer` made it), or jsonl files whose lines are
// either conversations ({"messages": [...]}, rendered with the GLM-4 chat template) or
// pre-tokenized samples ({"input_ids": [...], "labels": [...]}, labels -100 = no loss, labels
// defaulting to input_ids). Token ids must be below vocab_size. Samples longer than max_length
// (> 0) are deleted and counted. Every bad line is reported as file:line.
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
