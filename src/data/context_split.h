// Context parallelism (--context_parallel_size C): the C ranks of a group hold one row of tokens
// between them. Per-token work (norms, projections, SwiGLU, RoPE at the tokens' row positions, the
// lm_head and the loss) stays on the rank that holds the token; attention gathers the row's keys and
// values from the group (GLM-4 has 2 or 4 KV heads against 32 query heads, so k | v is 8-16x
// smaller than q) and the gradients of those keys and values are summed back to their owners.
//
// The row is cut into 2C chunks of equal length and rank r holds chunks r and 2C-1-r (zigzag): under
// the causal mask a chunk's attention work grows with its place in the row, and each rank's pair
// sums to the same work.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "data/sharded_loader.h"

namespace glm {

struct ContextSplit {
  int size = 1;  // C, the ranks sharing a row
  int rank = 0;  // this rank's place in its group, 0 <= rank < size

  // A row splits when its length is a positive multiple of 2C (the data path pads rows to that).
  static Status check_row(int64_t tokens, int size);
  int64_t chunk(int64_t tokens) const { return tokens / (2 * size); }
  // The row positions this rank holds, ascending: chunk rank, then chunk 2C-1-rank.
  std::vector<int32_t> positions(int64_t tokens) const;
  // For each position of the row, its row in the group's gathered buffer: rank 0's tokens in the
  // order of positions(), then rank 1's, and so on (what an all-gather of equal parts yields).
  static std::vector<int32_t> gathered_rows(int64_t tokens, int size);

  // This rank's share of a whole row: the row is first padded to a multiple of 2C with tokens that
  // are their own one-token documents and have no target (they change no loss and no gradient),
  // then the rank takes its positions. A group of 1 returns the row as it is.
  HostMicroBatch share(const HostMicroBatch& row) const;
  // Tokens share() adds to a row of `tokens` tokens.
  int64_t padding(int64_t tokens) const;
};

}  // namespace glm
