// Shared test helpers: deterministic random data and finite-difference gradient checks.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "data/sharded_loader.h"
#include "model/config.h"
#include "model/glm4_model.h"
#include "model/kv_cache.h"
#include "train/engine.h"

namespace glm::test {

// A micro-batch held in host vectors (CPU backend tests): view() points the model's MicroBatch at them.
// With its index (index_micro_batch, as the engine uploads it) unless indexed is false: the lm_head
// then runs over every row. Each view() rebuilds the index: use one view at a time.
// Sets (or, with value nullptr, unsets) an environment variable for a scope and restores what it
// was: a knob a test sets does not leak into later tests, nor does it lose the caller's setting.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    had_ = std::getenv(name) != nullptr;
    if (value != nullptr)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      ::setenv(name_.c_str(), old_.c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};

struct HostBatch {
  std::vector<int32_t> tokens, targets, positions, doc_start;
  MicroBatchIndex index;
  MicroBatch view(bool indexed = true) {
    auto t = [](std::vector<int32_t>& v) { return Tensor{v.data(), static_cast<int64_t>(v.size()), DType::i32}; };
    MicroBatch b;
    b.tokens = t(tokens);
    b.targets = t(targets);
    b.positions = t(positions);
    b.doc_start = t(doc_start);
    b.n = static_cast<int64_t>(tokens.size());
    if (!indexed) return b;
    index = index_micro_batch(tokens, targets);
    b.label_rows = t(index.label_rows);
    b.label_targets = t(index.label_targets);
    b.token_order = t(index.token_order);
    b.token_runs = t(index.token_runs);
    b.n_labelled = static_cast<int64_t>(index.label_rows.size());
    return b;
  }
};

// Two packed documents of 5 and 6 tokens; some positions carry no target.
inline HostBatch two_document_batch() {
  HostBatch b;
  b.tokens = {3, 17, 5, 0, 9, 11, 2, 18, 7, 7, 14};
  b.targets = {17, -1, 0, 9, -1, 2, 18, -1, 7, 14, -1};
  b.positions = {0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5};
  b.doc_start = {0, 0, 0, 0, 0, 5, 5, 5, 5, 5, 5};
  return b;
}

// The tiny GLM-4 the CPU and MPI tests train: 2 layers of hidden 32 (4 heads on 2 KV groups of 8),
// FFN 64, the byte-level vocabulary of 272, 512 positions. Callers change what their test needs and
// call finalize_and_validate().
inline ModelConfig tiny_glm4() {
  ModelConfig m;
  m.vocab_size = 272;
  m.hidden_size = 32;
  m.intermediate_size = 64;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = 8;
  m.max_position_embeddings = 512;
  m.rope_theta = 5e6;
  return m;
}

// GLM-4-9B-Chat's shapes (GLM4_SPEC.md section 3), validated.
inline ModelConfig glm4_9b_chat() {
  ModelConfig m;
  m.vocab_size = 151552;
  m.hidden_size = 4096;
  m.intermediate_size = 13696;
  m.num_hidden_layers = 40;
  m.num_attention_heads = 32;
  m.num_key_value_heads = 2;
  m.head_dim = 128;
  m.max_position_embeddings = 131072;
  m.rope_theta = 5e6;
  EXPECT_TRUE(m.finalize_and_validate().is_ok());
  return m;
}

// Values in [-scale, scale): never zeros, never a pattern the kernels could special-case.
inline std::vector<double> random_vector(size_t n, uint64_t seed, double scale = 1.0) {
  SplitMix64 rng(seed);
  std::vector<double> v(n);
  for (auto& x : v) x = scale * (2.0 * rng.uniform() - 1.0);
  return v;
}

// Central differences of loss() with respect to every element of x, compared with analytic:
// |fd - analytic| <= tolerance * max(|fd|, |analytic|) + atol. atol covers the roundoff of the
// difference quotient itself (~1e-16 x |loss| / step), so near-zero gradients do not flake.
inline void expect_gradient_matches(const std::function<double()>& loss, std::vector<double>& x,
                                    const std::vector<double>& analytic, double tolerance, const char* what,
                                    double step = 1e-5, double atol = 1e-9) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + step;
    const double up = loss();
    x[i] = saved - step;
    const double down = loss();
    x[i] = saved;
    const double fd = (up - down) / (2 * step);
    const double bound = tolerance * std::max(std::fabs(fd), std::fabs(analytic[i])) + atol;
    if (!(std::fabs(fd - analytic[i]) <= bound) && ++failures <= 5)
      ADD_FAILURE() << what << "[" << i << "]: finite difference " << fd << " vs analytic " << analytic[i];
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << x.size() << " gradient entries differ";
}

// Norm-wise relative error ||ours - ref|| / ||ref|| (fp64 sums); infinite when ours holds a NaN or inf.
inline double relative_error(std::span<const float> ours, std::span<const float> ref) {
  EXPECT_EQ(ours.size(), ref.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < ours.size() && i < ref.size(); ++i) {
    if (!std::isfinite(ours[i])) return INFINITY;
    diff += (static_cast<double>(ours[i]) - ref[i]) * (static_cast<double>(ours[i]) - ref[i]);
    norm += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// A micro-batch of random documents of the given lengths (token ids below vocab, seeded); the
// first `unlabeled` positions of each document carry no loss, the rest predict themselves.
inline HostMicroBatch random_documents(int64_t vocab, uint64_t seed, std::initializer_list<int> lengths,
                                       int unlabeled) {
  SplitMix64 rng(seed);
  HostMicroBatch b;
  for (int len : lengths) {
    TokenizedSample s;
    for (int t = 0; t < len; ++t) {
      s.tokens.push_back(static_cast<int32_t>(rng.next() % static_cast<uint64_t>(vocab)));
      s.labels.push_back(t < unlabeled ? -1 : s.tokens.back());
    }
    append_document(b, s);
  }
  return b;
}

// `steps` optimizer steps of `window` with the optimizer updating each unit inside backward or
// after it (TrainingEngine::set_optimizer_in_backward), each step checked to have taken that path:
// the losses, the gradient norms and the parameters after the last step (as far as the steps got).
struct StepTrace {
  std::vector<double> losses, norms;
  std::vector<float> params;
};
inline StepTrace trace_steps(TrainingEngine& e, std::span<const HostMicroBatch> window, double lr, int steps,
                             bool in_backward) {
  e.set_optimizer_in_backward(in_backward);
  StepTrace t;
  for (int s = 0; s < steps; ++s) {
    auto r = e.step(window, lr);
    EXPECT_TRUE(r.is_ok()) << r.status().message();
    if (!r.is_ok()) return t;
    EXPECT_EQ(r.value().updated_in_backward, in_backward);
    t.losses.push_back(r.value().loss);
    t.norms.push_back(r.value().grad_norm);
  }
  t.params = e.parameters().take();
  return t;
}


// Removes a test program's scratch directory when the program ends; register it at namespace
// scope (before RUN_ALL_TESTS): ::testing::AddGlobalTestEnvironment(new RemoveDirectoryAtEnd(dir)).
class RemoveDirectoryAtEnd : public ::testing::Environment {
 public:
  explicit RemoveDirectoryAtEnd(std::filesystem::path dir) : dir_(std::move(dir)) {}
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

 private:
  std::filesystem::path dir_;
};

// Forwards of several sequences through one KV cache (model/kv_cache.h), as continuous batching
// makes them: forward k feeds feed[k][s] tokens of sequence s (sequences in order in the row), each
// token to the next of `rows` (a shuffled list makes the cache paged). wanted[k][i]: the (sequence,
// token index) of forward k's logit row i; every fed token's logits are wanted.
struct DecodeScript {
  std::vector<HostDecodeBatch> batches;
  std::vector<std::vector<std::pair<size_t, size_t>>> wanted;
};
inline DecodeScript decode_script(const std::vector<std::vector<int32_t>>& sequences,
                                  const std::vector<std::vector<int>>& feed, std::vector<int32_t> rows) {
  DecodeScript script;
  std::vector<std::vector<int32_t>> cached(sequences.size());
  std::vector<size_t> fed(sequences.size(), 0);
  for (const auto& takes : feed) {
    HostDecodeBatch& b = script.batches.emplace_back();
    auto& wanted = script.wanted.emplace_back();
    int32_t row_start = 0;
    for (size_t s = 0; s < sequences.size(); ++s) {
      if (takes[s] == 0) continue;
      b.kv_rows.insert(b.kv_rows.end(), cached[s].begin(), cached[s].end());
      for (int j = 0; j < takes[s]; ++j) {
        const int32_t row = rows.back();
        rows.pop_back();
        const auto p = static_cast<int32_t>(fed[s]);
        cached[s].push_back(row);
        b.kv_rows.push_back(row);
        b.tokens.push_back(sequences[s][fed[s]]);
        b.positions.push_back(p);
        b.row_position.push_back(row_start + p);
        b.doc_start.push_back(row_start);
        b.cache_rows.push_back(row);
        b.logit_rows.push_back(static_cast<int32_t>(b.tokens.size() - 1));
        wanted.emplace_back(s, fed[s]++);
      }
      row_start += static_cast<int32_t>(cached[s].size());
    }
  }
  return script;
}

// The logits of one sequence's tokens as recomputing the whole prefix gives them, one row per token.
inline std::vector<float> recomputed_logits(TrainingEngine& engine, const std::vector<int32_t>& tokens) {
  HostMicroBatch whole;
  whole.tokens = tokens;
  for (size_t t = 0; t < tokens.size(); ++t) {
    whole.targets.push_back(-1);
    whole.positions.push_back(static_cast<int32_t>(t));
    whole.doc_start.push_back(0);
  }
  std::vector<float> logits;
  EXPECT_TRUE(engine.logits(whole, logits).is_ok());
  return logits;
}

}  // namespace glm::test
