// Communicator over host buffers with MPI's non-blocking collectives and a deadline per collective.
#pragma once

#include <mpi.h>

#include "mpi/communicator.h"

namespace glm {

class MpiCommunicator final : public Communicator {
 public:
  // Duplicates comm so that our traffic never matches anybody else's. timeout <= 0 waits forever.
  MpiCommunicator(MPI_Comm comm, std::chrono::duration<double> timeout);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }
  MPI_Comm comm() const { return comm_; }

  std::unique_ptr<CommRequest> start_all_reduce(const void* send, void* recv, size_t count, CommType type,
                                                ReduceOp op) override;
  std::unique_ptr<CommRequest> start_reduce_scatter(const void* send, void* recv, size_t recv_count, CommType type,
                                                    ReduceOp op) override;
  std::unique_ptr<CommRequest> start_all_gather(const void* send, void* recv, size_t send_count,
                                                CommType type) override;
  std::unique_ptr<CommRequest> start_broadcast(void* buffer, size_t count, CommType type, int root) override;
  std::unique_ptr<CommRequest> start_barrier() override;
  Result<std::unique_ptr<Communicator>> split(int color, int key) override;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::chrono::duration<double> timeout_;
};

}  // namespace glm
