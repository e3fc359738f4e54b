// The CUDA backend: bf16 parameters, gradients and activations in device memory, fp32 statistics,
// master weights and moments; kernels from kernels/cuda, GEMMs through cuBLASLt; one main stream, and
// a side stream for work beside it (on_side: the optimizer inside backward).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "base/numa.h"
#include "kernels/cuda/adamw.cuh"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/cross_entropy.cuh"
#include "kernels/cuda/decode_attention.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/dropout.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/rmsnorm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/swiglu.cuh"
#include "kernels/cuda_device.h"
#include "model/backend.h"
#include "model/cuda_profiler.h"

#define GLM_CUDA_RETURN(call)                                                                               \
  do {                                                                                                      \
    cudaError_t glm_cuda_error_ = (call);                                                                   \
    if (glm_cuda_error_ != cudaSuccess)                                                                     \
      return GLM_ERROR(::glm::ErrorKind::internal, #call " failed: ", cudaGetErrorString(glm_cuda_error_)); \
  } while (0)

#define GLM_CUBLAS_RETURN(call)                                                     \
  do {                                                                              \
    cublasStatus_t glm_cublas_status_ = (call);                                     \
    if (glm_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                \
      return GLM_ERROR(::glm::ErrorKind::internal, #call " failed: cuBLAS status ", \
                       static_cast<int>(glm_cublas_status_));                       \
  } while (0)

namespace glm {
namespace {

using cuda::bf16;

int dtype_code(DType d) { return d == DType::f32 ? 0 : (d == DType::f64 ? 1 : (d == DType::bf16 ? 2 : -1)); }

// The element-wise kernels (convert, scale, fill) take floating types only.
Status check_float(const char* op, DType d) {
  if (dtype_code(d) < 0) return GLM_INTERNAL_ERROR(op, " of ", dtype_name(d), " on CUDA (f32, f64 or bf16 only)");
  return Status::ok();
}

#define GLM_PROFILE_OP(name) OpProfiler::Scope glm_profile_scope_(&profiler_, name, stream_)

// Grow-only device scratch: allocated on first use at the largest size asked for. Every growth
// advances *epoch (the backend's): a CUDA graph captured before it holds the old address.
class Scratch {
 public:
  explicit Scratch(uint64_t* epoch) : epoch_(epoch) {}
  ~Scratch() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  Result<void*> get(size_t bytes) {
    if (bytes > bytes_) {
      if (ptr_ != nullptr) cudaFree(ptr_);
      ptr_ = nullptr;
      bytes_ = 0;
      ++*epoch_;
      if (cudaMalloc(&ptr_, bytes) != cudaSuccess)
        return GLM_ERROR(ErrorKind::internal, "out of device memory allocating ", bytes, " bytes of scratch");
      bytes_ = bytes;
    }
    return ptr_;
  }

 private:
  uint64_t* epoch_;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A copy on the backend's copy stream and the event that marks its end.
class CudaAsyncCopy final : public AsyncCopy {
 public:
  explicit CudaAsyncCopy(cudaEvent_t done) : done_(done) {}
  ~CudaAsyncCopy() override {
    if (done_ != nullptr) {
      cudaEventSynchronize(done_);
      cudaEventDestroy(done_);
    }
  }
  Status finish() override {
    if (done_ == nullptr) return Status::ok();
    const cudaError_t e = cudaEventSynchronize(done_);
    cudaEventDestroy(done_);
    done_ = nullptr;
    if (e != cudaSuccess) return GLM_ERROR(ErrorKind::internal, "asynchronous copy: ", cudaGetErrorString(e));
    return Status::ok();
  }
  void* device_event() const override { return done_; }

 private:
  cudaEvent_t done_;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const BackendConfig& config)
      : device_(device), config_(config), profiler_(config.profile, config.profile_trace) {}
  ~CudaBackend() override {
    if (profiler_.enabled()) {
      profiler_.report();
      // Which cuBLASLt candidate each tuned GEMM shape kept, and its time against the first heuristic.
      for (const auto& r : gemm_.tune_log()) {
        const double first = r.seconds.empty() ? 0 : r.seconds[0], kept = r.seconds[static_cast<size_t>(r.chosen)];
        std::fprintf(stderr, "  gemm tuned %-40s candidate %d of %zu, %+.1f%% against the first\n", r.shape.c_str(),
                     r.chosen, r.seconds.size(), first > 0 && kept > 0 ? 100.0 * (first / kept - 1.0) : 0.0);
      }
    }
    if (main_ != nullptr) cudaStreamSynchronize(main_);
    if (side_ != nullptr) cudaStreamSynchronize(side_);
    for (auto& [key, graph] : graphs_) cudaGraphExecDestroy(graph.exec);
    for (cudaStream_t s : {copy_down_, copy_up_})
      if (s != nullptr) cudaStreamSynchronize(s);
    for (cudaEvent_t e : {fork_, joined_})
      if (e != nullptr) cudaEventDestroy(e);
    for (cudaStream_t s : {main_, side_, copy_down_, copy_up_})
      if (s != nullptr) cudaStreamDestroy(s);
  }

  Status init() {
    GLM_CUDA_RETURN(cudaSetDevice(device_));
    char bus_id[32] = {};
    if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device_) == cudaSuccess) {
      pci_bus_id_ = bus_id;
      host_numa_node_ = pci_numa_node(bus_id);
    }
    cudaGetLastError();
    // The main stream has the highest priority and the side stream the lowest, so that the block
    // scheduler hands SMs that free up to the main stream's pending blocks first. Without that, a
    // side update that starts just before a GEMM (a layer's MLP half, released after its
    // backward) fills every SM with its short blocks, the GEMM waits for most of it to drain, and
    // the update runs alone rather than beside backward.
    int lowest = 0, highest = 0;
    GLM_CUDA_RETURN(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
    GLM_CUDA_RETURN(cudaStreamCreateWithPriority(&main_, cudaStreamNonBlocking, highest));
    GLM_CUDA_RETURN(cudaStreamCreateWithPriority(&side_, cudaStreamNonBlocking, lowest));
    GLM_CUDA_RETURN(cudaStreamCreateWithFlags(&copy_down_, cudaStreamNonBlocking));
    GLM_CUDA_RETURN(cudaStreamCreateWithFlags(&copy_up_, cudaStreamNonBlocking));
    GLM_CUDA_RETURN(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    GLM_CUDA_RETURN(cudaEventCreateWithFlags(&joined_, cudaEventDisableTiming));
    stream_ = main_;
    // From the first on_side() until join_side() (enqueue order: the side stream may be idle
    // already), GEMMs are planned for all SMs but --optimizer_side_sms (0 plans them for every SM): cuBLASLt's kernels
    // fill every SM they are planned for and stay resident until they finish, so without SMs of its own the side work
    // (the memory-bound optimizer) would only run in the gaps between GEMMs.
    int sms = 0;
    GLM_CUDA_RETURN(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_));
    multiprocessors_ = sms;
    int side_sms = std::max(config_.optimizer_side_sms, 0);
    // At most a quarter of the SMs: on a small GPU the GEMMs keep at least three quarters.
    side_sms = std::min(side_sms, sms / 4);
    side_sm_target_ = side_sms > 0 ? sms - side_sms : 0;
    const std::string err = gemm_.init();
    if (!err.empty()) return GLM_ERROR(ErrorKind::internal, err);
    gemm_.set_autotune(config_.gemm_autotune == GemmAutotune::all     ? cuda::Gemm::Autotune::all
                       : config_.gemm_autotune == GemmAutotune::large ? cuda::Gemm::Autotune::large
                                                                      : cuda::Gemm::Autotune::off);
    flash_.allow_wgmma = config_.attention_kernel == AttentionKernel::auto_select;
    cudaDeviceProp prop{};
    GLM_CUDA_RETURN(cudaGetDeviceProperties(&prop, device_));
    device_name_ = prop.name;
    major_ = prop.major;
    minor_ = prop.minor;
    int clock_khz = 0;
    GLM_CUDA_RETURN(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device_));
    peak_ = gpu_bf16_peak(device_name_, major_, minor_, prop.multiProcessorCount, clock_khz);
    if (major_ < 8)
      return GLM_USER_ERROR("the ", device_name_, " has compute capability ", major_, ".", minor_,
                            ": glm_hpc's bf16 tensor-core kernels need 8.0 or newer (Ampere, Ada, Hopper)");
    if (!cuda::device_has_kernel_image())
      return GLM_USER_ERROR("this glm_hpc was built for CUDA architectures ", cuda::built_architectures(),
                            ", which hold no code for the ", device_name_, " (sm_", major_, minor_,
                            "): rebuild with the default architectures or -DCMAKE_CUDA_ARCHITECTURES=", major_,
                            minor_, major_ == 9 && minor_ == 0 ? "a" : "");
    GLM_CUDA_RETURN(cudaDeviceGetAttribute(&shared_optin_, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_));
    shared_limit_ = shared_optin_;
    if (config_.shared_memory_limit_kib > 0)
      shared_limit_ = std::min(shared_limit_, config_.shared_memory_limit_kib * 1024);
    flash_.shared_limit = static_cast<size_t>(shared_limit_);
    wgmma_128_ = cuda::flash_wgmma_available(128) && cuda::flash_wgmma_shared_bytes() <= flash_.shared_limit;
    decode_clusters_ = flash_.allow_wgmma && cuda::decode_attention_clusters_available();
    flash_.backward_head_chunk = config_.attention_backward_head_chunk;
    flash_.dq_vector_atomics = config_.attention_dq_vector_atomics;
    return Status::ok();
  }

  std::string name() const override { return "cuda"; }
  PeakFlops bf16_peak() const override { return peak_; }
  std::string description() const override {
    std::string text = "cuda (" + device_name_ + ", sm_" + std::to_string(major_) + std::to_string(minor_) + ", " +
                       std::to_string(shared_limit_ / 1024) + " KiB of shared memory per block";
    if (shared_limit_ < shared_optin_) text += " of its " + std::to_string(shared_optin_ / 1024);
    text += "; attention: ";
    if (flash_.allow_wgmma && wgmma_128_)
      text += "wgmma kernels for sm_90a at head_dim 128, mma.sync elsewhere";
    else
      text += "mma.sync kernels, backward tiles at head_dim 128: " +
              cuda::flash_backward_variant(128, /*gathered=*/false, flash_.shared_limit);
    if (decode_clusters_) text += "; decode attention merged in thread-block clusters";
    return text + ")";
  }
  DType compute_dtype() const override { return DType::bf16; }
  DType optimizer_dtype() const override { return DType::f32; }
  DType stats_dtype() const override { return DType::f32; }
  bool host_accessible() const override { return false; }
  void* native_stream() override { return main_; }
  Status on_side(const std::function<Status()>& fn) override {
    if (stream_ != main_) return GLM_INTERNAL_ERROR("on_side() inside on_side()");
    GLM_CUDA_RETURN(cudaEventRecord(fork_, main_));
    GLM_CUDA_RETURN(cudaStreamWaitEvent(side_, fork_, 0));
    // Pending from here: a synchronize() inside fn (an upload or download) joins the side stream.
    side_pending_ = true;
    if (side_sm_target_ > 0) gemm_.set_sm_target(side_sm_target_);
    stream_ = side_;
    const Status st = fn();
    stream_ = main_;
    return st;
  }
  Status join_side() override {
    if (!side_pending_) return Status::ok();
    {
      // Profiled: how long the main stream, done with its own work, waits for the side work.
      OpProfiler::Scope wait(&profiler_, "main_waits_for_side", main_);
      GLM_CUDA_RETURN(cudaEventRecord(joined_, side_));
      GLM_CUDA_RETURN(cudaStreamWaitEvent(main_, joined_, 0));
    }
    side_pending_ = false;
    gemm_.set_sm_target(0);
    return Status::ok();
  }
  void reset_profile() override { profiler_.reset(); }
  int64_t device_memory_used() const override {
    size_t free_bytes = 0, total = 0;
    if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) return -1;
    return static_cast<int64_t>(total - free_bytes);
  }
  int64_t device_memory_free() const override {
    size_t free_bytes = 0, total = 0;
    if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) return -1;
    return static_cast<int64_t>(free_bytes);
  }

  Result<Buffer> allocate(int64_t numel, DType dtype) override {
    if (numel < 0) return GLM_INTERNAL_ERROR("negative allocation of ", numel, " elements");
    const size_t bytes = std::max<size_t>(static_cast<size_t>(numel) * dtype_size(dtype), 256);
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      cudaGetLastError();
      size_t free_bytes = 0, total = 0;
      cudaMemGetInfo(&free_bytes, &total);
      const double gib = 1024.0 * 1024.0 * 1024.0;
      char text[160];
      std::snprintf(text, sizeof(text), "%.2f GiB free of %.1f GiB", static_cast<double>(free_bytes) / gib,
                    static_cast<double>(total) / gib);
      const char* purpose = allocation_purpose();
      const std::string hint =
          out_of_memory_hint() != nullptr
              ? std::string(out_of_memory_hint())
              : concat("`glm_hpc plan` with this run's options and --world_size N --gpu_memory_gib ",
                       static_cast<int64_t>(static_cast<double>(total) / gib),
                       " shows what the run needs and names the cheapest settings that fit (ZeRO stage, "
                       "--recompute, --offload_optimizer cpu, --offload_param cpu)");
      return GLM_ERROR(ErrorKind::internal, "out of GPU memory allocating ", bytes, " bytes",
                       purpose != nullptr ? concat(" for ", purpose) : std::string(), " (", text, "); ", hint);
    }
    // Zeroed on the current stream and waited for: cudaMemset would run on the legacy default
    // stream, which the non-blocking streams do not wait for, so later work on the buffer could
    // run first and be zeroed over.
    if (cudaMemsetAsync(p, 0, bytes, stream_) != cudaSuccess || cudaStreamSynchronize(stream_) != cudaSuccess) {
      cudaFree(p);
      return GLM_ERROR(ErrorKind::internal, "zeroing a new allocation failed");
    }
    return Buffer(Tensor{p, numel, dtype}, [](void* q) { cudaFree(q); });
  }
  int host_numa_node() const override { return host_numa_node_; }
  std::string pci_bus_id() const override { return pci_bus_id_; }
  Result<Buffer> allocate_host(int64_t numel, DType dtype, bool pinned) override {
    // Pinning allocates the pages at once: from the GPU's NUMA node where the machine has several.
    PreferNumaNode near(host_numa_node_);
    if (!pinned) return host_buffer(numel, dtype);
    if (numel < 0) return GLM_INTERNAL_ERROR("negative allocation of ", numel, " elements");
    const size_t bytes = std::max<size_t>(static_cast<size_t>(numel) * dtype_size(dtype), 256);
    void* p = nullptr;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess) {
      cudaGetLastError();
      return GLM_USER_ERROR("cannot pin ", bytes, " bytes of host memory for the offloaded optimizer (the "
                            "memory-lock limit, `ulimit -l`, or the host's free memory); `glm_hpc plan` shows "
                            "the host memory a run needs, and --offload_pin_memory false uses pageable memory");
    }
    std::memset(p, 0, bytes);
    return Buffer(Tensor{p, numel, dtype}, [](void* q) { cudaFreeHost(q); });
  }
  cpu::AdamWRounding adamw_rounding() const override { return cpu::AdamWRounding::fused; }
  Status zero(Tensor t) override {
    GLM_PROFILE_OP("zero");
    if (!t.empty()) GLM_CUDA_RETURN(cudaMemsetAsync(t.data, 0, t.bytes(), stream_));
    return Status::ok();
  }
  // Large tensors (over 1 MiB) by a memset each, the small ones in launches of up to kZeroRanges.
  Status zero_all(std::span<const Tensor> ts) override {
    cuda::ZeroRanges small;
    auto flush = [&]() -> Status {
      if (small.count == 0) return Status::ok();
      GLM_PROFILE_OP("zero_all");
      GLM_CUDA_RETURN(cuda::zero_ranges(small, stream_));
      small.count = 0;
      return Status::ok();
    };
    for (const Tensor& t : ts) {
      if (t.empty()) continue;
      if (t.bytes() > (size_t{1} << 20)) {
        GLM_RETURN_IF_ERROR(zero(t));
        continue;
      }
      small.ptr[small.count] = t.data;
      small.bytes[small.count] = static_cast<int64_t>(t.bytes());
      if (++small.count == cuda::kZeroRanges) GLM_RETURN_IF_ERROR(flush());
    }
    return flush();
  }
  Status upload(Tensor dst, const void* src) override {
    GLM_CUDA_RETURN(cudaMemcpyAsync(dst.data, src, dst.bytes(), cudaMemcpyHostToDevice, stream_));
    return synchronize();
  }
  Status download(void* dst, Tensor src) override {
    GLM_CUDA_RETURN(cudaMemcpyAsync(dst, src.data, src.bytes(), cudaMemcpyDeviceToHost, stream_));
    return synchronize();
  }
  Result<std::unique_ptr<AsyncCopy>> start_download(void* dst, Tensor src) override {
    return start_copy(dst, src.data, src.bytes(), cudaMemcpyDeviceToHost, copy_down_);
  }
  Result<std::unique_ptr<AsyncCopy>> start_upload(Tensor dst, const void* src) override {
    return start_copy(dst.data, src, dst.bytes(), cudaMemcpyHostToDevice, copy_up_);
  }
  Status wait_for(const AsyncCopy& copy) override {
    if (copy.device_event() != nullptr)
      GLM_CUDA_RETURN(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(copy.device_event()), 0));
    return Status::ok();
  }
  // On a copy stream of its direction (both directions at once), after the work enqueued on stream_
  // so far; an event marks its end.
  Result<std::unique_ptr<AsyncCopy>> start_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                                                cudaStream_t copy) {
    cudaEvent_t ready = nullptr, done = nullptr;
    GLM_CUDA_RETURN(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    cudaError_t e = cudaEventRecord(ready, stream_);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(copy, ready, 0);
    if (e == cudaSuccess) e = cudaMemcpyAsync(dst, src, bytes, kind, copy);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(done, copy);
    cudaEventDestroy(ready);
    if (e != cudaSuccess) {
      if (done != nullptr) cudaEventDestroy(done);
      return GLM_ERROR(ErrorKind::internal, "asynchronous copy of ", bytes, " bytes: ", cudaGetErrorString(e));
    }
    return std::unique_ptr<AsyncCopy>(std::make_unique<CudaAsyncCopy>(done));
  }
  Status convert(Tensor dst, Tensor src) override {
    GLM_PROFILE_OP("convert");
    if (dst.numel != src.numel) return GLM_INTERNAL_ERROR("convert size mismatch ", dst.numel, " vs ", src.numel);
    if (dst.dtype == src.dtype) {
      if (dst.data != src.data)
        GLM_CUDA_RETURN(cudaMemcpyAsync(dst.data, src.data, dst.bytes(), cudaMemcpyDeviceToDevice, stream_));
      return Status::ok();
    }
    GLM_RETURN_IF_ERROR(check_float("convert", dst.dtype));
    GLM_RETURN_IF_ERROR(check_float("convert", src.dtype));
    GLM_CUDA_RETURN(
        cuda::convert(dst.data, dtype_code(dst.dtype), src.data, dtype_code(src.dtype), dst.numel, stream_));
    return Status::ok();
  }
  Status synchronize() override {
    GLM_RETURN_IF_ERROR(join_side());
    GLM_CUDA_RETURN(cudaStreamSynchronize(main_));
    return Status::ok();
  }

  Status run_graph(uint64_t key, const std::function<Status()>& record) override {
    if (!config_.cuda_graphs || graphs_failed_ || profiler_.enabled()) return record();
    return graph_step(key, record);
  }
  int64_t decode_launch_shape(int64_t n, int64_t kv_rows, AttentionShape s) const override {
    return cuda::decode_attention_splits(n, kv_rows, s.heads, s.kv_heads, multiprocessors_, decode_clusters_);
  }
  int64_t graph_launches() const override { return graph_launches_; }
  void clear_graphs() override {
    for (auto& [key, graph] : graphs_) cudaGraphExecDestroy(graph.exec);
    graphs_.clear();
    graph_keys_seen_.clear();
  }

  Status embedding_forward(Tensor out, Tensor table, Tensor tokens, int64_t n, int64_t hidden) override {
    GLM_PROFILE_OP("embedding_forward");
    GLM_CUDA_RETURN(cuda::embedding_forward(b(out), b(table), tokens.as<int32_t>(), n, hidden, stream_));
    return Status::ok();
  }
  Status embedding_backward(Tensor dtable, Tensor dout, Tensor tokens, Tensor token_order, Tensor token_runs, int64_t n,
                            int64_t hidden) override {
    GLM_PROFILE_OP("embedding_backward");
    if (token_order.numel != n || token_order.dtype != DType::i32 || token_runs.dtype != DType::i32 ||
        token_runs.numel < (n > 0 ? 2 : 1))
      return GLM_INTERNAL_ERROR("embedding_backward needs the micro-batch's token index (index_micro_batch), got ",
                                token_order.numel, " positions and ", token_runs.numel, " run bounds for ", n,
                                " tokens");
    GLM_CUDA_RETURN(cuda::embedding_backward(b(dtable), b(dout), tokens.as<int32_t>(), token_order.as<int32_t>(),
                                             token_runs.as<int32_t>(), token_runs.numel - 1, hidden, stream_));
    return Status::ok();
  }
  Status gather_rows(Tensor dst, Tensor src, Tensor rows, int64_t count, int64_t width) override {
    GLM_PROFILE_OP("gather_rows");
    return move_rows("gather_rows", dst, src, rows, count, width, true);
  }
  Status argmax_rows(Tensor ids, Tensor values, int64_t rows, int64_t cols) override {
    GLM_PROFILE_OP("argmax_rows");
    GLM_RETURN_IF_ERROR(check_argmax_rows(ids, values, rows, cols));
    GLM_CUDA_RETURN(cuda::argmax_rows(ids.as<int32_t>(), values.as<float>(), rows, cols, stream_));
    return Status::ok();
  }
  Status top_k_rows(Tensor ids, Tensor top, Tensor stats, Tensor values, int64_t rows, int64_t cols,
                    int64_t k) override {
    GLM_PROFILE_OP("top_k_rows");
    GLM_RETURN_IF_ERROR(check_top_k_rows(ids, top, stats, values, rows, cols, k));
    GLM_CUDA_RETURN(cuda::top_k_rows(ids.as<int32_t>(), top.as<float>(), stats.as<float>(), values.as<float>(), rows,
                                     cols, k, stream_));
    return Status::ok();
  }
  Status scatter_rows(Tensor dst, Tensor src, Tensor rows, int64_t count, int64_t width) override {
    GLM_PROFILE_OP("scatter_rows");
    return move_rows("scatter_rows", dst, src, rows, count, width, false);
  }
  Status zero_rows(Tensor dst, Tensor rows, int64_t count, int64_t width) override {
    GLM_PROFILE_OP("zero_rows");
    if (rows.dtype != DType::i32 || rows.numel < count || count < 0 || width <= 0 || dst.numel % width != 0)
      return GLM_INTERNAL_ERROR("zero_rows: ", count, " rows of width ", width, " of ", dst.numel, " elements");
    GLM_CUDA_RETURN(cuda::move_rows(dst.data, nullptr, rows.as<int32_t>(), count,
                                    width * static_cast<int64_t>(dtype_size(dst.dtype)), false, stream_));
    return Status::ok();
  }
  Status rmsnorm_forward(Tensor out, Tensor rstd, Tensor in, Tensor weight, int64_t n, int64_t hidden,
                         double eps) override {
    GLM_PROFILE_OP("rmsnorm_forward");
    GLM_CUDA_RETURN(
        cuda::rmsnorm_forward(b(out), rstd.as<float>(), b(in), b(weight), n, hidden, static_cast<float>(eps), stream_));
    return Status::ok();
  }
  Status rmsnorm_backward(Tensor din, Tensor dweight, Tensor dout, Tensor in, Tensor weight, Tensor rstd, int64_t n,
                          int64_t hidden) override {
    GLM_PROFILE_OP("rmsnorm_backward");
    int64_t floats = 0;
    GLM_CUDA_RETURN(cuda::rmsnorm_backward_scratch(n, hidden, &floats));
    GLM_ASSIGN_OR_RETURN(void* partials, norm_scratch_.get(sizeof(float) * static_cast<size_t>(floats)));
    GLM_CUDA_RETURN(cuda::rmsnorm_backward(b(din), b(dweight), static_cast<float*>(partials), b(dout), b(in), b(weight),
                                           rstd.as<float>(), n, hidden, stream_));
    return Status::ok();
  }
  Status linear_forward(Tensor out, Tensor in, Tensor weight, Tensor bias, int64_t n, int64_t in_features,
                        int64_t out_features) override {
    GLM_PROFILE_OP(bias.empty() ? "linear_forward" : "linear_forward_bias");
    return linear(out.data, out.dtype == DType::f32, b(in), b(weight), bias.empty() ? nullptr : b(bias), nullptr, n,
                  in_features, out_features);
  }
  Status linear_forward_add(Tensor out, Tensor in, Tensor weight, Tensor bias, Tensor addend, int64_t n,
                            int64_t in_features, int64_t out_features) override {
    GLM_PROFILE_OP("linear_forward_add");
    if (addend.numel != n * out_features || addend.dtype != out.dtype || out.dtype != DType::bf16)
      return GLM_INTERNAL_ERROR("linear_forward_add: addend of ", addend.numel, " elements for ", n * out_features);
    return linear(out.data, false, b(in), b(weight), bias.empty() ? nullptr : b(bias), addend.data, n, in_features,
                  out_features);
  }
  // One row: the norm, the linear and the SwiGLU, or RoPE and the KV-cache store, in the GEMV kernel; the
  // separate ops elsewhere.
  Status normed_linear_forward(Tensor out, Tensor in, Tensor norm_weight, double eps, Tensor weight, Tensor bias,
                               bool swiglu, int64_t n, int64_t in_features, int64_t out_features, Tensor normed,
                               Tensor rstd, Tensor gate_up, const RopeStore* rope) override {
    cuda::GemvFusion fusion;
    fusion.norm = b(norm_weight);
    fusion.eps = static_cast<float>(eps);
    fusion.swiglu = swiglu;
    if (rope != nullptr && rope->cache_rows.dtype == DType::i32 && rope->positions.dtype == DType::i32 &&
        rope->cache_rows.numel >= n && rope->positions.numel >= n) {
      cuda::GemvRope& r = fusion.rope;
      r.cache = b(rope->cache);
      r.position = rope->positions.as<int32_t>();
      r.cache_row = rope->cache_rows.as<int32_t>();
      r.q_width = rope->shape.heads * rope->shape.head_dim;
      r.kv_width = 2 * rope->shape.kv_heads * rope->shape.head_dim;
      r.head_dim = static_cast<int>(rope->shape.head_dim);
      r.rotary_dim = static_cast<int>(rope->rotary_dim);
      r.base = static_cast<float>(rope->base);
      if (!cuda::gemv_fusion_fits(n, in_features, out_features, in.data, weight.data, !bias.empty(), fusion))
        fusion.rope = {};  // the GEMV with the norm alone, then rope_store
    }
    if (!cuda::gemv_fusion_fits(n, in_features, out_features, in.data, weight.data, !bias.empty(), fusion))
      return Backend::normed_linear_forward(out, in, norm_weight, eps, weight, bias, swiglu, n, in_features,
                                            out_features, normed, rstd, gate_up, rope);
    const bool rope_fused = fusion.rope.cache != nullptr;
    {
      GLM_PROFILE_OP(swiglu ? "normed_linear_swiglu" : rope_fused ? "normed_linear_rope_store" : "normed_linear");
      GLM_CUDA_RETURN(cuda::gemv(out.data, false, b(in), b(weight), bias.empty() ? nullptr : b(bias), nullptr, n,
                                 in_features, out_features, stream_, fusion));
    }
    return rope != nullptr && !rope_fused ? rope_store(out, n, *rope) : Status::ok();
  }
  // A decode step of one or two sequences reads the weights through the GEMV kernel; more rows go to cuBLASLt.
  Status linear(void* out, bool out_f32, const bf16* in, const bf16* weight, const bf16* bias, const void* addend,
                int64_t n, int64_t in_features, int64_t out_features) {
    if (cuda::gemv_fits(n, in_features, in, weight)) {
      GLM_CUDA_RETURN(cuda::gemv(out, out_f32, in, weight, bias, addend, n, in_features, out_features, stream_));
    } else {
      GLM_CUBLAS_RETURN(gemm_.linear_forward(out, out_f32, in, weight, bias, n, in_features, out_features, stream_,
                                             addend));
    }
    return Status::ok();
  }
  Status linear_backward(Tensor din, Tensor dweight, Tensor dbias, Tensor dout, Tensor in, Tensor weight, int64_t n,
                         int64_t in_features, int64_t out_features, bool accumulate_din,
                         bool accumulate_dweight) override {
    if (!din.empty()) {
      GLM_PROFILE_OP("linear_dgrad");
      GLM_CUBLAS_RETURN(gemm_.linear_backward_input(b(din), b(dout), b(weight), n, in_features, out_features,
                                                    accumulate_din, stream_));
    }
    if (!dweight.empty()) {
      GLM_PROFILE_OP("linear_wgrad");
      GLM_CUBLAS_RETURN(gemm_.linear_backward_weight(b(dweight), b(dout), b(in), n, in_features, out_features,
                                                     accumulate_dweight, stream_));
    }
    if (!dbias.empty()) {
      GLM_PROFILE_OP("bias_grad");
      const int64_t floats = cuda::column_sum_scratch(n, out_features);
      GLM_ASSIGN_OR_RETURN(void* partials, bias_scratch_.get(sizeof(float) * static_cast<size_t>(floats)));
      GLM_CUDA_RETURN(
          cuda::column_sum_accumulate(b(dbias), b(dout), static_cast<float*>(partials), n, out_features, stream_));
    }
    return Status::ok();
  }
  Status rope_forward(Tensor qkv, Tensor positions, int64_t n, AttentionShape s, int64_t rotary_dim,
                      double base) override {
    GLM_PROFILE_OP("rope_forward");
    GLM_CUDA_RETURN(cuda::rope(b(qkv), positions.as<int32_t>(), n, s.heads, s.kv_heads, s.head_dim, rotary_dim,
                               static_cast<float>(base), 1.0f, stream_));
    return Status::ok();
  }
  bool rope_store_stages() const override { return false; }
  Status rope_store(Tensor qkv, int64_t n, const RopeStore& r) override {
    GLM_PROFILE_OP("rope_store");
    const AttentionShape& s = r.shape;
    if (r.cache_rows.dtype != DType::i32 || r.cache_rows.numel < n ||
        r.cache.numel % (2 * s.kv_heads * s.head_dim) != 0)
      return GLM_INTERNAL_ERROR("rope_store: ", n, " rows into a cache of ", r.cache.numel, " elements");
    GLM_CUDA_RETURN(cuda::rope_store(b(qkv), b(r.cache), r.positions.as<int32_t>(), r.cache_rows.as<int32_t>(), n,
                                     s.heads, s.kv_heads, s.head_dim, r.rotary_dim, static_cast<float>(r.base),
                                     stream_));
    return Status::ok();
  }
  Status rope_backward(Tensor dqkv, Tensor positions, int64_t n, AttentionShape s, int64_t rotary_dim,
                       double base) override {
    GLM_PROFILE_OP("rope_backward");
    GLM_CUDA_RETURN(cuda::rope(b(dqkv), positions.as<int32_t>(), n, s.heads, s.kv_heads, s.head_dim, rotary_dim,
                               static_cast<float>(base), -1.0f, stream_));
    return Status::ok();
  }
  Status attention_forward(Tensor out, Tensor lse, Tensor qkv, Tensor doc_start, int64_t n, AttentionShape s) override {
    GLM_PROFILE_OP("attention_forward");
    if (s.head_dim > cuda::kAttentionMaxHeadDim)
      return GLM_USER_ERROR("head_dim ", s.head_dim, " exceeds the CUDA attention kernel's ",
                            cuda::kAttentionMaxHeadDim);
    // Tensor-core flash attention where the head size allows, the warp-per-row kernel elsewhere.
    if (cuda::flash_attention_supports(s.head_dim)) {
      GLM_RETURN_IF_ERROR(check_flash_shared_memory(s.head_dim));
      GLM_CUDA_RETURN(cuda::flash_attention_forward(b(out), lse.as<float>(), b(qkv), doc_start.as<int32_t>(), n,
                                                    s.heads, s.kv_heads, s.head_dim, stream_, flash_));
      return Status::ok();
    }
    GLM_CUDA_RETURN(cuda::attention_forward(b(out), lse.as<float>(), b(qkv), doc_start.as<int32_t>(), n, s.heads,
                                            s.kv_heads, s.head_dim, stream_));
    return Status::ok();
  }
  Status attention_backward(Tensor dqkv, Tensor dout, Tensor out, Tensor lse, Tensor qkv, Tensor doc_start, int64_t n,
                            AttentionShape s) override {
    GLM_PROFILE_OP("attention_backward");
    const bool flash = cuda::flash_attention_supports(s.head_dim);
    const int64_t scratch = flash ? cuda::flash_attention_scratch(n, s.heads, s.kv_heads, s.head_dim) : n * s.heads;
    GLM_ASSIGN_OR_RETURN(void* acc, attention_scratch_.get(sizeof(float) * static_cast<size_t>(scratch)));
    if (flash) {
      GLM_RETURN_IF_ERROR(check_flash_shared_memory(s.head_dim));
      GLM_CUDA_RETURN(cuda::flash_attention_backward(b(dqkv), static_cast<float*>(acc), b(dout), b(out),
                                                     lse.as<float>(), b(qkv), doc_start.as<int32_t>(), n, s.heads,
                                                     s.kv_heads, s.head_dim, stream_, flash_));
      return Status::ok();
    }
    GLM_CUDA_RETURN(cuda::attention_backward(b(dqkv), static_cast<float*>(acc), b(dout), b(out), lse.as<float>(),
                                             b(qkv), doc_start.as<int32_t>(), n, s.heads, s.kv_heads, s.head_dim,
                                             stream_));
    return Status::ok();
  }
  bool has_gathered_attention() const override { return true; }
  Status check_gathered(AttentionShape s) const {
    if (!cuda::flash_attention_supports(s.head_dim))
      return GLM_USER_ERROR("--context_parallel_size > 1 on the CUDA backend needs head_dim 32, 64 or 128 (the "
                            "flash kernels'); this model's is ",
                            s.head_dim);
    return check_flash_shared_memory(s.head_dim);
  }
  // The mma.sync flash kernels' shared memory against the device's opt-in limit: a clear refusal
  // instead of a failed launch (Hopper's wgmma kernels, where they run, fit on the only devices
  // that have them).
  Status check_flash_shared_memory(int64_t head_dim) const {
    if (flash_.allow_wgmma && head_dim == 128 && wgmma_128_) return Status::ok();
    const size_t need = cuda::flash_attention_shared_bytes(head_dim);
    if (need <= static_cast<size_t>(shared_limit_)) return Status::ok();
    return GLM_USER_ERROR("flash attention at head_dim ", head_dim, " needs at least ", (need + 1023) / 1024,
                          " KiB of shared memory per block, and ", shared_limit_ / 1024, " KiB are allowed (the ",
                          device_name_, " (sm_", major_, minor_, ") has ", shared_optin_ / 1024,
                          shared_limit_ < shared_optin_ ? "; --shared_memory_limit_kib lowers it" : "", ")");
  }
  Status attention_forward_gathered(Tensor out, Tensor lse, Tensor qkv, Tensor kv, Tensor kv_rows,
                                    Tensor row_position, Tensor doc_start, int64_t n, AttentionShape s) override {
    GLM_PROFILE_OP("attention_forward_gathered");
    GLM_RETURN_IF_ERROR(check_gathered(s));
    // Without kv_rows, kv's rows are the row's positions in order (kv_row null for the kernels).
    const int64_t n_kv = kv_rows.data != nullptr ? kv_rows.numel : kv.numel / (2 * s.kv_heads * s.head_dim);
    GLM_CUDA_RETURN(cuda::flash_attention_forward_gathered(
        b(out), lse.as<float>(), b(qkv), b(kv), kv_rows.as<int32_t>(), row_position.as<int32_t>(),
        doc_start.as<int32_t>(), n, n_kv, s.heads, s.kv_heads, s.head_dim, stream_, flash_));
    return Status::ok();
  }
  Status attention_decode(Tensor out, Tensor lse, Tensor qkv, Tensor kv, Tensor kv_rows, Tensor row_position,
                          Tensor doc_start, int64_t n, AttentionShape s) override {
    if (!cuda::decode_attention_supported(s.heads, s.kv_heads, s.head_dim))
      return attention_forward_gathered(out, lse, qkv, kv, kv_rows, row_position, doc_start, n, s);
    GLM_PROFILE_OP("attention_decode");
    const int splits = static_cast<int>(decode_launch_shape(n, kv_rows.numel, s));
    const int64_t scratch = cuda::decode_attention_scratch(n, splits, s.heads, s.head_dim);
    GLM_ASSIGN_OR_RETURN(void* partial, attention_scratch_.get(sizeof(float) * static_cast<size_t>(scratch)));
    GLM_CUDA_RETURN(cuda::decode_attention(b(out), lse.as<float>(), static_cast<float*>(partial), b(qkv), b(kv),
                                           kv_rows.as<int32_t>(), row_position.as<int32_t>(), doc_start.as<int32_t>(),
                                           n, splits, s.heads, s.kv_heads, s.head_dim, decode_clusters_, stream_));
    return Status::ok();
  }
  Status attention_backward_gathered(Tensor dqkv, Tensor dkv, Tensor dout, Tensor out, Tensor lse, Tensor qkv,
                                     Tensor kv, Tensor kv_rows, Tensor row_position, Tensor doc_start, int64_t n,
                                     AttentionShape s) override {
    GLM_PROFILE_OP("attention_backward_gathered");
    GLM_RETURN_IF_ERROR(check_gathered(s));
    const int64_t scratch = cuda::flash_attention_gathered_scratch(n, kv_rows.numel, s.heads, s.kv_heads, s.head_dim);
    GLM_ASSIGN_OR_RETURN(void* acc, attention_scratch_.get(sizeof(float) * static_cast<size_t>(scratch)));
    GLM_CUDA_RETURN(cuda::flash_attention_backward_gathered(
        b(dqkv), b(dkv), static_cast<float*>(acc), b(dout), b(out), lse.as<float>(), b(qkv), b(kv),
        kv_rows.as<int32_t>(), row_position.as<int32_t>(), doc_start.as<int32_t>(), n, kv_rows.numel, s.heads,
        s.kv_heads, s.head_dim, stream_, flash_));
    return Status::ok();
  }
  Status copy_columns(Tensor dst, int64_t dst_stride, Tensor src, int64_t src_stride, int64_t rows,
                      int64_t cols) override {
    GLM_RETURN_IF_ERROR(check_copy_columns(dst, dst_stride, src, src_stride, rows, cols));
    if (rows == 0 || cols == 0) return Status::ok();
    const size_t element = dtype_size(dst.dtype);
    GLM_CUDA_RETURN(cudaMemcpy2DAsync(dst.data, static_cast<size_t>(dst_stride) * element, src.data,
                                      static_cast<size_t>(src_stride) * element, static_cast<size_t>(cols) * element,
                                      static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, stream_));
    return Status::ok();
  }
  Status swiglu_forward(Tensor out, Tensor gate_up, int64_t n, int64_t ffn) override {
    GLM_PROFILE_OP("swiglu_forward");
    GLM_CUDA_RETURN(cuda::swiglu_forward(b(out), b(gate_up), n, ffn, stream_));
    return Status::ok();
  }
  Status swiglu_backward(Tensor dgate_up, Tensor dout, Tensor gate_up, int64_t n, int64_t ffn) override {
    GLM_PROFILE_OP("swiglu_backward");
    GLM_CUDA_RETURN(cuda::swiglu_backward(b(dgate_up), b(dout), b(gate_up), n, ffn, stream_));
    return Status::ok();
  }
  Status add(Tensor out, Tensor a, Tensor c, int64_t count) override {
    GLM_PROFILE_OP("add");
    GLM_CUDA_RETURN(cuda::add_bf16(b(out), b(a), b(c), count, stream_));
    return Status::ok();
  }
  Status scale(Tensor x, double factor) override {
    GLM_PROFILE_OP("scale");
    GLM_RETURN_IF_ERROR(check_float("scale", x.dtype));
    GLM_CUDA_RETURN(cuda::scale(x.data, dtype_code(x.dtype), x.numel, factor, stream_));
    return Status::ok();
  }
  Status lm_head_cross_entropy(Tensor losses, Tensor correct, Tensor dhidden, Tensor dweight, Tensor hidden,
                               Tensor weight, Tensor targets, int64_t n, int64_t hidden_size, int64_t vocab,
                               double grad_scale, bool accumulate_dweight) override {
    const bool grad = !dhidden.empty();
    const int64_t chunk = lm_head_chunk_rows(n, vocab, config_.lm_head_scratch_bytes);
    // bf16 logits, as PyTorch's bf16 matmul gives them; the gradient overwrites them in place.
    GLM_ASSIGN_OR_RETURN(void* logits, logits_scratch_.get(sizeof(bf16) * static_cast<size_t>(chunk * vocab)));
    bf16* dlogits = grad ? static_cast<bf16*>(logits) : nullptr;
    for (int64_t t0 = 0; t0 < n; t0 += chunk) {
      const int64_t m = std::min(chunk, n - t0);
      const bf16* h = b(hidden) + t0 * hidden_size;
      {
        GLM_PROFILE_OP("lm_head_forward");
        GLM_CUBLAS_RETURN(gemm_.linear_forward(logits, false, h, b(weight), nullptr, m, hidden_size, vocab, stream_));
      }
      {
        GLM_PROFILE_OP("cross_entropy");
        GLM_CUDA_RETURN(cuda::cross_entropy(losses.as<float>() + t0,
                                            correct.empty() ? nullptr : correct.as<int32_t>() + t0, dlogits,
                                            static_cast<const bf16*>(logits), targets.as<int32_t>() + t0, m, vocab,
                                            static_cast<float>(grad_scale), stream_));
      }
      if (grad) {
        GLM_PROFILE_OP("lm_head_backward");
        GLM_CUBLAS_RETURN(gemm_.linear_backward_input(b(dhidden) + t0 * hidden_size, dlogits, b(weight), m, hidden_size,
                                                      vocab, false, stream_));
        if (!dweight.empty())  // a frozen lm_head (LoRA) has no gradient
          GLM_CUBLAS_RETURN(gemm_.linear_backward_weight(b(dweight), dlogits, h, m, hidden_size, vocab,
                                                         accumulate_dweight || t0 > 0, stream_));
      }
    }
    return Status::ok();
  }
  Status dropout(Tensor out, Tensor in, double p, uint64_t key, int64_t offset, bool accumulate) override {
    GLM_PROFILE_OP("dropout");
    if (out.numel != in.numel) return GLM_INTERNAL_ERROR("dropout size mismatch ", out.numel, " vs ", in.numel);
    if (out.dtype != DType::bf16 || in.dtype != DType::bf16)
      return GLM_INTERNAL_ERROR("dropout of ", dtype_name(in.dtype), " into ", dtype_name(out.dtype));
    GLM_CUDA_RETURN(cuda::dropout(b(out), b(in), out.numel, p, key, offset, accumulate, stream_));
    return Status::ok();
  }
  Result<double> sum_squares(Tensor x) override {
    GLM_PROFILE_OP("sum_squares");
    GLM_ASSIGN_OR_RETURN(void* acc, sum_scratch_.get(sizeof(double)));
    GLM_CUDA_RETURN(cudaMemsetAsync(acc, 0, sizeof(double), stream_));
    GLM_RETURN_IF_ERROR(add_squares(static_cast<double*>(acc), x));
    double result = 0;
    GLM_CUDA_RETURN(cudaMemcpyAsync(&result, acc, sizeof(double), cudaMemcpyDeviceToHost, stream_));
    GLM_RETURN_IF_ERROR(synchronize());
    return result;
  }
  Status accumulate_squares(Tensor x, Tensor sum) override {
    GLM_PROFILE_OP("accumulate_squares");
    if (sum.dtype != DType::f64 || sum.numel != 1)
      return GLM_INTERNAL_ERROR("accumulate_squares into ", sum.numel, " ", dtype_name(sum.dtype));
    return add_squares(sum.as<double>(), x);
  }
  Status add_squares(double* acc, Tensor x) {
    if (x.dtype == DType::bf16) {
      GLM_CUDA_RETURN(cuda::sum_squares_bf16(acc, b(x), x.numel, stream_));
    } else if (x.dtype == DType::f32) {
      GLM_CUDA_RETURN(cuda::sum_squares_f32(acc, x.as<float>(), x.numel, stream_));
    } else {
      return GLM_INTERNAL_ERROR("sum_squares of ", dtype_name(x.dtype));
    }
    return Status::ok();
  }
  Status fill(Tensor dst, double value) override {
    GLM_PROFILE_OP("fill");
    GLM_RETURN_IF_ERROR(check_float("fill", dst.dtype));
    GLM_CUDA_RETURN(cuda::fill(dst.data, dtype_code(dst.dtype), dst.numel, value, stream_));
    return Status::ok();
  }
  Status fill_normal(Tensor dst, uint64_t key, int64_t offset, double std) override {
    GLM_PROFILE_OP("fill_normal");
    GLM_RETURN_IF_ERROR(check_float("fill_normal", dst.dtype));
    GLM_CUDA_RETURN(cuda::fill_normal(dst.data, dtype_code(dst.dtype), dst.numel, key, offset, std, stream_));
    return Status::ok();
  }
  Status adamw(Tensor param, Tensor master, Tensor grad, Tensor exp_avg, Tensor exp_avg_sq, const AdamWStep& step,
               Tensor grad_sq_sum) override {
    GLM_PROFILE_OP("adamw");
    GLM_RETURN_IF_ERROR(check_sum_dtype("adamw", grad_sq_sum));
    const cuda::AdamWArgs a = adamw_args(step);
    double* sq = grad_sq_sum.empty() ? nullptr : grad_sq_sum.as<double>();
    const bool beside = stream_ == side_;
    if (master.dtype == DType::i16) {  // split: param holds the high halves
      GLM_RETURN_IF_ERROR(check_split("adamw", param, master));
      GLM_CUDA_RETURN(cuda::adamw_split(b(param), master.as<int16_t>(), b(grad), exp_avg.as<float>(),
                                        exp_avg_sq.as<float>(), master.numel, a, sq, stream_, beside));
      return Status::ok();
    }
    GLM_CUDA_RETURN(cuda::adamw(param.data == master.data ? nullptr : b(param), master.as<float>(), b(grad),
                                exp_avg.as<float>(), exp_avg_sq.as<float>(), master.numel, a, sq, stream_, beside));
    return Status::ok();
  }
  Status adamw_rows(Tensor param, Tensor master, Tensor grad, Tensor exp_avg, Tensor exp_avg_sq, const AdamWRows& r,
                    Tensor grad_sq_sum) override {
    GLM_PROFILE_OP("adamw_rows");
    GLM_RETURN_IF_ERROR(check_sum_dtype("adamw_rows", grad_sq_sum));
    GLM_RETURN_IF_ERROR(check_adamw_rows(param, master, grad, exp_avg, exp_avg_sq, r));
    const bool split = master.dtype == DType::i16;
    if (split) GLM_RETURN_IF_ERROR(check_split("adamw_rows", param, master));
    cuda::AdamWHistory h{};
    for (int64_t k = 0; k < r.until - r.floor; ++k) {
      const cuda::AdamWArgs a = adamw_args(r.history[static_cast<size_t>(k)]);
      h.beta1 = a.beta1, h.beta2 = a.beta2, h.eps = a.eps, h.weight_decay = a.weight_decay;
      h.lr[k] = a.lr;
      h.grad_scale[k] = a.grad_scale;
      h.bias_correction1[k] = a.bias_correction1;
      h.bias_correction2_sqrt[k] = a.bias_correction2_sqrt;
    }
    GLM_CUDA_RETURN(cuda::adamw_rows(
        !split && param.data == master.data ? nullptr : b(param), split ? nullptr : master.as<float>(),
        split ? master.as<int16_t>() : nullptr, b(grad), exp_avg.as<float>(), exp_avg_sq.as<float>(),
        r.rows.empty() ? nullptr : r.rows.as<int32_t>(), r.count, r.width, r.row_step.as<int32_t>(), r.floor, r.until,
        r.gradient, h, grad_sq_sum.empty() ? nullptr : grad_sq_sum.as<double>(), stream_, stream_ == side_));
    return Status::ok();
  }

 private:
  static bf16* b(const Tensor& t) { return static_cast<bf16*>(t.data); }
  // One step's scalars as the kernels take them (adamw and adamw_rows alike: the same floats).
  static cuda::AdamWArgs adamw_args(const AdamWStep& step) {
    cuda::AdamWArgs a;
    a.lr = static_cast<float>(step.lr);
    a.beta1 = static_cast<float>(step.beta1);
    a.beta2 = static_cast<float>(step.beta2);
    a.eps = static_cast<float>(step.eps);
    a.weight_decay = static_cast<float>(step.weight_decay);
    a.grad_scale = static_cast<float>(step.grad_scale);
    a.bias_correction1 = static_cast<float>(1.0 - std::pow(step.beta1, static_cast<double>(step.step)));
    a.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(step.beta2, static_cast<double>(step.step))));
    return a;
  }
  static Status check_sum_dtype(const char* op, const Tensor& grad_sq_sum) {
    if (!grad_sq_sum.empty() && grad_sq_sum.dtype != DType::f64)
      return GLM_INTERNAL_ERROR(op, ": the sum of squares accumulates in f64, not ", dtype_name(grad_sq_sum.dtype));
    return Status::ok();
  }
  static Status check_split(const char* op, const Tensor& param, const Tensor& master) {
    if (param.dtype != DType::bf16 || param.numel != master.numel)
      return GLM_INTERNAL_ERROR(op, ": a split master needs its bf16 high halves, got ", dtype_name(param.dtype));
    return Status::ok();
  }
  // gather_rows (gather) or scatter_rows.
  Status move_rows(const char* op, Tensor dst, Tensor src, Tensor rows, int64_t count, int64_t width, bool gather) {
    GLM_RETURN_IF_ERROR(check_rows_op(op, dst, src, rows, count, width, gather));
    GLM_CUDA_RETURN(cuda::move_rows(dst.data, src.data, rows.as<int32_t>(), count,
                                    width * static_cast<int64_t>(dtype_size(dst.dtype)), gather, stream_));
    return Status::ok();
  }

  // run_graph's work: the graph of key if current; else the first run eager, the second captured
  // (Relaxed mode: nothing the kernels' wrappers call is refused), instantiated and launched.
  Status graph_step(uint64_t key, const std::function<Status()>& record) {
    if (auto found = graphs_.find(key); found != graphs_.end()) {
      if (found->second.epoch == scratch_epoch_) {
        GLM_CUDA_RETURN(cudaGraphLaunch(found->second.exec, stream_));
        ++graph_launches_;
        return Status::ok();
      }
      cudaGraphExecDestroy(found->second.exec);  // a scratch it uses has moved since
      graphs_.erase(found);
    }
    if (graph_keys_seen_.insert(key).second) return record();
    const uint64_t epoch = scratch_epoch_;
    GLM_CUDA_RETURN(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
    const Status recorded = record();
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
    cudaGraphExec_t exec = nullptr;
    cudaError_t made = ended;
    if (recorded.is_ok() && ended == cudaSuccess) made = cudaGraphInstantiate(&exec, graph, 0);
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (!recorded.is_ok() || made != cudaSuccess) {
      (void)cudaGetLastError();  // the capture's error is not the next op's
      graphs_failed_ = true;
      std::fprintf(stderr, "glm_hpc: note: decode steps run op by op: capturing a CUDA graph failed (%s)\n",
                   recorded.is_ok() ? cudaGetErrorString(made) : recorded.message().c_str());
      return record();
    }
    if (scratch_epoch_ != epoch) {  // a scratch grew while capturing: the graph holds its old address
      cudaGraphExecDestroy(exec);
      return record();
    }
    graphs_[key] = CapturedGraph{exec, epoch};
    GLM_CUDA_RETURN(cudaGraphLaunch(exec, stream_));
    ++graph_launches_;
    return Status::ok();
  }

  int device_;
  std::string pci_bus_id_;
  BackendConfig config_;
  cuda::FlashOptions flash_;
  std::string device_name_;
  PeakFlops peak_;
  int major_ = 0, minor_ = 0, shared_optin_ = 0;  // compute capability, opt-in shared memory per block
  int shared_limit_ = 0;                          // what the kernels may use: --shared_memory_limit_kib
  bool wgmma_128_ = false;                        // Hopper's flash kernels (head_dim 128) built and usable here
  bool decode_clusters_ = false;                  // the decode attention's splits merged in clusters (sm_90+)
  // stream_ is where ops are enqueued: main_, or side_ inside on_side().
  cudaStream_t main_ = nullptr, side_ = nullptr, stream_ = nullptr;
  cudaStream_t copy_down_ = nullptr, copy_up_ = nullptr;  // start_download, start_upload
  int host_numa_node_ = -1;
  cudaEvent_t fork_ = nullptr, joined_ = nullptr;
  bool side_pending_ = false;  // side work enqueued since the last join_side()
  // SMs the GEMMs are planned for while side work is pending (0: all).
  int side_sm_target_ = 0;
  int multiprocessors_ = 1;  // sizes the decode attention's grid
  cuda::Gemm gemm_;
  uint64_t scratch_epoch_ = 0;  // Scratch growths so far: a graph of an earlier epoch is stale
  Scratch norm_scratch_{&scratch_epoch_}, attention_scratch_{&scratch_epoch_}, logits_scratch_{&scratch_epoch_},
      sum_scratch_{&scratch_epoch_}, bias_scratch_{&scratch_epoch_};
  // run_graph's graphs by key, with the scratch epoch they were captured in; the keys seen once
  // (run eagerly); graphs off for the rest of the run after a capture the driver refused.
  struct CapturedGraph {
    cudaGraphExec_t exec = nullptr;
    uint64_t epoch = 0;
  };
  std::map<uint64_t, CapturedGraph> graphs_;
  std::set<uint64_t> graph_keys_seen_;
  bool graphs_failed_ = false;
  int64_t graph_launches_ = 0;
  OpProfiler profiler_;
};

}  // namespace

Result<std::unique_ptr<Backend>> make_cuda_backend(int device, const BackendConfig& config) {
  const int count = cuda::cuda_device_count_impl();
  if (count == 0) return GLM_USER_ERROR("--device cuda: no CUDA device is visible");
  if (device < 0 || device >= count) return GLM_INTERNAL_ERROR("CUDA device ", device, " of ", count);
  auto backend = std::make_unique<CudaBackend>(device, config);
  GLM_RETURN_IF_ERROR(backend->init());
  return std::unique_ptr<Backend>(std::move(backend));
}

int cuda_device_count() { return cuda::cuda_device_count_impl(); }

}  // namespace glm
