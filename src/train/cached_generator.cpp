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
  std::vector<int32_t> tokens;  // the prompt, then (one lane) the reply so far: the sampler's context
  size_t prompt = 0;
  // Each lane's cache rows, in position order: one lane, or one per running beam.
  std::vector<std::vector<int32_t>> lanes = {{}};
  std::unique_ptr<BeamSearch> beams;  // num_beams > 1
  int64_t reserved = 0;               // rows promised to it
  Generation reply;
  Clock::time_point start;

  size_t length(size_t lane) const { return tokens.size() + (beams ? beams->reply(lane).size() : 0); }
  int32_t token(size_t lane, size_t position) const {
    return position < tokens.size() ? tokens[position] : beams->reply(lane)[position - tokens.size()];
  }
};

CachedGenerator::CachedGenerator(TrainingEngine& engine, GenerationOptions options)
    : engine_(engine), options_(std::move(options)) {}

CachedGenerator::~CachedGenerator() = default;

Result<std::unique_ptr<CachedGenerator>> CachedGenerator::create(TrainingEngine& engine,
                                                                 const GenerationOptions& options,
                                                                 int64_t cache_tokens, int64_t max_batch) {
  GLM_RETURN_IF_ERROR(options.sampling.validate());
  GLM_RETURN_IF_ERROR(options.beams.validate());
  if (max_batch < 1 || cache_tokens < 1)
    return GLM_INTERNAL_ERROR("a generator of ", max_batch, " sequences over ", cache_tokens, " cache rows");
  std::unique_ptr<CachedGenerator> g(new CachedGenerator(engine, options));
  GLM_ASSIGN_OR_RETURN(g->cache_, engine.create_kv_cache(cache_tokens, cache_tokens));
  // A beam search's step feeds all its beams in one forward.
  g->max_batch_ = std::min(max_batch, g->cache_->max_new() / options.beams.num_beams);
  if (g->max_batch_ < 1)
    return GLM_USER_ERROR("--num_beams ", options.beams.num_beams, " needs forwards of as many tokens; these take ",
                          g->cache_->max_new());
  return g;
}

int64_t CachedGenerator::cache_tokens() const { return cache_->capacity(); }
int64_t CachedGenerator::cache_bytes() const { return cache_->bytes(); }

int32_t CachedGenerator::take_row() {
  const int32_t row = free_rows_.back();
  free_rows_.pop_back();
  row_refs_[static_cast<size_t>(row)] = 1;
  return row;
}

void CachedGenerator::share(const std::vector<int32_t>& rows) {
  for (const int32_t r : rows) ++row_refs_[static_cast<size_t>(r)];
}

void CachedGenerator::release(const std::vector<int32_t>& rows) {
  for (auto it = rows.rbegin(); it != rows.rend(); ++it)
    if (--row_refs_[static_cast<size_t>(*it)] == 0) free_rows_.push_back(*it);
}

Result<bool> CachedGenerator::build_batch() {
  HostDecodeBatch& b = batch_;
  for (auto* v : {&b.tokens, &b.positions, &b.row_position, &b.doc_start, &b.cache_rows, &b.kv_rows, &b.logit_rows})
    v->clear();
  logit_owner_.clear();
  int64_t budget = cache_->max_new();
  int32_t row_start = 0;
  for (size_t i = 0; i < active_.size() && budget > 0; ++i) {
    Sequence& s = active_[i];
    if (s.lanes.size() > 1) {  // a beam search's step: every beam's token in this forward, or none
      int64_t pending = 0;
      for (size_t l = 0; l < s.lanes.size(); ++l) pending += static_cast<int64_t>(s.length(l) - s.lanes[l].size());
      if (pending > budget) continue;
    }
    for (size_t l = 0; l < s.lanes.size() && budget > 0; ++l) {
      std::vector<int32_t>& rows = s.lanes[l];
      const size_t length = s.length(l);
      const int64_t take = std::min<int64_t>(static_cast<int64_t>(length - rows.size()), budget);
      if (take == 0) continue;
      if (static_cast<int64_t>(free_rows_.size()) < take)
        return GLM_INTERNAL_ERROR("the KV cache ran out of rows: its sequences took more than they reserved");
      b.kv_rows.insert(b.kv_rows.end(), rows.begin(), rows.end());
      for (int64_t j = 0; j < take; ++j) {
        const int32_t row = take_row();
        const auto position = static_cast<int32_t>(rows.size());
        rows.push_back(row);
        b.kv_rows.push_back(row);
        b.tokens.push_back(s.token(l, static_cast<size_t>(position)));
        b.positions.push_back(position);
        b.row_position.push_back(row_start + position);
        b.doc_start.push_back(row_start);
        b.cache_rows.push_back(row);
      }
      row_start += static_cast<int32_t>(rows.size());
      budget -= take;
      if (rows.size() == length) {  // its whole context is in: the next token comes from these logits
        b.logit_rows.push_back(static_cast<int32_t>(b.tokens.size() - 1));
        logit_owner_.emplace_back(i, l);
      }
    }
  }
  // A forward of prompt chunks alone still fills the cache; the engine computes one row's logits.
  if (b.logit_rows.empty() && !b.tokens.empty()) b.logit_rows.push_back(static_cast<int32_t>(b.tokens.size() - 1));
  return !b.tokens.empty();
}

std::vector<size_t> CachedGenerator::advance(Outputs outputs, const std::function<void(size_t, int32_t)>& on_token) {
  const size_t vocab = static_cast<size_t>(engine_.config().vocab_size);
  scratch_.resize(vocab);
  std::vector<size_t> finished;
  for (size_t k = 0; k < logit_owner_.size(); ++k) {
    const size_t i = logit_owner_[k].first;
    Sequence& s = active_[i];
    if (s.beams) {  // its lanes' rows are these and the next ones, in lane order (build_batch)
      const size_t lanes = s.lanes.size();
      if (outputs == Outputs::top) {
        const auto width = static_cast<size_t>(top_k_);
        s.beams->step_top(std::span<const float>(top_stats_).subspan(2 * k, 2 * lanes),
                          std::span<const float>(top_).subspan(k * width, lanes * width),
                          std::span<const int32_t>(top_ids_).subspan(k * width, lanes * width), top_k_,
                          static_cast<int64_t>(vocab));
      } else {
        s.beams->step(std::span<const float>(logits_).subspan(k * vocab, lanes * vocab), static_cast<int64_t>(vocab));
      }
      if (s.beams->steps() == 1) s.reply.first_token_seconds = seconds_since(s.start);
      std::vector<std::vector<int32_t>> next;
      for (const size_t parent : s.beams->parents()) {
        next.push_back(s.lanes[parent]);
        share(next.back());
      }
      for (const std::vector<int32_t>& rows : s.lanes) release(rows);
      s.lanes = std::move(next);
      if (s.beams->done()) finished.push_back(i);
      k += lanes - 1;
      continue;
    }
    const size_t step = s.tokens.size() - s.prompt;
    const int32_t next = outputs == Outputs::argmax
                             ? argmax_[k]
                             : sample_token(std::span<const float>(logits_).subspan(k * vocab, vocab), s.tokens,
                                            options_.sampling, s.key, step, scratch_);
    if (step == 0) s.reply.first_token_seconds = seconds_since(s.start);
    if (std::find(options_.stop_ids.begin(), options_.stop_ids.end(), next) != options_.stop_ids.end()) {
      s.reply.stopped = true;
      finished.push_back(i);
      continue;
    }
    s.tokens.push_back(next);
    s.reply.tokens.push_back(next);
    if (on_token) on_token(s.request, next);
    const bool longest = static_cast<int64_t>(s.reply.tokens.size()) >= options_.max_new_tokens;
    if (longest || (options_.max_tokens > 0 && static_cast<int64_t>(s.tokens.size()) >= options_.max_tokens))
      finished.push_back(i);
  }
  return finished;
}

Status CachedGenerator::run(std::span<const GenerationRequest> requests,
                            const std::function<void(size_t, Generation)>& done,
                            const std::function<void(size_t, int32_t)>& on_token) {
  const int64_t capacity = cache_->capacity();
  // The rows a request may take: its prompt and its longest reply (each beam's), within max_tokens.
  auto needed = [&](const GenerationRequest& r) {
    const auto prompt = static_cast<int64_t>(r.prompt.size());
    return prompt + options_.beams.num_beams * reply_limit(options_, prompt);
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
  row_refs_.assign(static_cast<size_t>(capacity), 0);
  reserved_ = 0;
  active_.clear();
  // Greedy without a repetition penalty needs no logits on the host: the device picks the tokens.
  // Nor does beam search without one, greedy or with top_k: each row's best candidates, or what
  // top-k leaves, come from the device (Backend::top_k_rows takes up to 4096 a row).
  const SamplingOptions& sampling = options_.sampling;
  top_k_ = static_cast<int64_t>(BeamSearch::candidates(options_.beams, options_.stop_ids.size()));
  if (sampling.temperature > 0) top_k_ = std::max(top_k_, sampling.top_k);
  Outputs outputs = Outputs::logits;
  if (sampling.repetition_penalty == 1.0 && options_.beams.num_beams > 1 && top_k_ <= 4096 &&
      (sampling.temperature == 0 || sampling.top_k > 0))
    outputs = Outputs::top;
  else if (sampling.repetition_penalty == 1.0 && sampling.temperature == 0 && options_.beams.num_beams == 1)
    outputs = Outputs::argmax;
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
      if (options_.beams.num_beams > 1)
        s.beams =
            std::make_unique<BeamSearch>(requests[next].prompt, reply_limit(options_, static_cast<int64_t>(s.prompt)),
                                         options_.sampling, options_.beams, options_.stop_ids, s.key);
      reserved_ += s.reserved;
      active_.push_back(std::move(s));
      ++next;
    }
    GLM_ASSIGN_OR_RETURN(const bool fed, build_batch());
    if (!fed) return GLM_INTERNAL_ERROR("generation stalled: no sequence has a token to feed");
    if (outputs == Outputs::argmax) {
      GLM_RETURN_IF_ERROR(engine_.cached_argmax(batch_, *cache_, argmax_));
    } else if (outputs == Outputs::top) {
      GLM_RETURN_IF_ERROR(engine_.cached_top_k(batch_, *cache_, top_k_, top_stats_, top_, top_ids_));
    } else {
      GLM_RETURN_IF_ERROR(engine_.cached_logits(batch_, *cache_, logits_));
    }
    ++forwards_;
    const std::vector<size_t> finished = advance(outputs, on_token);
    for (auto it = finished.rbegin(); it != finished.rend(); ++it) {  // descending: earlier indices stay valid
      Sequence& s = active_[*it];
      for (const std::vector<int32_t>& rows : s.lanes) release(rows);
      reserved_ -= s.reserved;
      if (s.beams) take_best_beam(*s.beams, s.reply);
      s.reply.seconds = seconds_since(s.start);
      done(s.request, std::move(s.reply));
      active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(*it));
    }
  }
  return Status::ok();
}

}  // namespace glm
