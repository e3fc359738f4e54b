// JsonFields (see json_fields.h): typed reads that never throw, each failure naming file and field.
#include "base/json_fields.h"

#include <cmath>
#include <fstream>

#include "base/input_path.h"

namespace glm {
namespace {

const nlohmann::json& null_json() {
  static const nlohmann::json null;
  return null;
}

// " >= 0", " in [1, 4]", or nothing when unbounded.
std::string range_text(int64_t min, int64_t max) {
  if (min == JsonFields::kMinInt && max == JsonFields::kMaxInt) return "";
  if (max == JsonFields::kMaxInt) return concat(" >= ", min);
  if (min == JsonFields::kMinInt) return concat(" <= ", max);
  return concat(" in [", min, ", ", max, "]");
}

std::string number_requirement(double min, double max) {
  if (min == -JsonFields::kInf && max == JsonFields::kInf) return "a finite number";
  if (max == JsonFields::kInf) return concat("a finite number >= ", min);
  if (min == -JsonFields::kInf) return concat("a finite number <= ", max);
  return concat("a number in [", min, ", ", max, "]");
}

}  // namespace

std::string json_excerpt(const nlohmann::json& v) {
  // Invalid UTF-8 in a string is shown replaced, never thrown.
  std::string text = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  constexpr size_t kMax = 60;
  if (text.size() > kMax) text = text.substr(0, kMax) + "...";
  return text;
}

Result<nlohmann::json> read_json_object(const std::string& path) {
  GLM_RETURN_IF_ERROR(check_input_path(path, InputKind::file));
  std::ifstream in(path, std::ios::binary);
  if (!in) return GLM_USER_ERROR("cannot open '", path, "'");
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return GLM_USER_ERROR("'", path, "' is not valid JSON");
  if (!j.is_object()) return GLM_USER_ERROR("'", path, "' is not a JSON object");
  return j;
}

Result<JsonFields> JsonFields::of(const nlohmann::json& object, std::string file) {
  if (!object.is_object()) return GLM_USER_ERROR(file, " is not a JSON object");
  return JsonFields(object, std::move(file), "");
}

bool JsonFields::has(std::string_view key) const {
  const auto it = json_->find(key);
  return it != json_->end() && !it->is_null();
}

const nlohmann::json& JsonFields::raw(std::string_view key) const {
  const auto it = json_->find(key);
  return it == json_->end() ? null_json() : *it;
}

Status JsonFields::error(std::string_view key, const std::string& what) const {
  return GLM_USER_ERROR(file_, ": field '", prefix_, key, "' ", what);
}

Result<JsonFields> JsonFields::object(std::string_view key) const {
  if (!has(key)) return error(key, "is missing");
  const nlohmann::json& v = raw(key);
  if (!v.is_object()) return error(key, concat("must be an object, got ", json_excerpt(v)));
  return JsonFields(v, file_, concat(prefix_, key, "."));
}

Result<int64_t> JsonFields::integer_value(std::string_view key, const nlohmann::json& v, int64_t min,
                                          int64_t max) const {
  const std::string must = concat("must be an integer", range_text(min, max), ", got ");
  if (!v.is_number_integer()) return error(key, must + json_excerpt(v));
  // An unsigned value above int64's range would wrap through get<int64_t>().
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(kMaxInt))
    return error(key, must + json_excerpt(v));
  const int64_t value = v.get<int64_t>();
  if (value < min || value > max) return error(key, must + json_excerpt(v));
  return value;
}

Result<int64_t> JsonFields::integer(std::string_view key, int64_t min, int64_t max) const {
  if (!has(key)) return error(key, "is missing");
  return integer_value(key, raw(key), min, max);
}

Result<int64_t> JsonFields::integer_or(std::string_view key, int64_t fallback, int64_t min, int64_t max) const {
  return has(key) ? integer(key, min, max) : Result<int64_t>(fallback);
}

Result<uint64_t> JsonFields::unsigned_integer(std::string_view key) const {
  if (!has(key)) return error(key, "is missing");
  const nlohmann::json& v = raw(key);
  // nlohmann keeps non-negative integers as unsigned; a negative one would wrap.
  if (!v.is_number_unsigned()) return error(key, "must be an integer >= 0, got " + json_excerpt(v));
  return v.get<uint64_t>();
}

Result<double> JsonFields::number_value(std::string_view key, const nlohmann::json& v, double min, double max) const {
  const std::string must = concat("must be ", number_requirement(min, max), ", got ");
  if (!v.is_number()) return error(key, must + json_excerpt(v));
  const double value = v.get<double>();
  if (!std::isfinite(value) || value < min || value > max) return error(key, must + json_excerpt(v));
  return value;
}

Result<double> JsonFields::number(std::string_view key, double min, double max) const {
  if (!has(key)) return error(key, "is missing");
  return number_value(key, raw(key), min, max);
}

Result<double> JsonFields::number_or(std::string_view key, double fallback, double min, double max) const {
  return has(key) ? number(key, min, max) : Result<double>(fallback);
}

Result<bool> JsonFields::boolean(std::string_view key) const {
  if (!has(key)) return error(key, "is missing");
  const nlohmann::json& v = raw(key);
  if (!v.is_boolean()) return error(key, "must be true or false, got " + json_excerpt(v));
  return v.get<bool>();
}

Result<bool> JsonFields::boolean_or(std::string_view key, bool fallback) const {
  return has(key) ? boolean(key) : Result<bool>(fallback);
}

Result<std::string> JsonFields::string(std::string_view key) const {
  if (!has(key)) return error(key, "is missing");
  const nlohmann::json& v = raw(key);
  if (!v.is_string()) return error(key, "must be a string, got " + json_excerpt(v));
  return v.get<std::string>();
}

Result<std::string> JsonFields::string_or(std::string_view key, std::string fallback) const {
  return has(key) ? string(key) : Result<std::string>(std::move(fallback));
}

Result<std::vector<int64_t>> JsonFields::integers(std::string_view key, int64_t min, int64_t max) const {
  if (!has(key)) return error(key, "is missing");
  const nlohmann::json& v = raw(key);
  const std::string must = concat("must be a list of integers", range_text(min, max), ", got ");
  if (!v.is_array()) return error(key, must + json_excerpt(v));
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    auto value = integer_value(concat(key, "[", i, "]"), v[i], min, max);
    if (!value.is_ok()) return value.status();
    out.push_back(value.value());
  }
  return out;
}

Result<std::vector<std::string>> JsonFields::strings(std::string_view key) const {
  if (!has(key)) return error(key, "is missing");
  const nlohmann::json& v = raw(key);
  if (!v.is_array()) return error(key, "must be a list of strings, got " + json_excerpt(v));
  std::vector<std::string> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string()) return error(concat(key, "[", i, "]"), "must be a string, got " + json_excerpt(v[i]));
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

Result<std::vector<JsonFields>> JsonFields::objects(std::string_view key) const {
  if (!has(key)) return error(key, "is missing");
  const nlohmann::json& v = raw(key);
  if (!v.is_array()) return error(key, "must be a list of objects, got " + json_excerpt(v));
  std::vector<JsonFields> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string name = concat(key, "[", i, "]");
    if (!v[i].is_object()) return error(name, "must be an object, got " + json_excerpt(v[i]));
    out.push_back(JsonFields(v[i], file_, concat(prefix_, name, ".")));
  }
  return out;
}

}  // namespace glm
