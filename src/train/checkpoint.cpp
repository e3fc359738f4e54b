// Sharded HDF5 checkpoints (see checkpoint.h): writing, atomic publication, pruning, validated
// loading with resharding by unit-relative ranges.
#include "train/checkpoint.h"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

namespace glm {
namespace {

namespace fs = std::filesystem;
constexpr const char* kFormat = "glm_hpc-checkpoint";
constexpr int kVersion = 1;
constexpr const char* kDatasets[3] = {"master", "exp_avg", "exp_avg_sq"};

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

Status fsync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) return GLM_ERROR(ErrorKind::io, "cannot open '", p.string(), "' to sync it");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return GLM_ERROR(ErrorKind::io, "fsync of '", p.string(), "' failed");
  return Status::ok();
}

Status write_text_durably(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) return GLM_ERROR(ErrorKind::io, "cannot write '", tmp.string(), "'");
  }
  GLM_RETURN_IF_ERROR(fsync_path(tmp));
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return GLM_ERROR(ErrorKind::io, "cannot rename '", tmp.string(), "': ", ec.message());
  return Status::ok();
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

// The unit sizes without world-size padding: what a checkpoint must cover.
std::vector<int64_t> unpadded_units(const ModelConfig& c) {
  std::vector<int64_t> sizes;
  const ParamLayout layout(c, 1);
  for (const auto& u : layout.units()) sizes.push_back(u.numel);
  return sizes;
}

// This rank's slice of a unit to write: its shard (stages 1-3), or at stage 0 (every rank holds
// the whole unit) the r-th of N equal parts, so that each element is written once.
struct Slice {
  int64_t begin = 0, count = 0;  // unit-relative, and inside the owned range
  int64_t owned_offset = 0;      // where the slice starts inside the owned tensors
};

Slice write_slice(const TrainingEngine& e, int unit, int rank, int world) {
  const TrainingEngine::OptimizerShard s = e.optimizer_shard(unit);
  const int64_t padded = e.layout().units()[static_cast<size_t>(unit)].numel;
  const int64_t part = padded / world;
  const int64_t lo = std::max(s.unit_begin, part * rank), hi = std::min(s.unit_begin + s.master.numel, part * (rank + 1));
  Slice out;
  out.begin = lo;
  out.count = std::max<int64_t>(0, hi - lo);
  out.owned_offset = lo - s.unit_begin;
  return out;
}

Status write_rank_file(const TrainingEngine& engine, Backend& backend, const fs::path& path, int rank, int world) {
  quiet_hdf5();
  H5Id file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (!file.ok()) return GLM_ERROR(ErrorKind::io, "cannot create '", path.string(), "'");
  const int units = static_cast<int>(engine.layout().units().size());
  std::vector<float> host;
  for (int u = 0; u < units; ++u) {
    const Slice slice = write_slice(engine, u, rank, world);
    const TrainingEngine::OptimizerShard s = engine.optimizer_shard(u);
    if (s.master.dtype != DType::f32)
      return GLM_INTERNAL_ERROR("checkpoints store fp32 optimizer state, the backend keeps ", dtype_name(s.master.dtype));
    H5Id group(H5Gcreate2(file.get(), unit_group(u).c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    if (!group.ok()) return GLM_ERROR(ErrorKind::io, "cannot create group ", unit_group(u), " in '", path.string(), "'");
    const int64_t attrs[2] = {slice.begin, slice.count};
    const hsize_t two = 2;
    H5Id aspace(H5Screate_simple(1, &two, nullptr), H5Sclose);
    H5Id attr(H5Acreate2(group.get(), "begin_count", H5T_STD_I64LE, aspace.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    if (!attr.ok() || H5Awrite(attr.get(), H5T_NATIVE_INT64, attrs) < 0)
      return GLM_ERROR(ErrorKind::io, "cannot write attributes of ", unit_group(u), " in '", path.string(), "'");
    if (slice.count == 0) continue;
    const hsize_t n = static_cast<hsize_t>(slice.count);
    const hsize_t chunk = std::min<hsize_t>(n, hsize_t{1} << 20);
    H5Id plist(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    if (H5Pset_chunk(plist.get(), 1, &chunk) < 0 || H5Pset_fletcher32(plist.get()) < 0)
      return GLM_ERROR(ErrorKind::io, "HDF5 dataset properties failed for '", path.string(), "'");
    H5Id space(H5Screate_simple(1, &n, nullptr), H5Sclose);
    host.resize(static_cast<size_t>(slice.count));
    const Tensor sources[3] = {s.master, s.exp_avg, s.exp_avg_sq};
    for (int d = 0; d < 3; ++d) {
      GLM_RETURN_IF_ERROR(backend.download(host.data(), sources[d].slice(slice.owned_offset, slice.count)));
      H5Id ds(H5Dcreate2(group.get(), kDatasets[d], H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, plist.get(), H5P_DEFAULT),
              H5Dclose);
      if (!ds.ok() || H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, host.data()) < 0)
        return GLM_ERROR(ErrorKind::io, "cannot write ", unit_group(u), "/", kDatasets[d], " to '", path.string(),
                         "' (disk full?)");
    }
  }
  if (H5Fflush(file.get(), H5F_SCOPE_LOCAL) < 0) return GLM_ERROR(ErrorKind::io, "cannot flush '", path.string(), "'");
  return Status::ok();
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
               int64_t save_total_limit) {
  GLM_RETURN_IF_ERROR(write_text_durably(tmp / "meta.json", meta.dump(2) + "\n"));
  GLM_RETURN_IF_ERROR(write_text_durably(tmp / "COMPLETE", std::to_string(meta["step"].get<int64_t>()) + "\n"));
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
  GLM_RETURN_IF_ERROR(write_text_durably(output_dir / "latest", final_dir.filename().string() + "\n"));
  if (save_total_limit > 0) {
    std::vector<fs::path> all = complete_checkpoints(output_dir);
    for (size_t i = 0; i + static_cast<size_t>(save_total_limit) < all.size(); ++i) {
      if (all[i] == final_dir) continue;  // never the newest
      fs::remove_all(all[i], ec);
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
  if (meta.value("format", "") != kFormat || meta.value("version", 0) != kVersion)
    return GLM_USER_ERROR(path.string(), " is not a glm_hpc checkpoint of version ", kVersion);
  for (const char* field : {"step", "world_size", "units", "model", "consumed_samples", "seed", "optimizer_steps"})
    if (!meta.contains(field)) return GLM_USER_ERROR(path.string(), ": field '", field, "' is missing");
  return meta;
}

// Reads [lo, hi) (unit-relative) of one dataset of one rank file into dst (this rank's tensor).
Status read_range(hid_t group, const char* dataset, const fs::path& file, int unit, int64_t file_begin, int64_t lo,
                  int64_t hi, std::vector<float>& host) {
  H5Id ds(H5Dopen2(group, dataset, H5P_DEFAULT), H5Dclose);
  if (!ds.ok()) return GLM_USER_ERROR(file.string(), ": ", unit_group(unit), "/", dataset, " is missing");
  H5Id space(H5Dget_space(ds.get()), H5Sclose);
  const hsize_t start = static_cast<hsize_t>(lo - file_begin), count = static_cast<hsize_t>(hi - lo);
  if (H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr) < 0)
    return GLM_USER_ERROR(file.string(), ": ", unit_group(unit), "/", dataset, " is shorter than its attributes say");
  H5Id mem(H5Screate_simple(1, &count, nullptr), H5Sclose);
  host.resize(count);
  if (H5Dread(ds.get(), H5T_NATIVE_FLOAT, mem.get(), space.get(), H5P_DEFAULT, host.data()) < 0)
    return GLM_USER_ERROR(file.string(), ": ", unit_group(unit), "/", dataset,
                          " cannot be read (truncated or corrupt: its checksum does not match)");
  return Status::ok();
}

Status load_rank_slices(TrainingEngine& engine, const fs::path& dir, int saved_world,
                        const std::vector<int64_t>& unpadded) {
  quiet_hdf5();
  Backend& backend = engine.backend();
  const int units = static_cast<int>(engine.layout().units().size());
  std::vector<int64_t> covered(static_cast<size_t>(units), 0);
  std::vector<float> host;
  for (int r = 0; r < saved_world; ++r) {
    const fs::path path = dir / rank_file(r);
    if (!fs::exists(path)) return GLM_USER_ERROR("checkpoint '", dir.string(), "' misses ", rank_file(r));
    H5Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    if (!file.ok()) return GLM_USER_ERROR(path.string(), " is not a readable HDF5 file (truncated or corrupt)");
    for (int u = 0; u < units; ++u) {
      H5Id group(H5Gopen2(file.get(), unit_group(u).c_str(), H5P_DEFAULT), H5Gclose);
      if (!group.ok()) return GLM_USER_ERROR(path.string(), ": group ", unit_group(u), " is missing");
      int64_t bc[2] = {0, 0};
      H5Id attr(H5Aopen(group.get(), "begin_count", H5P_DEFAULT), H5Aclose);
      if (!attr.ok() || H5Aread(attr.get(), H5T_NATIVE_INT64, bc) < 0)
        return GLM_USER_ERROR(path.string(), ": ", unit_group(u), " has no readable begin_count attribute");
      const TrainingEngine::OptimizerShard mine = engine.optimizer_shard(u);
      // The overlap of the file's slice, this rank's owned range and the unit's real extent.
      const int64_t lo = std::max(bc[0], mine.unit_begin);
      const int64_t hi = std::min({bc[0] + bc[1], mine.unit_begin + mine.master.numel, unpadded[static_cast<size_t>(u)]});
      if (lo >= hi) continue;
      const Tensor targets[3] = {mine.master, mine.exp_avg, mine.exp_avg_sq};
      for (int d = 0; d < 3; ++d) {
        GLM_RETURN_IF_ERROR(read_range(group.get(), kDatasets[d], path, u, bc[0], lo, hi, host));
        GLM_RETURN_IF_ERROR(backend.upload(targets[d].slice(lo - mine.unit_begin, hi - lo), host.data()));
      }
      covered[static_cast<size_t>(u)] += hi - lo;
    }
  }
  for (int u = 0; u < units; ++u) {
    const TrainingEngine::OptimizerShard mine = engine.optimizer_shard(u);
    const int64_t need =
        std::max<int64_t>(0, std::min(mine.unit_begin + mine.master.numel, unpadded[static_cast<size_t>(u)]) -
                                 mine.unit_begin);
    if (covered[static_cast<size_t>(u)] != need)
      return GLM_USER_ERROR("checkpoint '", dir.string(), "': ", unit_group(u), " covers ", covered[static_cast<size_t>(u)],
                            " of the ", need, " elements this rank needs (rank files overlap or are missing slices)");
  }
  return backend.synchronize();
}

}  // namespace

Result<std::string> save_checkpoint(TrainingEngine& engine, Communicator& comm, const std::string& output_dir,
                                    const CheckpointState& state, int64_t save_total_limit) {
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
  GLM_RETURN_IF_ERROR(engine.backend().synchronize());
  Status wrote = write_rank_file(engine, engine.backend(), tmp / rank_file(rank), rank, world);
  if (wrote.is_ok()) wrote = fsync_path(tmp / rank_file(rank));
  GLM_RETURN_IF_ERROR(agree(comm, wrote, "writing the checkpoint"));
  Status published = Status::ok();
  if (rank == 0) {
    nlohmann::json meta = {{"format", kFormat},
                           {"version", kVersion},
                           {"step", state.step},
                           {"consumed_samples", state.consumed_samples},
                           {"seed", state.seed},
                           {"world_size", world},
                           {"zero_stage", engine.zero_stage()},
                           {"optimizer_steps", engine.optimizer_steps()},
                           {"model", model_shape(engine.config())},
                           {"units", unpadded_units(engine.config())}};
    published = publish(tmp, final_dir, out, meta, save_total_limit);
  }
  GLM_RETURN_IF_ERROR(agree(comm, published, "publishing the checkpoint"));
  return final_dir.string();
}

Result<std::string> resolve_checkpoint(const std::string& spec, const std::string& output_dir) {
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
      if (all.empty()) return GLM_USER_ERROR("--resume_from_checkpoint latest: no complete checkpoint in '", output_dir, "'");
      dir = all.back();
    }
  }
  if (!fs::is_directory(dir)) return GLM_USER_ERROR("--resume_from_checkpoint: '", dir.string(), "' is not a directory");
  if (!fs::exists(dir / "COMPLETE"))
    return GLM_USER_ERROR("checkpoint '", dir.string(), "' is incomplete (no COMPLETE marker: its save was interrupted)");
  return dir.string();
}

Result<CheckpointState> load_checkpoint(TrainingEngine& engine, Communicator& comm, const std::string& dir_name) {
  const fs::path dir(dir_name);
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
    if (local.is_ok()) local = load_rank_slices(engine, dir, m["world_size"].get<int>(), units);
    if (local.is_ok()) {
      state.step = m["step"].get<int64_t>();
      state.consumed_samples = m["consumed_samples"].get<int64_t>();
      state.seed = m["seed"].get<uint64_t>();
    }
  }
  GLM_RETURN_IF_ERROR(agree(comm, local, "loading the checkpoint"));
  GLM_RETURN_IF_ERROR(engine.optimizer_restored(meta.value()["optimizer_steps"].get<int64_t>()));
  return state;
}

}  // namespace glm
