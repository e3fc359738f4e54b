// Staging between the backend's working copy and the host master, a chunk at a time.
#include "train/optimizer_offload.h"

#include <algorithm>
#include <cstring>


namespace glm {

Result<std::unique_ptr<OptimizerOffload>> OptimizerOffload::create(Backend& backend, const OffloadConfig& config) {
  if (backend.optimizer_dtype() != DType::f32)
    return GLM_USER_ERROR("--offload_optimizer cpu keeps fp32 optimizer state; the ", backend.name(), " backend keeps ",
                          dtype_name(backend.optimizer_dtype()));
  const DType dt = backend.compute_dtype();
  if (config.staging_elements < 1 || config.threads < 1)
    return GLM_INTERNAL_ERROR("offload staging of ", config.staging_elements, " elements, ", config.threads, " threads");
  if (dt != DType::f32 && dt != DType::bf16)
    return GLM_INTERNAL_ERROR("offloaded optimizer over ", dtype_name(dt), " parameters");
  std::unique_ptr<OptimizerOffload> o(new OptimizerOffload(backend, config));
  for (int i = 0; i < kStagingSlots; ++i) {
    GLM_ASSIGN_OR_RETURN(o->grads_[i], backend.allocate_host(config.staging_elements, dt, config.pin_memory));
    GLM_ASSIGN_OR_RETURN(o->params_[i], backend.allocate_host(config.staging_elements, dt, config.pin_memory));
  }
  return o;
}

Status OptimizerOffload::read_params(float* master, Tensor params, bool params_on_host) {
  for (int64_t at = 0; at < params.numel; at += staging_elements()) {
    const int64_t k = std::min(staging_elements(), params.numel - at);
    const Tensor staging = params_on_host ? params.slice(at, k) : params_[0].slice(0, k);
    if (!params_on_host) GLM_RETURN_IF_ERROR(backend_.download(staging.data, params.slice(at, k)));
    if (staging.dtype == DType::f32) {
      std::memcpy(master + at, staging.data, staging.bytes());
    } else {
      cpu::widen_bf16(master + at, staging.as<uint16_t>(), k);
    }
  }
  return Status::ok();
}

Status OptimizerOffload::write_params(Tensor params, const float* master, cpu::Bf16Rounding bf16,
                                      bool params_on_host) {
  for (int64_t at = 0; at < params.numel; at += staging_elements()) {
    const int64_t k = std::min(staging_elements(), params.numel - at);
    const Tensor staging = params_on_host ? params.slice(at, k) : params_[0].slice(0, k);
    if (staging.dtype == DType::f32) {
      std::memcpy(staging.data, master + at, staging.bytes());
    } else {
      cpu::narrow_to_bf16(staging.as<uint16_t>(), master + at, k, bf16);
    }
    if (!params_on_host) GLM_RETURN_IF_ERROR(backend_.upload(params.slice(at, k), staging.data));
  }
  return Status::ok();
}

}  // namespace glm
