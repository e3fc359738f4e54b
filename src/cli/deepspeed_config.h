// --deepspeed FILE|zero1|zero2|zero3 (ms-swift's and transformers' option): a DeepSpeed JSON config
// mapped onto glm_hpc's options. Every key of the file gets one of three outcomes: applied (it sets
// an option, as a config-file line would), accepted without effect (glm_hpc always does that, or
// decides it elsewhere; the reason is printed once), or refused by name (a meaning glm_hpc does
// not have). "auto" values leave glm_hpc's option as it is. The table of keys is in
// docs/DEEPSPEED.md; tests/test_deepspeed_config.cpp checks it.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace glm {

struct DeepSpeedKey {
  enum class Outcome { applied, no_effect, refused };
  std::string key;     // dotted path in the file: zero_optimization.stage
  std::string value;   // the file's value as JSON text
  Outcome outcome = Outcome::no_effect;
  std::string option;  // applied: the glm_hpc option it sets
  std::string text;    // applied: the option's value text
  std::string reason;  // no_effect and refused: why
};

struct DeepSpeedConfig {
  std::string source;  // the file, or the preset's name
  std::vector<DeepSpeedKey> keys;  // in the file's order

  bool refused() const;
  // One line per key ("zero_optimization.stage 2: --zero_stage 2", "...: no effect: reason").
  std::string account() const;
};

// Reads a DeepSpeed JSON file, or ms-swift's presets zero1, zero2 and zero3 (the stage; everything
// else "auto"). Errors: the file cannot be read or is not a JSON object.
Result<DeepSpeedConfig> read_deepspeed_config(const std::string& spec);

}  // namespace glm
