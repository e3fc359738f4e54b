// MPI implementation of the Communicator: non-blocking collectives polled against a deadline.
#include "mpi/mpi_communicator.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "mpi/fatal.h"

namespace glm {

CommType comm_type_of(DType dtype) {
  return dtype == DType::bf16 ? CommType::bf16 : dtype == DType::f64 ? CommType::f64 : CommType::f32;
}

size_t comm_type_size(CommType type) {
  switch (type) {
    case CommType::f32:
      return 4;
    case CommType::f64:
      return 8;
    case CommType::bf16:
      return 2;
    case CommType::i32:
      return 4;
    case CommType::i64:
      return 8;
    case CommType::u8:
      return 1;
  }
  return 0;
}

const char* comm_type_name(CommType type) {
  switch (type) {
    case CommType::f32:
      return "f32";
    case CommType::f64:
      return "f64";
    case CommType::bf16:
      return "bf16";
    case CommType::i32:
      return "i32";
    case CommType::i64:
      return "i64";
    case CommType::u8:
      return "u8";
  }
  return "?";
}

Status Communicator::all_reduce(const void* send, void* recv, size_t count, CommType type, ReduceOp op) {
  return start_all_reduce(send, recv, count, type, op)->wait();
}
Status Communicator::reduce_scatter(const void* send, void* recv, size_t recv_count, CommType type, ReduceOp op) {
  return start_reduce_scatter(send, recv, recv_count, type, op)->wait();
}
Status Communicator::all_gather(const void* send, void* recv, size_t send_count, CommType type) {
  return start_all_gather(send, recv, send_count, type)->wait();
}
Status Communicator::broadcast(void* buffer, size_t count, CommType type, int root) {
  return start_broadcast(buffer, count, type, root)->wait();
}
Status Communicator::barrier() { return start_barrier()->wait(); }

namespace {
// The default grouped collective: its parts' requests, waited in order; the first error wins (every
// part is still waited, so nothing is left in flight).
class RequestGroup final : public CommRequest {
 public:
  explicit RequestGroup(std::vector<std::unique_ptr<CommRequest>> parts) : parts_(std::move(parts)) {}
  Status wait() override {
    Status first = Status::ok();
    for (auto& p : parts_) {
      Status s = p->wait();
      if (first.is_ok() && !s.is_ok()) first = std::move(s);
    }
    parts_.clear();
    return first;
  }

 private:
  std::vector<std::unique_ptr<CommRequest>> parts_;
};
}  // namespace

std::unique_ptr<CommRequest> Communicator::start_reduce_scatter_group(std::span<const CommPart> parts, CommType type,
                                                                      ReduceOp op) {
  std::vector<std::unique_ptr<CommRequest>> requests;
  for (const CommPart& p : parts) requests.push_back(start_reduce_scatter(p.send, p.recv, p.count, type, op));
  return std::make_unique<RequestGroup>(std::move(requests));
}

std::unique_ptr<CommRequest> Communicator::start_all_gather_group(std::span<const CommPart> parts, CommType type) {
  std::vector<std::unique_ptr<CommRequest>> requests;
  for (const CommPart& p : parts) requests.push_back(start_all_gather(p.send, p.recv, p.count, type));
  return std::make_unique<RequestGroup>(std::move(requests));
}

namespace {

float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
uint16_t float_to_bf16(float f) {  // round to nearest even; NaN stays NaN
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// MPI has no bf16: reduce 16-bit words through float.
void bf16_reduce(void* in, void* inout, int* len, MPI_Datatype*, int which) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    float x = bf16_to_float(a[i]), y = bf16_to_float(b[i]);
    float r = which == 0 ? x + y : (which == 1 ? std::max(x, y) : std::min(x, y));
    b[i] = float_to_bf16(r);
  }
}
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype* t) { bf16_reduce(in, inout, len, t, 0); }
void bf16_max(void* in, void* inout, int* len, MPI_Datatype* t) { bf16_reduce(in, inout, len, t, 1); }
void bf16_min(void* in, void* inout, int* len, MPI_Datatype* t) { bf16_reduce(in, inout, len, t, 2); }

MPI_Datatype mpi_type(CommType type) {
  switch (type) {
    case CommType::f32:
      return MPI_FLOAT;
    case CommType::f64:
      return MPI_DOUBLE;
    case CommType::bf16:
      return MPI_UINT16_T;
    case CommType::i32:
      return MPI_INT32_T;
    case CommType::i64:
      return MPI_INT64_T;
    case CommType::u8:
      return MPI_UINT8_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(ReduceOp op, CommType type) {
  if (type == CommType::bf16) {
    static MPI_Op ops[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
    int index = op == ReduceOp::sum ? 0 : (op == ReduceOp::max ? 1 : 2);
    if (ops[index] == MPI_OP_NULL) {
      MPI_User_function* fns[3] = {bf16_sum, bf16_max, bf16_min};
      MPI_Op_create(fns[index], 1, &ops[index]);
    }
    return ops[index];
  }
  switch (op) {
    case ReduceOp::sum:
      return MPI_SUM;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
  }
  return MPI_OP_NULL;
}

std::string mpi_error_string(int rc) {
  char msg[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return msg;
}

class MpiRequest final : public CommRequest {
 public:
  MpiRequest(std::string what, std::chrono::duration<double> timeout) : what_(std::move(what)), timeout_(timeout) {}
  ~MpiRequest() override {
    // A request dropped without wait() would leave MPI writing into freed memory later.
    if (!requests_.empty() && !waited_) {
      Status s = wait();
      if (!s.is_ok()) fatal_status(s);
    }
  }
  void add(MPI_Request r) { requests_.push_back(r); }
  void fail(Status s) {
    if (failure_.is_ok()) failure_ = std::move(s);
  }

  Status wait() override {
    waited_ = true;
    if (!failure_.is_ok()) {
      // Requests started before the failure must still complete before buffers can be reused.
      if (!requests_.empty()) MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
      requests_.clear();
      return failure_;
    }
    if (requests_.empty()) return Status::ok();
    auto start = std::chrono::steady_clock::now();
    int64_t polls = 0;
    while (true) {
      int done = 0;
      int rc = MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS) {
        requests_.clear();
        return GLM_ERROR(ErrorKind::comm, what_, " failed: ", mpi_error_string(rc));
      }
      if (done) {
        requests_.clear();
        return Status::ok();
      }
      ++polls;
      // Poll hard briefly, then back off: ranks may share cores (mpirun --oversubscribe).
      if (polls > 64) std::this_thread::sleep_for(std::chrono::microseconds(std::min<int64_t>(polls, 500)));
      if (timeout_.count() > 0 && (polls & 63) == 0 && std::chrono::steady_clock::now() - start > timeout_) {
        requests_.clear();  // never freed: MPI state is undefined now, the caller aborts the job
        return GLM_ERROR(ErrorKind::comm, what_, " did not complete within ", timeout_.count(),
                         " s (collective timeout): a peer rank died or is stuck");
      }
    }
  }

 private:
  std::string what_;
  std::chrono::duration<double> timeout_;
  std::vector<MPI_Request> requests_;
  Status failure_;
  bool waited_ = false;
};

constexpr size_t kMaxMpiCount = static_cast<size_t>(INT_MAX);

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::chrono::duration<double> timeout) : timeout_(timeout) {
  if (MPI_Comm_dup(comm, &comm_) != MPI_SUCCESS) GLM_FATAL("MPI_Comm_dup failed");
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

Result<std::unique_ptr<Communicator>> MpiCommunicator::split(int color, int key) {
  MPI_Comm part = MPI_COMM_NULL;
  if (MPI_Comm_split(comm_, color, key, &part) != MPI_SUCCESS)
    return GLM_ERROR(ErrorKind::internal, "MPI_Comm_split of ", size_, " ranks failed");
  auto out = std::make_unique<MpiCommunicator>(part, timeout_);  // duplicates it
  MPI_Comm_free(&part);
  return std::unique_ptr<Communicator>(std::move(out));
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

std::unique_ptr<CommRequest> MpiCommunicator::start_all_reduce(const void* send, void* recv, size_t count,
                                                               CommType type, ReduceOp op) {
  auto req = std::make_unique<MpiRequest>(concat("all_reduce(", count, " x ", comm_type_name(type), ")"), timeout_);
  const size_t elem = comm_type_size(type);
  // Chunks keep every MPI count below 2^31.
  for (size_t offset = 0; offset < count; offset += kMaxMpiCount) {
    size_t n = std::min(kMaxMpiCount, count - offset);
    void* r = static_cast<char*>(recv) + offset * elem;
    const void* s = send == recv ? MPI_IN_PLACE : static_cast<const char*>(send) + offset * elem;
    MPI_Request mr;
    int rc = MPI_Iallreduce(s, r, static_cast<int>(n), mpi_type(type), mpi_op(op, type), comm_, &mr);
    if (rc != MPI_SUCCESS) {
      req->fail(GLM_ERROR(ErrorKind::comm, "MPI_Iallreduce failed: ", mpi_error_string(rc)));
      break;
    }
    req->add(mr);
  }
  return req;
}

std::unique_ptr<CommRequest> MpiCommunicator::start_reduce_scatter(const void* send, void* recv, size_t recv_count,
                                                                   CommType type, ReduceOp op) {
  auto req =
      std::make_unique<MpiRequest>(concat("reduce_scatter(", recv_count, " x ", comm_type_name(type), ")"), timeout_);
  if (recv_count > kMaxMpiCount) {
    req->fail(GLM_ERROR(ErrorKind::internal, "reduce_scatter block of ", recv_count,
                        " elements exceeds MPI's 2^31 count limit; use smaller buckets"));
    return req;
  }
  MPI_Request mr;
  int rc = MPI_Ireduce_scatter_block(send == recv ? MPI_IN_PLACE : send, recv, static_cast<int>(recv_count),
                                     mpi_type(type), mpi_op(op, type), comm_, &mr);
  if (rc != MPI_SUCCESS)
    req->fail(GLM_ERROR(ErrorKind::comm, "MPI_Ireduce_scatter_block failed: ", mpi_error_string(rc)));
  else
    req->add(mr);
  return req;
}

std::unique_ptr<CommRequest> MpiCommunicator::start_all_gather(const void* send, void* recv, size_t send_count,
                                                               CommType type) {
  auto req =
      std::make_unique<MpiRequest>(concat("all_gather(", send_count, " x ", comm_type_name(type), ")"), timeout_);
  if (send_count > kMaxMpiCount) {
    req->fail(GLM_ERROR(ErrorKind::internal, "all_gather block of ", send_count,
                        " elements exceeds MPI's 2^31 count limit; use smaller buckets"));
    return req;
  }
  // In place when send already sits at this rank's block of recv.
  const size_t elem = comm_type_size(type);
  const void* s =
      send == static_cast<const char*>(recv) + static_cast<size_t>(rank_) * send_count * elem ? MPI_IN_PLACE : send;
  MPI_Request mr;
  int rc = MPI_Iallgather(s, static_cast<int>(send_count), mpi_type(type), recv, static_cast<int>(send_count),
                          mpi_type(type), comm_, &mr);
  if (rc != MPI_SUCCESS)
    req->fail(GLM_ERROR(ErrorKind::comm, "MPI_Iallgather failed: ", mpi_error_string(rc)));
  else
    req->add(mr);
  return req;
}

std::unique_ptr<CommRequest> MpiCommunicator::start_broadcast(void* buffer, size_t count, CommType type, int root) {
  auto req = std::make_unique<MpiRequest>(concat("broadcast(", count, " x ", comm_type_name(type), ")"), timeout_);
  const size_t elem = comm_type_size(type);
  for (size_t offset = 0; offset < count; offset += kMaxMpiCount) {
    size_t n = std::min(kMaxMpiCount, count - offset);
    MPI_Request mr;
    int rc =
        MPI_Ibcast(static_cast<char*>(buffer) + offset * elem, static_cast<int>(n), mpi_type(type), root, comm_, &mr);
    if (rc != MPI_SUCCESS) {
      req->fail(GLM_ERROR(ErrorKind::comm, "MPI_Ibcast failed: ", mpi_error_string(rc)));
      break;
    }
    req->add(mr);
  }
  return req;
}

std::unique_ptr<CommRequest> MpiCommunicator::start_barrier() {
  auto req = std::make_unique<MpiRequest>("barrier", timeout_);
  MPI_Request mr;
  int rc = MPI_Ibarrier(comm_, &mr);
  if (rc != MPI_SUCCESS)
    req->fail(GLM_ERROR(ErrorKind::comm, "MPI_Ibarrier failed: ", mpi_error_string(rc)));
  else
    req->add(mr);
  return req;
}

}  // namespace glm
