// Initialisation from a counter-based stream keyed by (seed, tensor name).
#include "model/param_init.h"

#include <algorithm>
#include <string>

namespace glm {
namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

}  // namespace

Status initialize_parameter_range(const ParamLayout& layout, const ModelConfig& config, uint64_t seed, Backend& backend,
                                  Tensor dst, int64_t begin) {
  // Generated where the parameters live (counter-based, so every backend and shard draws the same).
  GLM_RETURN_IF_ERROR(backend.zero(dst));
  const int64_t end = begin + dst.numel;
  for (const auto& e : layout.entries()) {
    const int64_t lo = std::max(begin, e.offset), hi = std::min(end, e.offset + e.numel);
    if (lo >= hi || e.kind == ParamKind::bias) continue;
    Tensor t = dst.slice(lo - begin, hi - lo);
    if (e.kind == ParamKind::norm) {
      GLM_RETURN_IF_ERROR(backend.fill(t, 1.0));
    } else {
      GLM_RETURN_IF_ERROR(backend.fill_normal(t, seed ^ fnv1a(e.name), lo - e.offset, config.initializer_range));
    }
    if (e.kind == ParamKind::embedding && config.pad_token_id >= 0) {
      // The padding row starts at zero, as transformers initialises an embedding's padding_idx.
      const int64_t row = e.offset + config.pad_token_id * config.hidden_size;
      const int64_t row_lo = std::max(lo, row), row_hi = std::min(hi, row + config.hidden_size);
      if (row_lo < row_hi) GLM_RETURN_IF_ERROR(backend.zero(dst.slice(row_lo - begin, row_hi - row_lo)));
    }
  }
  return backend.synchronize();
}

Status initialize_parameters(const ModelConfig& config, uint64_t seed, Backend& backend, Tensor params) {
  return initialize_parameter_range(ParamLayout(config), config, seed, backend, params, 0);
}

}  // namespace glm
