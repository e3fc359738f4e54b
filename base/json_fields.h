// Typed, range-checked reads of the fields of a JSON file a user may edit (a checkpoint's meta.json,
// config.json, prepared.json, a bench_comm profile): a missing field, a wrong type or a value
// outside what the file's writer could produce is a user error naming the file and the field.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace glm {

// The JSON object in the file at `path` (check_input_path first): a user error naming the file when
// it cannot be opened, is not JSON, or holds something other than an object.
Result<nlohmann::json> read_json_object(const std::string& path);

class JsonFields {
 public:
  static constexpr int64_t kMinInt = std::numeric_limits<int64_t>::min();
  static constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();
  static constexpr double kInf = std::numeric_limits<double>::infinity();

  // The fields of `object`, a JSON object read from `file` (its name in messages); a user error when
  // it is not an object. The JSON must outlive the reader.
  static Result<JsonFields> of(const nlohmann::json& object, std::string file);

  // Present and not null.
  bool has(std::string_view key) const;
  // The raw value, or null when absent.
  const nlohmann::json& raw(std::string_view key) const;
  // A nested object, its fields named "key.field" in messages.
  Result<JsonFields> object(std::string_view key) const;

  // Each read fails when the field is missing (or null), has another type or lies outside
  // [min, max]; the _or forms give `fallback` for a missing or null field instead.
  Result<int64_t> integer(std::string_view key, int64_t min = kMinInt, int64_t max = kMaxInt) const;
  Result<int64_t> integer_or(std::string_view key, int64_t fallback, int64_t min = kMinInt,
                             int64_t max = kMaxInt) const;
  Result<uint64_t> unsigned_integer(std::string_view key) const;
  // A number in [min, max], never NaN or infinite (a JSON value built in code may hold either).
  Result<double> number(std::string_view key, double min = -kInf, double max = kInf) const;
  Result<double> number_or(std::string_view key, double fallback, double min = -kInf, double max = kInf) const;
  Result<bool> boolean(std::string_view key) const;
  Result<bool> boolean_or(std::string_view key, bool fallback) const;
  Result<std::string> string(std::string_view key) const;
  Result<std::string> string_or(std::string_view key, std::string fallback) const;
  // An array of integers, each in [min, max].
  Result<std::vector<int64_t>> integers(std::string_view key, int64_t min = kMinInt, int64_t max = kMaxInt) const;
  Result<std::vector<std::string>> strings(std::string_view key) const;
  // An array of objects, the fields of element i named "key[i].field" in messages.
  Result<std::vector<JsonFields>> objects(std::string_view key) const;

  // "<file>: field '<prefix><key>' <what>": for checks beyond type and range.
  Status error(std::string_view key, const std::string& what) const;
  const std::string& file() const { return file_; }

 private:
  JsonFields(const nlohmann::json& object, std::string file, std::string prefix)
      : json_(&object), file_(std::move(file)), prefix_(std::move(prefix)) {}
  Result<int64_t> integer_value(std::string_view key, const nlohmann::json& v, int64_t min, int64_t max) const;
  Result<double> number_value(std::string_view key, const nlohmann::json& v, double min, double max) const;

  const nlohmann::json* json_;
  std::string file_;
  std::string prefix_;  // "lora." for a nested object's fields
};

// A JSON value as a message shows it: short, one line.
std::string json_excerpt(const nlohmann::json& v);

}  // namespace glm
