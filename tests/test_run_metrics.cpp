// What the step line reports beside the loss: model FLOPs (MFU's numerator, against the formula
// the benchmarks use for GLM-4-9B) and the GPU peaks (MFU's denominator).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "io/run_plots.h"
#include "model/gpu_peak.h"
#include "test_util.h"
#include "train/model_flops.h"

namespace glm::test {
namespace {

// benchmarks/calls/gpu_session.sh's count: 203,948,032 matmul parameters a layer, 620,756,992 in
// the head, and 6 x L x H x S attention FLOPs a token for rows of S tokens.
TEST(ModelFlops, FollowsTheBenchmarksCountForGlm4_9b) {
  const ModelConfig m = glm4_9b_chat();
  EXPECT_EQ(matmul_parameters(m), 40.0 * 203948032 + 620756992);
  HostMicroBatch row;
  const int64_t s = 4096;
  for (int64_t t = 0; t < s; ++t) {
    row.tokens.push_back(1);
    row.doc_start.push_back(0);
  }
  const std::vector<HostMicroBatch> rows{row};
  const double full = step_model_flops(m, rows, false);
  // Causal pairs are S(S+1)/2: 6 L H S^2 plus the diagonal's half.
  const double attention = 12.0 * 40 * 4096 * (static_cast<double>(s) * (s + 1) / 2);
  EXPECT_DOUBLE_EQ(full, 6.0 * matmul_parameters(m) * s + attention);
  EXPECT_NEAR(attention / (6.0 * 40 * 4096 * s * s), 1.0, 1e-3);
  EXPECT_DOUBLE_EQ(step_model_flops(m, rows, true), 4.0 * matmul_parameters(m) * s + attention);
}

// Packed documents attend within themselves only; a context-parallel share counts each of its
// queries' keys from the document start, by row position.
TEST(ModelFlops, CountsPairsWithinDocumentsAndShares) {
  ModelConfig m = tiny_glm4();
  HostMicroBatch packed;
  for (int64_t doc : {3, 5})
    for (int64_t i = 0; i < doc; ++i) {
      packed.tokens.push_back(1);
      packed.doc_start.push_back(doc == 3 ? 0 : 3);
    }
  const double per_pair = 12.0 * m.num_hidden_layers * m.num_attention_heads * m.head_dim;
  const double mm = 6.0 * matmul_parameters(m);
  EXPECT_DOUBLE_EQ(step_model_flops(m, std::vector<HostMicroBatch>{packed}, false), mm * 8 + per_pair * (6 + 15));
  HostMicroBatch share;  // row positions 6 and 7 of a 10-token document starting at 0
  share.tokens = {1, 1};
  share.doc_start = {0, 0};
  share.row_position = {6, 7};
  EXPECT_DOUBLE_EQ(step_model_flops(m, std::vector<HostMicroBatch>{share}, false), mm * 2 + per_pair * (7 + 8));
}

TEST(GpuPeak, DatasheetByNameElseEstimated) {
  EXPECT_DOUBLE_EQ(gpu_bf16_peak("NVIDIA H200", 9, 0, 132, 1980000).flops, 989.4e12);
  EXPECT_DOUBLE_EQ(gpu_bf16_peak("NVIDIA H100 PCIe", 9, 0, 114, 1755000).flops, 756e12);
  EXPECT_DOUBLE_EQ(gpu_bf16_peak("NVIDIA A100-SXM4-80GB", 8, 0, 108, 1410000).flops, 312e12);
  EXPECT_DOUBLE_EQ(gpu_bf16_peak("NVIDIA A10G", 8, 6, 80, 1710000).flops, 70e12);
  EXPECT_DOUBLE_EQ(gpu_bf16_peak("NVIDIA L40S", 8, 9, 142, 2520000).flops, 362.1e12);
  EXPECT_DOUBLE_EQ(gpu_bf16_peak("NVIDIA L4", 8, 9, 58, 2040000).flops, 121e12);
  EXPECT_DOUBLE_EQ(gpu_bf16_peak("NVIDIA GeForce RTX 4090", 8, 9, 128, 2520000).flops, 165.2e12);
  EXPECT_NE(gpu_bf16_peak("NVIDIA H200", 9, 0, 132, 1980000).source.find("H200 datasheet"), std::string::npos);
  // An unlisted Hopper: SMs x clock x 4096.
  const PeakFlops guess = gpu_bf16_peak("NVIDIA Future", 9, 0, 100, 2000000);
  EXPECT_DOUBLE_EQ(guess.flops, 100 * 2e9 * 4096);
  EXPECT_NE(guess.source.find("estimated"), std::string::npos);
  EXPECT_EQ(gpu_bf16_peak("NVIDIA Future", 7, 0, 80, 1500000).flops, 0);
}


// The loss chart's smoothing is TensorBoard's: a debiased exponential moving average.
TEST(PlotSmoothing, IsTensorBoardsDebiasedMovingAverage) {
  const std::vector<double> x = {4.0, 2.0, 3.0, 7.0, -1.0};
  const double w = 0.6;
  const std::vector<double> s = smooth_series(x, w);
  ASSERT_EQ(s.size(), x.size());
  double last = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    last = w * last + (1 - w) * x[i];
    EXPECT_NEAR(s[i], last / (1 - std::pow(w, static_cast<double>(i + 1))), 1e-12) << i;
  }
  EXPECT_DOUBLE_EQ(s[0], x[0]);  // debiased: the first point is itself
  for (double v : smooth_series(std::vector<double>(7, 2.5), 0.9)) EXPECT_NEAR(v, 2.5, 1e-12);
  EXPECT_EQ(smooth_series(x, 0.0), x);
}

}  // namespace
}  // namespace glm::test
