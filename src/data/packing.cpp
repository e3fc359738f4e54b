// First-fit-decreasing packing with a max segment tree over the rows' free room.
#include "data/packing.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

namespace glm {

std::span<const int64_t> PackingPlan::row(int64_t r) const {
  const auto begin = static_cast<size_t>(row_begin[static_cast<size_t>(r)]);
  const auto end = static_cast<size_t>(row_begin[static_cast<size_t>(r) + 1]);
  return std::span<const int64_t>(sample_order).subspan(begin, end - begin);
}

double PackingPlan::fill_ratio() const {
  return rows() > 0 ? static_cast<double>(tokens) / (static_cast<double>(rows()) * static_cast<double>(capacity)) : 0.0;
}

std::string PackingPlan::summary() const {
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.4f", fill_ratio());
  return concat("packing: ", samples(), " samples into ", rows(), " rows of up to ", capacity, " tokens, fill ratio ",
                ratio, " (", tokens, " tokens / ", rows(), " x ", capacity, ")");
}

Result<PackingPlan> pack_lengths(std::span<const int64_t> lengths, int64_t capacity) {
  if (capacity < 1) return GLM_INTERNAL_ERROR("packing capacity ", capacity, " must be positive");
  const size_t n = lengths.size();
  PackingPlan plan;
  plan.capacity = capacity;
  for (size_t i = 0; i < n; ++i) {
    if (lengths[i] < 1 || lengths[i] > capacity)
      return GLM_INTERNAL_ERROR("sample ", i, " has ", lengths[i], " tokens; packing needs 1..", capacity,
                                " (length control runs first)");
    plan.tokens += lengths[i];
  }
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return lengths[static_cast<size_t>(a)] > lengths[static_cast<size_t>(b)];
  });
  // Any two first-fit rows together hold more than `capacity` tokens (the later one's first
  // sample did not fit the earlier), so there are fewer than 2 tokens / capacity + 1 rows.
  const int64_t bound = std::min<int64_t>(static_cast<int64_t>(n), 2 * plan.tokens / capacity + 2);
  size_t leaves = 1;
  while (static_cast<int64_t>(leaves) < std::max<int64_t>(bound, 1)) leaves *= 2;
  std::vector<int64_t> room(2 * leaves, capacity);  // room[node] = most free room of a row below node
  std::vector<std::vector<int64_t>> rows;
  for (int64_t sample : order) {
    const int64_t length = lengths[static_cast<size_t>(sample)];
    if (room[1] < length) return GLM_INTERNAL_ERROR("packing ran out of its ", leaves, " rows");
    size_t node = 1;  // the leftmost row with room >= length (a fresh row always has room)
    while (node < leaves) node = room[2 * node] >= length ? 2 * node : 2 * node + 1;
    const size_t r = node - leaves;
    if (r >= rows.size()) rows.resize(r + 1);
    rows[r].push_back(sample);
    room[node] -= length;
    for (node /= 2; node >= 1; node /= 2) room[node] = std::max(room[2 * node], room[2 * node + 1]);
  }
  plan.row_begin.reserve(rows.size() + 1);
  plan.sample_order.reserve(n);
  plan.row_begin.push_back(0);
  for (const auto& row : rows) {
    plan.sample_order.insert(plan.sample_order.end(), row.begin(), row.end());
    plan.row_begin.push_back(static_cast<int64_t>(plan.sample_order.size()));
  }
  return plan;
}

Result<PackingPlan> pack_dataset(const Dataset& dataset, int64_t capacity) {
  std::vector<int64_t> lengths;
  lengths.reserve(static_cast<size_t>(dataset.size()));
  for (int64_t i = 0; i < dataset.size(); ++i) lengths.push_back(dataset.sample(i).size());
  return pack_lengths(lengths, capacity);
}

}  // namespace glm
