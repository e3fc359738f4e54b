// The collectives bench_comm measures, each a small plug-in of its harness (bench_comm.cpp): the
// element count a size gives, how to start it through the Communicator, nccl-tests' bus-bandwidth
// factor, and the exact result every rank must receive from InputPattern's data.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "benchmarks/comm/pattern.h"
#include "mpi/communicator.h"

namespace glm::bench {

class CollectiveBench {
 public:
  virtual ~CollectiveBench() = default;
  virtual const char* name() const = 0;
  // The reduction, as nccl-tests' redop column prints it ("none" for data movement).
  virtual const char* redop() const = 0;
  // busbw = algbw * bus_factor: what the busiest link of a ring moves, relative to the buffer, so
  // busbw compares with the hardware's link bandwidth whatever the world size (nccl-tests'
  // doc/PERFORMANCE.md).
  virtual double bus_factor(int world) const = 0;
  // The full (unsharded) element count measured for `requested` elements: the sharded collectives
  // round down to a multiple of the world size, as nccl-tests does.
  virtual size_t full_count(size_t requested, int world) const { return requested / world * world; }
  // How many elements this rank receives.
  virtual size_t recv_count(size_t full, int world) const { return full; }
  // Starts the collective over `full` elements; send holds InputPattern data from element 0.
  virtual std::unique_ptr<CommRequest> start(Communicator& comm, const void* send, void* recv, size_t full,
                                             CommType type) const = 0;
  // This rank's received elements (in host memory) against the values they must have.
  virtual Mismatch check(const void* received, CommType type, const InputPattern& pattern, int rank, int world,
                         size_t full, int threads) const = 0;
};

// The names bench_comm accepts, in the order it runs them.
const std::vector<std::string>& collective_names();
// One of collective_names(); null for anything else.
std::unique_ptr<CollectiveBench> make_collective_bench(const std::string& name);

}  // namespace glm::bench
