// The sampler against transformers' definitions on rows small enough to reason about: greedy with
// ties, the repetition penalty's two signs, top-k ties, top-p's boundary, temperature, and the
// draw's distribution and reproducibility; beam search on a scripted model and beam sample's draws.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "model/beam_search.h"
#include "model/sampler.h"

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

// Beam search on a scripted model of three tokens (A, B and the stop token E), whose next-token
// probabilities depend on the reply's first token: A first (0.6), then A 0.5, B 0.3, E 0.2; B first
// (0.4), then E 0.9. Greedy decoding follows A, A, A, A; two beams find B E, whose probability
// 0.36 beats every reply through A; its score is log(0.36) over its length (2 tokens, E included)
// to the length penalty. A step's parents name the beams the running ones extend.
std::vector<float> scripted_logits(std::span<const int32_t> reply) {
  if (reply.empty()) return logs({0.6, 0.4, 1e-9});
  return reply[0] == 0 ? logs({0.5, 0.3, 0.2}) : logs({0.05, 0.05, 0.9});
}

BeamHypothesis scripted_search(const BeamOptions& beams, int64_t* steps = nullptr) {
  SamplingOptions greedy;
  greedy.temperature = 0;
  const std::vector<int32_t> prompt = {1}, stop = {2};
  BeamSearch search(prompt, /*max_new=*/4, greedy, beams, stop, 0);
  while (!search.done()) {
    std::vector<float> rows;
    for (size_t b = 0; b < search.running(); ++b) {
      const std::vector<float> row = scripted_logits(search.reply(b));
      rows.insert(rows.end(), row.begin(), row.end());
    }
    search.step(rows, 3);
    if (search.steps() == 2) {  // A A and A B run on, both from the beam that was A
      EXPECT_EQ(search.running(), 2u);
      EXPECT_EQ(search.parents(), (std::vector<size_t>{0, 0}));
      EXPECT_EQ(std::vector<int32_t>(search.reply(0).begin(), search.reply(0).end()), (std::vector<int32_t>{0, 0}));
      EXPECT_EQ(std::vector<int32_t>(search.reply(1).begin(), search.reply(1).end()), (std::vector<int32_t>{0, 1}));
    }
  }
  if (steps != nullptr) *steps = search.steps();
  return search.best();
}

TEST(BeamSearch, TwoBeamsFindTheLikelierReplyGreedyMisses) {
  for (const double penalty : {1.0, 0.0, -1.0}) {
    SCOPED_TRACE(penalty);
    int64_t steps = 0;
    const BeamHypothesis best = scripted_search({.num_beams = 2, .length_penalty = penalty}, &steps);
    EXPECT_EQ(best.tokens, (std::vector<int32_t>{1, 2}));
    EXPECT_TRUE(best.stopped);
    EXPECT_NEAR(best.score, std::log(0.4 * 0.9) / std::pow(2.0, penalty), 1e-5);
    EXPECT_EQ(steps, 4) << "one hypothesis finished: the others run to max_new";
  }
  // early_stopping true waits for two finished hypotheses: B E, then A A A A at max_new.
  int64_t steps = 0;
  const BeamHypothesis full = scripted_search({.num_beams = 2, .early_stopping = EarlyStopping::when_full}, &steps);
  EXPECT_EQ(full.tokens, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(steps, 4);
}

// Beam sample draws its candidates without replacement in proportion to their probability
// (transformers' torch.multinomial over the beams' scores): with one beam, two candidates are drawn
// and the likelier of the two runs on, so token 3 (p 0.1) never does and token 2 (p 0.2) only when
// drawn with token 3: P = 0.2 * 0.1 / 0.8 + 0.1 * 0.2 / 0.9.
TEST(BeamSearch, BeamSampleDrawsCandidatesWithoutReplacement) {
  const std::vector<double> p = {0.4, 0.3, 0.2, 0.1};
  auto pair = [&](size_t i, size_t j) { return p[i] * p[j] / (1 - p[i]) + p[j] * p[i] / (1 - p[j]); };
  const double expected[] = {pair(0, 1) + pair(0, 2) + pair(0, 3), pair(1, 2) + pair(1, 3), pair(2, 3), 0.0};
  SamplingOptions o;
  o.temperature = 1.0;
  const std::vector<int32_t> prompt = {0};
  const std::vector<float> logits = logs(p);
  std::map<int32_t, double> f;
  constexpr int kDraws = 20000;
  for (int s = 0; s < kDraws; ++s) {
    BeamSearch search(prompt, 8, o, {.num_beams = 1}, {}, static_cast<uint64_t>(s));
    search.step(logits, 4);
    ASSERT_EQ(search.running(), 1u);
    f[search.reply(0)[0]] += 1.0 / kDraws;
  }
  for (int32_t t = 0; t < 4; ++t) EXPECT_NEAR(f[t], expected[t], 0.01) << "token " << t;
  BeamSearch again(prompt, 8, o, {.num_beams = 1}, {}, 7), other(prompt, 8, o, {.num_beams = 1}, {}, 7);
  again.step(logits, 4);
  other.step(logits, 4);
  EXPECT_EQ(again.reply(0)[0], other.reply(0)[0]) << "the same seed and sequence draw the same";
}

// transformers' beam warpers keep one token more than the end tokens: top-p of 0.01 would leave
// one token, and beam sample still has two beams to run (one per kept token that does not end).
TEST(BeamSearch, BeamSampleKeepsATokenBeyondTheEndTokens) {
  SamplingOptions o;
  o.temperature = 1.0;
  o.top_p = 0.01;
  const std::vector<int32_t> prompt = {0}, stop = {4};
  BeamSearch search(prompt, 8, o, {.num_beams = 2}, stop, 3);
  search.step(std::vector<float>{6, 2, 1, 0, -1}, 5);
  ASSERT_EQ(search.running(), 2u);
  std::vector<int32_t> first = {search.reply(0)[0], search.reply(1)[0]};
  std::sort(first.begin(), first.end());
  EXPECT_EQ(first, (std::vector<int32_t>{0, 1}));
}

TEST(BeamSearch, OptionsOutOfRangeAreRefusedByName) {
  EXPECT_NE(BeamOptions{.num_beams = 0}.validate().message().find("--num_beams"), std::string::npos);
  EXPECT_NE(BeamOptions{.length_penalty = std::nan("")}.validate().message().find("--length_penalty"),
            std::string::npos);
  const BeamOptions negative{.num_beams = 4, .length_penalty = -2};
  EXPECT_TRUE(negative.validate().is_ok());
}

}  // namespace
}  // namespace glm
