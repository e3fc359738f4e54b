// The Communicator interface: collectives over host (MPI) or device (NCCL) buffers.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "base/status.h"
#include "base/tensor.h"

namespace glm {

enum class CommType { f32, f64, bf16, i32, i64, u8 };
enum class ReduceOp { sum, max, min };

size_t comm_type_size(CommType type);
// The wire type of a tensor's elements (f32, f64 or bf16 compute data).
CommType comm_type_of(DType dtype);
const char* comm_type_name(CommType type);

// A collective in flight. wait() returns once it completed, or an error after the deadline.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual Status wait() = 0;
};

// One part of a grouped collective: its own send and receive buffers and element count (per rank:
// a reduce-scatter's receive count, an all-gather's send count).
struct CommPart {
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;
  // True when buffers are device memory and collectives are ordered on the device (NCCL): the
  // caller need not synchronize before starting one, and wait() does not block the host.
  virtual bool device_buffers() const { return false; }
  // Seconds compute stood waiting for collectives since the last call, where the communicator can
  // measure it on the device (NCCL, from events); host waits are measured by the caller.
  virtual Result<double> take_device_exposed_seconds() { return 0.0; }
  // Device communicators: the next collective started also waits for this device event (a
  // cudaEvent_t of the caller's, e.g. the end of an upload into its send buffer), beside the
  // compute enqueued so far. The event must stay valid until that collective is started. Host
  // communicators ignore it: their callers finish copies before starting a collective.
  virtual Status order_next_after(void* device_event) { return Status::ok(); }

  // send == recv is allowed (in place) for all_reduce and broadcast.
  virtual std::unique_ptr<CommRequest> start_all_reduce(const void* send, void* recv, size_t count, CommType type,
                                                        ReduceOp op) = 0;
  // send holds size() * recv_count elements; rank r keeps the reduced block r.
  virtual std::unique_ptr<CommRequest> start_reduce_scatter(const void* send, void* recv, size_t recv_count,
                                                            CommType type, ReduceOp op) = 0;
  // recv gets size() * send_count elements, block r from rank r.
  virtual std::unique_ptr<CommRequest> start_all_gather(const void* send, void* recv, size_t send_count,
                                                        CommType type) = 0;
  virtual std::unique_ptr<CommRequest> start_broadcast(void* buffer, size_t count, CommType type, int root) = 0;
  virtual std::unique_ptr<CommRequest> start_barrier() = 0;
  // Several reduce-scatters / all-gathers, each part as start_reduce_scatter / start_all_gather
  // would do it, as one request: ZeRO's multi-unit buckets, each unit reduced or gathered where it
  // lies instead of through a packed copy. NCCL fuses the parts into one group (one launch); the
  // default starts them one after another and waits for all.
  virtual std::unique_ptr<CommRequest> start_reduce_scatter_group(std::span<const CommPart> parts, CommType type,
                                                                  ReduceOp op);
  virtual std::unique_ptr<CommRequest> start_all_gather_group(std::span<const CommPart> parts, CommType type);

  // The ranks of this communicator with the same color, ordered by key (MPI_Comm_split): the
  // sub-groups of a process grid. Collective over this communicator.
  virtual Result<std::unique_ptr<Communicator>> split(int color, int key) {
    return GLM_INTERNAL_ERROR("the ", name(), " communicator cannot be split");
  }

  // Blocking forms: start and wait.
  Status all_reduce(const void* send, void* recv, size_t count, CommType type, ReduceOp op);
  Status reduce_scatter(const void* send, void* recv, size_t recv_count, CommType type, ReduceOp op);
  Status all_gather(const void* send, void* recv, size_t send_count, CommType type);
  Status broadcast(void* buffer, size_t count, CommType type, int root);
  Status barrier();
};

}  // namespace glm
