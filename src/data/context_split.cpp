// Zigzag split of a row over a context-parallel group (see context_split.h).
#include "data/context_split.h"

#include <limits>

namespace glm {

Status ContextSplit::check_row(int64_t tokens, int size) {
  if (size < 1) return GLM_USER_ERROR("--context_parallel_size must be >= 1, got ", size);
  if (tokens > std::numeric_limits<int32_t>::max())
    return GLM_USER_ERROR("a row of ", tokens, " tokens is longer than the 2^31 - 1 positions glm_hpc indexes");
  if (tokens <= 0 || tokens % (2 * int64_t{size}) != 0)
    return GLM_USER_ERROR("a row of ", tokens, " tokens cannot be split over --context_parallel_size ", size,
                          ": its length must be a positive multiple of ", 2 * int64_t{size},
                          " (2 x context_parallel_size chunks of equal length)");
  return Status::ok();
}

std::vector<int32_t> ContextSplit::positions(int64_t tokens) const {
  const int64_t c = chunk(tokens);
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(2 * c));
  for (const int64_t part : {int64_t{rank}, 2 * int64_t{size} - 1 - rank})
    for (int64_t i = 0; i < c; ++i) out.push_back(static_cast<int32_t>(part * c + i));
  return out;
}

std::vector<int32_t> ContextSplit::gathered_rows(int64_t tokens, int size) {
  std::vector<int32_t> rows(static_cast<size_t>(tokens));
  int32_t next = 0;
  for (int r = 0; r < size; ++r)
    for (const int32_t p : ContextSplit{size, r}.positions(tokens)) rows[static_cast<size_t>(p)] = next++;
  return rows;
}

int64_t ContextSplit::padding(int64_t tokens) const {
  const int64_t multiple = 2 * int64_t{size};
  return (multiple - tokens % multiple) % multiple;
}

HostMicroBatch ContextSplit::share(const HostMicroBatch& row) const {
  if (size == 1) return row;
  const int64_t n = row.size(), tokens = n + padding(n);
  HostMicroBatch out;
  out.row_tokens = tokens;
  out.row_position = positions(tokens);
  out.kv_rows = gathered_rows(tokens, size);
  for (const int32_t p : out.row_position) {
    const bool pad = p >= n;
    out.tokens.push_back(pad ? 0 : row.tokens[static_cast<size_t>(p)]);
    const int32_t target = pad ? -1 : row.targets[static_cast<size_t>(p)];
    out.targets.push_back(target);
    out.target_count += target >= 0 ? 1 : 0;
    out.positions.push_back(pad ? 0 : row.positions[static_cast<size_t>(p)]);
    out.doc_start.push_back(pad ? p : row.doc_start[static_cast<size_t>(p)]);
  }
  return out;
}

}  // namespace glm
