// Console and jsonl metrics.
#include "train/metrics_logger.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <nlohmann/json.hpp>
#include <system_error>

#include "base/json_text.h"
#include "io/durable_file.h"
#include "io/tensorboard.h"

namespace glm {

namespace {

// GpuHealth's numbers, their logging.jsonl keys and the console's units.
struct HealthField {
  const char* key;
  double GpuHealth::*value;
  const char* unit;
};
constexpr HealthField kHealthFields[] = {{"gpu_util", &GpuHealth::utilization, "%"},
                                         {"gpu_mem_util", &GpuHealth::memory_utilization, nullptr},
                                         {"gpu_power_w", &GpuHealth::power_watts, " W"},
                                         {"gpu_temp_c", &GpuHealth::temperature_c, " C"},
                                         {"gpu_sm_clock_mhz", &GpuHealth::sm_clock_mhz, " MHz"},
                                         {"gpu_mem_clock_mhz", &GpuHealth::memory_clock_mhz, nullptr}};

// " | gpu 97% 650 W 61 C 1980 MHz" (one rank) or the range over the ranks ("95-99%"), and
// " | slowest rank R +P%" (its busy time over the median rank's) with several ranks.
std::string ranks_text(const RanksReport& r) {
  std::string text;
  if (!r.gpus.empty()) {
    text = " | gpu";
    for (const HealthField& f : kHealthFields) {
      if (f.unit == nullptr) continue;
      double lo = INFINITY, hi = -INFINITY;
      for (const GpuHealth& g : r.gpus)
        if (g.*f.value >= 0) lo = std::min(lo, g.*f.value), hi = std::max(hi, g.*f.value);
      if (hi < 0) continue;
      text += lo == hi ? concat(" ", std::lround(hi), f.unit) : concat(" ", std::lround(lo), "-", std::lround(hi), f.unit);
    }
  }
  if (r.busy_seconds.size() > 1 && r.median_seconds > 0) {
    char slowest[64];
    std::snprintf(slowest, sizeof(slowest), " | slowest rank %d %+.0f%%", r.slowest_rank,
                  100.0 * (r.slowest_seconds / r.median_seconds - 1.0));
    text += slowest;
  }
  return text;
}

// The per-rank numbers of a step record: gpu_* arrays by rank (null where NVML could not say), and
// the slowest rank's busy time against the median.
void add_ranks(nlohmann::json& j, const RanksReport& r) {
  for (const HealthField& f : kHealthFields) {
    if (r.gpus.empty()) break;
    nlohmann::json values = nlohmann::json::array();
    for (const GpuHealth& g : r.gpus) values.push_back(g.*f.value >= 0 ? nlohmann::json(g.*f.value) : nlohmann::json());
    j[f.key] = std::move(values);
  }
  if (!r.straggler.empty()) j["straggler"] = r.straggler;
  if (r.busy_seconds.size() > 1) {
    j["slowest_rank"] = r.slowest_rank;
    j["slowest_busy_seconds"] = r.slowest_seconds;
    j["median_busy_seconds"] = r.median_seconds;
  }
}

}  // namespace

Result<MetricsLogger> MetricsLogger::open(const std::string& output_dir, bool enabled, bool tensorboard) {
  MetricsLogger logger;
  logger.enabled_ = enabled;
  if (enabled && !output_dir.empty()) {
    logger.path_ = output_dir + "/logging.jsonl";
    logger.args_path_ = output_dir + "/args.json";
    if (tensorboard) logger.tensorboard_dir_ = output_dir + "/runs";
  }
  return logger;
}

Status MetricsLogger::begin(int64_t resumed_step) {
  GLM_RETURN_IF_ERROR(begin_jsonl(resumed_step));
  if (tensorboard_dir_.empty() || tensorboard_) return Status::ok();
  GLM_ASSIGN_OR_RETURN(tensorboard_, TensorBoardWriter::open(tensorboard_dir_, resumed_step));
  if (resumed_step > 0) return Status::ok();
  // The run's options, as args.json holds them, on the text dashboard.
  std::ifstream args(args_path_);
  if (!args) return Status::ok();
  const std::string text((std::istreambuf_iterator<char>(args)), std::istreambuf_iterator<char>());
  GLM_RETURN_IF_ERROR(tensorboard_->text("args", 0, "```json\n" + text + "\n```"));
  return tensorboard_->flush();
}

Status MetricsLogger::begin_jsonl(int64_t resumed_step) {
  if (path_.empty() || jsonl_.is_open()) return Status::ok();
  if (resumed_step > 0) {
    // Keep what was logged up to the checkpoint (a record torn by a kill is dropped), through a
    // temporary file and a rename so that a failure here loses nothing.
    std::ifstream in(path_);
    if (in) {
      std::string kept, line;
      while (std::getline(in, line)) {
        const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
        if (j["step"].get<int64_t>() <= resumed_step) kept += line + '\n';
      }
      GLM_RETURN_IF_ERROR(write_file_durably(path_, kept));
      jsonl_.open(path_, std::ios::out | std::ios::app);
      if (!jsonl_) return GLM_FILE_ERROR("cannot write", path_, errno);
      return Status::ok();
    }
  }
  jsonl_.open(path_, std::ios::out | std::ios::trunc);
  if (!jsonl_) return GLM_FILE_ERROR("cannot write", path_, errno);
  return Status::ok();
}

void MetricsLogger::print(const std::string& line) const {
  if (!enabled_) return;
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

Status MetricsLogger::log_eval(int64_t step, int64_t max_steps, double eval_loss, double token_accuracy,
                              int64_t eval_tokens) {
  if (!enabled_) return Status::ok();
  const double ppl = std::exp(eval_loss);
  char line[256];
  std::snprintf(line, sizeof(line),
                "eval at step %lld/%lld | eval_loss %.4f | eval_ppl %.4f | eval_token_acc %.4f | %lld target tokens",
                static_cast<long long>(step), static_cast<long long>(max_steps), eval_loss, ppl, token_accuracy,
                static_cast<long long>(eval_tokens));
  print(line);
  return write_record(nlohmann::json{{"step", step},
                                     {"eval_loss", eval_loss},
                                     {"eval_ppl", ppl},
                                     {"eval_token_acc", token_accuracy},
                                     {"eval_tokens", eval_tokens}});
}

Status MetricsLogger::log_save(int64_t step, const std::string& dir, int64_t bytes, double seconds) {
  if (!enabled_) return Status::ok();
  const double gb = static_cast<double>(bytes) / 1e9, rate = seconds > 0 ? gb / seconds : 0.0;
  char detail[128];
  std::snprintf(detail, sizeof(detail), " (%.3f GB in %.2f s, %.2f GB/s)", gb, seconds, rate);
  print("glm_hpc: saved " + dir + detail);
  return write_record(nlohmann::json{{"step", step},
                                     {"checkpoint", dir},
                                     {"save_bytes", bytes},
                                     {"save_seconds", seconds},
                                     {"save_gb_per_s", rate}});
}

Status MetricsLogger::log(const StepMetrics& m) {
  if (!enabled_) return Status::ok();
  char line[512];
  // comm: share of the step spent waiting on collectives that compute did not hide.
  std::snprintf(line, sizeof(line),
                "step %lld/%lld | loss %.4f | lr %.3e | grad_norm %.4f | tokens/s %.0f | comm %.1f%% | elapsed %s | "
                "eta %s",
                static_cast<long long>(m.step), static_cast<long long>(m.max_steps), m.loss, m.lr, m.grad_norm,
                m.tokens_per_second, m.step_seconds > 0 ? 100.0 * m.exposed_comm_seconds / m.step_seconds : 0.0,
                format_duration(m.elapsed_seconds).c_str(), format_duration(m.eta_seconds).c_str());
  std::string text = line;
  char more[64];
  if (m.mfu >= 0) {
    std::snprintf(more, sizeof(more), " | mfu %.1f%%", 100.0 * m.mfu);
    text += more;
  }
  if (m.device_memory_bytes >= 0) {
    std::snprintf(more, sizeof(more), " | mem %.1f GiB", static_cast<double>(m.device_memory_bytes) / (1 << 30));
    text += more;
  }
  if (m.host_memory_bytes >= 0) {
    std::snprintf(more, sizeof(more), " | host %.1f GiB", static_cast<double>(m.host_memory_bytes) / (1 << 30));
    text += more;
  }
  text += ranks_text(m.ranks);
  print(text);
  if (jsonl_.is_open()) {
    nlohmann::json j = {{"step", m.step},
                        {"max_steps", m.max_steps},
                        {"loss", m.loss},
                        {"learning_rate", m.lr},
                        {"grad_norm", m.grad_norm},
                        {"tokens_per_second", m.tokens_per_second},
                        {"tokens", m.tokens},
                        {"elapsed_seconds", m.elapsed_seconds},
                        {"eta_seconds", m.eta_seconds},
                        {"step_seconds", m.step_seconds},
                        {"exposed_comm_seconds", m.exposed_comm_seconds}};
    if (m.device_memory_bytes >= 0) j["device_memory_gib"] = static_cast<double>(m.device_memory_bytes) / (1 << 30);
    if (m.host_memory_bytes >= 0) j["host_memory_gib"] = static_cast<double>(m.host_memory_bytes) / (1 << 30);
    j["model_tflops_per_gpu"] = m.model_tflops;
    if (m.mfu >= 0) j["mfu"] = m.mfu;
    add_ranks(j, m.ranks);
    return write_record(j);
  }
  return Status::ok();
}

Status MetricsLogger::log_skip(int64_t step, int64_t max_steps, const std::string& reason, int64_t first_sample,
                               int64_t end_sample, int64_t consecutive) {
  if (!enabled_) return Status::ok();
  print(concat("glm_hpc: step ", step, "/", max_steps, " skipped: ", reason, "; its batch: samples ", first_sample,
               " to ", end_sample - 1, " of the shuffled stream; nothing applied (", consecutive, " in a row)"));
  return write_record(nlohmann::json{{"step", step},
                                     {"skipped", reason},
                                     {"samples", {first_sample, end_sample}},
                                     {"consecutive_skips", consecutive}});
}

std::string tensorboard_tag(const std::string& key) {
  constexpr std::string_view kEval = "eval_";
  if (key.starts_with(kEval)) return "eval/" + key.substr(kEval.size());
  return "train/" + key;
}

Status MetricsLogger::rank_scalars(const std::string& tag, int64_t step, const nlohmann::json& by_rank) {
  double lo = INFINITY, hi = -INFINITY;
  for (size_t r = 0; r < by_rank.size(); ++r) {
    if (!by_rank[r].is_number()) continue;
    const double v = by_rank[r].get<double>();
    lo = std::min(lo, v), hi = std::max(hi, v);
    if (by_rank.size() <= kTensorBoardRankTags)
      GLM_RETURN_IF_ERROR(tensorboard_->scalar(concat(tag, "/rank", r), step, v));
  }
  if (by_rank.size() <= kTensorBoardRankTags || hi < lo) return Status::ok();
  GLM_RETURN_IF_ERROR(tensorboard_->scalar(tag + "/min", step, lo));
  return tensorboard_->scalar(tag + "/max", step, hi);
}

Status MetricsLogger::write_record(const nlohmann::json& record) {
  if (tensorboard_ && record.contains("step")) {
    // Every number of the record but its step, as a scalar at that step (NaN stays NaN).
    const int64_t step = record["step"].get<int64_t>();
    for (const auto& [key, value] : record.items()) {
      if (key == "step" || key == "max_steps") continue;
      if (key.starts_with("gpu_") && value.is_array()) {
        GLM_RETURN_IF_ERROR(rank_scalars(tensorboard_tag(key), step, value));
        continue;
      }
      if (value.is_number()) GLM_RETURN_IF_ERROR(tensorboard_->scalar(tensorboard_tag(key), step, value.get<double>()));
      if (value.is_null() && (key == "loss" || key == "grad_norm"))  // json has no NaN: nlohmann writes null
        GLM_RETURN_IF_ERROR(tensorboard_->scalar(tensorboard_tag(key), step, std::nan("")));
    }
    GLM_RETURN_IF_ERROR(tensorboard_->flush());
  }
  if (!jsonl_.is_open()) return Status::ok();
  jsonl_ << json_text(record) << '\n';
  jsonl_.flush();
  if (!jsonl_) return GLM_FILE_ERROR("cannot write", path_, errno);
  return Status::ok();
}

}  // namespace glm
