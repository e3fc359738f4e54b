// Deterministic parameter initialisation: the same values on every backend, layout and shard.
#pragma once

#include <cstdint>

#include "base/status.h"
#include "base/tensor.h"
#include "model/backend.h"
#include "model/config.h"
#include "model/param_layout.h"

namespace glm {

// Deterministic initialisation independent of layout padding and world size: weights and
// embeddings N(0, initializer_range) from a stream seeded by (seed, tensor name); norms 1; biases 0.
Status initialize_parameters(const ModelConfig& config, uint64_t seed, Backend& backend, Tensor params);
// The same values for the global layout range [begin, begin + dst.numel) only (a ZeRO shard).
Status initialize_parameter_range(const ParamLayout& layout, const ModelConfig& config, uint64_t seed, Backend& backend,
                                  Tensor dst, int64_t begin);

}  // namespace glm
