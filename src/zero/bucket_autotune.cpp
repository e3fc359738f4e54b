// Measuring and reading bus-bandwidth curves, and picking the knee.
#include "zero/bucket_autotune.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/json_fields.h"
#include "base/input_path.h"

namespace glm {
namespace {

std::string show_bytes(int64_t bytes) {
  char buf[32];
  if (bytes >= (int64_t{1} << 30) && bytes % (int64_t{1} << 30) == 0)
    std::snprintf(buf, sizeof(buf), "%lld GiB", static_cast<long long>(bytes >> 30));
  else if (bytes >= (int64_t{1} << 20))
    std::snprintf(buf, sizeof(buf), "%.4g MiB", static_cast<double>(bytes) / (1 << 20));
  else
    std::snprintf(buf, sizeof(buf), "%.4g KiB", static_cast<double>(bytes) / 1024);
  return buf;
}

}  // namespace

size_t bandwidth_knee(const std::vector<BandwidthPoint>& curve, double fraction) {
  double plateau = 0;
  for (const auto& p : curve) plateau = std::max(plateau, p.busbw);
  for (size_t i = 0; i < curve.size(); ++i)
    if (curve[i].busbw >= fraction * plateau) return i;
  return curve.empty() ? 0 : curve.size() - 1;
}

const char* gradient_collective(int zero_stage) { return zero_stage == 0 ? "all_reduce" : "reduce_scatter"; }

Result<std::vector<BandwidthPoint>> measure_bandwidth_curve(Communicator& data, Communicator& scalars,
                                                            Backend& backend, int zero_stage, DType reduce,
                                                            int64_t min_bytes, int64_t max_bytes) {
  const int world = data.size();
  if (world < 2) return GLM_INTERNAL_ERROR("a bandwidth curve needs at least 2 ranks");
  const int64_t elem = static_cast<int64_t>(dtype_size(reduce));
  const int64_t unit = elem * world;  // every size splits into equal blocks
  const int64_t max_numel = max_bytes / unit * world;
  GLM_ASSIGN_OR_RETURN(Buffer send, backend.allocate(max_numel, reduce));
  GLM_ASSIGN_OR_RETURN(Buffer recv, backend.allocate(max_numel, reduce));
  GLM_RETURN_IF_ERROR(backend.zero(send.tensor()));
  GLM_RETURN_IF_ERROR(backend.synchronize());
  const CommType type = comm_type_of(reduce);
  const bool all_reduce = zero_stage == 0;
  std::vector<BandwidthPoint> curve;
  for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    const int64_t numel = bytes / unit * world;
    if (numel <= 0) continue;
    auto once = [&]() -> Status {
      auto request = all_reduce ? data.start_all_reduce(send.tensor().data, recv.tensor().data,
                                                        static_cast<size_t>(numel), type, ReduceOp::sum)
                                : data.start_reduce_scatter(send.tensor().data, recv.tensor().data,
                                                            static_cast<size_t>(numel / world), type, ReduceOp::sum);
      return request->wait();
    };
    GLM_RETURN_IF_ERROR(once());  // warm-up: connections and algorithm selection
    GLM_RETURN_IF_ERROR(backend.synchronize());
    GLM_RETURN_IF_ERROR(scalars.barrier());
    const int iters = bytes <= (int64_t{64} << 20) ? 5 : 3;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) GLM_RETURN_IF_ERROR(once());
    GLM_RETURN_IF_ERROR(backend.synchronize());  // NCCL's wait() only orders the compute stream
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
    GLM_RETURN_IF_ERROR(scalars.all_reduce(&seconds, &seconds, 1, CommType::f64, ReduceOp::max));
    BandwidthPoint p;
    p.bytes = numel * elem;
    p.time_us = seconds * 1e6;
    const double factor = all_reduce ? 2.0 * (world - 1) / world : static_cast<double>(world - 1) / world;
    p.busbw = seconds > 0 ? static_cast<double>(p.bytes) / seconds / 1e9 * factor : 0.0;
    curve.push_back(p);
  }
  if (curve.empty()) return GLM_INTERNAL_ERROR("no bandwidth measured between ", min_bytes, " and ", max_bytes, " bytes");
  return curve;
}

Result<std::vector<BandwidthPoint>> read_bandwidth_curve(const std::string& path, int zero_stage, DType reduce) {
  GLM_RETURN_IF_ERROR(check_input_path(path).with_context("--comm_profile"));
  std::ifstream in(path);
  if (!in) return GLM_USER_ERROR("--comm_profile '", path, "' cannot be read");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    return GLM_USER_ERROR("--comm_profile '", path, "' is not JSON: ", e.what());
  }
  if (!j.is_object() || !j.contains("rows") || !j["rows"].is_array())
    return GLM_USER_ERROR("--comm_profile '", path, "' has no \"rows\" array (expected bench_comm --json output)");
  GLM_ASSIGN_OR_RETURN(const JsonFields profile, JsonFields::of(j, concat("--comm_profile ", path)));
  GLM_ASSIGN_OR_RETURN(const std::vector<JsonFields> rows, profile.objects("rows"));
  const std::string collective = gradient_collective(zero_stage);
  const std::string type = comm_type_name(comm_type_of(reduce));
  std::vector<BandwidthPoint> curve;
  for (const JsonFields& row : rows) {
    GLM_ASSIGN_OR_RETURN(const std::string row_collective, row.string("collective"));
    GLM_ASSIGN_OR_RETURN(const std::string row_type, row.string("type"));
    if (row_collective != collective || row_type != type) continue;
    BandwidthPoint p;
    GLM_ASSIGN_OR_RETURN(p.bytes, row.integer("size", 1));
    GLM_ASSIGN_OR_RETURN(const int64_t wrong, row.integer_or("wrong", 0, 0));
    if (wrong != 0)
      return GLM_USER_ERROR("--comm_profile '", path, "': a ", collective, " row of ", p.bytes,
                            " bytes has wrong results; measure again");
    GLM_ASSIGN_OR_RETURN(p.time_us, row.number("time_us", 0.0));
    GLM_ASSIGN_OR_RETURN(p.busbw, row.number("busbw", 0.0));
    curve.push_back(p);
  }
  if (curve.empty())
    return GLM_USER_ERROR("--comm_profile '", path, "' has no ", collective, " rows of type ", type,
                          " (run bench_comm with --dtype ", type == "bf16" ? "bf16" : "f32", ")");
  std::sort(curve.begin(), curve.end(), [](const auto& a, const auto& b) { return a.bytes < b.bytes; });
  return curve;
}

BucketChoice choose_reduce_bucket_size(const std::vector<BandwidthPoint>& curve, int zero_stage, DType reduce,
                                       const std::string& source) {
  const size_t knee = bandwidth_knee(curve);
  size_t best = 0;
  for (size_t i = 0; i < curve.size(); ++i)
    if (curve[i].busbw > curve[best].busbw) best = i;
  BucketChoice c;
  c.elements = std::max<int64_t>(1, curve[knee].bytes / static_cast<int64_t>(dtype_size(reduce)));
  char head[512];
  std::snprintf(head, sizeof(head),
                "--reduce_bucket_size auto: %lld elements (%s of %s): %s busbw %.2f GB/s there is the smallest size "
                "reaching %.0f%% of the plateau %.2f GB/s (at %s); %s:",
                static_cast<long long>(c.elements), show_bytes(curve[knee].bytes).c_str(), dtype_name(reduce),
                gradient_collective(zero_stage), curve[knee].busbw, 100 * kKneeFraction, curve[best].busbw,
                show_bytes(curve[best].bytes).c_str(), source.c_str());
  c.explanation = head;
  for (const auto& p : curve) {
    char point[96];
    std::snprintf(point, sizeof(point), " %s %.2f", show_bytes(p.bytes).c_str(), p.busbw);
    c.explanation += point;
  }
  c.explanation += " GB/s";
  return c;
}

}  // namespace glm
