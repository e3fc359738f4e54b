// Content hashes that name what produced a dataset: a tokenizer's ranks, a dataset file's bytes,
// the options of a tokenization. 64-bit FNV-1a: identity, not security.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

namespace glm {

class ContentHash {
 public:
  ContentHash& update(std::string_view bytes);
  // A length-prefixed field, so that ("ab", "c") and ("a", "bc") hash differently.
  ContentHash& field(std::string_view bytes);
  uint64_t value() const { return hash_; }
  // "fnv1a64:" and 16 hex digits.
  std::string hex() const;

 private:
  uint64_t hash_ = 0xcbf29ce484222325ULL;
};

// The hash of a file's bytes; an unreadable file (or not a regular one) is a user error naming it,
// a stop by signal (base/stop_signal.h) an ErrorKind::stopped status.
Result<std::string> hash_file(const std::string& path);

}  // namespace glm
