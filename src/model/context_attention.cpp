// Cross-rank attention of a context-parallel group (see context_attention.h).
#include "model/context_attention.h"

namespace glm {

int64_t context_share_tokens(int64_t row_tokens, int group_size) {
  if (group_size <= 1) return row_tokens;
  const int64_t chunks = 2 * int64_t{group_size};
  return 2 * ((row_tokens + chunks - 1) / chunks);
}

Result<std::unique_ptr<ContextAttention>> ContextAttention::create(Backend& backend, Communicator& group,
                                                                   AttentionShape shape, int64_t max_tokens) {
  if (!backend.has_gathered_attention()) return backend.no_context_parallelism();
  std::unique_ptr<ContextAttention> a(new ContextAttention(backend, group, shape));
  a->max_tokens_ = max_tokens;
  const int64_t width = a->kv_width(), row = int64_t{group.size()} * max_tokens;
  const DType dtype = backend.compute_dtype();
  GLM_ASSIGN_OR_RETURN(a->local_, backend.allocate(max_tokens * width, dtype));
  GLM_ASSIGN_OR_RETURN(a->kv_, backend.allocate(row * width, dtype));
  GLM_ASSIGN_OR_RETURN(a->dkv_, backend.allocate(row * width, dtype));
  return a;
}

int64_t ContextAttention::buffer_bytes() const {
  return static_cast<int64_t>(local_.tensor().bytes() + kv_.tensor().bytes() + dkv_.tensor().bytes());
}

Status ContextAttention::check(const MicroBatch& b) const {
  if (b.n <= 0 || b.n > max_tokens_ || b.row_tokens != b.n * group_.size() || b.kv_rows.numel != b.row_tokens ||
      b.row_position.numel < b.n)
    return GLM_INTERNAL_ERROR("context-parallel share of ", b.n, " tokens of a ", b.row_tokens, "-token row over ",
                              group_.size(), " ranks (", max_tokens_, " at most, ", b.kv_rows.numel, " kv rows)");
  return Status::ok();
}

Status ContextAttention::gather(Tensor qkv, int64_t n) {
  const int64_t width = kv_width(), q_width = shape_.heads * shape_.head_dim;
  Tensor local = local_.tensor().slice(0, n * width);
  GLM_RETURN_IF_ERROR(backend_.copy_columns(local, width, qkv.slice(q_width, qkv.numel - q_width),
                                            shape_.qkv_width(), n, width));
  if (!group_.device_buffers()) GLM_RETURN_IF_ERROR(backend_.synchronize());
  return group_.all_gather(local.data, kv_.tensor().data, static_cast<size_t>(n * width), comm_type_of(local.dtype));
}

Status ContextAttention::forward(Tensor out, Tensor lse, Tensor qkv, const MicroBatch& b) {
  GLM_RETURN_IF_ERROR(check(b));
  GLM_RETURN_IF_ERROR(gather(qkv, b.n));
  return backend_.attention_forward_gathered(out, lse, qkv, kv_.tensor().slice(0, b.row_tokens * kv_width()),
                                             b.kv_rows, b.row_position, b.doc_start, b.n, shape_);
}

Status ContextAttention::backward(Tensor dqkv, Tensor dout, Tensor out, Tensor lse, Tensor qkv, const MicroBatch& b) {
  GLM_RETURN_IF_ERROR(check(b));
  // The layer's own keys and values again: forward's gather holds the last layer's.
  GLM_RETURN_IF_ERROR(gather(qkv, b.n));
  const int64_t width = kv_width(), q_width = shape_.heads * shape_.head_dim;
  Tensor dkv = dkv_.tensor().slice(0, b.row_tokens * width), local = local_.tensor().slice(0, b.n * width);
  GLM_RETURN_IF_ERROR(backend_.zero(dkv));
  GLM_RETURN_IF_ERROR(backend_.attention_backward_gathered(dqkv, dkv, dout, out, lse, qkv,
                                                           kv_.tensor().slice(0, b.row_tokens * width), b.kv_rows,
                                                           b.row_position, b.doc_start, b.n, shape_));
  if (!group_.device_buffers()) GLM_RETURN_IF_ERROR(backend_.synchronize());
  GLM_RETURN_IF_ERROR(group_.reduce_scatter(dkv.data, local.data, static_cast<size_t>(b.n * width),
                                            comm_type_of(dkv.dtype), ReduceOp::sum));
  return backend_.copy_columns(dqkv.slice(q_width, dqkv.numel - q_width), shape_.qkv_width(), local, width, b.n,
                               width);
}

}  // namespace glm
