// KV cache of generation (see kv_cache.h).
#include "model/kv_cache.h"

#include <atomic>

#include "model/glm4_model.h"

namespace glm {

Result<std::unique_ptr<KvCache>> KvCache::create(Backend& backend, const ModelConfig& config, int64_t capacity,
                                                 int64_t max_new) {
  if (capacity < 1 || max_new < 1 || max_new > capacity)
    return GLM_INTERNAL_ERROR("KV cache of ", capacity, " rows for forwards of ", max_new, " new tokens");
  AttentionShape shape;
  shape.heads = config.num_attention_heads;
  shape.kv_heads = config.num_key_value_heads;
  shape.head_dim = config.head_dim;
  static std::atomic<uint64_t> next_id{1};
  std::unique_ptr<KvCache> cache(new KvCache(backend, shape));
  cache->id_ = next_id++;
  cache->capacity_ = capacity;
  cache->max_new_ = max_new;
  const AllocationPurpose purpose(backend, "the KV cache of generation");
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    GLM_ASSIGN_OR_RETURN(Buffer b, backend.allocate(capacity * cache->width(), backend.compute_dtype()));
    cache->layers_.push_back(std::move(b));
  }
  if (backend.rope_store_stages()) {
    GLM_ASSIGN_OR_RETURN(cache->staging_, backend.allocate(max_new * cache->width(), backend.compute_dtype()));
  }
  return cache;
}

KvCache::~KvCache() { backend_.clear_graphs(); }

int64_t KvCache::bytes_per_token(const ModelConfig& config, int64_t element_size) {
  return config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim * element_size;
}

int64_t KvCache::bytes() const {
  int64_t total = static_cast<int64_t>(staging_.tensor().bytes());  // 0 where the backend does not stage
  for (const Buffer& b : layers_) total += static_cast<int64_t>(b.tensor().bytes());
  return total;
}

Status KvCache::check(const MicroBatch& b) const {
  if (b.n > max_new_ || b.cache_rows.numel != b.n || b.kv_rows.numel != b.row_tokens)
    return GLM_INTERNAL_ERROR("KV cache forward of ", b.n, " tokens (at most ", max_new_, ") with ", b.cache_rows.numel,
                              " cache rows and ", b.kv_rows.numel, " row entries for ", b.row_tokens);
  return Status::ok();
}

Result<RopeStore> KvCache::rope_store(int64_t layer, const MicroBatch& b, int64_t rotary_dim, double rope_base) {
  GLM_RETURN_IF_ERROR(check(b));
  RopeStore r;
  r.positions = b.positions;
  r.shape = shape_;
  r.rotary_dim = rotary_dim;
  r.base = rope_base;
  r.cache = layers_[static_cast<size_t>(layer)].tensor();
  r.cache_rows = b.cache_rows;
  if (staging_.numel() > 0) r.staging = staging_.tensor().slice(0, b.n * width());
  return r;
}

Status KvCache::attend(int64_t layer, Tensor out, Tensor lse, Tensor qkv, const MicroBatch& b) {
  GLM_RETURN_IF_ERROR(check(b));
  Tensor cache = layers_[static_cast<size_t>(layer)].tensor();
  if (b.decode)
    return backend_.attention_decode(out, lse, qkv, cache, b.kv_rows, b.row_position, b.doc_start, b.n, shape_);
  // Every row position is a new token of this forward (prompts whose whole context comes at once):
  // token i is at row position i and its k | v are row i of qkv, so the prompts attend as a training
  // batch's packed documents do, with the kernels for contiguous rows instead of the gathered ones.
  if (b.row_tokens == b.n) return backend_.attention_forward(out, lse, qkv, b.doc_start, b.n, shape_);
  // The row's cache rows are one run: the kernels read it as a block, without a row index per key.
  if (b.kv_run_start >= 0 && b.kv_run_start + b.row_tokens <= capacity_)
    return backend_.attention_forward_gathered(out, lse, qkv, cache.slice(b.kv_run_start * width(), b.row_tokens * width()),
                                               Tensor{nullptr, 0, DType::i32}, b.row_position, b.doc_start, b.n, shape_);
  return backend_.attention_forward_gathered(out, lse, qkv, cache, b.kv_rows, b.row_position, b.doc_start, b.n, shape_);
}

}  // namespace glm
