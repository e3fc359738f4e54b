// Cross-entropy over a chunk of bf16 logits rows (the lm_head GEMM writes them chunk by chunk, so
// the full [n, vocab] logits never exist at once), with fp32 softmax statistics.
#pragma once

#include "kernels/cuda/common.cuh"

namespace glm::cuda {

// losses[r] = logsumexp(logits[r]) - logits[r, targets[r]] (0 where targets[r] < 0). When dlogits
// is non-null: dlogits[r] = (softmax - onehot) * grad_scale in bf16 (0 on ignored rows). When
// correct is non-null: correct[r] = 1 where the first index of the row's maximum is the target
// (torch.argmax; found in the pass that sums the exponentials, so it costs no extra read), else 0.
// Two reads of each row (online softmax statistics, then the gradient) and one bf16 write;
// dlogits may be logits itself (the gradient then replaces the logits in place).
cudaError_t cross_entropy(float* losses, int32_t* correct, bf16* dlogits, const bf16* logits, const int32_t* targets,
                          int64_t rows, int64_t vocab, float grad_scale, cudaStream_t stream);

// Greedy decoding: ids[r] = the first column holding the maximum of values' row r ([rows, cols] fp32).
cudaError_t argmax_rows(int32_t* ids, const float* values, int64_t rows, int64_t cols, cudaStream_t stream);

// Beam search: stats[2r] = the maximum of values' row r, stats[2r + 1] = log of the sum of
// exp(x - maximum) over the row; ids[r * k + j], top[r * k + j] for j < k: the row's k largest
// values, descending, the lower column first among equal ones (-1 and -inf past its columns).
cudaError_t top_k_rows(int32_t* ids, float* top, float* stats, const float* values, int64_t rows, int64_t cols,
                       int64_t k, cudaStream_t stream);

}  // namespace glm::cuda
