// NCCL implementation of the Communicator: a communication stream ordered against the compute
// stream with events, a non-blocking NCCL communicator and a watchdog thread that aborts it on an
// asynchronous error or a missed deadline (see nccl_communicator.h).
#include "mpi/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <condition_variable>
#include <cstdio>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

#include "mpi/fatal.h"

namespace glm {
namespace {

using Clock = std::chrono::steady_clock;

#define GLM_NCCL_CUDA_RETURN(call)                                                                      \
  do {                                                                                                  \
    cudaError_t glm_cuda_error_ = (call);                                                               \
    if (glm_cuda_error_ != cudaSuccess)                                                                 \
      return GLM_ERROR(::glm::ErrorKind::comm, #call " failed: ", cudaGetErrorString(glm_cuda_error_)); \
  } while (0)

ncclDataType_t nccl_type(CommType t) {
  switch (t) {
    case CommType::f32:
      return ncclFloat32;
    case CommType::f64:
      return ncclFloat64;
    case CommType::bf16:
      return ncclBfloat16;
    case CommType::i32:
      return ncclInt32;
    case CommType::i64:
      return ncclInt64;
    case CommType::u8:
      return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  return ncclSum;
}

// State shared by the communicator, its watchdog and the fatal path's abort hook (which may
// outlive the communicator). `mutex` serialises every call on `comm` against the abort.
struct Shared {
  std::mutex mutex;
  ncclComm_t comm = nullptr;
  bool aborted = false;
  std::string failure;  // why the watchdog aborted: returned by every later call

  // Aborts once; the caller holds `mutex`.
  void abort_locked(const std::string& why) {
    if (aborted) return;
    aborted = true;
    if (failure.empty()) failure = why;
    if (comm != nullptr) ncclCommAbort(comm);
    comm = nullptr;
  }
};

// Reused CUDA events: creating and destroying two or three events per collective would add host
// work to every call. An event goes back to the pool only when nothing will query it again (its
// Op is gone); stream waits already enqueued on it captured its state when they were issued, so
// recording it again for a later collective is safe.
class EventPool {
 public:
  ~EventPool() {
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }
  cudaError_t take(cudaEvent_t* event) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!free_.empty()) {
        *event = free_.back();
        free_.pop_back();
        return cudaSuccess;
      }
    }
    return cudaEventCreateWithFlags(event, cudaEventDefault);  // timing on: exposed time is measured
  }
  void give_back(cudaEvent_t event) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(event);
  }

 private:
  std::mutex mutex_;  // the watchdog thread may release the last reference to an Op
  std::vector<cudaEvent_t> free_;
};

enum class OpKind { all_reduce, reduce_scatter, all_gather, broadcast, barrier };

// One collective in flight: the events that order it and measure how long compute waited on it.
// Its description is formatted only when something failed (no string work per call).
struct Op {
  OpKind kind = OpKind::barrier;
  size_t count = 0;
  CommType type = CommType::u8;
  int root = 0;
  Clock::time_point start;
  cudaEvent_t done = nullptr;     // recorded on the communication stream after the collective
  cudaEvent_t reached = nullptr;  // recorded on the compute stream where it waits for the collective
  std::shared_ptr<EventPool> pool;
  ~Op() {
    if (done != nullptr) pool->give_back(done);
    if (reached != nullptr) pool->give_back(reached);
  }
  std::string what() const {
    switch (kind) {
      case OpKind::all_reduce:
        return concat("all_reduce(", count, " x ", comm_type_name(type), ")");
      case OpKind::reduce_scatter:
        return concat("reduce_scatter(", count, " x ", comm_type_name(type), ")");
      case OpKind::all_gather:
        return concat("all_gather(", count, " x ", comm_type_name(type), ")");
      case OpKind::broadcast:
        return concat("broadcast(", count, " x ", comm_type_name(type), " from rank ", root, ")");
      case OpKind::barrier:
        return "barrier";
    }
    return "collective";
  }
};

class NcclCommunicatorImpl;

class NcclRequest final : public CommRequest {
 public:
  NcclRequest(NcclCommunicatorImpl* owner, std::shared_ptr<Op> op, Status status)
      : owner_(owner), op_(std::move(op)), status_(std::move(status)) {}
  ~NcclRequest() override {
    if (!waited_) (void)wait();  // keep the compute stream ordered even if nobody waited
  }
  Status wait() override;

 private:
  NcclCommunicatorImpl* owner_;
  std::shared_ptr<Op> op_;
  Status status_;
  bool waited_ = false;
};

class NcclCommunicatorImpl final : public Communicator {
 public:
  NcclCommunicatorImpl(int rank, int size, int device, cudaStream_t compute, std::chrono::duration<double> timeout)
      : rank_(rank), size_(size), device_(device), compute_(compute), timeout_(timeout) {}

  ~NcclCommunicatorImpl() override {
    {
      std::lock_guard<std::mutex> lock(watch_mutex_);
      stop_ = true;
    }
    watch_cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    cudaSetDevice(device_);
    // Outstanding collectives get the deadline too: a peer that never joins must not hang the exit.
    const auto drain_start = Clock::now();
    while (stream_ != nullptr && cudaStreamQuery(stream_) == cudaErrorNotReady) {
      if (Clock::now() - drain_start > timeout_) {
        std::lock_guard<std::mutex> lock(shared_->mutex);
        shared_->abort_locked("collectives still running when the communicator was destroyed");
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    measured_.clear();
    watched_.clear();
    {
      std::lock_guard<std::mutex> lock(shared_->mutex);
      if (!shared_->aborted && shared_->comm != nullptr) {
        // Finalize flushes outstanding work; with a non-blocking communicator it is polled.
        ncclResult_t r = ncclCommFinalize(shared_->comm);
        const auto start = Clock::now();
        while (r == ncclInProgress && Clock::now() - start < timeout_) ncclCommGetAsyncError(shared_->comm, &r);
        if (r == ncclSuccess) {
          ncclCommDestroy(shared_->comm);
        } else {
          ncclCommAbort(shared_->comm);
        }
        shared_->comm = nullptr;
      }
    }
    if (scratch_ != nullptr) cudaFree(scratch_);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (mpi_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&mpi_);
    if (ready_ != nullptr) cudaEventDestroy(ready_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  Status init(MPI_Comm mpi_comm) {
    GLM_NCCL_CUDA_RETURN(cudaSetDevice(device_));
    // Kept for split(): the sub-groups' communicators are made from its MPI sub-communicators.
    if (MPI_Comm_dup(mpi_comm, &mpi_) != MPI_SUCCESS) return GLM_ERROR(ErrorKind::comm, "MPI_Comm_dup failed");
    // The compute stream's priority: the collectives' blocks get SMs no later than compute's when
    // SMs free up (the backend's side stream, lower, yields to both).
    int priority = 0;
    GLM_NCCL_CUDA_RETURN(cudaStreamGetPriority(compute_, &priority));
    GLM_NCCL_CUDA_RETURN(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority));
    GLM_NCCL_CUDA_RETURN(cudaMalloc(&scratch_, sizeof(int32_t)));
    GLM_NCCL_CUDA_RETURN(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    ncclUniqueId id{};
    if (rank_ == 0) {
      const ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess) return GLM_ERROR(ErrorKind::comm, "ncclGetUniqueId failed: ", ncclGetErrorString(r));
    }
    if (MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, mpi_comm) != MPI_SUCCESS)
      return GLM_ERROR(ErrorKind::comm, "MPI_Bcast of the NCCL unique id failed");
    // Non-blocking: no NCCL call can block the host for longer than our deadline, and the
    // communicator can be aborted from the watchdog while a collective is stuck.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&comm, size_, id, rank_, &config);
    const auto start = Clock::now();
    while (r == ncclInProgress) {
      if (Clock::now() - start > timeout_) {
        ncclCommAbort(comm);
        return GLM_ERROR(ErrorKind::comm, "NCCL communicator creation did not finish within ", timeout_.count(),
                         " s (collective timeout)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ncclCommGetAsyncError(comm, &r);
    }
    if (r != ncclSuccess) {
      if (comm != nullptr) ncclCommAbort(comm);
      return GLM_ERROR(ErrorKind::comm, "ncclCommInitRankConfig failed on device ", device_, ": ",
                       ncclGetErrorString(r));
    }
    shared_->comm = comm;
    std::weak_ptr<Shared> weak = shared_;
    register_abort_hook([weak] {
      if (auto s = weak.lock()) {
        std::lock_guard<std::mutex> lock(s->mutex);
        s->abort_locked("the job is ending on a fatal error");
      }
    });
    watchdog_ = std::thread([this] { watch(); });
    return Status::ok();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }
  bool device_buffers() const override { return true; }
  Result<std::unique_ptr<Communicator>> split(int color, int key) override {
    MPI_Comm part = MPI_COMM_NULL;
    if (MPI_Comm_split(mpi_, color, key, &part) != MPI_SUCCESS)
      return GLM_ERROR(ErrorKind::comm, "MPI_Comm_split of ", size_, " ranks failed");
    auto made = make_nccl_communicator(part, device_, compute_, timeout_);
    MPI_Comm_free(&part);
    return made;
  }

  std::unique_ptr<CommRequest> start_all_reduce(const void* send, void* recv, size_t count, CommType type,
                                                ReduceOp op) override {
    return enqueue(OpKind::all_reduce, count, type, 0, [&](ncclComm_t c) {
      return ncclAllReduce(send, recv, count, nccl_type(type), nccl_op(op), c, stream_);
    });
  }
  std::unique_ptr<CommRequest> start_reduce_scatter(const void* send, void* recv, size_t recv_count, CommType type,
                                                    ReduceOp op) override {
    return enqueue(OpKind::reduce_scatter, recv_count, type, 0, [&](ncclComm_t c) {
      return ncclReduceScatter(send, recv, recv_count, nccl_type(type), nccl_op(op), c, stream_);
    });
  }
  std::unique_ptr<CommRequest> start_all_gather(const void* send, void* recv, size_t send_count,
                                                CommType type) override {
    return enqueue(OpKind::all_gather, send_count, type, 0,
                   [&](ncclComm_t c) { return ncclAllGather(send, recv, send_count, nccl_type(type), c, stream_); });
  }
  // One NCCL group: the parts launch together, as one collective for the events and the watchdog.
  std::unique_ptr<CommRequest> start_reduce_scatter_group(std::span<const CommPart> parts, CommType type,
                                                          ReduceOp op) override {
    return enqueue(OpKind::reduce_scatter, total_count(parts), type, 0, [&](ncclComm_t c) {
      return grouped(parts, [&](const CommPart& p) {
        return ncclReduceScatter(p.send, p.recv, p.count, nccl_type(type), nccl_op(op), c, stream_);
      });
    });
  }
  std::unique_ptr<CommRequest> start_all_gather_group(std::span<const CommPart> parts, CommType type) override {
    return enqueue(OpKind::all_gather, total_count(parts), type, 0, [&](ncclComm_t c) {
      return grouped(parts, [&](const CommPart& p) {
        return ncclAllGather(p.send, p.recv, p.count, nccl_type(type), c, stream_);
      });
    });
  }
  std::unique_ptr<CommRequest> start_broadcast(void* buffer, size_t count, CommType type, int root) override {
    return enqueue(OpKind::broadcast, count, type, root, [&](ncclComm_t c) {
      return ncclBroadcast(buffer, buffer, count, nccl_type(type), root, c, stream_);
    });
  }
  std::unique_ptr<CommRequest> start_barrier() override {
    // NCCL has no barrier: a one-element all-reduce completes only when every rank joined.
    return enqueue(OpKind::barrier, 1, CommType::i32, 0,
                   [&](ncclComm_t c) { return ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, c, stream_); });
  }

  Status order_next_after(void* device_event) override {
    if (device_event != nullptr) after_.push_back(static_cast<cudaEvent_t>(device_event));
    return Status::ok();
  }
  Result<double> take_device_exposed_seconds() override {
    GLM_NCCL_CUDA_RETURN(cudaSetDevice(device_));
    GLM_NCCL_CUDA_RETURN(cudaStreamSynchronize(compute_));
    GLM_RETURN_IF_ERROR(failure_status());
    double seconds = 0;
    for (const auto& op : measured_) {
      float ms = 0;
      GLM_NCCL_CUDA_RETURN(cudaEventElapsedTime(&ms, op->reached, op->done));
      if (ms > 0) seconds += ms / 1e3;  // the collective finished after compute reached it
    }
    measured_.clear();
    return seconds;
  }

  // NcclRequest::wait(): order the compute stream after the collective; the host goes on.
  Status order_compute_after(const std::shared_ptr<Op>& op) {
    GLM_RETURN_IF_ERROR(failure_status());
    GLM_NCCL_CUDA_RETURN(cudaEventRecord(op->reached, compute_));
    GLM_NCCL_CUDA_RETURN(cudaStreamWaitEvent(compute_, op->done, 0));
    measured_.push_back(op);
    return Status::ok();
  }

 private:
  Status failure_status() {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    if (!shared_->aborted) return Status::ok();
    return GLM_ERROR(ErrorKind::comm, "NCCL communicator of ", rank_prefix(), " was aborted: ", shared_->failure);
  }

  static size_t total_count(std::span<const CommPart> parts) {
    size_t n = 0;
    for (const CommPart& p : parts) n += p.count;
    return n;
  }
  // ncclGroupStart, one call per part, ncclGroupEnd (which a non-blocking communicator may answer
  // with ncclInProgress: start() polls that). A failed part still ends the group.
  template <typename PartCall>
  static ncclResult_t grouped(std::span<const CommPart> parts, PartCall&& part) {
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return r;
    for (const CommPart& p : parts) {
      const ncclResult_t pr = part(p);
      if (pr != ncclSuccess && pr != ncclInProgress) {
        (void)ncclGroupEnd();
        return pr;
      }
    }
    return ncclGroupEnd();
  }

  template <typename Call>
  std::unique_ptr<CommRequest> enqueue(OpKind kind, size_t count, CommType type, int root, Call&& call) {
    auto op = std::make_shared<Op>();
    op->kind = kind;
    op->count = count;
    op->type = type;
    op->root = root;
    op->pool = pool_;
    Status s = start(*op, call);
    if (s.is_ok()) {
      // The watchdog holds the collective until its done event fires or its deadline passes.
      std::lock_guard<std::mutex> lock(watch_mutex_);
      watched_.push_back(op);
    }
    return std::make_unique<NcclRequest>(this, std::move(op), std::move(s));
  }

  template <typename Call>
  Status start(Op& op, Call& call) {
    GLM_NCCL_CUDA_RETURN(cudaSetDevice(device_));
    GLM_NCCL_CUDA_RETURN(pool_->take(&op.done));
    GLM_NCCL_CUDA_RETURN(pool_->take(&op.reached));
    // The communication stream starts after everything compute enqueued so far (the buffer's
    // producer). One event serves every call: the wait captures the record made just before it.
    GLM_NCCL_CUDA_RETURN(cudaEventRecord(ready_, compute_));
    GLM_NCCL_CUDA_RETURN(cudaStreamWaitEvent(stream_, ready_, 0));
    for (cudaEvent_t e : after_) GLM_NCCL_CUDA_RETURN(cudaStreamWaitEvent(stream_, e, 0));
    after_.clear();
    {
      std::lock_guard<std::mutex> lock(shared_->mutex);
      if (shared_->aborted)
        return GLM_ERROR(ErrorKind::comm, op.what(), " on an aborted NCCL communicator (", rank_prefix(),
                         "): ", shared_->failure);
      ncclResult_t r = call(shared_->comm);
      // A non-blocking communicator may still be enqueueing: poll to completion of the enqueue.
      const auto start = Clock::now();
      while (r == ncclInProgress) {
        if (Clock::now() - start > timeout_) {
          shared_->abort_locked(concat(op.what(), " could not be enqueued within ", timeout_.count(), " s"));
          return GLM_ERROR(ErrorKind::comm, op.what(), " could not be enqueued within ", timeout_.count(),
                           " s (collective timeout) on ", rank_prefix());
        }
        std::this_thread::yield();  // the thread finishing the enqueue may share this core
        ncclCommGetAsyncError(shared_->comm, &r);
      }
      if (r != ncclSuccess) {
        const std::string why =
            concat(op.what(), " failed: ", ncclGetErrorString(r), " (", ncclGetLastError(shared_->comm), ")");
        shared_->abort_locked(why);
        return GLM_ERROR(ErrorKind::comm, why, " on ", rank_prefix());
      }
    }
    GLM_NCCL_CUDA_RETURN(cudaEventRecord(op.done, stream_));
    op.start = Clock::now();
    return Status::ok();
  }

  // The watchdog: every few milliseconds, NCCL's asynchronous error and each in-flight
  // collective's deadline. On failure it aborts the communicator (which also releases any kernel
  // spinning on a dead peer) and prints the reason; the next call on this rank returns it.
  void watch() {
    cudaSetDevice(device_);
    std::unique_lock<std::mutex> watch_lock(watch_mutex_);
    while (!stop_) {
      watch_cv_.wait_for(watch_lock, std::chrono::milliseconds(20));
      if (stop_) break;
      std::string failure;
      for (auto it = watched_.begin(); it != watched_.end();) {
        const cudaError_t q = cudaEventQuery((*it)->done);
        if (q == cudaSuccess) {
          it = watched_.erase(it);
          continue;
        }
        if (q != cudaErrorNotReady) {
          failure = concat((*it)->what(), ": CUDA error ", cudaGetErrorString(q));
          break;
        }
        if (timeout_.count() > 0 && Clock::now() - (*it)->start > timeout_) {
          failure = concat((*it)->what(), " did not complete within ", timeout_.count(),
                           " s (collective timeout): a peer rank died or is stuck");
          break;
        }
        ++it;
      }
      std::lock_guard<std::mutex> lock(shared_->mutex);
      if (shared_->aborted) break;
      if (failure.empty()) {
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(shared_->comm, &async);
        if (async != ncclSuccess && async != ncclInProgress)
          failure = concat("NCCL asynchronous error: ", ncclGetErrorString(async), " (",
                           ncclGetLastError(shared_->comm), ")");
      }
      if (!failure.empty()) {
        std::fprintf(stderr, "glm_hpc: %s: aborting the NCCL communicator: %s\n", rank_prefix().c_str(),
                     failure.c_str());
        std::fflush(stderr);
        shared_->abort_locked(failure);
        break;
      }
    }
  }

  int rank_, size_, device_;
  MPI_Comm mpi_ = MPI_COMM_NULL;
  cudaStream_t compute_;
  std::chrono::duration<double> timeout_;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
  cudaEvent_t ready_ = nullptr;  // compute stream's position at each start_*, waited on by stream_
  std::vector<cudaEvent_t> after_;  // order_next_after(): also waited on by the next start_*
  std::shared_ptr<EventPool> pool_ = std::make_shared<EventPool>();
  std::shared_ptr<Shared> shared_ = std::make_shared<Shared>();
  std::vector<std::shared_ptr<Op>> measured_;  // waited collectives whose stall is not yet counted

  std::mutex watch_mutex_;
  std::condition_variable watch_cv_;
  bool stop_ = false;
  std::list<std::shared_ptr<Op>> watched_;
  std::thread watchdog_;
};

Status NcclRequest::wait() {
  if (waited_) return Status::ok();
  waited_ = true;
  GLM_RETURN_IF_ERROR(status_);
  return owner_->order_compute_after(op_);
}

}  // namespace

Result<std::unique_ptr<Communicator>> make_nccl_communicator(MPI_Comm comm, int device, void* compute_stream,
                                                             std::chrono::duration<double> timeout) {
  int rank = 0, size = 1;
  if (MPI_Comm_rank(comm, &rank) != MPI_SUCCESS || MPI_Comm_size(comm, &size) != MPI_SUCCESS)
    return GLM_ERROR(ErrorKind::comm, "MPI_Comm_rank/size failed");
  auto c =
      std::make_unique<NcclCommunicatorImpl>(rank, size, device, static_cast<cudaStream_t>(compute_stream), timeout);
  GLM_RETURN_IF_ERROR(c->init(comm));
  return std::unique_ptr<Communicator>(std::move(c));
}

}  // namespace glm
