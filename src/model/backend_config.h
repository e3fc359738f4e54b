// Settings of a device backend, fixed when it is created (the CLI's Kernels group fills them).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "base/enum_names.h"

namespace glm {

enum class GemmAutotune { off, large, all };      // --gemm_autotune
enum class AttentionKernel { auto_select, mma };  // --attention_kernel: auto or mma (mma.sync everywhere)

template <>
struct EnumNames<GemmAutotune> {
  static constexpr std::pair<GemmAutotune, std::string_view> table[] = {
      {GemmAutotune::off, "off"}, {GemmAutotune::large, "large"}, {GemmAutotune::all, "all"}};
};
template <>
struct EnumNames<AttentionKernel> {
  static constexpr std::pair<AttentionKernel, std::string_view> table[] = {{AttentionKernel::auto_select, "auto"},
                                                                           {AttentionKernel::mma, "mma"}};
};

struct BackendConfig {
  // SMs left to the optimizer's side stream while it updates beside backward (GEMMs are planned for
  // the others; at most a quarter of the device); 0 plans GEMMs for every SM.
  int optimizer_side_sms = 12;
  GemmAutotune gemm_autotune = GemmAutotune::off;
  AttentionKernel attention_kernel = AttentionKernel::auto_select;
  // KiB of shared memory per block the kernels may plan for, at most the device's opt-in limit (0: the
  // device's). Below Hopper's it also turns the wgmma kernels off: a larger GPU runs what a smaller
  // one would (tests force the A100's 163 and the RTX 4090's 99 on an H200).
  int shared_memory_limit_kib = 0;
  // The wgmma attention backward's block order (heads per chunk) and dQ atomics (16-byte or paired):
  // kernel variants that tests and benchmarks compare; the defaults are the tuned ones.
  int attention_backward_head_chunk = 8;
  bool attention_dq_vector_atomics = true;
  // Device memory for one chunk of the fused lm_head + cross-entropy's bf16 logits.
  int64_t lm_head_scratch_bytes = int64_t{2} << 30;
  bool cuda_graphs = true;    // --cuda_graphs: decode steps replayed as CUDA graphs (Backend::run_graph)
  bool profile = false;       // --profile: per-op device time and idle gaps on stderr at exit
  std::string profile_trace;  // --profile_trace FILE: a Chrome trace of the profiled ops
};

}  // namespace glm
