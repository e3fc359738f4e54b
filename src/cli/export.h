// glm_hpc export: a checkpoint (any world size and ZeRO stage) to a Hugging Face model directory,
// in transformers' `glm` layout or THUDM's `chatglm` layout, written whole or not at all.
#pragma once

#include <string>

#include "cli/options.h"
#include "base/status.h"

namespace glm {

// Tokenizer files an exported directory carries when the source has them; the modeling files
// only with --export_format chatglm (its remote code).
inline constexpr const char* kTokenizerFiles[] = {"tokenizer.model",       "tokenizer.json",
                                                  "tokenizer_config.json", "special_tokens_map.json",
                                                  "added_tokens.json",     "tokenization_chatglm.py"};
inline constexpr const char* kChatglmCodeFiles[] = {"configuration_chatglm.py", "modeling_chatglm.py"};

// --ckpt_dir: a checkpoint directory, or an output directory whose latest complete checkpoint is
// meant; returns the checkpoint directory, checked complete.
Result<std::string> resolve_export_checkpoint(const std::string& dir);

// Runs the export on one process; returns the report to print (files, bytes, parameters).
Result<std::string> run_export(const CliOptions& options);

}  // namespace glm
