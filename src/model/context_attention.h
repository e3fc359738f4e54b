// Attention over a row that a context-parallel group shares (data/context_split.h): each rank
// holds some of the row's tokens. Forward gathers every rank's k | v over the group (all-gather)
// and runs the rank's queries against the whole row's keys and values; backward sums the gradients
// of the gathered k | v back to the ranks that own those tokens (reduce-scatter) and writes them
// into the k and v blocks of the rank's dqkv. The rank's shares are equal, so the gathered row is
// the group's shares one after another (MicroBatch::kv_rows maps row positions into it).
#pragma once

#include <memory>

#include "model/backend.h"
#include "model/glm4_model.h"
#include "mpi/communicator.h"

namespace glm {

// Tokens of one rank's share of a row of row_tokens over a group of group_size: 2 of the 2C chunks
// of the row padded to a multiple of 2C (data/context_split.h); the row itself for a group of 1.
int64_t context_share_tokens(int64_t row_tokens, int group_size);

class ContextAttention {
 public:
  // max_tokens: the most tokens of one rank's share. The group outlives this object.
  static Result<std::unique_ptr<ContextAttention>> create(Backend& backend, Communicator& group, AttentionShape shape,
                                                          int64_t max_tokens);

  int group_size() const { return group_.size(); }
  // Bytes of the gather and gradient buffers.
  int64_t buffer_bytes() const;
  // out [n, q_width] and lse [n, heads] for the share's n queries; qkv is the share's fused rows
  // after RoPE. Collective over the group.
  Status forward(Tensor out, Tensor lse, Tensor qkv, const MicroBatch& b);
  // dqkv [n, qkv_width]: dq, and the k and v gradients of the share's own tokens summed over every
  // query of the row. Collective over the group; gathers the layer's k | v again (the buffer holds
  // whichever layer ran last), then sums the gathered rows' gradients to their owners.
  Status backward(Tensor dqkv, Tensor dout, Tensor out, Tensor lse, Tensor qkv, const MicroBatch& b);

 private:
  ContextAttention(Backend& backend, Communicator& group, AttentionShape shape)
      : backend_(backend), group_(group), shape_(shape) {}
  int64_t kv_width() const { return 2 * shape_.kv_heads * shape_.head_dim; }
  Status check(const MicroBatch& b) const;
  // kv_ = every rank's k | v, in group order.
  Status gather(Tensor qkv, int64_t n);

  Backend& backend_;
  Communicator& group_;
  AttentionShape shape_;
  int64_t max_tokens_ = 0;
  Buffer local_;  // [max_tokens, kv_width]: this share's k | v, then its summed gradient
  Buffer kv_;     // [size x max_tokens, kv_width]: the gathered row
  Buffer dkv_;    // [size x max_tokens, kv_width]: gradients of the gathered row from this share's queries
};

}  // namespace glm
