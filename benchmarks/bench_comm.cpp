// bench_comm: all-reduce, reduce-scatter and all-gather through glm's Communicator (NCCL over GPU
// memory, or MPI over host memory) over a range of sizes, printed in nccl-tests' table convention
// (size, count, type, time, algbw, busbw) with a JSON file of the same rows. Every size's result
// is checked exactly; a wrong one names the collective, size and rank and exits 1.
//
//   mpirun -np 2 bench_comm [--backend nccl|mpi] [--dtype bf16|f32|both] [--min_bytes 1K]
//                           [--max_bytes 4G] [--iters 20] [--warmup 5] [--json FILE]
//
// A plain program, not a Google Benchmark one: Google Benchmark picks each benchmark's iteration
// count from the process's own timings, so ranks would disagree on how many collectives to run and
// deadlock; its warm-up, repetitions and reporters are per process too. Fixed iterations, timing
// that is the maximum over ranks, and output on rank 0 only are what nccl-tests does, and what
// would be left after switching every one of those Google Benchmark features off.
#include <algorithm>
#include <boost/program_options.hpp>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "benchmarks/comm/collectives.h"
#include "benchmarks/comm/pattern.h"
#include "model/backend.h"
#include "mpi/fatal.h"
#include "mpi/mpi_communicator.h"
#include "mpi/nccl_communicator.h"
#include "mpi/runtime.h"

namespace glm::bench {
namespace {

namespace po = boost::program_options;
using Clock = std::chrono::steady_clock;

constexpr size_t kKiB = 1024, kMiB = kKiB * 1024, kGiB = kMiB * 1024;

struct BenchOptions {
  std::string backend = "auto";  // nccl when every rank has a GPU of its own, else mpi
  std::vector<CommType> types;
  std::vector<std::string> collectives;
  size_t min_bytes = kKiB;
  size_t max_bytes = 0;  // 0: 4 GiB with NCCL, 64 MiB with MPI
  int iters = 20;
  int warmup = 5;
  std::string json;
  double collective_timeout = 300;
  int test_corrupt_rank = -1;
};

// "1024", "1K"/"1KiB", "64M"/"64MiB", "4G"/"4GiB" (binary multiples, as nccl-tests reads them).
Result<size_t> parse_bytes(const std::string& option, const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  std::string unit = text.substr(digits);
  if (unit.size() == 3 && unit.substr(1) == "iB") unit = unit.substr(0, 1);
  size_t scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  if (unit == "K" || unit == "k") scale = kKiB;
  if (unit == "M" || unit == "m") scale = kMiB;
  if (unit == "G" || unit == "g") scale = kGiB;
  if (digits == 0 || digits > 12 || scale == 0)
    return GLM_USER_ERROR("--", option, " '", text, "' is not a size: use bytes or a K/M/G (KiB/MiB/GiB) suffix");
  const size_t value = std::stoull(text.substr(0, digits));
  if (value > (size_t{1} << 50) / scale) return GLM_USER_ERROR("--", option, " '", text, "' is too large");
  return value * scale;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) items.push_back(item);
  return items;
}

// Every rank parses the same command line, so every rank reaches the same verdict.
Result<BenchOptions> parse_options(int argc, char** argv, bool* help, std::string* usage) {
  BenchOptions o;
  std::string dtype = "both", ops = "all", min_bytes = "1K", max_bytes;
  po::options_description d("bench_comm options");
  d.add_options()("help", "print this help")(
      "backend", po::value(&o.backend)->default_value(o.backend),
      "nccl (device buffers, one GPU per rank) or mpi (host buffers); auto picks nccl when every rank has a GPU")(
      "dtype", po::value(&dtype)->default_value(dtype), "bf16, f32 or both")(
      "op", po::value(&ops)->default_value(ops),
      "comma-separated among all_reduce, reduce_scatter, all_gather; all for the three")(
      "min_bytes", po::value(&min_bytes)->default_value(min_bytes), "smallest full (unsharded) buffer; K/M/G suffixes")(
      "max_bytes", po::value(&max_bytes),
      "largest full buffer, reached by factors of 2 (default 4G with nccl, 64M with mpi)")(
      "iters", po::value(&o.iters)->default_value(o.iters), "timed iterations per size")(
      "warmup", po::value(&o.warmup)->default_value(o.warmup), "untimed iterations per size before them")(
      "json", po::value(&o.json), "also write the rows to this JSON file (rank 0)")(
      "collective_timeout", po::value(&o.collective_timeout)->default_value(o.collective_timeout),
      "seconds before a stuck collective aborts the job")(
      "test_corrupt_rank", po::value(&o.test_corrupt_rank)->default_value(-1),
      "for the tests: this rank changes one received element before the check, which must then fail");
  std::ostringstream text;
  text << d;
  *usage = text.str();
  try {
    po::variables_map vm;
    po::store(po::command_line_parser(argc, argv).options(d).run(), vm);
    po::notify(vm);
    *help = vm.count("help") > 0;
  } catch (const po::error& e) {
    return GLM_USER_ERROR(e.what());
  }
  if (o.backend != "auto" && o.backend != "nccl" && o.backend != "mpi")
    return GLM_USER_ERROR("--backend '", o.backend, "': use nccl or mpi");
  if (dtype == "bf16" || dtype == "both") o.types.push_back(CommType::bf16);
  if (dtype == "f32" || dtype == "both") o.types.push_back(CommType::f32);
  if (o.types.empty()) return GLM_USER_ERROR("--dtype '", dtype, "': use bf16, f32 or both");
  o.collectives = ops == "all" ? collective_names() : split_list(ops);
  for (const std::string& name : o.collectives)
    if (make_collective_bench(name) == nullptr)
      return GLM_USER_ERROR("--op '", name, "': use all_reduce, reduce_scatter, all_gather or all");
  if (o.collectives.empty()) return GLM_USER_ERROR("--op names no collective");
  GLM_ASSIGN_OR_RETURN(o.min_bytes, parse_bytes("min_bytes", min_bytes));
  if (!max_bytes.empty()) {
    GLM_ASSIGN_OR_RETURN(o.max_bytes, parse_bytes("max_bytes", max_bytes));
  }
  if (o.iters < 1) return GLM_USER_ERROR("--iters must be at least 1");
  if (o.warmup < 0) return GLM_USER_ERROR("--warmup must not be negative");
  return o;
}

// One row of the table and of the JSON file; time is the slowest rank's average per iteration.
struct Row {
  std::string collective;
  size_t bytes = 0;  // the full (unsharded) buffer
  size_t count = 0;  // its elements
  CommType type = CommType::f32;
  std::string redop;
  double time_us = 0;
  double algbw = 0;  // GB/s (1e9 bytes/s): bytes / time
  double busbw = 0;  // GB/s: algbw * the collective's bus factor
  uint64_t wrong = 0;
};

void print_header() {
  std::printf("# %-14s %13s %13s %5s %5s %10s %8s %8s %7s\n", "collective", "size(B)", "count(elem)", "type", "redop",
              "time(us)", "algbw", "busbw", "#wrong");
  std::printf("# %-14s %13s %13s %5s %5s %10s %8s %8s %7s\n", "", "", "", "", "", "", "(GB/s)", "(GB/s)", "");
}

void print_row(const Row& r) {
  std::printf("  %-14s %13zu %13zu %5s %5s %10.2f %8.2f %8.2f %7llu\n", r.collective.c_str(), r.bytes, r.count,
              comm_type_name(r.type), r.redop.c_str(), r.time_us, r.algbw, r.busbw,
              static_cast<unsigned long long>(r.wrong));
  std::fflush(stdout);
}

Status write_json(const std::string& path, const nlohmann::json& j) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out) return GLM_ERROR(ErrorKind::io, "cannot write ", tmp);
    out << j.dump(2) << "\n";
    if (!out) return GLM_ERROR(ErrorKind::io, "error writing ", tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);  // never a half-written file under the final name
  if (ec) return GLM_ERROR(ErrorKind::io, "cannot rename ", tmp, " to ", path, ": ", ec.message());
  return Status::ok();
}

void mpi_check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) GLM_FATAL(what, " failed");
}

DType dtype_of(CommType type) { return type == CommType::bf16 ? DType::bf16 : DType::f32; }

// The sweep on one rank: the backend owning the buffers, the communicator, and the rows so far.
class CommBench {
 public:
  CommBench(const BenchOptions& options, const ProcessInfo& info, Backend& backend, Communicator& comm)
      : o_(options), info_(info), backend_(backend), comm_(comm), pattern_(info.world_size) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    threads_ = std::max(1, static_cast<int>(cores) / std::max(1, info.local_size));
  }

  Status allocate() {
    const int64_t words = static_cast<int64_t>((o_.max_bytes + 3) / 4);
    GLM_ASSIGN_OR_RETURN(send_, backend_.allocate(words, DType::f32));
    GLM_ASSIGN_OR_RETURN(recv_, backend_.allocate(words, DType::f32));
    host_ = std::make_unique_for_overwrite<uint8_t[]>(static_cast<size_t>(words) * 4);
    return Status::ok();
  }

  // Every rank runs the same collectives in the same order; returns 1 on the first wrong result.
  int run() {
    if (info_.rank == 0) print_header();
    for (CommType type : o_.types) {
      // Rank r's send buffer holds pattern(r, i) for every i: each collective reads a prefix.
      const size_t max_count = o_.max_bytes / comm_type_size(type);
      fill_elements(host_.get(), type, max_count, threads_, [&](size_t i) { return pattern_.value(info_.rank, i); });
      GLM_CHECK_OK(
          backend_.upload(Tensor{send_.tensor().data, static_cast<int64_t>(max_count), dtype_of(type)}, host_.get()));
      for (const std::string& name : o_.collectives) {
        const auto collective = make_collective_bench(name);
        for (size_t bytes = o_.min_bytes; bytes <= o_.max_bytes; bytes *= 2) {
          Row row = measure(*collective, type, bytes / comm_type_size(type));
          rows_.push_back(row);
          if (info_.rank == 0) print_row(row);
          if (row.wrong != 0) return 1;
        }
      }
    }
    if (info_.rank == 0) {
      double sum = 0;
      for (const Row& r : rows_) sum += r.busbw;
      std::printf("# Avg bus bandwidth    : %.4f GB/s (mean busbw of %zu rows)\n",
                  rows_.empty() ? 0.0 : sum / rows_.size(), rows_.size());
      std::fflush(stdout);
    }
    return 0;
  }

  nlohmann::json json() const {
    nlohmann::json rows = nlohmann::json::array();
    double sum = 0;
    for (const Row& r : rows_) {
      rows.push_back({{"collective", r.collective},
                      {"size", r.bytes},
                      {"count", r.count},
                      {"type", comm_type_name(r.type)},
                      {"redop", r.redop},
                      {"time_us", r.time_us},
                      {"algbw", r.algbw},
                      {"busbw", r.busbw},
                      {"wrong", r.wrong}});
      sum += r.busbw;
    }
    return {{"tool", "bench_comm"},
            {"backend", comm_.name()},
            {"world_size", info_.world_size},
            {"iters", o_.iters},
            {"warmup", o_.warmup},
            {"in_place", false},
            {"bandwidth_unit", "GB/s (1e9 bytes/s)"},
            {"rows", rows},
            {"avg_busbw", rows_.empty() ? 0.0 : sum / rows_.size()}};
  }

 private:
  // Warm-up, then the timed iterations between two synchronisations (NCCL's wait() only orders
  // the compute stream, so the backend's synchronize() is what waits for the device), then the
  // check of what the last timed iteration left in the receive buffer.
  Row measure(const CollectiveBench& collective, CommType type, size_t requested) {
    const int world = info_.world_size;
    const size_t full = collective.full_count(requested, world);
    const size_t received = collective.recv_count(full, world);
    const size_t element = comm_type_size(type);
    const Tensor recv{recv_.tensor().data, static_cast<int64_t>(received), dtype_of(type)};
    auto once = [&] { GLM_CHECK_OK(collective.start(comm_, send_.tensor().data, recv.data, full, type)->wait()); };

    for (int i = 0; i < o_.warmup; ++i) once();
    GLM_CHECK_OK(backend_.zero(recv));  // the pattern has no zeros: a collective that wrote nothing fails
    GLM_CHECK_OK(backend_.synchronize());
    mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    const auto start = Clock::now();
    for (int i = 0; i < o_.iters; ++i) once();
    GLM_CHECK_OK(backend_.synchronize());
    double seconds = std::chrono::duration<double>(Clock::now() - start).count() / o_.iters;
    mpi_check(MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
    // Drops the per-collective events NCCL keeps for exposed-time accounting (the trainer's, not ours).
    GLM_CHECK_OK(comm_.take_device_exposed_seconds().status());

    GLM_CHECK_OK(backend_.download(host_.get(), recv));
    if (info_.rank == o_.test_corrupt_rank) {
      // Zero is never a correct value (see InputPattern).
      std::fill_n(host_.get() + received / 2 * element, element, uint8_t{0});
    }
    const Mismatch mismatch = collective.check(host_.get(), type, pattern_, info_.rank, world, full, threads_);

    Row row;
    row.collective = collective.name();
    row.bytes = full * element;
    row.count = full;
    row.type = type;
    row.redop = collective.redop();
    row.time_us = seconds * 1e6;
    row.algbw = static_cast<double>(row.bytes) / seconds / 1e9;
    row.busbw = row.algbw * collective.bus_factor(world);
    row.wrong = mismatch.wrong;
    mpi_check(MPI_Allreduce(MPI_IN_PLACE, &row.wrong, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
    if (row.wrong != 0) report_wrong(row, mismatch, received);
    return row;
  }

  // Rank 0 prints, for every rank that received wrong elements, how many and the first one.
  void report_wrong(const Row& row, const Mismatch& mine, size_t received) {
    const double local[4] = {static_cast<double>(mine.wrong), static_cast<double>(mine.first_index), mine.got,
                             mine.expected};
    std::vector<double> all(4 * static_cast<size_t>(info_.world_size));
    mpi_check(MPI_Gather(local, 4, MPI_DOUBLE, all.data(), 4, MPI_DOUBLE, 0, MPI_COMM_WORLD), "MPI_Gather");
    if (info_.rank != 0) return;
    for (int r = 0; r < info_.world_size; ++r) {
      const double* m = &all[4 * static_cast<size_t>(r)];
      if (m[0] == 0) continue;
      std::fprintf(stderr,
                   "bench_comm: wrong result: %s %s size %zu B (%zu elements) on rank %d: %.0f of %zu received "
                   "elements wrong, first at element %.0f: got %g, expected %g\n",
                   row.collective.c_str(), comm_type_name(row.type), row.bytes, row.count, r, m[0], received, m[1],
                   m[2], m[3]);
    }
    std::fflush(stderr);
  }

  const BenchOptions& o_;
  const ProcessInfo& info_;
  Backend& backend_;
  Communicator& comm_;
  InputPattern pattern_;
  int threads_ = 1;
  Buffer send_, recv_;
  std::unique_ptr<uint8_t[]> host_;  // staging for uploads and checks
  std::vector<Row> rows_;
};

// Whether every rank can run NCCL on a GPU of its own (all ranks agree), and if not, why.
std::string nccl_unavailable_reason(const ProcessInfo& info) {
  std::string reason;
#ifndef GLM_HAVE_NCCL
  reason = "this build has no NCCL";
#else
  const int gpus = cuda_device_count();
  if (gpus < info.local_size)
    reason = concat(info.local_size, " ranks on ", info.host, " need a GPU each, ", gpus, " visible");
#endif
  int ok = reason.empty() ? 1 : 0;
  mpi_check(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD), "MPI_Allreduce");
  if (ok == 0 && reason.empty()) reason = "another host has fewer GPUs than ranks";
  return ok == 1 ? std::string() : reason;
}

void print_setup(const BenchOptions& o, const ProcessInfo& info, const std::string& backend) {
  char host[64] = {0};
  std::snprintf(host, sizeof(host), "%s", info.host.c_str());
  std::vector<char> hosts(sizeof(host) * static_cast<size_t>(info.world_size));
  mpi_check(MPI_Gather(host, sizeof(host), MPI_CHAR, hosts.data(), sizeof(host), MPI_CHAR, 0, MPI_COMM_WORLD),
            "MPI_Gather");
  int local_ranks[1] = {info.local_rank};
  std::vector<int> locals(static_cast<size_t>(info.world_size));
  mpi_check(MPI_Gather(local_ranks, 1, MPI_INT, locals.data(), 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Gather");
  if (info.rank != 0) return;
  std::string types;
  for (CommType t : o.types) types += std::string(types.empty() ? "" : ",") + comm_type_name(t);
  std::printf(
      "# bench_comm: %s through glm::Communicator, %d ranks, %s, %zu..%zu B by factors of 2, iters %d, "
      "warmup %d, out of place\n",
      backend.c_str(), info.world_size, types.c_str(), o.min_bytes, o.max_bytes, o.iters, o.warmup);
  for (int r = 0; r < info.world_size; ++r) {
    std::printf("#   rank %d: %s", r, &hosts[sizeof(host) * static_cast<size_t>(r)]);
    if (backend == "nccl") std::printf(", device %d", locals[static_cast<size_t>(r)]);
    std::printf("\n");
  }
  std::fflush(stdout);
}

// Prints an agreed failure once (on the lowest failing rank) and gives every rank its exit code.
int agreed_exit(const Status& local) {
  const AgreedStatus agreed = agree_on_status(local, MPI_COMM_WORLD);
  if (agreed.status.is_ok()) return 0;
  if (agreed.report_here) std::fprintf(stderr, "bench_comm: error: %s\n", agreed.status.message().c_str());
  return agreed.status.exit_code();
}

int run(const ProcessInfo& info, int argc, char** argv) {
  bool help = false;
  std::string usage;
  Result<BenchOptions> parsed = parse_options(argc, argv, &help, &usage);
  if (help) {
    if (info.rank == 0) std::printf("%s", usage.c_str());
    return 0;
  }
  if (int code = agreed_exit(parsed.status()); code != 0) return code;
  BenchOptions o = parsed.take();

  const std::string unavailable = nccl_unavailable_reason(info);
  if (o.backend == "auto") o.backend = unavailable.empty() ? "nccl" : "mpi";
  if (o.backend == "nccl" && !unavailable.empty())
    return agreed_exit(GLM_USER_ERROR("--backend nccl unavailable: ", unavailable));
  if (o.max_bytes == 0) o.max_bytes = o.backend == "nccl" ? 4 * kGiB : 64 * kMiB;
  Status valid;
  // Every rank's block of a sharded collective must hold at least one element of the widest type.
  if (o.min_bytes < 4 * static_cast<size_t>(info.world_size))
    valid = GLM_USER_ERROR("--min_bytes ", o.min_bytes, " is too small for ", info.world_size,
                           " ranks: at least 4 bytes per rank");
  else if (o.min_bytes > o.max_bytes)
    valid = GLM_USER_ERROR("--min_bytes ", o.min_bytes, " exceeds --max_bytes ", o.max_bytes);
  else if (info.world_size > InputPattern::kMaxWorldSize)
    valid = GLM_USER_ERROR("the exact-sum check supports at most ", InputPattern::kMaxWorldSize, " ranks");
  if (int code = agreed_exit(valid); code != 0) return code;

  // The backend owns the buffers; NCCL orders its collectives after the backend's stream.
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Communicator> comm;
  const auto timeout = std::chrono::duration<double>(o.collective_timeout);
  if (o.backend == "nccl") {
    auto cuda = make_cuda_backend(info.local_rank);
    if (int code = agreed_exit(cuda.status()); code != 0) return code;
    backend = cuda.take();
    // Collective: every rank calls it, and all go on only if every rank has its communicator.
    auto nccl = make_nccl_communicator(MPI_COMM_WORLD, info.local_rank, backend->native_stream(), timeout);
    if (int code = agreed_exit(nccl.status()); code != 0) return code;
    comm = nccl.take();
  } else {
    backend = make_cpu_backend(DType::f32);
    comm = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, timeout);
  }

  print_setup(o, info, o.backend);
  CommBench bench(o, info, *backend, *comm);
  if (int code = agreed_exit(bench.allocate()); code != 0) return code;
  if (bench.run() != 0) return 1;  // every rank saw the same summed wrong count
  Status written;
  if (info.rank == 0 && !o.json.empty()) written = write_json(o.json, bench.json());
  return agreed_exit(written);
}

}  // namespace
}  // namespace glm::bench

int main(int argc, char** argv) {
  glm::MpiRuntime runtime(&argc, &argv);
  // run() returns before MPI_Finalize, so communicators and buffers are gone by then.
  return glm::bench::run(runtime.info(), argc, argv);
}
