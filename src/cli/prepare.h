// glm_hpc prepare: the data pipeline without training; the length (and packing) report, and one
// sample decoded with its trained tokens marked.
#pragma once

#include <string>

#include "cli/options.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "base/status.h"

namespace glm {

// Trained tokens of a printed example sit between these markers (documented in --help).
inline constexpr const char* kTrainedOpen = "[[";
inline constexpr const char* kTrainedClose = "]]";
// Separates the tokens of the example's token-by-token line.
inline constexpr const char* kTokenSeparator = "|";

// Sample `index` of `dataset` as text: the input tokens decoded, with every run of trained
// positions (a label >= 0 after the first position) between [[ and ]]. A trained position shows
// its label, which is its input token except in pre-tokenized data that says otherwise. Without a
// tokenizer the ids are printed, else a second line shows every input token decoded on its own,
// between |, so the tokenizer's merges are visible. An index outside the dataset is a user error.
Result<std::string> format_example(const Dataset& dataset, int64_t index, const Tokenizer* tokenizer);

// Everything `glm_hpc prepare` prints: the dataset report, the packing report with --packing,
// and the example of --print_example.
Result<std::string> prepare_report(const CliOptions& options, const Dataset& dataset, const Tokenizer* tokenizer);

// prepare writes token shards when --output_dir is given on the command line (not a config's
// output directory meant for training).
bool prepare_writes_shards(const CliOptions& options);
// Writes `dataset` as token shards to --output_dir (data/token_shards.h); returns the line to print.
Result<std::string> write_prepared(const CliOptions& options, const Dataset& dataset, const Tokenizer* tokenizer);

}  // namespace glm
