// A Communicator of one process that needs no MPI (single-process tools and tests).
#pragma once

#include <cstring>

#include "mpi/communicator.h"

namespace glm {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "local"; }
  std::unique_ptr<CommRequest> start_all_reduce(const void* send, void* recv, size_t count, CommType type,
                                                ReduceOp) override {
    return copy(send, recv, count * comm_type_size(type));
  }
  std::unique_ptr<CommRequest> start_reduce_scatter(const void* send, void* recv, size_t recv_count, CommType type,
                                                    ReduceOp) override {
    return copy(send, recv, recv_count * comm_type_size(type));
  }
  std::unique_ptr<CommRequest> start_all_gather(const void* send, void* recv, size_t send_count,
                                                CommType type) override {
    return copy(send, recv, send_count * comm_type_size(type));
  }
  std::unique_ptr<CommRequest> start_broadcast(void*, size_t, CommType, int) override { return done(); }
  std::unique_ptr<CommRequest> start_barrier() override { return done(); }
  Result<std::unique_ptr<Communicator>> split(int, int) override {
    return std::unique_ptr<Communicator>(std::make_unique<LocalCommunicator>());
  }

 private:
  struct Done final : CommRequest {
    Status wait() override { return Status::ok(); }
  };
  static std::unique_ptr<CommRequest> done() { return std::make_unique<Done>(); }
  static std::unique_ptr<CommRequest> copy(const void* send, void* recv, size_t bytes) {
    if (send != recv) std::memmove(recv, send, bytes);
    return done();
  }
};

}  // namespace glm
