// Sharded HDF5 checkpoints (see checkpoint.h): writing, atomic publication, pruning, validated
// loading with resharding by unit-relative ranges.
#include "train/checkpoint.h"

#include "io/checkpoint_file.h"
#include "io/durable_file.h"

#include <hdf5.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

namespace glm {
namespace {

namespace fs = std::filesystem;
constexpr const char* kFormat = "glm_hpc-checkpoint";
// 3: a unit's slice of a rank may be several runs (attribute `ranges` instead of `begin_count`):
// written only where ZeRO-3 keeps persistent tensors apart (elsewhere 2, which older glm_hpc reads).
// 2: contiguous datasets written with O_DIRECT, CRC32C per block (io/checkpoint_file.h). 1: chunked
// datasets with Fletcher-32; still read.
constexpr int kVersion = 3;
constexpr int kVersionWithoutRanges = 2;
constexpr int kOldestReadableVersion = 1;
constexpr const char* kDatasets[3] = {"master", "exp_avg", "exp_avg_sq"};
// LoRA checkpoints: the adapters' optimizer state, replicated, in one file written by rank 0.
constexpr const char* kLoraFile = "adapters.h5";
constexpr const char* kLoraGroup = "lora";

// An HDF5 identifier closed by its own close function when it leaves scope.
class H5Id {
 public:
  H5Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~H5Id() {
    if (id_ >= 0) close_(id_);
  }
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// HDF5 prints its own error stacks by default; we report the file and the dataset instead.
void quiet_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

std::string rank_file(int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank_%05d.h5", rank);
  return name;
}
std::string unit_group(int unit) {
  char name[32];
  std::snprintf(name, sizeof(name), "unit_%05d", unit);
  return name;
}

// Every rank's status, agreed: ok only if ok everywhere; a failing rank keeps its own message.
Status agree(Communicator& comm, const Status& local, const char* what) {
  int32_t failed = local.is_ok() ? 0 : 1;
  GLM_RETURN_IF_ERROR(comm.all_reduce(&failed, &failed, 1, CommType::i32, ReduceOp::max));
  if (!local.is_ok()) return local;
  if (failed != 0) return GLM_ERROR(ErrorKind::io, what, " failed on another rank (its message is above)");
  return Status::ok();
}

nlohmann::json model_shape(const ModelConfig& c) {
  return {{"vocab_size", c.vocab_size},
          {"hidden_size", c.hidden_size},
          {"intermediate_size", c.intermediate_size},
          {"num_hidden_layers", c.num_hidden_layers},
          {"num_attention_heads", c.num_attention_heads},
          {"num_key_value_heads", c.num_key_value_heads},
          {"head_dim", c.head_dim}};
}

// Everything export needs to describe the model (model_shape() is what resuming must match).
nlohmann::json model_config_json(const ModelConfig& c) {
  nlohmann::json j = model_shape(c);
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rope_theta"] = c.rope_theta;
  j["partial_rotary_factor"] = c.partial_rotary_factor;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["initializer_range"] = c.initializer_range;
  return j;
}

// The unit sizes without world-size padding: what a checkpoint must cover.
std::vector<int64_t> unpadded_units(const ModelConfig& c) {
  std::vector<int64_t> sizes;
  const ParamLayout layout(c, 1);
  for (const auto& u : layout.units()) sizes.push_back(u.numel);
  return sizes;
}

std::string train_type_of(const TrainingEngine& engine) { return engine.lora_layout() != nullptr ? "lora" : "full"; }

nlohmann::json lora_json(const LoraConfig& c, int64_t numel) {
  std::vector<LoraTarget> sorted = c.targets;  // the order of --target_modules does not matter
  std::sort(sorted.begin(), sorted.end());
  nlohmann::json targets = nlohmann::json::array();
  for (LoraTarget t : sorted) targets.push_back(lora_target_name(t));
  // dropout is recorded but not compared on resume: it changes no shape or value of the adapters, and
  // HF/ms-swift let a resumed run change lora_dropout too.
  return {{"rank", c.rank}, {"alpha", c.alpha}, {"dropout", c.dropout}, {"targets", targets}, {"numel", numel}};
}

// The base a LoRA checkpoint's adapters were trained on.
nlohmann::json base_json(const std::string& base_model, uint64_t seed, double sum_squares) {
  return {{"model_id_or_path", base_model.empty() ? nlohmann::json(nullptr) : nlohmann::json(base_model)},
          {"random_init_seed", base_model.empty() ? nlohmann::json(seed) : nlohmann::json(nullptr)},
          {"sum_squares", sum_squares}};
}

Status write_lora_file(const TrainingEngine& engine, Backend& backend, const fs::path& path) {
  const TrainingEngine::OptimizerShard s = engine.lora_optimizer_state();
  const Tensor sources[3] = {s.master, s.exp_avg, s.exp_avg_sq};
  for (const Tensor& t : sources)
    if (t.dtype != DType::f32)
      return GLM_INTERNAL_ERROR("LoRA checkpoints store fp32 optimizer state, the backend keeps ", dtype_name(t.dtype));
  std::vector<CheckpointFileGroup> groups(1);
  groups[0].name = kLoraGroup;
  groups[0].attributes = {{"numel", {s.master.numel}}};
  for (const char* name : kDatasets) groups[0].datasets.emplace_back(name, s.master.numel);
  auto fill = [&](size_t, size_t dataset, int64_t first, std::span<float> dst) -> Status {
    return backend.download(dst.data(), sources[dataset].slice(first, static_cast<int64_t>(dst.size())));
  };
  auto written = write_checkpoint_file(path.string(), groups, fill);
  return written.is_ok() ? Status::ok() : written.status();
}

// A run of this rank's optimizer state inside one of the checkpoint's units (the layout's home
// units: embedding, layers, head), located as the layout without persistent tensors places it.
struct Slice {
  int64_t begin = 0, count = 0;          // unit-relative
  TrainingEngine::OptimizerShard owner;  // the optimizer state of the layout unit holding it
  int64_t owned_offset = 0;              // where the run starts inside owner's tensors
  // n values of dataset d from `from` inside the run, to or from the host; the master (d = 0) goes
  // through `masters` (it may be split into halves on the device).
  Status download(MasterTransfer& masters, int d, int64_t from, float* dst, int64_t n) const {
    if (d == 0) return masters.download(owner, owned_offset + from, std::span<float>(dst, static_cast<size_t>(n)));
    return masters.backend().download(dst, moment(d).slice(owned_offset + from, n));
  }
  Status upload(MasterTransfer& masters, int d, int64_t from, const float* src, int64_t n) const {
    if (d == 0)
      return masters.upload(owner, owned_offset + from, std::span<const float>(src, static_cast<size_t>(n)));
    return masters.backend().upload(moment(d).slice(owned_offset + from, n), src);
  }
  Tensor moment(int d) const { return d == 1 ? owner.exp_avg : owner.exp_avg_sq; }
};

int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

// What this rank holds of home unit `unit`. Without persistent tensors: its optimizer's range of
// the unit, one run. With them (ZeRO-3), a tensor and its alignment padding are one run in either
// layout: each tensor's owned part maps on its own, and runs adjacent in both are joined.
std::vector<Slice> owned_slices(const TrainingEngine& e, int unit) {
  const ParamLayout& layout = e.layout();
  if (layout.persistent_unit() < 0) {
    Slice whole;
    whole.owner = e.optimizer_shard(unit);
    whole.begin = whole.owner.unit_begin;
    whole.count = whole.owner.master.numel;
    return {whole};
  }
  std::vector<Slice> out;
  int last_owner = -1;
  for (const ParamEntry& entry : layout.entries()) {
    if (entry.home_unit != unit) continue;
    const TrainingEngine::OptimizerShard s = e.optimizer_shard(entry.unit);
    const int64_t at = entry.offset - layout.units()[static_cast<size_t>(entry.unit)].offset;
    const int64_t span = align_up(entry.numel, ParamLayout::kAlignment);
    const int64_t lo = std::max(at, s.unit_begin), hi = std::min(at + span, s.unit_begin + s.master.numel);
    if (lo >= hi) continue;
    const int64_t begin = entry.home_offset + (lo - at), owned = lo - s.unit_begin;
    Slice* prev = out.empty() ? nullptr : &out.back();
    if (prev != nullptr && last_owner == entry.unit && prev->begin + prev->count == begin &&
        prev->owned_offset + prev->count == owned) {
      prev->count += hi - lo;
      continue;
    }
    Slice run;
    run.begin = begin;
    run.count = hi - lo;
    run.owner = s;
    run.owned_offset = owned;
    out.push_back(run);
    last_owner = entry.unit;
  }
  return out;
}

// This rank's slices of a unit to write: what it holds (stages 1-3), or at stage 0 (every rank
// holds the whole unit) the r-th of N equal parts, so that each element is written once.
std::vector<Slice> write_slices(const TrainingEngine& e, int unit, int rank, int world) {
  std::vector<Slice> held = owned_slices(e, unit);
  if (e.layout().persistent_unit() >= 0) return held;  // ZeRO-3: nothing is held twice
  Slice& s = held.front();
  const int64_t padded = e.layout().units()[static_cast<size_t>(unit)].numel;
  const int64_t part = padded / world;
  const int64_t lo = std::max(s.begin, part * rank), hi = std::min(s.begin + s.count, part * (rank + 1));
  s.owned_offset = lo - s.begin;
  s.begin = lo;
  s.count = std::max<int64_t>(0, hi - lo);
  return held;
}

// GLM_TEST_KILL_DURING_SAVE=<rank>[:<step>] (fault tests only): that rank raises SIGKILL on itself
// halfway through writing its file of checkpoint-<step> (of every save when no step is given).
bool test_kill_during_save(int rank, int64_t step) {
  const char* spec = std::getenv("GLM_TEST_KILL_DURING_SAVE");
  if (spec == nullptr || *spec == '\0') return false;
  char* end = nullptr;
  const long who = std::strtol(spec, &end, 10);
  if (end == spec || who != rank) return false;
  if (*end == '\0') return true;
  return *end == ':' && std::strtoll(end + 1, nullptr, 10) == step;
}

Status write_rank_file(const TrainingEngine& engine, Backend& backend, const fs::path& path, int rank, int world,
                       bool kill_midway) {
  if (!engine.optimizer_settled()) return GLM_INTERNAL_ERROR("checkpoint of an optimizer with deferred updates pending");
  for (size_t u = 0; u < engine.layout().units().size(); ++u)
    if (const DType d = engine.optimizer_shard(static_cast<int>(u)).master.dtype; d != DType::f32 && d != DType::i16)
      return GLM_INTERNAL_ERROR("checkpoints store fp32 optimizer state, the backend keeps ", dtype_name(d));
  MasterTransfer masters(backend);
  const bool ranges = engine.layout().persistent_unit() >= 0;
  const int units = engine.layout().home_units();
  std::vector<CheckpointFileGroup> groups(static_cast<size_t>(units));
  std::vector<std::vector<Slice>> slices;
  for (int u = 0; u < units; ++u) {
    const std::vector<Slice>& runs = slices.emplace_back(write_slices(engine, u, rank, world));
    CheckpointFileGroup& g = groups[static_cast<size_t>(u)];
    g.name = unit_group(u);
    int64_t count = 0;
    std::vector<int64_t> flat;  // begin, count of each run; one empty run when there is none
    for (const Slice& run : runs) {
      flat.insert(flat.end(), {run.begin, run.count});
      count += run.count;
    }
    if (flat.empty()) flat = {0, 0};
    if (ranges) {
      g.attributes = {{"ranges", flat}};
    } else {
      g.attributes = {{"begin_count", {runs.front().begin, runs.front().count}}};
    }
    if (count > 0)
      for (const char* name : kDatasets) g.datasets.emplace_back(name, count);
  }
  // The dataset is the unit's runs back to back; a block may span several.
  auto fill = [&](size_t unit, size_t dataset, int64_t first, std::span<float> dst) -> Status {
    int64_t base = 0, pos = first;
    size_t done = 0;
    for (const Slice& run : slices[unit]) {
      if (done < dst.size() && pos < base + run.count) {
        const int64_t from = pos - base;
        const int64_t n = std::min(run.count - from, static_cast<int64_t>(dst.size() - done));
        GLM_RETURN_IF_ERROR(run.download(masters, static_cast<int>(dataset), from, dst.data() + done, n));
        done += static_cast<size_t>(n);
        pos += n;
      }
      base += run.count;
    }
    if (done != dst.size())
      return GLM_INTERNAL_ERROR("checkpoint fill past the runs of ", unit_group(static_cast<int>(unit)));
    return Status::ok();
  };
  CheckpointFileOptions options;
  if (kill_midway) {  // part of the shard is on disk, the rest never will be
    options.pause_before_group = static_cast<size_t>(units / 2);
    options.at_pause = [&] {
      std::fprintf(stderr, "glm_hpc: rank %d: GLM_TEST_KILL_DURING_SAVE: SIGKILL while writing '%s'\n", rank,
                   path.c_str());
      std::fflush(stderr);
      std::raise(SIGKILL);
    };
  }
  auto written = write_checkpoint_file(path.string(), groups, fill, options);
  return written.is_ok() ? Status::ok() : written.status();
}

int64_t step_of(const fs::path& dir) {
  const std::string name = dir.filename().string();
  if (name.rfind("checkpoint-", 0) != 0) return -1;
  try {
    size_t used = 0;
    const int64_t step = std::stoll(name.substr(11), &used);
    return used == name.size() - 11 ? step : -1;
  } catch (...) {
    return -1;
  }
}

// Complete checkpoints of output_dir, oldest first.
std::vector<fs::path> complete_checkpoints(const fs::path& output_dir) {
  std::vector<fs::path> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(output_dir, ec)) {
    if (entry.is_directory() && step_of(entry.path()) >= 0 && fs::exists(entry.path() / "COMPLETE"))
      found.push_back(entry.path());
  }
  std::sort(found.begin(), found.end(), [](const fs::path& a, const fs::path& b) { return step_of(a) < step_of(b); });
  return found;
}

// Rank 0, after every rank file is on disk: meta, marker, rename, latest, pruning.
Status publish(const fs::path& tmp, const fs::path& final_dir, const fs::path& output_dir, const nlohmann::json& meta,
               int64_t save_total_limit, const std::string& best_checkpoint) {
  GLM_RETURN_IF_ERROR(write_file_durably(tmp / "meta.json", meta.dump(2) + "\n"));
  if (fs::exists(output_dir / "args.json")) {  // the run's options travel with its checkpoints (export reads them)
    std::ifstream in(output_dir / "args.json", std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    if (!in) return GLM_ERROR(ErrorKind::io, "cannot read '", (output_dir / "args.json").string(), "'");
    GLM_RETURN_IF_ERROR(write_file_durably(tmp / "args.json", text.str()));
  }
  GLM_RETURN_IF_ERROR(write_file_durably(tmp / "COMPLETE", std::to_string(meta["step"].get<int64_t>()) + "\n"));
  GLM_RETURN_IF_ERROR(fsync_path(tmp));
  std::error_code ec;
  if (fs::exists(final_dir)) {  // a rerun into the same output_dir: replace, never half
    const fs::path old = final_dir.string() + ".old";
    fs::remove_all(old, ec);
    fs::rename(final_dir, old, ec);
    if (ec) return GLM_ERROR(ErrorKind::io, "cannot move the previous '", final_dir.string(), "' aside: ", ec.message());
    fs::rename(tmp, final_dir, ec);
    fs::remove_all(old);
  } else {
    fs::rename(tmp, final_dir, ec);
  }
  if (ec) return GLM_ERROR(ErrorKind::io, "cannot rename '", tmp.string(), "' to '", final_dir.string(), "': ", ec.message());
  GLM_RETURN_IF_ERROR(fsync_path(output_dir));
  GLM_RETURN_IF_ERROR(write_file_durably(output_dir / "latest", final_dir.filename().string() + "\n"));
  if (save_total_limit > 0) {
    // Oldest first, never the newest nor the best; the best counts toward the limit (so a limit of
    // 1 keeps 2 while the best is older), as in Hugging Face's Trainer._sorted_checkpoints.
    const std::vector<fs::path> all = complete_checkpoints(output_dir);
    auto kept = [&](const fs::path& p) {
      return p == final_dir || (!best_checkpoint.empty() && p.filename() == best_checkpoint);
    };
    const int64_t protected_count = std::count_if(all.begin(), all.end(), kept);
    int64_t excess = static_cast<int64_t>(all.size()) - std::max(save_total_limit, protected_count);
    for (size_t i = 0; i < all.size() && excess > 0; ++i) {
      if (kept(all[i])) continue;
      fs::remove_all(all[i], ec);
      if (ec) return GLM_ERROR(ErrorKind::io, "cannot remove the old checkpoint '", all[i].string(), "': ", ec.message());
      --excess;
    }
  }
  return Status::ok();
}

Status check_field(const nlohmann::json& saved, const nlohmann::json& ours, const std::string& field,
                   const fs::path& meta) {
  if (!saved.contains(field)) return GLM_USER_ERROR(meta.string(), ": field '", field, "' is missing");
  if (saved[field] != ours[field])
    return GLM_USER_ERROR(meta.string(), ": the checkpoint's ", field, " is ", saved[field].dump(), ", this run's ",
                          ours[field].dump(), " (a checkpoint of another model shape)");
  return Status::ok();
}

Result<nlohmann::json> read_meta(const fs::path& dir) {
  const fs::path path = dir / "meta.json";
  std::ifstream in(path);
  if (!in) return GLM_USER_ERROR("checkpoint '", dir.string(), "' has no readable meta.json");
  nlohmann::json meta = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (meta.is_discarded() || !meta.is_object()) return GLM_USER_ERROR(path.string(), " is not valid JSON");
  if (meta.value("format", "") != kFormat)
    return GLM_USER_ERROR(path.string(), " is not a glm_hpc checkpoint (its format field is not '", kFormat, "')");
  const int version = meta.contains("version") && meta["version"].is_number_integer() ? meta["version"].get<int>() : -1;
  if (version < kOldestReadableVersion || version > kVersion)
    return GLM_USER_ERROR(path.string(), ": checkpoint version ", meta.contains("version") ? meta["version"].dump() : "(none)",
                          " is not one this glm_hpc reads (", kOldestReadableVersion, " to ", kVersion, ")");
  for (const char* field : {"step", "world_size", "units", "model", "consumed_samples", "seed", "optimizer_steps"})
    if (!meta.contains(field)) return GLM_USER_ERROR(path.string(), ": field '", field, "' is missing");
  return meta;
}

// A run of a unit in a rank file: unit-relative [begin, begin + count), stored from element
// `stored` of the group's datasets.
struct FileRun {
  int64_t begin = 0, count = 0, stored = 0;
};

// The runs of one unit group: attribute ranges (version 3), else begin_count (one run).
Result<std::vector<FileRun>> file_runs(hid_t group, const fs::path& path, int unit) {
  const bool has_ranges = H5Aexists(group, "ranges") > 0;
  const char* name = has_ranges ? "ranges" : "begin_count";
  H5Id attr(H5Aopen(group, name, H5P_DEFAULT), H5Aclose);
  H5Id space(attr.ok() ? H5Aget_space(attr.get()) : -1, H5Sclose);
  const hssize_t n = space.ok() ? H5Sget_simple_extent_npoints(space.get()) : -1;
  std::vector<int64_t> values(static_cast<size_t>(std::max<hssize_t>(n, 0)));
  if (n <= 0 || n % 2 != 0 || (!has_ranges && n != 2) || H5Aread(attr.get(), H5T_NATIVE_INT64, values.data()) < 0)
    return GLM_USER_ERROR(path.string(), ": ", unit_group(unit), " has no readable ", name, " attribute");
  std::vector<FileRun> runs;
  int64_t stored = 0;
  for (size_t i = 0; i < values.size(); i += 2) {
    if (values[i] < 0 || values[i + 1] < 0)
      return GLM_USER_ERROR(path.string(), ": ", unit_group(unit), " has a negative ", name, " attribute");
    runs.push_back({values[i], values[i + 1], stored});
    stored += values[i + 1];
  }
  return runs;
}

// Reads [lo, hi) (unit-relative) of one dataset of one rank file into host, checked against the
// file's block checksums (checksum_block; none in version-1 files, whose Fletcher-32 HDF5 checks).
Status read_range(hid_t group, const char* dataset, const fs::path& file, std::optional<int64_t> checksum_block,
                  int unit, int64_t file_begin, int64_t lo, int64_t hi, std::vector<float>& host) {
  host.resize(static_cast<size_t>(hi - lo));
  return read_checked_range(group, unit_group(unit), dataset, file.string(), checksum_block, lo - file_begin, host);
}

// Writes straight into the optimizer state and, where masters are split, into the live bf16
// parameters (their high halves): a load that fails partway leaves the engine unusable, which is
// fine while every caller gives up on a load error (a fallback to an older checkpoint would first
// need a fresh engine or a full reload).
Status load_rank_slices(TrainingEngine& engine, const fs::path& dir, int saved_world,
                        const std::vector<int64_t>& unpadded, bool weights_only) {
  quiet_hdf5();
  Backend& backend = engine.backend();
  const int units = engine.layout().home_units();
  std::vector<int64_t> covered(static_cast<size_t>(units), 0);
  std::vector<std::vector<Slice>> mine;
  for (int u = 0; u < units; ++u) mine.push_back(owned_slices(engine, u));
  std::vector<float> host;
  MasterTransfer masters(backend);
  for (int r = 0; r < saved_world; ++r) {
    const fs::path path = dir / rank_file(r);
    if (!fs::exists(path)) return GLM_USER_ERROR("checkpoint '", dir.string(), "' misses ", rank_file(r));
    H5Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    if (!file.ok()) return GLM_USER_ERROR(path.string(), " is not a readable HDF5 file (truncated or corrupt)");
    GLM_ASSIGN_OR_RETURN(const std::optional<int64_t> checksum_block, checksum_block_bytes(file.get(), path.string()));
    for (int u = 0; u < units; ++u) {
      H5Id group(H5Gopen2(file.get(), unit_group(u).c_str(), H5P_DEFAULT), H5Gclose);
      if (!group.ok()) return GLM_USER_ERROR(path.string(), ": group ", unit_group(u), " is missing");
      GLM_ASSIGN_OR_RETURN(const std::vector<FileRun> runs, file_runs(group.get(), path, u));
      for (const FileRun& run : runs) {
        for (const Slice& held : mine[static_cast<size_t>(u)]) {
          // The overlap of the file's run, this rank's run and the unit's real extent.
          const int64_t lo = std::max(run.begin, held.begin);
          const int64_t hi =
              std::min({run.begin + run.count, held.begin + held.count, unpadded[static_cast<size_t>(u)]});
          if (lo >= hi) continue;
          for (int d = 0; d < (weights_only ? 1 : 3); ++d) {
            GLM_RETURN_IF_ERROR(
                read_range(group.get(), kDatasets[d], path, checksum_block, u, run.begin - run.stored, lo, hi, host));
            GLM_RETURN_IF_ERROR(held.upload(masters, d, lo - held.begin, host.data(), hi - lo));
          }
          covered[static_cast<size_t>(u)] += hi - lo;
        }
      }
    }
  }
  if (weights_only) {  // Adam starts over: zero moments, as a fresh optimizer has
    for (size_t u = 0; u < engine.layout().units().size(); ++u) {
      const TrainingEngine::OptimizerShard s = engine.optimizer_shard(static_cast<int>(u));
      GLM_RETURN_IF_ERROR(backend.zero(s.exp_avg));
      GLM_RETURN_IF_ERROR(backend.zero(s.exp_avg_sq));
    }
  }
  for (int u = 0; u < units; ++u) {
    int64_t need = 0;
    for (const Slice& held : mine[static_cast<size_t>(u)])
      need += std::max<int64_t>(0, std::min(held.begin + held.count, unpadded[static_cast<size_t>(u)]) - held.begin);
    if (covered[static_cast<size_t>(u)] != need)
      return GLM_USER_ERROR("checkpoint '", dir.string(), "': ", unit_group(u), " covers ", covered[static_cast<size_t>(u)],
                            " of the ", need, " elements this rank needs (rank files overlap or are missing slices)");
  }
  return backend.synchronize();
}

}  // namespace

Result<SaveReport> save_checkpoint(TrainingEngine& engine, Communicator& comm, const std::string& output_dir,
                                   const CheckpointState& state, int64_t save_total_limit) {
  const auto started = std::chrono::steady_clock::now();
  const fs::path out(output_dir), final_dir = out / ("checkpoint-" + std::to_string(state.step));
  const fs::path tmp = out / (".checkpoint-" + std::to_string(state.step) + ".tmp");
  const int rank = comm.rank(), world = comm.size();
  Status made = Status::ok();
  if (rank == 0) {
    std::error_code ec;
    fs::remove_all(tmp, ec);  // a save killed earlier left this; it was never published
    fs::create_directories(tmp, ec);
    if (ec) made = GLM_ERROR(ErrorKind::io, "cannot create '", tmp.string(), "': ", ec.message());
  }
  GLM_RETURN_IF_ERROR(agree(comm, made, "creating the checkpoint directory"));
  const LoraLayout* lora = engine.lora_layout();
  double base_sum_squares = 0;
  if (lora != nullptr) {
    GLM_ASSIGN_OR_RETURN(base_sum_squares, engine.base_checksum());  // collective
  }
  GLM_RETURN_IF_ERROR(engine.settle_optimizer());  // deferred embedding rows: every row at this step
  GLM_RETURN_IF_ERROR(engine.backend().synchronize());
  // LoRA: the replicated adapters' state, written once (by rank 0); else every rank's slices.
  const bool writes = lora == nullptr || rank == 0;
  const fs::path mine = tmp / (lora != nullptr ? std::string(kLoraFile) : rank_file(rank));
  // write_rank_file and write_lora_file end with the file's fdatasync.
  Status wrote = Status::ok();
  if (lora != nullptr && writes) {
    wrote = write_lora_file(engine, engine.backend(), mine);
  } else if (lora == nullptr) {
    wrote = write_rank_file(engine, engine.backend(), mine, rank, world, test_kill_during_save(rank, state.step));
  }
  int64_t bytes = 0;
  if (wrote.is_ok() && writes) {
    std::error_code ec;
    bytes = static_cast<int64_t>(fs::file_size(mine, ec));
    if (ec) wrote = GLM_ERROR(ErrorKind::io, "cannot stat '", mine.string(), "': ", ec.message());
  }
  GLM_RETURN_IF_ERROR(agree(comm, wrote, "writing the checkpoint"));
  GLM_RETURN_IF_ERROR(comm.all_reduce(&bytes, &bytes, 1, CommType::i64, ReduceOp::sum));
  Status published = Status::ok();
  if (rank == 0) {
    const bool ranges = engine.layout().persistent_unit() >= 0;  // write_rank_file's choice
    nlohmann::json meta = {{"format", kFormat},
                           {"version", ranges ? kVersion : kVersionWithoutRanges},
                           {"step", state.step},
                           {"consumed_samples", state.consumed_samples},
                           {"seed", state.seed},
                           {"world_size", world},
                           {"zero_stage", engine.zero_stage()},
                           {"optimizer_steps", engine.optimizer_steps()},
                           {"model", model_shape(engine.config())},
                           {"model_config", model_config_json(engine.config())},
                           {"units", unpadded_units(engine.config())},
                           {"train_type", train_type_of(engine)}};
    if (lora != nullptr) {
      meta["lora"] = lora_json(lora->config(), lora->total_numel());
      meta["base"] = base_json(state.base_model, state.seed, base_sum_squares);
    }
    meta["tokenizer"] = state.tokenizer_hash.empty()
                            ? nlohmann::json(nullptr)
                            : nlohmann::json{{"path", state.tokenizer}, {"content_hash", state.tokenizer_hash}};
    meta["eval_loss"] = state.eval_loss ? nlohmann::json(*state.eval_loss) : nlohmann::json(nullptr);
    // Hugging Face's trainer_state.json names.
    meta["best_metric"] = state.best ? nlohmann::json(state.best->loss) : nlohmann::json(nullptr);
    meta["best_global_step"] = state.best ? nlohmann::json(state.best->step) : nlohmann::json(nullptr);
    meta["best_model_checkpoint"] = state.best && !state.best->checkpoint.empty()
                                        ? nlohmann::json(state.best->checkpoint)
                                        : nlohmann::json(nullptr);
    published = publish(tmp, final_dir, out, meta, save_total_limit, state.best ? state.best->checkpoint : "");
  }
  GLM_RETURN_IF_ERROR(agree(comm, published, "publishing the checkpoint"));
  SaveReport report;
  report.dir = final_dir.string();
  report.bytes = bytes;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return report;
}

Result<std::string> resolve_checkpoint(const std::string& spec, const std::string& output_dir,
                                       const std::string& option) {
  fs::path dir(spec);
  if (spec == "latest") {
    const fs::path out(output_dir);
    std::ifstream in(out / "latest");
    std::string name;
    if (in >> name && fs::exists(out / name / "COMPLETE")) {
      dir = out / name;
    } else {
      // latest is written after the rename; if it is missing or stale, the newest complete one.
      const auto all = complete_checkpoints(out);
      if (all.empty()) return GLM_USER_ERROR(option, " latest: no complete checkpoint in '", output_dir, "'");
      dir = all.back();
    }
  }
  if (!fs::is_directory(dir)) return GLM_USER_ERROR(option, ": '", dir.string(), "' is not a directory");
  if (!fs::exists(dir / "COMPLETE"))
    return GLM_USER_ERROR("checkpoint '", dir.string(), "' is incomplete (no COMPLETE marker: its save was interrupted)");
  return dir.string();
}

namespace {

// The tokenizer recorded in meta.json against this run's: another vocabulary mapping would make the
// trained embeddings mean other tokens.
Status check_tokenizer(const nlohmann::json& m, const ResumeExpectation& expect, const fs::path& meta) {
  if (expect.tokenizer_hash.empty() || !m.contains("tokenizer") || !m["tokenizer"].is_object()) return Status::ok();
  const nlohmann::json& t = m["tokenizer"];
  const std::string saved = t.value("content_hash", ""), path = t.value("path", "");
  if (saved.empty() || saved == expect.tokenizer_hash) return Status::ok();
  return GLM_USER_ERROR(meta.string(), ": the checkpoint was trained with the tokenizer '", path, "' (content hash ",
                        saved, "), this run's tokenizer '", expect.tokenizer, "' has content hash ",
                        expect.tokenizer_hash, ": resume with the tokenizer the checkpoint was trained with");
}

// train_type, and for LoRA the adapters' configuration and the base, against this run's.
Status check_training_kind(const nlohmann::json& m, const TrainingEngine& engine, const ResumeExpectation& expect,
                           double base_sum_squares, const fs::path& meta) {
  const std::string saved = m.contains("train_type") && m["train_type"].is_string() ? m["train_type"].get<std::string>()
                                                                                   : std::string("full");
  const std::string ours = train_type_of(engine);
  if (saved != ours)
    return GLM_USER_ERROR(meta.string(), ": the checkpoint's train_type is ", saved, ", this run's --train_type is ",
                          ours, saved == "lora" ? " (a LoRA checkpoint holds only adapters, not the full weights)"
                                                : " (a full-training checkpoint holds no LoRA adapters)");
  const LoraLayout* lora = engine.lora_layout();
  if (lora == nullptr) return Status::ok();
  if (!m.contains("lora") || !m["lora"].is_object() || !m.contains("base") || !m["base"].is_object())
    return GLM_USER_ERROR(meta.string(), ": a LoRA checkpoint without the 'lora' or 'base' object");
  const nlohmann::json mine = lora_json(lora->config(), lora->total_numel());
  const char* options[] = {"--lora_rank", "--lora_alpha", "--target_modules", "--lora_rank"};
  const char* fields[] = {"rank", "alpha", "targets", "numel"};
  for (size_t i = 0; i < std::size(fields); ++i) {
    const nlohmann::json& v = m["lora"].contains(fields[i]) ? m["lora"][fields[i]] : nlohmann::json(nullptr);
    if (v != mine[fields[i]])
      return GLM_USER_ERROR(meta.string(), ": the checkpoint's lora.", fields[i], " is ", v.dump(), ", this run's (",
                            options[i], ") is ", mine[fields[i]].dump(), ": resume with the LoRA configuration it was trained with");
  }
  const nlohmann::json& base = m["base"];
  const bool saved_random = base.contains("random_init_seed") && base["random_init_seed"].is_number_integer();
  const bool ours_random = expect.base_model.empty();
  const auto describe = [](bool random, const nlohmann::json& seed, const nlohmann::json& path) {
    return random ? concat("random init with seed ", seed.dump()) : concat("--model_id_or_path ", path.dump());
  };
  const nlohmann::json our_base = base_json(expect.base_model, expect.base_seed, base_sum_squares);
  if (saved_random != ours_random || (saved_random && base["random_init_seed"] != our_base["random_init_seed"]))
    return GLM_USER_ERROR(meta.string(), ": the checkpoint's base is ",
                          describe(saved_random, base.value("random_init_seed", nlohmann::json()),
                                   base.value("model_id_or_path", nlohmann::json())),
                          ", this run's base is ",
                          describe(ours_random, our_base["random_init_seed"], our_base["model_id_or_path"]),
                          " (field base): the adapters only make sense on the base they were trained on");
  if (!base.contains("sum_squares") || !base["sum_squares"].is_number())
    return GLM_USER_ERROR(meta.string(), ": field 'base.sum_squares' is missing or not a number");
  const double theirs = base["sum_squares"].get<double>();
  if (!lora_base_fingerprint_matches(theirs, base_sum_squares))
    return GLM_USER_ERROR(meta.string(), ": the checkpoint's base.sum_squares (a fingerprint of the base weights) is ",
                          theirs, ", this run's base gives ", base_sum_squares,
                          ": these are other base weights than the adapters were trained on");
  return Status::ok();
}

// The first `datasets` of kDatasets (master, exp_avg, exp_avg_sq) of adapters.h5, whole, checked.
Status read_lora_file(const fs::path& dir, int64_t expected_numel, int datasets,
                      const std::function<Status(int dataset, std::span<const float> values)>& sink) {
  quiet_hdf5();
  const fs::path path = dir / kLoraFile;
  if (!fs::exists(path)) return GLM_USER_ERROR("checkpoint '", dir.string(), "' misses ", kLoraFile);
  H5Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.ok()) return GLM_USER_ERROR(path.string(), " is not a readable HDF5 file (truncated or corrupt)");
  GLM_ASSIGN_OR_RETURN(const std::optional<int64_t> checksum_block, checksum_block_bytes(file.get(), path.string()));
  H5Id group(H5Gopen2(file.get(), kLoraGroup, H5P_DEFAULT), H5Gclose);
  if (!group.ok()) return GLM_USER_ERROR(path.string(), ": group ", kLoraGroup, " is missing");
  int64_t numel = -1;
  H5Id attr(H5Aopen(group.get(), "numel", H5P_DEFAULT), H5Aclose);
  if (!attr.ok() || H5Aread(attr.get(), H5T_NATIVE_INT64, &numel) < 0)
    return GLM_USER_ERROR(path.string(), ": ", kLoraGroup, " has no readable numel attribute");
  if (numel != expected_numel)
    return GLM_USER_ERROR(path.string(), ": ", numel, " adapter elements, the LoRA layout has ", expected_numel);
  std::vector<float> host(static_cast<size_t>(numel));
  for (int d = 0; d < datasets; ++d) {
    GLM_RETURN_IF_ERROR(
        read_checked_range(group.get(), kLoraGroup, kDatasets[d], path.string(), checksum_block, 0, host));
    GLM_RETURN_IF_ERROR(sink(d, host));
  }
  return Status::ok();
}

// Every rank reads the whole replicated LoRA state.
Status load_lora_file(TrainingEngine& engine, const fs::path& dir, bool weights_only) {
  const TrainingEngine::OptimizerShard mine = engine.lora_optimizer_state();
  Backend& backend = engine.backend();
  const Tensor targets[3] = {mine.master, mine.exp_avg, mine.exp_avg_sq};
  GLM_RETURN_IF_ERROR(
      read_lora_file(dir, mine.master.numel, weights_only ? 1 : 3,
                     [&](int d, std::span<const float> values) { return backend.upload(targets[d], values.data()); }));
  if (weights_only) {  // Adam starts over: zero moments, as a fresh optimizer has
    GLM_RETURN_IF_ERROR(backend.zero(mine.exp_avg));
    GLM_RETURN_IF_ERROR(backend.zero(mine.exp_avg_sq));
  }
  return backend.synchronize();
}

std::optional<double> optional_number(const nlohmann::json& m, const char* field) {
  if (!m.contains(field) || !m[field].is_number()) return std::nullopt;
  return m[field].get<double>();
}

}  // namespace

Result<CheckpointState> load_checkpoint(TrainingEngine& engine, Communicator& comm, const std::string& dir_name,
                                        const ResumeExpectation& expect) {
  const fs::path dir(dir_name);
  double base_sum_squares = 0;
  if (engine.lora_layout() != nullptr) {
    GLM_ASSIGN_OR_RETURN(base_sum_squares, engine.base_checksum());  // collective
  }
  Status local = Status::ok();
  CheckpointState state;
  auto meta = read_meta(dir);
  if (!meta.is_ok()) local = meta.status();
  if (local.is_ok()) {
    const nlohmann::json& m = meta.value();
    const nlohmann::json ours = model_shape(engine.config());
    for (const auto& [field, value] : ours.items()) {
      local = check_field(m["model"], ours, field, dir / "meta.json");
      if (!local.is_ok()) break;
    }
    const std::vector<int64_t> units = unpadded_units(engine.config());
    if (local.is_ok() && m["units"].get<std::vector<int64_t>>() != units)
      local = GLM_USER_ERROR((dir / "meta.json").string(), ": unit sizes differ from this model's layout");
    if (local.is_ok()) local = check_tokenizer(m, expect, dir / "meta.json");
    if (local.is_ok()) local = check_training_kind(m, engine, expect, base_sum_squares, dir / "meta.json");
    if (local.is_ok())
      local = engine.lora_layout() != nullptr
                  ? load_lora_file(engine, dir, expect.weights_only)
                  : load_rank_slices(engine, dir, m["world_size"].get<int>(), units, expect.weights_only);
    if (local.is_ok()) {
      state.step = m["step"].get<int64_t>();
      state.consumed_samples = m["consumed_samples"].get<int64_t>();
      state.seed = m["seed"].get<uint64_t>();
      if (m.contains("base") && m["base"].is_object() && m["base"].contains("model_id_or_path") &&
          m["base"]["model_id_or_path"].is_string())
        state.base_model = m["base"]["model_id_or_path"].get<std::string>();
      if (m.contains("tokenizer") && m["tokenizer"].is_object()) {
        state.tokenizer = m["tokenizer"].value("path", "");
        state.tokenizer_hash = m["tokenizer"].value("content_hash", "");
      }
      state.eval_loss = optional_number(m, "eval_loss");
      const std::optional<double> best = optional_number(m, "best_metric");
      if (best && m.contains("best_global_step") && m["best_global_step"].is_number_integer()) {
        state.best = EvalRecord{m["best_global_step"].get<int64_t>(), *best,
                                m.contains("best_model_checkpoint") && m["best_model_checkpoint"].is_string()
                                    ? m["best_model_checkpoint"].get<std::string>()
                                    : std::string()};
      }
    }
  }
  GLM_RETURN_IF_ERROR(agree(comm, local, "loading the checkpoint"));
  // Weights only: the optimizer starts at step 0 (bias correction from scratch) with zero moments.
  GLM_RETURN_IF_ERROR(
      engine.optimizer_restored(expect.weights_only ? 0 : meta.value()["optimizer_steps"].get<int64_t>()));
  return state;
}

namespace {

// meta.json's model_config; checkpoints written before it existed fall back on the run's args.json.
Result<ModelConfig> saved_model_config(const nlohmann::json& meta, const nlohmann::json& args,
                                       const fs::path& meta_path) {
  const bool has_config = meta.contains("model_config") && meta["model_config"].is_object();
  const nlohmann::json* options = args.is_object() && args.contains("options") ? &args["options"] : nullptr;
  if (!has_config && options == nullptr)
    return GLM_USER_ERROR(meta_path.string(),
                          " has no model_config (an older glm_hpc wrote it) and no args.json is "
                          "beside the checkpoint to take RoPE and norm settings from");
  auto number = [&](const char* field) -> Result<double> {
    const nlohmann::json* v = nullptr;
    if (has_config && meta["model_config"].contains(field)) {
      v = &meta["model_config"][field];
    } else if (!has_config && meta["model"].contains(field)) {
      v = &meta["model"][field];
    } else if (!has_config && options->contains(field) && (*options)[field].contains("value")) {
      v = &(*options)[field]["value"];
    }
    if (v == nullptr || !v->is_number())
      return GLM_USER_ERROR(meta_path.string(), ": model_config field '", field, "' is missing or not a number");
    return v->get<double>();
  };
  ModelConfig c;
  int64_t* integers[] = {
      &c.vocab_size,          &c.hidden_size,         &c.intermediate_size, &c.num_hidden_layers,
      &c.num_attention_heads, &c.num_key_value_heads, &c.head_dim,          &c.max_position_embeddings};
  const char* integer_names[] = {
      "vocab_size",          "hidden_size",         "intermediate_size", "num_hidden_layers",
      "num_attention_heads", "num_key_value_heads", "head_dim",          "max_position_embeddings"};
  for (size_t i = 0; i < std::size(integers); ++i) {
    GLM_ASSIGN_OR_RETURN(const double v, number(integer_names[i]));
    *integers[i] = static_cast<int64_t>(v);
  }
  GLM_ASSIGN_OR_RETURN(c.rope_theta, number("rope_theta"));
  GLM_ASSIGN_OR_RETURN(c.partial_rotary_factor, number("partial_rotary_factor"));
  GLM_ASSIGN_OR_RETURN(c.rms_norm_eps, number("rms_norm_eps"));
  GLM_ASSIGN_OR_RETURN(c.initializer_range, number("initializer_range"));
  Status valid = c.finalize_and_validate();
  if (!valid.is_ok()) return GLM_USER_ERROR(meta_path.string(), ": invalid model configuration: ", valid.message());
  return c;
}

// meta.json's lora and base objects (written by save_checkpoint: lora_json, base_json).
Result<LoraCheckpointInfo> saved_lora(const nlohmann::json& meta, const ModelConfig& config,
                                      const fs::path& meta_path) {
  if (!meta.contains("lora") || !meta["lora"].is_object() || !meta.contains("base") || !meta["base"].is_object())
    return GLM_USER_ERROR(meta_path.string(), ": a LoRA checkpoint without the 'lora' or 'base' object");
  const nlohmann::json& l = meta["lora"];
  const nlohmann::json& b = meta["base"];
  LoraCheckpointInfo out;
  if (!l.contains("rank") || !l["rank"].is_number_integer() || l["rank"].get<int64_t>() < 1)
    return GLM_USER_ERROR(meta_path.string(), ": field 'lora.rank' is missing or not a positive integer");
  if (!l.contains("alpha") || !l["alpha"].is_number() || !(l["alpha"].get<double>() > 0))
    return GLM_USER_ERROR(meta_path.string(), ": field 'lora.alpha' is missing or not a positive number");
  if (!l.contains("targets") || !l["targets"].is_array() || l["targets"].empty())
    return GLM_USER_ERROR(meta_path.string(), ": field 'lora.targets' is missing or not a list of module names");
  out.config.rank = l["rank"].get<int64_t>();
  out.config.alpha = l["alpha"].get<double>();
  // Checkpoints written before dropout was implemented lack the field: they trained without dropout.
  out.config.dropout = l.contains("dropout") && l["dropout"].is_number() ? l["dropout"].get<double>() : 0.0;
  std::string names;
  for (const auto& t : l["targets"]) {
    if (!t.is_string()) return GLM_USER_ERROR(meta_path.string(), ": field 'lora.targets' holds a non-string");
    names += (names.empty() ? "" : ",") + t.get<std::string>();
  }
  auto targets = parse_lora_targets(names);
  if (!targets.is_ok()) return GLM_USER_ERROR(meta_path.string(), ": lora.targets: ", targets.status().message());
  out.config.targets = targets.take();
  const int64_t numel = LoraLayout(config, out.config).total_numel();
  if (l.value("numel", nlohmann::json()) != nlohmann::json(numel))
    return GLM_USER_ERROR(meta_path.string(), ": lora.numel is ", l.value("numel", nlohmann::json()).dump(),
                          ", the LoRA layout of its model and configuration has ", numel);
  const nlohmann::json path = b.value("model_id_or_path", nlohmann::json());
  const nlohmann::json seed = b.value("random_init_seed", nlohmann::json());
  if (path.is_string() && !path.get<std::string>().empty()) {
    out.base_model = path.get<std::string>();
  } else if (seed.is_number_unsigned() || seed.is_number_integer()) {
    out.random_init_seed = seed.get<uint64_t>();
  } else {
    return GLM_USER_ERROR(meta_path.string(), ": field 'base' names neither a model_id_or_path nor a random_init_seed");
  }
  if (!b.contains("sum_squares") || !b["sum_squares"].is_number())
    return GLM_USER_ERROR(meta_path.string(), ": field 'base.sum_squares' is missing or not a number");
  out.base_sum_squares = b["sum_squares"].get<double>();
  return out;
}

Result<nlohmann::json> read_args(const fs::path& path) {
  std::ifstream in(path);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return GLM_USER_ERROR(path.string(), " is not valid JSON");
  return j;
}

}  // namespace

Result<CheckpointInfo> read_checkpoint_info(const std::string& dir_name) {
  const fs::path dir(dir_name);
  CheckpointInfo info;
  info.dir = dir_name;
  GLM_ASSIGN_OR_RETURN(const nlohmann::json meta, read_meta(dir));
  for (const fs::path& args : {dir / "args.json", dir.parent_path() / "args.json"}) {
    if (fs::exists(args)) {
      GLM_ASSIGN_OR_RETURN(info.args, read_args(args));
      break;
    }
  }
  const fs::path meta_path = dir / "meta.json";
  GLM_ASSIGN_OR_RETURN(info.config, saved_model_config(meta, info.args, meta_path));
  const nlohmann::json ours = model_shape(info.config);
  for (const auto& [field, value] : ours.items())
    GLM_RETURN_IF_ERROR(check_field(meta["model"], ours, field, meta_path));
  if (!meta["units"].is_array() || meta["units"] != nlohmann::json(unpadded_units(info.config)))
    return GLM_USER_ERROR(meta_path.string(), ": unit sizes differ from the layout of the model it describes");
  for (const char* field : {"world_size", "step", "zero_stage"})
    if (meta.contains(field) && !meta[field].is_number_integer())
      return GLM_USER_ERROR(meta_path.string(), ": field '", field, "' must be an integer");
  if (meta["world_size"].get<int64_t>() < 1 || meta["world_size"].get<int64_t>() > 1'000'000)
    return GLM_USER_ERROR(meta_path.string(), ": world_size ", meta["world_size"].dump(), " is not a rank count");
  info.world_size = meta["world_size"].get<int>();
  info.zero_stage = meta.contains("zero_stage") ? meta["zero_stage"].get<int>() : 0;
  info.step = meta["step"].get<int64_t>();
  if (meta.contains("tokenizer") && meta["tokenizer"].is_object() && meta["tokenizer"].contains("path") &&
      meta["tokenizer"]["path"].is_string())
    info.tokenizer = meta["tokenizer"]["path"].get<std::string>();
  if (meta.value("train_type", "full") == "lora") {
    GLM_ASSIGN_OR_RETURN(info.lora, saved_lora(meta, info.config, meta_path));
  }
  return info;
}

bool lora_base_fingerprint_matches(double recorded, double computed) {
  // A weak fingerprint: it tells other weights apart, not a base changed by a tiny fraction.
  return std::abs(recorded - computed) <= kLoraBaseFingerprintTolerance * std::max(std::abs(recorded), 1.0);
}

Result<std::vector<float>> read_checkpoint_adapters(const CheckpointInfo& info) {
  if (!info.lora)
    return GLM_USER_ERROR("checkpoint '", info.dir, "' is a full-training checkpoint: it holds no LoRA adapters");
  const LoraLayout layout(info.config, info.lora->config);
  std::vector<float> adapters;
  GLM_RETURN_IF_ERROR(read_lora_file(info.dir, layout.total_numel(), 1, [&](int, std::span<const float> values) {
    adapters.assign(values.begin(), values.end());
    return Status::ok();
  }));
  return adapters;
}

Status read_checkpoint_masters(const CheckpointInfo& info,
                               const std::function<Status(int unit, std::span<const float> values)>& sink) {
  if (info.lora)
    return GLM_USER_ERROR("checkpoint '", info.dir,
                          "' is a LoRA checkpoint (train_type lora): it holds the adapters, not the model's weights");
  quiet_hdf5();
  const fs::path dir(info.dir);
  std::vector<std::unique_ptr<H5Id>> files;
  std::vector<std::optional<int64_t>> checksum_blocks;
  for (int r = 0; r < info.world_size; ++r) {
    const fs::path path = dir / rank_file(r);
    if (!fs::exists(path)) return GLM_USER_ERROR("checkpoint '", dir.string(), "' misses ", rank_file(r));
    files.push_back(std::make_unique<H5Id>(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose));
    if (!files.back()->ok())
      return GLM_USER_ERROR(path.string(), " is not a readable HDF5 file (truncated or corrupt)");
    GLM_ASSIGN_OR_RETURN(const std::optional<int64_t> block, checksum_block_bytes(files.back()->get(), path.string()));
    checksum_blocks.push_back(block);
  }
  const std::vector<int64_t> units = unpadded_units(info.config);
  std::vector<float> unit_values, host;
  for (int u = 0; u < static_cast<int>(units.size()); ++u) {
    const int64_t size = units[static_cast<size_t>(u)];
    unit_values.assign(static_cast<size_t>(size), 0.0f);
    std::vector<std::pair<int64_t, int64_t>> pieces;  // [lo, hi) read, to prove exact coverage
    for (int r = 0; r < info.world_size; ++r) {
      const fs::path path = dir / rank_file(r);
      H5Id group(H5Gopen2(files[static_cast<size_t>(r)]->get(), unit_group(u).c_str(), H5P_DEFAULT), H5Gclose);
      if (!group.ok()) return GLM_USER_ERROR(path.string(), ": group ", unit_group(u), " is missing");
      GLM_ASSIGN_OR_RETURN(const std::vector<FileRun> runs, file_runs(group.get(), path, u));
      for (const FileRun& run : runs) {
        const int64_t lo = run.begin, hi = std::min(run.begin + run.count, size);  // the tail past `size` is padding
        if (lo >= hi) continue;
        GLM_RETURN_IF_ERROR(read_range(group.get(), kDatasets[0], path, checksum_blocks[static_cast<size_t>(r)], u,
                                       run.begin - run.stored, lo, hi, host));
        std::copy(host.begin(), host.end(), unit_values.begin() + lo);
        pieces.emplace_back(lo, hi);
      }
    }
    std::sort(pieces.begin(), pieces.end());
    int64_t cursor = 0;
    for (const auto& [lo, hi] : pieces) {
      if (lo < cursor)
        return GLM_USER_ERROR("checkpoint '", dir.string(), "': ", unit_group(u), " elements [", lo, ", ",
                              std::min(cursor, hi), ") are in two rank files");
      if (lo > cursor) break;
      cursor = hi;
    }
    if (cursor != size)
      return GLM_USER_ERROR("checkpoint '", dir.string(), "': ", unit_group(u), " elements from ", cursor,
                            " on are in no rank file (of ", info.world_size, "; meta.json's world_size)");
    GLM_RETURN_IF_ERROR(sink(u, unit_values));
  }
  return Status::ok();
}

}  // namespace glm
