// bench_comm as CI and users run it, under mpirun: the MPI backend at 2 and 3 ranks (3: sizes that
// do not split evenly), its JSON rows checked for format and consistency with nccl-tests'
// definitions (never for speed); a corrupted result must fail naming collective, size and rank;
// NCCL at 2 ranks where 2 GPUs are visible.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/backend.h"

namespace glm::test {
namespace {

// The JSON holds the doubles bench_comm computed: its definitions hold up to rounding.
constexpr double kRelativeTolerance = 1e-9;

struct RunResult {
  int exit_code = -1;
  std::string output;
};

// bench_comm under mpirun with a hard time limit (a hang shows up as exit code 124).
RunResult run_bench(const std::string& args, int ranks) {
  const std::string cmd = std::string("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 240 ") +
                          GLM_MPIEXEC + " --oversubscribe -np " + std::to_string(ranks) + " " + GLM_BENCH_COMM + " " +
                          args + " 2>&1";
  RunResult r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), buf.size(), pipe) != nullptr) r.output += buf.data();
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string scratch_path(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / "glm_hpc_bench_comm_tests";
  std::filesystem::create_directories(dir);
  const auto path = dir / name;
  std::filesystem::remove(path);
  return path.string();
}

int count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t p = haystack.find(needle); p != std::string::npos; p = haystack.find(needle, p + 1)) ++n;
  return n;
}

void expect_close(double actual, double expected, const std::string& what) {
  EXPECT_LE(std::fabs(actual - expected), kRelativeTolerance * std::fabs(expected)) << what;
}

// Runs a sweep from 1 KiB to max_bytes and checks every row against nccl-tests' definitions.
void sweep_and_check(const std::string& backend, int ranks, size_t max_bytes, const std::string& name) {
  const std::string json_path = scratch_path(name + ".json");
  const RunResult r = run_bench("--backend " + backend + " --dtype both --min_bytes 1K --max_bytes " +
                                    std::to_string(max_bytes) + " --iters 2 --warmup 1 --json " + json_path,
                                ranks);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "# bench_comm: " + backend), 1) << "only rank 0 prints\n" << r.output;
  EXPECT_EQ(count(r.output, "# Avg bus bandwidth"), 1) << r.output;
  EXPECT_EQ(count(r.output, "wrong result"), 0) << r.output;

  std::ifstream in(json_path);
  ASSERT_TRUE(in) << "no JSON file " << json_path;
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j.at("backend"), backend);
  EXPECT_EQ(j.at("world_size"), ranks);
  const auto& rows = j.at("rows");

  struct Collective {
    std::string name, redop;
    double bus_factor;
    bool sharded;
  };
  const double n = ranks;
  const std::vector<Collective> collectives = {{"all_reduce", "sum", 2 * (n - 1) / n, false},
                                               {"reduce_scatter", "sum", (n - 1) / n, true},
                                               {"all_gather", "none", (n - 1) / n, true}};
  const std::vector<std::pair<std::string, size_t>> types = {{"bf16", 2}, {"f32", 4}};
  std::vector<size_t> sizes;
  for (size_t s = 1024; s <= max_bytes; s *= 2) sizes.push_back(s);
  ASSERT_EQ(rows.size(), types.size() * collectives.size() * sizes.size()) << rows.dump(1);

  size_t index = 0;
  double busbw_sum = 0;
  for (const auto& [type, element] : types) {
    for (const Collective& c : collectives) {
      for (size_t nominal : sizes) {
        const auto& row = rows.at(index++);
        const std::string what = row.dump();
        EXPECT_EQ(row.at("collective"), c.name) << what;
        EXPECT_EQ(row.at("type"), type) << what;
        EXPECT_EQ(row.at("redop"), c.redop) << what;
        // size is the full buffer; the sharded collectives round it down to whole elements per rank.
        const size_t count_elements = c.sharded ? nominal / element / ranks * ranks : nominal / element;
        EXPECT_EQ(row.at("count").get<size_t>(), count_elements) << what;
        EXPECT_EQ(row.at("size").get<size_t>(), count_elements * element) << what;
        EXPECT_EQ(row.at("wrong").get<uint64_t>(), 0u) << what;
        const double time_us = row.at("time_us"), algbw = row.at("algbw"), busbw = row.at("busbw");
        EXPECT_GT(time_us, 0) << what;
        EXPECT_GT(algbw, 0) << what;
        EXPECT_GT(busbw, 0) << what;
        expect_close(algbw, static_cast<double>(count_elements * element) / time_us / 1e3, "algbw " + what);
        expect_close(busbw, algbw * c.bus_factor, "busbw " + what);
        busbw_sum += busbw;
      }
    }
  }
  // One table line per row on stdout, from rank 0 only.
  for (const Collective& c : collectives)
    EXPECT_EQ(count(r.output, "  " + c.name + " "), static_cast<int>(sizes.size() * types.size())) << r.output;
  expect_close(j.at("avg_busbw"), busbw_sum / rows.size(), "avg_busbw");
}

TEST(BenchComm, MpiNp2) { sweep_and_check("mpi", 2, 1 << 20, "mpi_np2"); }

TEST(BenchComm, MpiNp3) { sweep_and_check("mpi", 3, 1 << 20, "mpi_np3"); }

TEST(BenchComm, WrongResultFailsNamingRank) {
  const std::string json_path = scratch_path("corrupt.json");
  const RunResult r = run_bench(
      "--backend mpi --dtype bf16 --op reduce_scatter --min_bytes 1K --max_bytes 4K --iters 1 --warmup 0 "
      "--test_corrupt_rank 1 --json " +
          json_path,
      2);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  // reduce_scatter of 512 bf16 over 2 ranks: rank 1 receives 256 elements and element 128 is zeroed.
  EXPECT_EQ(count(r.output,
                  "bench_comm: wrong result: reduce_scatter bf16 size 1024 B (512 elements) on rank 1: 1 "
                  "of 256 received elements wrong, first at element 128: got 0, expected "),
            1)
      << r.output;
  EXPECT_EQ(count(r.output, "on rank 0"), 0) << r.output;
  EXPECT_FALSE(std::filesystem::exists(json_path)) << "no JSON after a wrong result";
}

TEST(BenchComm, BadOptionExits2) {
  const RunResult r = run_bench("--backend mpi --dtype f16", 2);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(count(r.output, "bench_comm: error: --dtype 'f16': use bf16, f32 or both"), 1) << r.output;
}

TEST(BenchCommGpu, NcclNp2) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "NCCL at 2 ranks needs 2 GPUs, " << cuda_device_count() << " visible";
  sweep_and_check("nccl", 2, 16 << 20, "nccl_np2");
}

}  // namespace
}  // namespace glm::test
