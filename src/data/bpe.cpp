// Rank-file parsing, the bytes -> rank hash table, and the two merge searches of byte-level BPE.
#include "data/bpe.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>

#include "base/input_path.h"

namespace glm {
namespace {

// Special ids follow the ordinary ranks; keep room so that they stay int32.
constexpr int64_t kMaxRanks = std::numeric_limits<int32_t>::max() - 64;
// A rank file is read whole into memory; GLM-4's (151,329 ranks) is 2.6 MB, cl100k_base's 1.7 MB.
constexpr int64_t kMaxRankFileBytes = int64_t{1} << 30;

// Tokens are short (most under 8 bytes), so one multiply per 8 bytes and a final avalanche is
// enough; the table's tags take the high bits, the slot index the low ones.
inline uint64_t hash_bytes(std::string_view s) {
  constexpr uint64_t kMultiplier = 0x9e3779b97f4a7c15ULL;
  uint64_t h = s.size() * 0xff51afd7ed558ccdULL;
  const char* p = s.data();
  size_t n = s.size();
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    h = (h ^ word) * kMultiplier;
    h = (h << 31) | (h >> 33);
  }
  if (n > 0) {
    uint64_t word = 0;
    std::memcpy(&word, p, n);
    h = (h ^ word) * kMultiplier;
  }
  h ^= h >> 32;
  h *= 0xd6e8feb86659fd93ULL;
  h ^= h >> 32;
  return h;
}

// Strict RFC 4648 base64 with padding, as tiktoken writes it. Appends to `out`; false when invalid.
bool decode_base64(std::string_view in, std::string& out) {
  static const auto kValue = [] {
    std::array<int8_t, 256> v;
    v.fill(-1);
    const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) v[static_cast<unsigned char>(alphabet[i])] = static_cast<int8_t>(i);
    return v;
  }();
  if (in.empty() || in.size() % 4 != 0) return false;
  for (size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    int padding = 0;
    if (last) padding = (in[i + 3] == '=') + (in[i + 2] == '=' && in[i + 3] == '=');
    uint32_t group = 0;
    for (int k = 0; k < 4 - padding; ++k) {
      const int8_t v = kValue[static_cast<unsigned char>(in[i + k])];
      if (v < 0) return false;
      group |= static_cast<uint32_t>(v) << (18 - 6 * k);
    }
    out.push_back(static_cast<char>(group >> 16));
    if (padding < 2) out.push_back(static_cast<char>(group >> 8));
    if (padding < 1) out.push_back(static_cast<char>(group));
  }
  return true;
}

std::string quoted_excerpt(std::string_view s) {
  constexpr size_t kMax = 60;
  return concat("'", s.substr(0, kMax), s.size() > kMax ? "...'" : "'");
}

}  // namespace

int32_t BpeRanks::find(std::string_view s) const {
  const uint64_t h = hash_bytes(s);
  const auto tag = static_cast<uint32_t>(h >> 32);
  for (uint64_t i = h & mask_;; i = (i + 1) & mask_) {
    const Slot slot = slots_[i];
    if (slot.rank < 0) return kNoRank;
    if (slot.tag == tag && bytes(slot.rank) == s) return slot.rank;
  }
}

Result<BpeRanks> BpeRanks::parse(std::string_view text, const std::string& source) {
  struct Entry {
    int64_t rank;
    uint32_t offset, length;  // in `decoded`
    int64_t line;
    std::string_view token;  // base64, for messages
  };
  std::vector<Entry> entries;
  std::string decoded;
  decoded.reserve(text.size() * 3 / 4);
  int64_t line_number = 0;
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = std::min(text.find('\n', pos), text.size());
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos)
      return GLM_USER_ERROR(source, ":", line_number, ": expected '<base64 token bytes> <rank>', got ",
                            quoted_excerpt(line));
    const std::string_view token = line.substr(0, space), rank_text = line.substr(space + 1);
    const size_t offset = decoded.size();
    if (!decode_base64(token, decoded))
      return GLM_USER_ERROR(source, ":", line_number, ": token ", quoted_excerpt(token), " is not base64");
    int64_t rank = -1;
    const auto [rank_end, error] = std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
    if (error != std::errc() || rank_end != rank_text.data() + rank_text.size() || rank < 0 || rank >= kMaxRanks)
      return GLM_USER_ERROR(source, ":", line_number, ": rank ", quoted_excerpt(rank_text),
                            " is not an integer in [0, ", kMaxRanks, ")");
    if (decoded.size() > std::numeric_limits<uint32_t>::max())
      return GLM_USER_ERROR(source, ": the tokens' bytes exceed 4 GiB");
    entries.push_back(
        {rank, static_cast<uint32_t>(offset), static_cast<uint32_t>(decoded.size() - offset), line_number, token});
  }
  if (entries.empty()) return GLM_USER_ERROR(source, ": no ranks (an empty tokenizer file?)");
  if (static_cast<int64_t>(entries.size()) >= kMaxRanks) return GLM_USER_ERROR(source, ": too many ranks");

  // n lines with distinct ranks below n are exactly 0..n-1.
  const auto n = static_cast<int64_t>(entries.size());
  std::vector<int32_t> entry_of_rank(n, -1);
  for (size_t e = 0; e < entries.size(); ++e) {
    const Entry& entry = entries[e];
    if (entry.rank >= n)
      return GLM_USER_ERROR(source, ":", entry.line, ": rank ", entry.rank, " is out of range: the file's ", n,
                            " tokens must have the ranks 0..", n - 1);
    if (entry_of_rank[entry.rank] >= 0)
      return GLM_USER_ERROR(source, ":", entry.line, ": duplicate rank ", entry.rank, " (also on line ",
                            entries[entry_of_rank[entry.rank]].line, ")");
    entry_of_rank[entry.rank] = static_cast<int32_t>(e);
  }

  BpeRanks table;
  table.arena_.reserve(decoded.size());
  table.offsets_.reserve(n + 1);
  for (int64_t r = 0; r < n; ++r) {
    const Entry& entry = entries[entry_of_rank[r]];
    table.offsets_.push_back(static_cast<uint32_t>(table.arena_.size()));
    table.arena_.append(decoded, entry.offset, entry.length);
  }
  table.offsets_.push_back(static_cast<uint32_t>(table.arena_.size()));

  uint64_t capacity = 16;
  while (capacity < 2 * static_cast<uint64_t>(n)) capacity *= 2;
  table.slots_.assign(capacity, Slot{0, -1});
  table.mask_ = capacity - 1;
  for (int32_t r = 0; r < n; ++r) {
    const std::string_view bytes = table.bytes(r);
    if (const int32_t existing = table.find(bytes); existing != kNoRank)
      return GLM_USER_ERROR(source, ":", entries[entry_of_rank[r]].line, ": token ",
                            quoted_excerpt(entries[entry_of_rank[r]].token), " already has rank ", existing, " (line ",
                            entries[entry_of_rank[existing]].line, ")");
    const uint64_t h = hash_bytes(bytes);
    uint64_t i = h & table.mask_;
    while (table.slots_[i].rank >= 0) i = (i + 1) & table.mask_;
    table.slots_[i] = Slot{static_cast<uint32_t>(h >> 32), r};
  }

  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    table.byte_rank_[b] = table.find(std::string_view(&c, 1));
    if (table.byte_rank_[b] == kNoRank)
      return GLM_USER_ERROR(source, ": byte 0x", "0123456789abcdef"[b >> 4], "0123456789abcdef"[b & 15],
                            " has no rank; byte-level BPE needs one for every single byte");
  }
  return table;
}

Result<BpeRanks> BpeRanks::load(const std::string& path) {
  GLM_RETURN_IF_ERROR(check_input_file_size(path, kMaxRankFileBytes,
                                            "a tiktoken rank file may hold (GLM-4's tokenizer.model is 2.6 MB)"));
  std::ifstream in(path, std::ios::binary);
  if (!in) return GLM_USER_ERROR("cannot open tokenizer file '", path, "': ", std::strerror(errno));
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return GLM_ERROR(ErrorKind::io, "cannot read tokenizer file '", path, "'");
  return parse(contents.str(), path);
}

namespace {

// Linear scan for the lowest pair rank; tiktoken's own approach, best while pieces are short.
void merge_by_scan(const BpeRanks& ranks, std::string_view piece, std::vector<int32_t>& out, BpeScratch& scratch) {
  auto& parts = scratch.parts;
  const auto n = static_cast<uint32_t>(piece.size());
  parts.clear();
  for (uint32_t i = 0; i < n; ++i) {
    const int32_t pair = i + 1 < n ? ranks.find(piece.substr(i, 2)) : BpeRanks::kNoRank;
    parts.push_back({i, ranks.byte_rank(static_cast<unsigned char>(piece[i])), pair});
  }
  parts.push_back({n, BpeRanks::kNoRank, BpeRanks::kNoRank});  // sentinel: the end of the last part
  // Rank of part i joined with part i + 1 (the sentinel has no successor).
  auto pair_rank = [&](size_t i) {
    if (i + 2 >= parts.size()) return BpeRanks::kNoRank;
    return ranks.find(piece.substr(parts[i].start, parts[i + 2].start - parts[i].start));
  };
  for (;;) {
    size_t best = 0;
    int32_t best_rank = BpeRanks::kNoRank;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      if (parts[i].pair_rank < best_rank) {
        best_rank = parts[i].pair_rank;
        best = i;
      }
    }
    if (best_rank == BpeRanks::kNoRank) break;
    parts[best].token = best_rank;
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    parts[best].pair_rank = pair_rank(best);
    if (best > 0) parts[best - 1].pair_rank = pair_rank(best - 1);
  }
  for (size_t i = 0; i + 1 < parts.size(); ++i) out.push_back(parts[i].token);
}

// The same merge order from a min-heap of (pair rank, start). An entry is stale once its part was
// merged away or its pair grew; a pair's bytes only ever grow, and ranks are unique, so comparing
// the stored rank with the part's current pair rank tells stale from live.
void merge_by_heap(const BpeRanks& ranks, std::string_view piece, std::vector<int32_t>& out, BpeScratch& scratch) {
  const auto n = static_cast<int32_t>(piece.size());
  auto &next = scratch.next, &previous = scratch.previous, &token = scratch.token, &pair_rank = scratch.pair_rank;
  auto& heap = scratch.heap;
  next.resize(n);
  previous.resize(n);
  token.resize(n);
  pair_rank.resize(n);
  heap.clear();
  auto key = [](int32_t rank, int32_t start) {
    return (static_cast<uint64_t>(rank) << 32) | static_cast<uint32_t>(start);
  };
  for (int32_t i = 0; i < n; ++i) {
    next[i] = i + 1;
    previous[i] = i - 1;
    token[i] = ranks.byte_rank(static_cast<unsigned char>(piece[i]));
    pair_rank[i] = i + 1 < n ? ranks.find(piece.substr(i, 2)) : BpeRanks::kNoRank;
    if (pair_rank[i] != BpeRanks::kNoRank) heap.push_back(key(pair_rank[i], i));
  }
  std::make_heap(heap.begin(), heap.end(), std::greater<>());
  // Rank of part i joined with its successor (parts end at next[], n ends the piece).
  auto joined_rank = [&](int32_t i) {
    if (next[i] >= n) return BpeRanks::kNoRank;
    const int32_t end = next[next[i]];
    return ranks.find(piece.substr(i, end - i));
  };
  auto update = [&](int32_t i) {
    pair_rank[i] = joined_rank(i);
    if (pair_rank[i] != BpeRanks::kNoRank) {
      heap.push_back(key(pair_rank[i], i));
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    }
  };
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const uint64_t top = heap.back();
    heap.pop_back();
    const auto rank = static_cast<int32_t>(top >> 32);
    const auto i = static_cast<int32_t>(top & 0xffffffffu);
    if (pair_rank[i] != rank) continue;
    const int32_t j = next[i];  // merged into i
    token[i] = rank;
    next[i] = next[j];
    if (next[j] < n) previous[next[j]] = i;
    pair_rank[j] = BpeRanks::kNoRank;
    update(i);
    if (previous[i] >= 0) update(previous[i]);
  }
  for (int32_t i = 0; i < n; i = next[i]) out.push_back(token[i]);
}

// Below this many bytes the scan's quadratic term costs less than the heap's bookkeeping.
constexpr size_t kScanMaxBytes = 64;

}  // namespace

void byte_pair_encode(const BpeRanks& ranks, std::string_view piece, std::vector<int32_t>& out, BpeScratch& scratch,
                      MergeSearch search) {
  if (search == MergeSearch::automatic) search = piece.size() <= kScanMaxBytes ? MergeSearch::scan : MergeSearch::heap;
  if (search == MergeSearch::scan)
    merge_by_scan(ranks, piece, out, scratch);
  else
    merge_by_heap(ranks, piece, out, scratch);
}

}  // namespace glm
