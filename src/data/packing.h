// Packing (--packing): whole samples bin-packed into rows of at most max_length tokens, so fewer
// tokens of a micro-batch are spent on short samples' empty room; each sample stays its own document.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "base/status.h"

namespace glm {

// Rows of sample indices. With packing a row is what the loader and the batch accounting call one
// sample: global batch, steps per epoch and consumed samples count rows.
struct PackingPlan {
  int64_t capacity = 0;               // tokens a row may hold (max_length)
  std::vector<int64_t> row_begin;     // row r is sample_order[row_begin[r] .. row_begin[r + 1])
  std::vector<int64_t> sample_order;  // every sample index exactly once, row after row
  int64_t tokens = 0;                 // sum of the packed samples' lengths

  int64_t rows() const { return row_begin.empty() ? 0 : static_cast<int64_t>(row_begin.size()) - 1; }
  int64_t samples() const { return static_cast<int64_t>(sample_order.size()); }
  std::span<const int64_t> row(int64_t r) const;
  double fill_ratio() const;  // tokens / (rows x capacity)
  // "packing: S samples into R rows of up to C tokens, fill ratio F (T tokens / R x C)".
  std::string summary() const;
};

// First-fit decreasing: samples by decreasing length (ties by index), each into the first row that
// still has room, opening a row when none has. Deterministic, O(n log n), never splits a sample;
// a length above capacity or below 1 is an internal error (length control runs first).
Result<PackingPlan> pack_lengths(std::span<const int64_t> lengths, int64_t capacity);
Result<PackingPlan> pack_dataset(const Dataset& dataset, int64_t capacity);

}  // namespace glm
