// The prepare subcommand's report and example rendering.
#include "cli/prepare.h"

#include <filesystem>
#include <vector>

#include "data/packing.h"
#include "data/token_shards.h"

namespace glm {

Result<std::string> format_example(const Dataset& dataset, int64_t index, const Tokenizer* tokenizer) {
  const int64_t n = dataset.size();
  if (index < 0 || index >= n)
    return GLM_USER_ERROR("--print_example ", index, " is not a sample: ", n, " samples are kept (0 to ", n - 1, ")");
  const SampleView s = dataset.sample(index);
  // Runs of positions with the same trained flag, decoded together so multi-byte text survives.
  std::string text;
  std::vector<int32_t> run;
  bool run_trained = false;
  int64_t relabelled = 0;
  auto flush = [&] {
    if (run.empty()) return;
    std::string piece;
    if (tokenizer != nullptr) {
      piece = tokenizer->decode(run);
    } else {
      for (size_t i = 0; i < run.size(); ++i) piece += concat(i > 0 ? " " : "", run[i]);
      if (!text.empty()) text += " ";
    }
    text += run_trained ? concat(kTrainedOpen, piece, kTrainedClose) : piece;
    run.clear();
  };
  for (size_t t = 0; t < s.tokens.size(); ++t) {
    const bool trained = t > 0 && s.labels[t] >= 0;
    if (trained != run_trained) flush();
    run_trained = trained;
    run.push_back(trained ? s.labels[t] : s.tokens[t]);
    relabelled += trained && s.labels[t] != s.tokens[t] ? 1 : 0;
  }
  flush();
  const std::string source = dataset.source_of(static_cast<size_t>(index));
  std::string header = concat("glm_hpc: sample ", index, " of ", n, source.empty() ? "" : concat(" (", source, ")"),
                              ": ", s.tokens.size(), " tokens, ", s.target_count(), " trained, shown between ",
                              kTrainedOpen, " and ", kTrainedClose);
  if (relabelled > 0)
    header +=
        concat("; ", relabelled, " trained position(s) carry a label other than their input token, shown as the label");
  if (tokenizer == nullptr) return concat(header, " (token ids: no tokenizer to decode them):\n", text, "\n");
  // Where the tokenizer cut the text: each input token decoded, control bytes escaped.
  std::string pieces;
  for (size_t t = 0; t < s.tokens.size(); ++t) {
    if (t > 0) pieces += kTokenSeparator;
    for (const char c : tokenizer->decode(s.tokens.subspan(t, 1))) {
      const auto u = static_cast<unsigned char>(c);
      if (c == '\n')
        pieces += "\\n";
      else if (c == '\t')
        pieces += "\\t";
      else if (c == '\\')
        pieces += "\\\\";
      else if (u < 0x20 || u == 0x7f)
        pieces += concat("\\x", "0123456789abcdef"[u >> 4], "0123456789abcdef"[u & 15]);
      else
        pieces += c;
    }
  }
  return concat(header, ":\n", text, "\nglm_hpc: its ", s.tokens.size(), " input tokens one by one, separated by ",
                kTokenSeparator, " (\\n is a newline, \\t a tab, \\\\ a backslash, \\xNN another control byte):\n",
                pieces, "\n");
}

Result<std::string> prepare_report(const CliOptions& options, const Dataset& dataset, const Tokenizer* tokenizer) {
  const TrainConfig& t = options.train;
  std::string out;
  if (!dataset.prepared.empty()) out += concat("glm_hpc: samples memory-mapped from ", dataset.prepared, "\n");
  out += concat("glm_hpc: ", dataset.report.describe(), "\n");
  if (dataset.report.skipped_bad > 0)
    out += concat("glm_hpc: --on_bad_sample skip dropped ", dataset.report.skipped_bad,
                  " bad sample(s); the first:", dataset.report.skipped_reasons, "\n");
  if (t.packing) {
    GLM_ASSIGN_OR_RETURN(PackingPlan plan, pack_dataset(dataset, t.max_length));
    out += concat("glm_hpc: ", plan.summary(), "\n");
  }
  if (options.print_example >= 0) {
    GLM_ASSIGN_OR_RETURN(std::string example, format_example(dataset, options.print_example, tokenizer));
    out += example;
  }
  return out;
}

bool prepare_writes_shards(const CliOptions& options) {
  return options.effective.contains("output_dir") && options.effective["output_dir"]["source"] == "command_line";
}

Result<std::string> write_prepared(const CliOptions& options, const Dataset& dataset, const Tokenizer* tokenizer) {
  const TrainConfig& t = options.train;
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& path : t.datasets)
    if (fs::exists(t.output_dir, ec) && fs::equivalent(path, t.output_dir, ec))
      return GLM_USER_ERROR("--output_dir '", t.output_dir,
                            "' is the --dataset being read; write to another directory");
  PrepareInfo info;
  info.datasets = t.datasets;
  info.max_length = t.max_length;
  info.truncation = t.truncation_strategy;
  info.loss_scale = t.loss_scale;
  info.system = t.system;
  if (tokenizer != nullptr) {
    info.tokenizer = tokenizer->source();
    info.tokenizer_hash = tokenizer->content_hash();
  }
  GLM_RETURN_IF_ERROR(write_token_shards(dataset, t.model.vocab_size, info, t.output_dir));
  return concat("glm_hpc: wrote ", dataset.size(), " samples (", dataset.report.tokens, " tokens) as token shards to ",
                t.output_dir, "; train on them with --dataset ", t.output_dir, "\n");
}

}  // namespace glm
