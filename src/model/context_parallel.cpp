// Zigzag split of a row over a context-parallel group (see context_parallel.h).
#include "model/context_parallel.h"

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

std::vector<int64_t> ContextSplit::gathered_rows(int64_t tokens, int size) {
  std::vector<int64_t> rows(static_cast<size_t>(tokens));
  int64_t next = 0;
  for (int r = 0; r < size; ++r)
    for (const int32_t p : ContextSplit{size, r}.positions(tokens)) rows[static_cast<size_t>(p)] = next++;
  return rows;
}

}  // namespace glm
