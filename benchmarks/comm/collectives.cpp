// All-reduce, reduce-scatter and all-gather for bench_comm (see collectives.h). Every one sums or
// moves InputPattern data, so the expected value of each received element is known exactly.
#include "benchmarks/comm/collectives.h"

namespace glm::bench {
namespace {

// sum over ranks of pattern.value(q, i): at most 256, exact in bf16.
uint32_t sum_over_ranks(const InputPattern& pattern, int world, size_t i) {
  uint32_t sum = 0;
  for (int q = 0; q < world; ++q) sum += pattern.value(q, i);
  return sum;
}

class AllReduceBench final : public CollectiveBench {
 public:
  const char* name() const override { return "all_reduce"; }
  const char* redop() const override { return "sum"; }
  double bus_factor(int world) const override { return 2.0 * (world - 1) / world; }
  size_t full_count(size_t requested, int) const override { return requested; }
  std::unique_ptr<CommRequest> start(Communicator& comm, const void* send, void* recv, size_t full,
                                     CommType type) const override {
    return comm.start_all_reduce(send, recv, full, type, ReduceOp::sum);
  }
  Mismatch check(const void* received, CommType type, const InputPattern& pattern, int, int world, size_t full,
                 int threads) const override {
    return count_mismatches(received, type, full, threads, [&](size_t i) { return sum_over_ranks(pattern, world, i); });
  }
};

class ReduceScatterBench final : public CollectiveBench {
 public:
  const char* name() const override { return "reduce_scatter"; }
  const char* redop() const override { return "sum"; }
  double bus_factor(int world) const override { return static_cast<double>(world - 1) / world; }
  size_t recv_count(size_t full, int world) const override { return full / world; }
  std::unique_ptr<CommRequest> start(Communicator& comm, const void* send, void* recv, size_t full,
                                     CommType type) const override {
    return comm.start_reduce_scatter(send, recv, full / comm.size(), type, ReduceOp::sum);
  }
  // Rank r keeps the reduced block r of the full buffer.
  Mismatch check(const void* received, CommType type, const InputPattern& pattern, int rank, int world, size_t full,
                 int threads) const override {
    const size_t block = full / world, offset = static_cast<size_t>(rank) * block;
    return count_mismatches(received, type, block, threads,
                            [&](size_t j) { return sum_over_ranks(pattern, world, offset + j); });
  }
};

class AllGatherBench final : public CollectiveBench {
 public:
  const char* name() const override { return "all_gather"; }
  const char* redop() const override { return "none"; }
  double bus_factor(int world) const override { return static_cast<double>(world - 1) / world; }
  std::unique_ptr<CommRequest> start(Communicator& comm, const void* send, void* recv, size_t full,
                                     CommType type) const override {
    return comm.start_all_gather(send, recv, full / comm.size(), type);
  }
  // Block q of the result is rank q's first full/world send elements.
  Mismatch check(const void* received, CommType type, const InputPattern& pattern, int, int world, size_t full,
                 int threads) const override {
    const size_t block = full / world, element = comm_type_size(type);
    Mismatch total;
    for (int q = 0; q < world; ++q) {
      const void* block_data = static_cast<const char*>(received) + static_cast<size_t>(q) * block * element;
      Mismatch m = count_mismatches(block_data, type, block, threads, [&](size_t j) { return pattern.value(q, j); });
      if (m.wrong == 0) continue;
      if (total.wrong == 0) {
        total = m;
        total.first_index += static_cast<size_t>(q) * block;
      } else {
        total.wrong += m.wrong;
      }
    }
    return total;
  }
};

}  // namespace

const std::vector<std::string>& collective_names() {
  static const std::vector<std::string> names = {"all_reduce", "reduce_scatter", "all_gather"};
  return names;
}

std::unique_ptr<CollectiveBench> make_collective_bench(const std::string& name) {
  if (name == "all_reduce") return std::make_unique<AllReduceBench>();
  if (name == "reduce_scatter") return std::make_unique<ReduceScatterBench>();
  if (name == "all_gather") return std::make_unique<AllGatherBench>();
  return nullptr;
}

}  // namespace glm::bench
