// Context parallelism's pieces on the CPU: the zigzag split of a row (every position held once,
// equal causal work per rank) and attention of a rank's queries against the gathered keys and
// values, forward and backward, equal to attention over the whole row for every group size 1-4,
// with documents whose boundaries fall inside and across chunks.
#include <gtest/gtest.h>

#include <numeric>

#include "kernels/cpu/cpu_ops.h"
#include "data/context_split.h"
#include "test_util.h"

namespace glm::test {
namespace {

TEST(ContextSplit, ZigzagHoldsEveryPositionOnceWithEqualCausalWork) {
  for (int size : {1, 2, 3, 4, 8}) {
    for (int64_t chunk : {1, 3, 7}) {
      const int64_t tokens = 2 * size * chunk;
      ASSERT_TRUE(ContextSplit::check_row(tokens, size).is_ok());
      std::vector<int> held(static_cast<size_t>(tokens), 0);
      int64_t first_work = -1;
      for (int r = 0; r < size; ++r) {
        const ContextSplit split{size, r};
        const std::vector<int32_t> p = split.positions(tokens);
        ASSERT_EQ(static_cast<int64_t>(p.size()), 2 * chunk);
        EXPECT_TRUE(std::is_sorted(p.begin(), p.end()));
        EXPECT_EQ(p.front(), r * chunk) << "chunk r first";
        EXPECT_EQ(p.back(), tokens - r * chunk - 1) << "chunk 2C-1-r last";
        int64_t work = 0;  // keys a causal row attends to: position + 1
        for (const int32_t q : p) {
          ++held[static_cast<size_t>(q)];
          work += q + 1;
        }
        if (first_work < 0) first_work = work;
        EXPECT_EQ(work, first_work) << "size " << size << " rank " << r;
      }
      for (int64_t t = 0; t < tokens; ++t) EXPECT_EQ(held[static_cast<size_t>(t)], 1) << "position " << t;
      const std::vector<int32_t> rows = ContextSplit::gathered_rows(tokens, size);
      for (int r = 0; r < size; ++r) {
        const std::vector<int32_t> p = ContextSplit{size, r}.positions(tokens);
        for (size_t i = 0; i < p.size(); ++i)
          EXPECT_EQ(rows[static_cast<size_t>(p[i])], r * 2 * chunk + static_cast<int64_t>(i)) << "rank-major";
      }
    }
  }
}

TEST(ContextSplit, RowsThatCannotSplitAreRefusedNamingTheMultiple) {
  const Status s = ContextSplit::check_row(10, 3);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.exit_code(), 2);
  EXPECT_NE(s.message().find("a row of 10 tokens cannot be split over --context_parallel_size 3: its length must be "
                             "a positive multiple of 6"),
            std::string::npos)
      << s.message();
  EXPECT_FALSE(ContextSplit::check_row(0, 2).is_ok());
  EXPECT_FALSE(ContextSplit::check_row(8, 0).is_ok());
  EXPECT_FALSE(ContextSplit::check_row(int64_t{1} << 32, 1).is_ok());
}

// A row of a million tokens (three documents; its length not a multiple of 2C) split over 8 ranks:
// every token and target lands on exactly one rank, at its row position, with its document's start;
// the padding tokens have no target and are their own documents.
TEST(ContextSplit, ShareOfAMillionTokenRow) {
  const int64_t n = 1'000'003;
  HostMicroBatch row;
  for (int64_t t = 0; t < n; ++t) {
    const int32_t start = t < 400'000 ? 0 : t < 999'000 ? 400'000 : 999'000;
    row.tokens.push_back(static_cast<int32_t>(t % 1000));
    row.targets.push_back(t % 3 == 0 ? -1 : static_cast<int32_t>((t + 1) % 1000));
    row.target_count += t % 3 == 0 ? 0 : 1;
    row.positions.push_back(static_cast<int32_t>(t - start));
    row.doc_start.push_back(start);
  }
  const int size = 8;
  const int64_t padded = n + ContextSplit{size, 0}.padding(n);
  EXPECT_EQ(padded % 16, 0);
  EXPECT_LT(padded - n, 16);
  int64_t targets = 0, tokens = 0;
  for (int r = 0; r < size; ++r) {
    const HostMicroBatch share = ContextSplit{size, r}.share(row);
    ASSERT_EQ(share.row_tokens, padded);
    ASSERT_EQ(share.size(), padded / size);
    ASSERT_EQ(static_cast<int64_t>(share.kv_rows.size()), padded);
    targets += share.target_count;
    tokens += share.size();
    for (int64_t i = 0; i < share.size(); ++i) {
      const int32_t p = share.row_position[static_cast<size_t>(i)];
      if (p < n) {
        ASSERT_EQ(share.tokens[static_cast<size_t>(i)], row.tokens[static_cast<size_t>(p)]);
        ASSERT_EQ(share.targets[static_cast<size_t>(i)], row.targets[static_cast<size_t>(p)]);
        ASSERT_EQ(share.positions[static_cast<size_t>(i)], row.positions[static_cast<size_t>(p)]);
        ASSERT_EQ(share.doc_start[static_cast<size_t>(i)], row.doc_start[static_cast<size_t>(p)]);
      } else {
        ASSERT_EQ(share.targets[static_cast<size_t>(i)], -1) << "padding trains nothing";
        ASSERT_EQ(share.doc_start[static_cast<size_t>(i)], p) << "padding attends to itself only";
      }
    }
  }
  EXPECT_EQ(targets, row.target_count);
  EXPECT_EQ(tokens, padded);
}

// A row of `tokens` with documents starting at the given positions (0 first).
std::vector<int32_t> doc_starts(int64_t tokens, const std::vector<int32_t>& starts) {
  std::vector<int32_t> out(static_cast<size_t>(tokens));
  size_t next = 0;
  int32_t current = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    while (next < starts.size() && starts[next] <= t) current = starts[next++];
    out[static_cast<size_t>(t)] = current;
  }
  return out;
}

// Every rank of a group of `size` computes its queries against the gathered k | v; forward rows,
// and the backward's dq plus the group-summed dk | dv, equal attention over the whole row.
void expect_gathered_equals_whole(int size, int64_t chunk, const std::vector<int32_t>& starts, uint64_t seed) {
  const cpu::AttentionShape shape{4, 2, 5};  // GQA 4 heads on 2 KV groups, odd head_dim
  const int64_t tokens = 2 * size * chunk, width = shape.qkv_width(), d = shape.head_dim;
  const int64_t q_width = shape.heads * d, kv_width = shape.kv_heads * d;
  const std::vector<int32_t> doc = doc_starts(tokens, starts);
  const std::vector<double> qkv = random_vector(tokens * width, seed, 2.0);
  const std::vector<double> dout = random_vector(tokens * q_width, seed + 1);
  std::vector<double> out(static_cast<size_t>(tokens * q_width)), lse(static_cast<size_t>(tokens * shape.heads));
  cpu::attention_forward(out.data(), lse.data(), qkv.data(), doc.data(), tokens, shape);
  std::vector<double> dqkv(qkv.size());
  cpu::attention_backward(dqkv.data(), dout.data(), out.data(), lse.data(), qkv.data(), doc.data(), tokens, shape);

  // The all-gather: k | v of every rank's tokens, rank-major.
  const std::vector<int32_t> rows = ContextSplit::gathered_rows(tokens, size);
  std::vector<double> kv(static_cast<size_t>(tokens * 2 * kv_width));
  for (int64_t t = 0; t < tokens; ++t)
    std::copy_n(qkv.begin() + t * width + q_width, 2 * kv_width, kv.begin() + rows[static_cast<size_t>(t)] * 2 * kv_width);
  std::vector<double> dkv_sum(kv.size(), 0.0);  // the reduce-scatter's sum over the group
  std::vector<std::vector<double>> dq_local(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    const std::vector<int32_t> pos = ContextSplit{size, r}.positions(tokens);
    const int64_t n = static_cast<int64_t>(pos.size());
    std::vector<double> local_qkv(static_cast<size_t>(n * width)), local_dout(static_cast<size_t>(n * q_width));
    std::vector<int32_t> local_doc(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = pos[static_cast<size_t>(i)];
      std::copy_n(qkv.begin() + p * width, width, local_qkv.begin() + i * width);
      std::copy_n(dout.begin() + p * q_width, q_width, local_dout.begin() + i * q_width);
      local_doc[static_cast<size_t>(i)] = doc[static_cast<size_t>(p)];
    }
    std::vector<double> o(static_cast<size_t>(n * q_width)), l(static_cast<size_t>(n * shape.heads));
    cpu::attention_forward_gathered(o.data(), l.data(), local_qkv.data(), kv.data(), rows.data(), pos.data(),
                                    local_doc.data(), n, shape);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = pos[static_cast<size_t>(i)];
      for (int64_t j = 0; j < q_width; ++j)
        ASSERT_NEAR(o[i * q_width + j], out[p * q_width + j], 1e-13) << "size " << size << " position " << p;
      for (int64_t h = 0; h < shape.heads; ++h)
        ASSERT_NEAR(l[i * shape.heads + h], lse[p * shape.heads + h], 1e-13) << "position " << p;
    }
    std::vector<double> local_dqkv(local_qkv.size(), 7.0);  // poisoned: overwritten
    cpu::attention_backward_gathered(local_dqkv.data(), dkv_sum.data(), local_dout.data(), o.data(), l.data(),
                                     local_qkv.data(), kv.data(), rows.data(), pos.data(), local_doc.data(), n, shape);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < q_width; ++j)
        EXPECT_NEAR(local_dqkv[i * width + j], dqkv[pos[static_cast<size_t>(i)] * width + j], 1e-12) << "dq";
      for (int64_t j = q_width; j < width; ++j) EXPECT_EQ(local_dqkv[i * width + j], 0.0) << "k and v blocks zeroed";
    }
  }
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < 2 * kv_width; ++j)
      EXPECT_NEAR(dkv_sum[rows[static_cast<size_t>(t)] * 2 * kv_width + j], dqkv[t * width + q_width + j], 1e-12)
          << "size " << size << " dk|dv of position " << t;
}

TEST(ContextParallelAttention, GatheredEqualsWholeRow) {
  // Documents starting inside a chunk and exactly on chunk edges; a single document.
  expect_gathered_equals_whole(1, 5, {0, 4}, 31);
  expect_gathered_equals_whole(2, 3, {0, 3, 5}, 32);
  expect_gathered_equals_whole(3, 3, {0, 7, 8, 13}, 33);
  expect_gathered_equals_whole(4, 2, {0}, 34);
  expect_gathered_equals_whole(4, 3, {0, 2, 11, 12, 19}, 35);
}

}  // namespace
}  // namespace glm::test
