// Continuous batching over a KV cache (see cached_generator.h).
#include "train/cached_generator.h"

#include <algorithm>
#include <chrono>

namespace glm {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

struct CachedGenerator::Sequence {
  size_t request = 0;
  uint64_t key = 0;             // its sequence number, for the sampler
  std::vector<int32_t> tokens;  // the prompt, then the reply so far (the sampler's context)
  size_t prompt = 0;
  size_t fed = 0;              // tokens whose k | v are in the cache
  std::vector<int32_t> rows;   // their cache rows, in order
  int64_t reserved = 0;        // rows promised to it
  Generation reply;
  Clock::time_point start;
};

CachedGenerator::CachedGenerator(TrainingEngine& engine, GenerationOptions options)
    : engine_(engine), options_(std::move(options)) {}

CachedGenerator::~CachedGenerator() = default;

Result<std::unique_ptr<CachedGenerator>> CachedGenerator::create(TrainingEngine& engine,
                                                                 const GenerationOptions& options,
                                                                 int64_t cache_tokens, int64_t max_batch) {
  GLM_RETURN_IF_ERROR(options.sampling.validate());
  if (max_batch < 1 || cache_tokens < 1)
    return GLM_INTERNAL_ERROR("a generator of ", max_batch, " sequences over ", cache_tokens, " cache rows");
  std::unique_ptr<CachedGenerator> g(new CachedGenerator(engine, options));
  GLM_ASSIGN_OR_RETURN(g->cache_, engine.create_kv_cache(cache_tokens, cache_tokens));
  g->max_batch_ = std::min(max_batch, g->cache_->max_new());
  return g;
}

int64_t CachedGenerator::cache_tokens() const { return cache_->capacity(); }
int64_t CachedGenerator::cache_bytes() const { return cache_->bytes(); }

bool CachedGenerator::build_batch() {
  HostDecodeBatch& b = batch_;
  for (auto* v : {&b.tokens, &b.positions, &b.row_position, &b.doc_start, &b.cache_rows, &b.kv_rows, &b.logit_rows})
    v->clear();
  logit_owner_.clear();
  int64_t budget = cache_->max_new();
  int32_t row_start = 0;
  for (size_t i = 0; i < active_.size() && budget > 0; ++i) {
    Sequence& s = active_[i];
    const int64_t take = std::min<int64_t>(static_cast<int64_t>(s.tokens.size() - s.fed), budget);
    if (take == 0) continue;
    b.kv_rows.insert(b.kv_rows.end(), s.rows.begin(), s.rows.end());
    for (int64_t j = 0; j < take; ++j) {
      const int32_t row = free_rows_.back();
      free_rows_.pop_back();
      const auto position = static_cast<int32_t>(s.fed + static_cast<size_t>(j));
      s.rows.push_back(row);
      b.kv_rows.push_back(row);
      b.tokens.push_back(s.tokens[static_cast<size_t>(position)]);
      b.positions.push_back(position);
      b.row_position.push_back(row_start + position);
      b.doc_start.push_back(row_start);
      b.cache_rows.push_back(row);
    }
    row_start += static_cast<int32_t>(s.rows.size());
    s.fed += static_cast<size_t>(take);
    budget -= take;
    if (s.fed == s.tokens.size()) {  // its whole context is in: the next token comes from these logits
      b.logit_rows.push_back(static_cast<int32_t>(b.tokens.size() - 1));
      logit_owner_.push_back(i);
    }
  }
  // A forward of prompt chunks alone still fills the cache; the engine computes one row's logits.
  if (b.logit_rows.empty() && !b.tokens.empty()) b.logit_rows.push_back(static_cast<int32_t>(b.tokens.size() - 1));
  return !b.tokens.empty();
}

std::vector<size_t> CachedGenerator::advance(const std::vector<float>& logits, const std::vector<int32_t>& argmax,
                                             const std::function<void(size_t, int32_t)>& on_token) {
  const size_t vocab = static_cast<size_t>(engine_.config().vocab_size);
  scratch_.resize(vocab);
  std::vector<size_t> finished;
  for (size_t k = 0; k < logit_owner_.size(); ++k) {
    Sequence& s = active_[logit_owner_[k]];
    const size_t step = s.tokens.size() - s.prompt;
    const int32_t next = !argmax.empty() ? argmax[k]
                                         : sample_token(std::span<const float>(logits).subspan(k * vocab, vocab),
                                                        s.tokens, options_.sampling, s.key, step, scratch_);
    if (step == 0) s.reply.first_token_seconds = seconds_since(s.start);
    if (std::find(options_.stop_ids.begin(), options_.stop_ids.end(), next) != options_.stop_ids.end()) {
      s.reply.stopped = true;
      finished.push_back(logit_owner_[k]);
      continue;
    }
    s.tokens.push_back(next);
    s.reply.tokens.push_back(next);
    if (on_token) on_token(s.request, next);
    const bool longest = static_cast<int64_t>(s.reply.tokens.size()) >= options_.max_new_tokens;
    if (longest || (options_.max_tokens > 0 && static_cast<int64_t>(s.tokens.size()) >= options_.max_tokens))
      finished.push_back(logit_owner_[k]);
  }
  return finished;
}

Status CachedGenerator::run(std::span<const GenerationRequest> requests,
                            const std::function<void(size_t, Generation)>& done,
                            const std::function<void(size_t, int32_t)>& on_token) {
  const int64_t capacity = cache_->capacity();
  // The rows a request may take: its prompt and its longest reply, within max_tokens.
  auto needed = [&](const GenerationRequest& r) {
    const int64_t all = static_cast<int64_t>(r.prompt.size()) + options_.max_new_tokens;
    return options_.max_tokens > 0 ? std::min(all, options_.max_tokens) : all;
  };
  for (size_t i = 0; i < requests.size(); ++i) {
    const int64_t length = static_cast<int64_t>(requests[i].prompt.size());
    if (length == 0) return GLM_USER_ERROR("an empty prompt: generation continues a sequence of at least one token");
    if (options_.max_tokens > 0 && length >= options_.max_tokens)
      return GLM_USER_ERROR("a prompt of ", length, " tokens leaves no room for a reply within ", options_.max_tokens,
                            " tokens (--max_length)");
    if (needed(requests[i]) > capacity)
      return GLM_USER_ERROR("a prompt of ", length, " tokens and its reply need ", needed(requests[i]),
                            " KV cache rows; the cache has ", capacity);
  }
  free_rows_.resize(static_cast<size_t>(capacity));
  for (int64_t r = 0; r < capacity; ++r) free_rows_[static_cast<size_t>(r)] = static_cast<int32_t>(capacity - 1 - r);
  reserved_ = 0;
  active_.clear();
  std::vector<float> logits;
  std::vector<int32_t> argmax;
  // Greedy without a repetition penalty needs no logits on the host: the device picks the tokens.
  const bool device_greedy = options_.sampling.temperature == 0 && options_.sampling.repetition_penalty == 1.0;
  for (size_t next = 0; next < requests.size() || !active_.empty();) {
    while (static_cast<int64_t>(active_.size()) < max_batch_ && next < requests.size() &&
           reserved_ + needed(requests[next]) <= capacity) {
      Sequence s;
      s.request = next;
      s.key = requests[next].sequence;
      s.tokens.assign(requests[next].prompt.begin(), requests[next].prompt.end());
      s.prompt = s.tokens.size();
      s.reserved = needed(requests[next]);
      s.start = Clock::now();
      reserved_ += s.reserved;
      active_.push_back(std::move(s));
      ++next;
    }
    if (!build_batch()) return GLM_INTERNAL_ERROR("generation stalled: no sequence has a token to feed");
    if (device_greedy) {
      GLM_RETURN_IF_ERROR(engine_.cached_argmax(batch_, *cache_, argmax));
    } else {
      GLM_RETURN_IF_ERROR(engine_.cached_logits(batch_, *cache_, logits));
    }
    ++forwards_;
    const std::vector<size_t> finished = advance(logits, argmax, on_token);
    for (auto it = finished.rbegin(); it != finished.rend(); ++it) {  // descending: earlier indices stay valid
      Sequence& s = active_[*it];
      free_rows_.insert(free_rows_.end(), s.rows.rbegin(), s.rows.rend());
      reserved_ -= s.reserved;
      s.reply.seconds = seconds_since(s.start);
      done(s.request, std::move(s.reply));
      active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(*it));
    }
  }
  return Status::ok();
}

}  // namespace glm
