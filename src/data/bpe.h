// Byte-level BPE over a tiktoken rank file (GLM-4's tokenizer.model): the rank table, its
// loading with file:line errors, and the lowest-rank-first merge of one pre-tokenized piece.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace glm {

// Bytes <-> rank of every ordinary token. Ranks are dense (0..size()-1): the special tokens are
// numbered from size() on (GLM4_SPEC.md 5.3), which a gap would make ambiguous.
class BpeRanks {
 public:
  static constexpr int32_t kNoRank = std::numeric_limits<int32_t>::max();  // sorts after every rank

  // Lines "<base64 of the token's bytes> <rank>"; empty lines are ignored as tiktoken does.
  // `source` names the text in error messages ("path:line: ...").
  static Result<BpeRanks> parse(std::string_view text, const std::string& source);
  static Result<BpeRanks> load(const std::string& path);

  int32_t size() const { return static_cast<int32_t>(offsets_.size()) - 1; }
  std::string_view bytes(int32_t rank) const {
    return std::string_view(arena_).substr(offsets_[rank], offsets_[rank + 1] - offsets_[rank]);
  }
  int32_t byte_rank(unsigned char b) const { return byte_rank_[b]; }
  // The rank of exactly these bytes, or kNoRank. The hot path of encoding.
  int32_t find(std::string_view bytes) const;

 private:
  struct Slot {
    uint32_t tag;  // high hash bits: most mismatches are rejected without touching arena_
    int32_t rank;  // -1: empty
  };
  std::string arena_;              // every token's bytes, in rank order
  std::vector<uint32_t> offsets_;  // token r is arena_[offsets_[r], offsets_[r + 1])
  std::vector<Slot> slots_;        // open addressing, linear probing, at most half full
  uint64_t mask_ = 0;
  int32_t byte_rank_[256] = {};
};

// Buffers reused across the pieces of one encode call, so merging allocates only while they grow.
struct BpeScratch {
  struct Part {
    uint32_t start;     // first byte of this part in the piece
    int32_t token;      // rank of the part's bytes
    int32_t pair_rank;  // rank of this part joined with the next one, or kNoRank
  };
  std::vector<Part> parts;
  std::vector<int32_t> next, previous, token, pair_rank;
  std::vector<uint64_t> heap;
};

// How the next merge is found. A scan of the parts is fastest for the short pieces of ordinary
// text but quadratic; a heap keeps a piece of n bytes at O(n log n), and the regex lets pieces
// be arbitrarily long (a megabyte of letters or spaces is one piece). Both give identical tokens.
enum class MergeSearch { automatic, scan, heap };

// Appends the tokens of `piece` (non-empty): start from single bytes, repeatedly merge the
// adjacent pair whose joined bytes have the lowest rank (the leftmost on a tie) until no joined
// pair has a rank.
void byte_pair_encode(const BpeRanks& ranks, std::string_view piece, std::vector<int32_t>& out, BpeScratch& scratch,
                      MergeSearch search = MergeSearch::automatic);

}  // namespace glm
