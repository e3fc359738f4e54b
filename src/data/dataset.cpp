// Dataset loading: read (conversations or pre-tokenized), render, length control.
#include "data/dataset.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/counter_rng.h"
#include "base/input_path.h"
#include "base/progress.h"
#include "base/stop_signal.h"
#include "data/conversation_reader.h"
#include "data/token_shards.h"

namespace glm {
namespace {
constexpr int kMaxListedErrors = 20;
}

Status parse_pretokenized(const nlohmann::json& j, int64_t vocab_size, TokenizedSample& out) {
  const auto& ids = j["input_ids"];
  if (!ids.is_array() || ids.empty()) return GLM_USER_ERROR("\"input_ids\" must be a non-empty array of integers");
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!ids[i].is_number_integer() || ids[i].get<int64_t>() < 0 || ids[i].get<int64_t>() >= vocab_size)
      return GLM_USER_ERROR("input_ids[", i, "] = ", ids[i].dump(), " is not a token id below vocab_size ", vocab_size);
    out.tokens.push_back(ids[i].get<int32_t>());
  }
  if (j.contains("labels")) {
    const auto& labels = j["labels"];
    if (!labels.is_array() || labels.size() != ids.size())
      return GLM_USER_ERROR("\"labels\" must be an array as long as input_ids (", ids.size(), ")");
    for (size_t i = 0; i < labels.size(); ++i) {
      const bool ok =
          labels[i].is_number_integer() && (labels[i].get<int64_t>() == -100 ||
                                            (labels[i].get<int64_t>() >= 0 && labels[i].get<int64_t>() < vocab_size));
      if (!ok) return GLM_USER_ERROR("labels[", i, "] = ", labels[i].dump(), " is neither -100 nor a token id");
      out.labels.push_back(labels[i].get<int32_t>() == -100 ? -1 : labels[i].get<int32_t>());
    }
  } else {
    out.labels = out.tokens;
  }
  if (j.contains("attention_mask")) {
    const auto& mask = j["attention_mask"];
    if (!mask.is_array() || mask.size() != ids.size())
      return GLM_USER_ERROR("\"attention_mask\" must be as long as input_ids");
    for (const auto& m : mask)
      if (m != 1) return GLM_USER_ERROR("attention_mask holds zeros: remove the padding, one sequence per line");
  }
  if (out.target_count() == 0) return GLM_USER_ERROR("no label after the first position: nothing to learn or score");
  return Status::ok();
}

std::string DatasetReport::length_summary() const {
  if (lengths.empty()) return "no samples";
  std::vector<int64_t> sorted = lengths;
  std::sort(sorted.begin(), sorted.end());
  auto pct = [&](double p) {
    return sorted[std::min(sorted.size() - 1, static_cast<size_t>(p * static_cast<double>(sorted.size())))];
  };
  return concat("token lengths p50 ", pct(0.5), " / p90 ", pct(0.9), " / p99 ", pct(0.99), " / max ", sorted.back(),
                "; ", kept > 0 ? target_tokens / kept : 0, " trained tokens per sample");
}

int64_t SampleView::target_count() const {
  int64_t n = 0;
  for (size_t t = 1; t < labels.size(); ++t) n += labels[t] >= 0 ? 1 : 0;
  return n;
}

int64_t Dataset::size() const {
  if (!mapped) return static_cast<int64_t>(samples.size());
  return mapped_selection.empty() ? mapped->samples() : static_cast<int64_t>(mapped_selection.size());
}

SampleView Dataset::sample(int64_t i) const {
  if (!mapped) return samples[static_cast<size_t>(i)];
  return mapped->sample(mapped_selection.empty() ? i : mapped_selection[static_cast<size_t>(i)]);
}

std::string DatasetReport::describe() const {
  return concat("dataset ", kept, " of ", read, " samples kept (max_length ", max_length, ", ", enum_name(truncation),
                ": ", deleted_too_long, " deleted, ", truncated, " truncated, ", deleted_no_target,
                " left without trained tokens), ", tokens, " tokens, ", target_tokens, " trained; ", length_summary());
}

std::string Dataset::source_of(size_t i) const {
  if (i >= sources.size() || sources[i].file < 0 || static_cast<size_t>(sources[i].file) >= files.size()) return "";
  return concat(files[static_cast<size_t>(sources[i].file)], ":", sources[i].line);
}

Result<Dataset> load_dataset(const std::vector<std::string>& paths, const Tokenizer* tokenizer, int64_t max_length,
                             int64_t vocab_size, bool skip_bad, Truncation truncation,
                             const ConversationOptions& conversation) {
  if (paths.empty()) return GLM_USER_ERROR("no --dataset given");
  for (const auto& path : paths) {
    if (!is_prepared_dir(path)) continue;
    if (paths.size() > 1)
      return GLM_USER_ERROR("'", path, "' is a prepared directory: give it as the only --dataset (", paths.size(),
                            " given)");
    GLM_ASSIGN_OR_RETURN(Dataset prepared, load_prepared(path, vocab_size, tokenizer));
    if (max_length > 0 && prepared.report.max_tokens > max_length)
      return GLM_USER_ERROR("'", path, "' holds samples of up to ", prepared.report.max_tokens,
                            " tokens (prepared with max_length ", prepared.report.max_length,
                            "), longer than --max_length ", max_length, ": prepare it again with this max_length");
    return prepared;
  }
  Dataset d;
  d.report.max_length = max_length;
  d.report.truncation = truncation;
  static const ByteTokenizer unused;
  ChatTemplate chat(tokenizer != nullptr ? *tokenizer : unused);
  for (const auto& path : paths) {
    d.files.push_back(path);
    GLM_RETURN_IF_ERROR(check_input_path(path).with_context("dataset file"));
    std::ifstream in(path, std::ios::binary);
    if (!in) return GLM_USER_ERROR("cannot open dataset file '", path, "'");
    std::string errors;
    int64_t line_no = 0, error_count = 0, samples_in_file = 0;
    // Parse and tokenize the line (thread-safe: the tokenizer and template are const).
    auto process = [&](const std::string& line, TokenizedSample& sample) -> Status {
      Status s;
      try {
        const nlohmann::json j = nlohmann::json::parse(line);
        if (j.is_object() && j.contains("input_ids")) {
          s = parse_pretokenized(j, vocab_size, sample);
        } else if (tokenizer == nullptr) {
          s = GLM_USER_ERROR("a conversation needs a tokenizer, and this run has none (the model directory holds ",
                             "no tokenizer.model): give --tokenizer FILE, or pre-tokenized {\"input_ids\": [...], ",
                             "\"labels\": [...]} lines");
        } else {
          Conversation c;
          s = parse_any_conversation(j, c);
          const bool has_system = !c.messages.empty() && c.messages.front().role == Role::system;
          if (s.is_ok() && !has_system && !conversation.system.empty())
            c.messages.insert(c.messages.begin(), Message{Role::system, conversation.system, std::nullopt});
          if (s.is_ok()) sample = chat.render(c, conversation.loss_scale);
          for (int32_t id : sample.tokens)
            if (id >= vocab_size) {
              s = GLM_USER_ERROR("token id ", id, " of the chat template exceeds vocab_size ", vocab_size);
              break;
            }
        }
      } catch (const nlohmann::json::parse_error& e) {
        s = GLM_USER_ERROR("malformed JSON (", e.what(), ")");
      } catch (const std::exception& e) {
        s = GLM_USER_ERROR("cannot process the line: ", e.what());
      }
      return s;
    };
    // Batches of lines are tokenized on every core; the results are then taken in file order, so
    // the dataset, its report and its messages do not depend on the number of threads.
    constexpr size_t kBatchLines = 16384;
    const size_t threads = std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::string> batch;
    std::vector<int64_t> batch_line_nos;
    std::vector<TokenizedSample> batch_samples;
    std::vector<Status> batch_status;
    bool more = true;
    std::error_code size_error;
    const auto file_bytes = std::filesystem::file_size(path, size_error);
    Progress progress("tokenizing " + path, size_error ? 0 : static_cast<int64_t>(file_bytes), Progress::Unit::bytes);
    int64_t bytes_read = 0;
    while (more) {
      batch.clear();
      batch_line_nos.clear();
      std::string text;
      while (batch.size() < kBatchLines && (more = static_cast<bool>(std::getline(in, text)))) {
        ++line_no;
        bytes_read += static_cast<int64_t>(text.size()) + 1;
        if (!text.empty() && text.back() == '\r') text.pop_back();
        if (text.find_first_not_of(" \t") == std::string::npos) continue;
        batch.push_back(std::move(text));
        batch_line_nos.push_back(line_no);
      }
      batch_samples.assign(batch.size(), TokenizedSample{});
      batch_status.assign(batch.size(), Status::ok());
      const size_t workers = std::min(threads, (batch.size() + 63) / 64);
      auto run = [&](size_t w) {
        for (size_t i = w; i < batch.size() && stop_signal() == 0; i += std::max<size_t>(workers, 1))
          batch_status[i] = process(batch[i], batch_samples[i]);
      };
      if (workers <= 1) {
        run(0);
      } else {
        std::vector<std::thread> pool;
        for (size_t w = 0; w < workers; ++w) pool.emplace_back(run, w);
        for (auto& t : pool) t.join();
      }
      if (stop_signal() != 0) return stopped_status(concat("while tokenizing '", path, "' (", line_no, " lines read)"));
      for (size_t b = 0; b < batch.size(); ++b) {
        line_no = batch_line_nos[b];
        TokenizedSample sample = std::move(batch_samples[b]);
        const Status s = batch_status[b];
        if (!s.is_ok()) {
          if (skip_bad) {
            if (d.report.skipped_bad < 5)
              d.report.skipped_reasons += concat("\n  ", path, ":", line_no, ": ", s.message());
            ++d.report.skipped_bad;
            continue;
          }
          if (error_count < kMaxListedErrors) errors += concat("\n  ", path, ":", line_no, ": ", s.message());
          ++error_count;
          continue;
        }
        ++samples_in_file;
        ++d.report.read;
        const int64_t length = static_cast<int64_t>(sample.tokens.size());
        d.report.lengths.push_back(length);
        if (max_length > 0 && length > max_length) {
          if (truncation == Truncation::remove) {
            ++d.report.deleted_too_long;
            continue;
          }
          const int64_t from = truncation == Truncation::left ? length - max_length : 0;
          sample.tokens.assign(sample.tokens.begin() + from, sample.tokens.begin() + from + max_length);
          sample.labels.assign(sample.labels.begin() + from, sample.labels.begin() + from + max_length);
          ++d.report.truncated;
          if (sample.target_count() == 0) {
            ++d.report.deleted_no_target;
            continue;
          }
        }
        d.report.tokens += static_cast<int64_t>(sample.tokens.size());
        d.report.target_tokens += sample.target_count();
        d.report.max_tokens = std::max<int64_t>(d.report.max_tokens, static_cast<int64_t>(sample.tokens.size()));
        d.samples.push_back(std::move(sample));
        d.sources.push_back({static_cast<int32_t>(d.files.size() - 1), line_no});
      }
      progress.update(bytes_read);
    }
    if (in.bad()) return GLM_USER_ERROR("error reading dataset file '", path, "'");
    progress.finish();
    if (error_count > 0)
      return GLM_USER_ERROR(
          error_count, " bad sample(s) in '", path, "'", errors,
          error_count > kMaxListedErrors ? concat("\n  ... and ", error_count - kMaxListedErrors, " more") : "");
    if (samples_in_file == 0)
      return GLM_USER_ERROR("dataset file '", path, "' holds no usable samples",
                            skip_bad && d.report.skipped_bad > 0
                                ? concat(" (", d.report.skipped_bad, " skipped as bad:", d.report.skipped_reasons, ")")
                                : "");
  }
  d.report.kept = static_cast<int64_t>(d.samples.size());
  if (d.samples.empty())
    return GLM_USER_ERROR("no sample is left after length control: every one of the ", d.report.read,
                          " samples is longer than --max_length ", max_length, " tokens (", d.report.deleted_too_long,
                          " deleted, ", d.report.deleted_no_target,
                          " truncated to no trained tokens); nothing to train on");
  return d;
}

namespace {
void recount(Dataset& d) {
  DatasetReport r;
  r.read = d.size();
  r.max_length = d.report.max_length;
  r.truncation = d.report.truncation;
  for (int64_t i = 0; i < d.size(); ++i) {
    const SampleView s = d.sample(i);
    r.tokens += s.size();
    r.target_tokens += s.target_count();
    r.max_tokens = std::max<int64_t>(r.max_tokens, s.size());
    r.lengths.push_back(s.size());
  }
  r.kept = r.read;
  d.report.tokens = r.tokens;
  d.report.target_tokens = r.target_tokens;
  d.report.max_tokens = r.max_tokens;
  d.report.kept = r.kept;
  if (d.report.read == 0) d.report = r;
}
}  // namespace

Status split_dataset(Dataset& train, double ratio, uint64_t seed, Dataset& validation) {
  const int64_t n = train.size();
  const int64_t held = std::max<int64_t>(1, static_cast<int64_t>(ratio * static_cast<double>(n)));
  if (held >= n)
    return GLM_USER_ERROR("--split_dataset_ratio ", ratio, " of ", n, " samples leaves nothing to train on");
  // A seeded shuffle of indices decides who is held out, so every rank splits identically.
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  uint64_t state = seed ^ 0x5eed5eed5eedULL;
  for (int64_t i = n - 1; i > 0; --i) {
    state = splitmix64_mix(state);
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(state % static_cast<uint64_t>(i + 1))]);
  }
  std::vector<bool> held_out(static_cast<size_t>(n), false);
  for (int64_t i = 0; i < held; ++i) held_out[static_cast<size_t>(order[static_cast<size_t>(i)])] = true;
  validation = Dataset();
  validation.report.max_length = train.report.max_length;
  validation.report.truncation = train.report.truncation;
  if (train.mapped) {
    // Both parts select from the same mapped shards.
    std::vector<int64_t> keep_selection;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t mapped_index = train.mapped_selection.empty() ? i : train.mapped_selection[static_cast<size_t>(i)];
      (held_out[static_cast<size_t>(i)] ? validation.mapped_selection : keep_selection).push_back(mapped_index);
    }
    validation.mapped = train.mapped;
    validation.prepared = train.prepared;
    train.mapped_selection = std::move(keep_selection);
    recount(train);
    recount(validation);
    return Status::ok();
  }
  std::vector<TokenizedSample> keep;
  std::vector<SampleSource> keep_sources;
  const bool sourced = train.sources.size() == train.samples.size();
  validation.files = train.files;
  for (int64_t i = 0; i < n; ++i) {
    const bool held_i = held_out[static_cast<size_t>(i)];
    (held_i ? validation.samples : keep).push_back(std::move(train.samples[static_cast<size_t>(i)]));
    if (sourced) (held_i ? validation.sources : keep_sources).push_back(train.sources[static_cast<size_t>(i)]);
  }
  train.samples = std::move(keep);
  train.sources = std::move(keep_sources);
  recount(train);
  recount(validation);
  return Status::ok();
}

}  // namespace glm
