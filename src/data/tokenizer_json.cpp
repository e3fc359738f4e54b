// tokenizer.json as tiktoken ranks (see tokenizer_json.h).
#include "data/tokenizer_json.h"

#include <array>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "base/input_path.h"
#include "data/tiktoken_tokenizer.h"
#include "data/tokenizer.h"

namespace glm {
namespace {

// GPT-2's map of the 256 bytes to printable characters, inverted: code point -> byte (-1: none).
std::unordered_map<uint32_t, int> unicode_to_byte() {
  std::unordered_map<uint32_t, int> map;
  std::array<bool, 256> printable{};
  for (int b = '!'; b <= '~'; ++b) printable[static_cast<size_t>(b)] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) printable[static_cast<size_t>(b)] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) printable[static_cast<size_t>(b)] = true;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) map[printable[static_cast<size_t>(b)] ? static_cast<uint32_t>(b) : next++] = b;
  return map;
}

// A vocabulary string's bytes; false where it holds a character outside the byte map.
bool spelled_bytes(const std::string& text, const std::unordered_map<uint32_t, int>& map, std::string& out) {
  out.clear();
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const int length = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (length == 0 || i + static_cast<size_t>(length) > text.size()) return false;
    uint32_t cp = length == 1 ? c : c & (0x7Fu >> length);
    for (int k = 1; k < length; ++k) cp = (cp << 6) | (static_cast<unsigned char>(text[i + static_cast<size_t>(k)]) & 0x3Fu);
    const auto it = map.find(cp);
    if (it == map.end()) return false;
    out += static_cast<char>(it->second);
    i += static_cast<size_t>(length);
  }
  return true;
}

// The Split pre-tokenizer's regex (alone or in a Sequence), or "" when there is none.
std::string split_pattern(const nlohmann::json& pre) {
  if (!pre.is_object()) return "";
  if (pre.value("type", "") == "Split" && pre.contains("pattern") && pre["pattern"].contains("Regex"))
    return pre["pattern"]["Regex"].get<std::string>();
  if (pre.value("type", "") == "Sequence" && pre.contains("pretokenizers"))
    for (const auto& p : pre["pretokenizers"]) {
      const std::string found = split_pattern(p);
      if (!found.empty()) return found;
    }
  return "";
}

}  // namespace

Result<std::vector<std::string>> read_tokenizer_json_ranks(const std::string& path) {
  GLM_RETURN_IF_ERROR(check_input_path(path, InputKind::file));
  std::ifstream in(path, std::ios::binary);
  if (!in) return GLM_USER_ERROR("cannot open tokenizer file '", path, "'");
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return GLM_USER_ERROR(path, " is not a JSON object");
  const nlohmann::json& model = j.contains("model") ? j["model"] : nlohmann::json();
  if (!model.is_object() || model.value("type", "") != "BPE" || !model.contains("vocab") || !model["vocab"].is_object())
    return GLM_USER_ERROR(path, ": \"model\" is not a BPE model with a vocab (GLM-4's tokenizer.json is)");
  if (model.value("byte_fallback", false)) return GLM_USER_ERROR(path, ": byte_fallback BPE is not GLM-4's tokenizer");
  const std::string pattern = split_pattern(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : nlohmann::json());
  if (pattern != kGlm4PretokenizePattern)
    return GLM_USER_ERROR(path, ": the pre-tokenizer's Split regex is ",
                          pattern.empty() ? std::string("missing") : "'" + pattern + "'",
                          ", not GLM-4's (tokenizer_json.h); use the model's tokenizer.model");
  // Ranks: the vocabulary's ids, 0..n-1, each token's bytes.
  const auto map = unicode_to_byte();
  const nlohmann::json& vocab = model["vocab"];
  std::vector<std::string> tokens(vocab.size());
  std::vector<char> seen(vocab.size(), 0);
  std::unordered_map<std::string, int64_t> id_of;
  std::string bytes;
  for (const auto& [text, id_json] : vocab.items()) {
    const int64_t id = id_json.is_number_integer() ? id_json.get<int64_t>() : -1;
    if (id < 0 || id >= static_cast<int64_t>(tokens.size()) || seen[static_cast<size_t>(id)])
      return GLM_USER_ERROR(path, ": vocab entry ", nlohmann::json(text).dump(), " has id ", id_json.dump(),
                            "; the ", tokens.size(), " ids must be 0..", tokens.size() - 1, " once each");
    if (!spelled_bytes(text, map, bytes))
      return GLM_USER_ERROR(path, ": vocab entry ", nlohmann::json(text).dump(),
                            " is not byte-level (a character outside GPT-2's byte map)");
    seen[static_cast<size_t>(id)] = 1;
    tokens[static_cast<size_t>(id)] = bytes;
    id_of[text] = id;
  }
  // Merges in rank order: what tiktoken's lowest-rank-first merging reproduces.
  int64_t last = -1, index = 0;
  for (const auto& merge : model.contains("merges") ? model["merges"] : nlohmann::json::array()) {
    std::string a, b;
    if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      a = merge[0].get<std::string>();
      b = merge[1].get<std::string>();
    } else if (merge.is_string() && merge.get<std::string>().find(' ') != std::string::npos) {
      const std::string m = merge.get<std::string>();
      a = m.substr(0, m.find(' '));
      b = m.substr(m.find(' ') + 1);
    } else {
      return GLM_USER_ERROR(path, ": merges[", index, "] is neither [\"a\", \"b\"] nor \"a b\"");
    }
    const auto it = id_of.find(a + b);
    if (it == id_of.end() || it->second <= last)
      return GLM_USER_ERROR(path, ": merges[", index, "] (", nlohmann::json(a).dump(), " + ", nlohmann::json(b).dump(),
                            ") ", it == id_of.end() ? "makes no vocabulary token" : "is out of rank order",
                            ": not a tiktoken-style BPE (use the model's tokenizer.model)");
    last = it->second;
    ++index;
  }
  // The special tokens right after the ranks, in GLM-4's order.
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::unordered_map<std::string, int64_t> added;
  for (const auto& t : j.contains("added_tokens") ? j["added_tokens"] : nlohmann::json::array())
    if (t.is_object() && t.contains("content") && t.contains("id")) added[t.value("content", "")] = t["id"].get<int64_t>();
  for (int s = 0; s < static_cast<int>(SpecialToken::count); ++s) {
    const char* text = special_token_text(static_cast<SpecialToken>(s));
    const auto it = added.find(text);
    if (it == added.end() || it->second != n + s)
      return GLM_USER_ERROR(path, ": special token ", text, " is ",
                            it == added.end() ? std::string("missing") : concat("id ", it->second),
                            "; GLM-4's 14 special tokens follow the ", n, " ranks in order (id ", n + s, " here)");
  }
  return tokens;
}

}  // namespace glm
