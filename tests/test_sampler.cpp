// The sampler against transformers' definitions on rows small enough to reason about: greedy with
// ties, the repetition penalty's two signs, top-k ties, top-p's boundary, temperature, and the
// draw's distribution and reproducibility.
#include "model/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

namespace glm {
namespace {

int32_t pick(const std::vector<float>& logits, const SamplingOptions& o, std::vector<int32_t> context = {},
             uint64_t sequence = 0, uint64_t step = 0) {
  std::vector<float> scratch(logits.size());
  return sample_token(logits, context, o, sequence, step, scratch);
}

// Frequency of each token over `draws` steps of one sequence.
std::map<int32_t, double> frequencies(const std::vector<float>& logits, const SamplingOptions& o, int draws) {
  std::map<int32_t, double> f;
  for (int i = 0; i < draws; ++i) f[pick(logits, o, {}, 3, static_cast<uint64_t>(i))] += 1.0 / draws;
  return f;
}

std::vector<float> logs(const std::vector<double>& p) {
  std::vector<float> out;
  for (double x : p) out.push_back(static_cast<float>(std::log(x)));
  return out;
}

TEST(Sampler, GreedyTakesTheHighestLogitAndTheLowestIdOnTies) {
  SamplingOptions greedy;
  greedy.temperature = 0;
  EXPECT_EQ(pick({0.1f, 2.5f, -1.0f, 2.4f}, greedy), 1);
  EXPECT_EQ(pick({3.0f, 1.0f, 3.0f}, greedy), 0);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogitsOnce) {
  SamplingOptions greedy;
  greedy.temperature = 0;
  greedy.repetition_penalty = 2.0;
  // 4 -> 2 (seen twice, penalised once) loses to 3; a seen negative logit sinks further.
  EXPECT_EQ(pick({4.0f, 3.0f, -1.0f}, greedy, {0, 0}), 1);
  EXPECT_EQ(pick({-1.0f, -1.5f}, greedy, {0}), 1);  // -1 * 2 = -2 < -1.5
  greedy.repetition_penalty = 1.0;
  EXPECT_EQ(pick({4.0f, 3.0f, -1.0f}, greedy, {0, 0}), 0);
}

TEST(Sampler, TopKKeepsTiesWithTheKthAndTopPKeepsTheSmallestSetReachingP) {
  SamplingOptions o;
  o.top_k = 2;
  // The two highest are tied at 3: only ids 1 and 3 are ever drawn, about evenly.
  auto f = frequencies({1.0f, 3.0f, 2.0f, 3.0f}, o, 4000);
  EXPECT_EQ(f.count(0) + f.count(2), 0u);
  EXPECT_NEAR(f[1], 0.5, 0.03);
  o.top_k = 3;  // ties with the 3rd: 3, 3, 2 kept, 1 removed
  f = frequencies({1.0f, 3.0f, 2.0f, 3.0f}, o, 4000);
  EXPECT_EQ(f.count(0), 0u);
  EXPECT_GT(f[2], 0.05);
  o.top_k = 0;
  o.top_p = 0.75;  // from the bottom: 0.05 and 0.05 + 0.15 are <= 0.25 and go; 0.3 and 0.5 stay
  f = frequencies(logs({0.5, 0.3, 0.15, 0.05}), o, 8000);
  EXPECT_EQ(f.count(2) + f.count(3), 0u);
  EXPECT_NEAR(f[0], 0.5 / 0.8, 0.02);
  o.top_p = 0.01;  // the highest always stays
  f = frequencies(logs({0.2, 0.5, 0.3}), o, 200);
  EXPECT_EQ(f.size(), 1u);
  EXPECT_EQ(f.count(1), 1u);
}

TEST(Sampler, DrawsFollowTheSoftmaxAtTheTemperature) {
  SamplingOptions o;
  auto f = frequencies(logs({0.6, 0.3, 0.1}), o, 20000);
  EXPECT_NEAR(f[0], 0.6, 0.015);
  EXPECT_NEAR(f[1], 0.3, 0.015);
  EXPECT_NEAR(f[2], 0.1, 0.01);
  o.temperature = 0.5;  // p^2 renormalised: 0.36, 0.09, 0.01 over 0.46
  f = frequencies(logs({0.6, 0.3, 0.1}), o, 20000);
  EXPECT_NEAR(f[0], 0.36 / 0.46, 0.015);
  EXPECT_NEAR(f[2], 0.01 / 0.46, 0.005);
}

TEST(Sampler, TheSameSeedSequenceAndStepGiveTheSameToken) {
  const std::vector<float> flat(50, 0.0f);
  SamplingOptions a, b;
  b.seed = a.seed + 1;
  std::vector<int32_t> first, again, other_seed, other_sequence;
  for (uint64_t step = 0; step < 64; ++step) {
    first.push_back(pick(flat, a, {}, 7, step));
    again.push_back(pick(flat, a, {}, 7, step));
    other_seed.push_back(pick(flat, b, {}, 7, step));
    other_sequence.push_back(pick(flat, a, {}, 8, step));
  }
  EXPECT_EQ(first, again);
  EXPECT_NE(first, other_seed);
  EXPECT_NE(first, other_sequence);
}

TEST(Sampler, OptionsOutOfRangeAreRefusedByName) {
  auto refused = [](SamplingOptions o, const char* name) {
    const Status s = o.validate();
    EXPECT_FALSE(s.is_ok()) << name;
    EXPECT_NE(s.message().find(name), std::string::npos) << s.message();
  };
  SamplingOptions o;
  EXPECT_TRUE(o.validate().is_ok());
  o.temperature = -0.1;
  refused(o, "--temperature");
  o = {};
  o.temperature = std::nan("");
  refused(o, "--temperature");
  o = {};
  o.top_k = -1;
  refused(o, "--top_k");
  o = {};
  o.top_p = 0;
  refused(o, "--top_p");
  o = {};
  o.top_p = 1.5;
  refused(o, "--top_p");
  o = {};
  o.repetition_penalty = 0;
  refused(o, "--repetition_penalty");
}

}  // namespace
}  // namespace glm
