// Generation of many replies at once with a KV cache (model/kv_cache.h): continuous batching. Up
// to max_batch sequences are active; every forward feeds each active sequence's next token, plus
// prompt tokens of sequences being admitted (chunked prefill, within the engine's max_tokens), and
// a sequence that ends frees its cache rows and its place for the next prompt at once. A sequence
// is admitted only when the cache can hold its prompt and its longest reply, so no sequence ever
// waits for room. Each reply depends only on its prompt and its sequence number (sampler.h keys
// the draws by sequence and step): the same tokens as generate() (train/generate.h), in any
// batching. With num_beams > 1 a sequence runs model/beam_search.h over one lane of the batch per
// running beam: the prompt is fed once, and beams share the cache rows of their common prefix
// (counted references), so a step reorders no cache; a sequence reserves its prompt and num_beams
// longest replies.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "train/engine.h"
#include "train/generate.h"

namespace glm {

struct GenerationRequest {
  std::span<const int32_t> prompt;
  uint64_t sequence = 0;  // keys its draws (sampler.h)
};

class CachedGenerator {
 public:
  // cache_tokens: the KV cache's rows; max_batch: sequences generated together (>= 1).
  static Result<std::unique_ptr<CachedGenerator>> create(TrainingEngine& engine, const GenerationOptions& options,
                                                         int64_t cache_tokens, int64_t max_batch);
  ~CachedGenerator();

  // Generates every request's reply; done(i, reply) as request i finishes (in any order), and
  // on_token(i, token), when given, as each token of request i's reply is chosen (streaming). A
  // request that cannot fit the cache or options.max_tokens is a user error before anything is
  // generated.
  Status run(std::span<const GenerationRequest> requests, const std::function<void(size_t, Generation)>& done,
             const std::function<void(size_t, int32_t)>& on_token = {});

  int64_t cache_tokens() const;
  int64_t cache_bytes() const;  // backend memory of the KV cache
  int64_t forwards() const { return forwards_; }  // engine forwards so far

 private:
  struct Sequence;
  CachedGenerator(TrainingEngine& engine, GenerationOptions options);
  // Adds the next forward's tokens of every active sequence to batch_; false when none has any.
  Result<bool> build_batch();
  int32_t take_row();                              // an unused cache row, referenced once
  void share(const std::vector<int32_t>& rows);    // one more reference to each row
  void release(const std::vector<int32_t>& rows);  // one fewer; rows no longer referenced are unused
  // What a forward brings back: whole logit rows, the device's greedy choices, or (beam search
  // without processing of the log-probabilities) each row's statistics and best logits.
  enum class Outputs { logits, argmax, top };
  // Samples each sequence that produced logits, takes the device's greedy choice, or steps its beam
  // search, from the last forward's outputs; returns the indices of those that finished.
  std::vector<size_t> advance(Outputs outputs, const std::function<void(size_t, int32_t)>& on_token);

  TrainingEngine& engine_;
  GenerationOptions options_;
  std::unique_ptr<KvCache> cache_;
  int64_t max_batch_ = 1;
  std::vector<int32_t> free_rows_;  // a stack of unused cache rows
  std::vector<int32_t> row_refs_;   // lanes holding each cache row
  int64_t reserved_ = 0;            // rows promised to active sequences (their prompts and longest replies)
  std::vector<Sequence> active_;
  HostDecodeBatch batch_;
  std::vector<std::pair<size_t, size_t>> logit_owner_;  // the active sequence and lane of each logit row of batch_
  std::vector<float> scratch_, logits_, top_stats_, top_;
  std::vector<int32_t> argmax_, top_ids_;
  int64_t top_k_ = 0;  // logits a row brings back with Outputs::top
  int64_t forwards_ = 0;
};

}  // namespace glm
