// BPE learning with incremental pair counts: a merge revisits only the pieces holding its pair.
#include "data/bpe_trainer.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "data/conversation_reader.h"
#include "data/tiktoken_tokenizer.h"

namespace glm {
namespace {

uint64_t pair_key(int32_t a, int32_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b); }

std::string base64(std::string_view bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t group = 0;
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    for (size_t k = 0; k < n; ++k)
      group |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + k])) << (16 - 8 * k);
    for (size_t k = 0; k < 4; ++k) out += k <= n ? kAlphabet[(group >> (18 - 6 * k)) & 63] : '=';
  }
  return out;
}

// A distinct piece: its current symbols and how often it occurs.
struct Word {
  std::vector<int32_t> symbols;
  int64_t count = 0;
};

class PairCounts {
 public:
  void add_word(const Word& w, int64_t sign) {
    for (size_t i = 0; i + 1 < w.symbols.size(); ++i) {
      const uint64_t key = pair_key(w.symbols[i], w.symbols[i + 1]);
      auto it = counts_.try_emplace(key, 0).first;
      it->second += sign * w.count;
      if (it->second == 0) counts_.erase(it);
    }
  }
  // The most frequent pair, ties to the smallest key; count 0 when there is none.
  std::pair<uint64_t, int64_t> best() const {
    std::pair<uint64_t, int64_t> b{0, 0};
    for (const auto& [key, count] : counts_)
      if (count > b.second || (count == b.second && key < b.first)) b = {key, count};
    return b;
  }

 private:
  std::unordered_map<uint64_t, int64_t> counts_;
};

}  // namespace

Result<std::vector<std::string>> learn_bpe_tokens(const std::vector<std::string>& texts, int32_t ranks) {
  if (ranks < 256) return GLM_USER_ERROR("a byte-level rank file needs at least 256 ranks, asked for ", ranks);
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
  GLM_ASSIGN_OR_RETURN(BpeRanks byte_ranks, BpeRanks::parse(format_rank_file(tokens), "the 256 byte ranks"));
  GLM_ASSIGN_OR_RETURN(TiktokenTokenizer splitter, TiktokenTokenizer::create(std::move(byte_ranks)));

  // Distinct pieces in byte order, so the data structures do not depend on the order of texts.
  std::map<std::string, int64_t> piece_counts;
  for (const auto& text : texts)
    splitter.pretokenize(text, [&](std::string_view p) { ++piece_counts[std::string(p)]; });
  std::vector<Word> words;
  words.reserve(piece_counts.size());
  for (const auto& [piece, count] : piece_counts) {
    Word w;
    w.count = count;
    for (const unsigned char c : piece) w.symbols.push_back(c);
    words.push_back(std::move(w));
  }

  PairCounts counts;
  std::unordered_map<uint64_t, std::vector<int32_t>> holders;  // pair -> words that held it (may be stale)
  for (size_t w = 0; w < words.size(); ++w) {
    counts.add_word(words[w], 1);
    for (size_t i = 0; i + 1 < words[w].symbols.size(); ++i)
      holders[pair_key(words[w].symbols[i], words[w].symbols[i + 1])].push_back(static_cast<int32_t>(w));
  }
  std::unordered_map<std::string, int32_t> id_of;
  for (int32_t id = 0; id < 256; ++id) id_of.emplace(tokens[static_cast<size_t>(id)], id);
  std::vector<int64_t> visited(words.size(), -1);

  for (int64_t step = 0; static_cast<int32_t>(tokens.size()) < ranks; ++step) {
    const auto [key, count] = counts.best();
    if (count < 2) break;  // a pair seen once teaches nothing
    const auto a = static_cast<int32_t>(key >> 32), b = static_cast<int32_t>(key & 0xffffffffu);
    std::string joined = tokens[static_cast<size_t>(a)] + tokens[static_cast<size_t>(b)];
    // Two routes to the same bytes (ab + c, a + bc) share one token: ranks stay unique.
    auto [it, added] = id_of.emplace(joined, static_cast<int32_t>(tokens.size()));
    if (added) tokens.push_back(std::move(joined));
    const int32_t merged = it->second;
    std::vector<int32_t> list = std::move(holders[key]);
    holders.erase(key);
    for (const int32_t w : list) {
      if (visited[static_cast<size_t>(w)] == step) continue;
      visited[static_cast<size_t>(w)] = step;
      Word& word = words[static_cast<size_t>(w)];
      counts.add_word(word, -1);
      std::vector<int32_t> next;
      next.reserve(word.symbols.size());
      for (size_t i = 0; i < word.symbols.size(); ++i) {
        if (i + 1 < word.symbols.size() && word.symbols[i] == a && word.symbols[i + 1] == b) {
          next.push_back(merged);
          ++i;
        } else {
          next.push_back(word.symbols[i]);
        }
      }
      word.symbols = std::move(next);
      counts.add_word(word, 1);
      for (size_t i = 0; i + 1 < word.symbols.size(); ++i)
        if (word.symbols[i] == merged || word.symbols[i + 1] == merged)
          holders[pair_key(word.symbols[i], word.symbols[i + 1])].push_back(w);
    }
  }
  return tokens;
}

std::string format_rank_file(const std::vector<std::string>& tokens) {
  std::string out;
  for (size_t r = 0; r < tokens.size(); ++r) out += concat(base64(tokens[r]), " ", r, "\n");
  return out;
}

Result<std::vector<std::string>> conversation_texts(const std::vector<std::string>& paths) {
  std::vector<std::string> texts;
  for (const auto& path : paths) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return GLM_USER_ERROR("cannot open '", path, "'");
    std::string line;
    for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      Conversation c;
      Status s;
      try {
        s = parse_any_conversation(nlohmann::json::parse(line), c);
      } catch (const nlohmann::json::parse_error& e) {
        s = GLM_USER_ERROR("malformed JSON (", e.what(), ")");
      }
      if (!s.is_ok()) return GLM_USER_ERROR(path, ":", line_no, ": ", s.message());
      for (const Message& m : c.messages)
        if (!m.content.empty()) texts.push_back("\n" + m.content);
    }
    if (in.bad()) return GLM_USER_ERROR("error reading '", path, "'");
  }
  return texts;
}

}  // namespace glm
