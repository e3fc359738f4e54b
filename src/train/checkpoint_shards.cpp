// Rank files (see checkpoint_shards.h): which unit-relative runs of the optimizer state this rank
// holds, written to and read from io/checkpoint_file.h's files.
#include "train/checkpoint_shards.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <span>

#include "io/checkpoint_file.h"
#include "train/checkpoint_format.h"

namespace glm {
namespace {

namespace fs = std::filesystem;

// A run of this rank's optimizer state inside one of the checkpoint's units (the layout's home
// units: embedding, layers, head), located as the layout without persistent tensors places it.
struct Slice {
  int64_t begin = 0, count = 0;          // unit-relative
  TrainingEngine::OptimizerShard owner;  // the optimizer state of the layout unit holding it
  int64_t owned_offset = 0;              // where the run starts inside owner's tensors
  // n values of dataset d from `from` inside the run, to or from the host; the master (d = 0) goes
  // through `masters` (it may be split into halves on the device).
  Status download(OptimizerStateTransfer& masters, int d, int64_t from, float* dst, int64_t n) const {
    return masters.download(owner, d, owned_offset + from, std::span<float>(dst, static_cast<size_t>(n)));
  }
  Status upload(OptimizerStateTransfer& masters, int d, int64_t from, const float* src, int64_t n) const {
    return masters.upload(owner, d, owned_offset + from, std::span<const float>(src, static_cast<size_t>(n)));
  }
};

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

// One group per home unit: the runs it holds (attribute ranges where ZeRO-3 keeps persistent tensors
// apart, else begin_count) and the first `datasets` of master, exp_avg and exp_avg_sq, the runs back
// to back.
std::vector<CheckpointFileGroup> rank_file_groups(const std::vector<std::vector<Slice>>& slices, bool ranges,
                                                  int datasets) {
  std::vector<CheckpointFileGroup> groups(slices.size());
  for (size_t u = 0; u < slices.size(); ++u) {
    const std::vector<Slice>& runs = slices[u];
    CheckpointFileGroup& g = groups[u];
    g.name = checkpoint_unit_group(static_cast<int>(u));
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
      for (int d = 0; d < datasets; ++d) g.datasets.emplace_back(kCheckpointDatasets[d], count);
  }
  return groups;
}

// Elements [first, first + dst.size()) of a unit's dataset, the unit's runs back to back; a block may
// span several runs.
Status fill_from_runs(const std::vector<Slice>& runs, OptimizerStateTransfer& masters, size_t unit, size_t dataset,
                      int64_t first, std::span<float> dst) {
  int64_t base = 0, pos = first;
  size_t done = 0;
  for (const Slice& run : runs) {
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
    return GLM_INTERNAL_ERROR("checkpoint fill past the runs of ", checkpoint_unit_group(static_cast<int>(unit)));
  return Status::ok();
}

// Part of the shard is on disk, the rest never will be.
void kill_midway_through(CheckpointFileOptions& options, size_t group, int rank, const fs::path& path) {
  options.pause_before_group = group;
  options.at_pause = [rank, path] {
    std::fprintf(stderr, "glm_hpc: rank %d: GLM_TEST_KILL_DURING_SAVE: SIGKILL while writing '%s'\n", rank,
                 path.c_str());
    std::fflush(stderr);
    std::raise(SIGKILL);
  };
}

}  // namespace

Status write_rank_file(const TrainingEngine& engine, Backend& backend, const fs::path& path, int rank, int world,
                       bool model_only, bool kill_midway) {
  if (!engine.optimizer_settled())
    return GLM_INTERNAL_ERROR("checkpoint of an optimizer with deferred updates pending");
  for (size_t u = 0; u < engine.layout().units().size(); ++u)
    if (const DType d = engine.optimizer_shard(static_cast<int>(u)).master.dtype; d != DType::f32 && d != DType::i16)
      return GLM_INTERNAL_ERROR("checkpoints store fp32 optimizer state, the backend keeps ", dtype_name(d));
  OptimizerStateTransfer masters(backend);
  const bool ranges = engine.layout().persistent_unit() >= 0;
  const int units = engine.layout().home_units();
  std::vector<std::vector<Slice>> slices;
  for (int u = 0; u < units; ++u) slices.push_back(write_slices(engine, u, rank, world));
  const std::vector<CheckpointFileGroup> groups = rank_file_groups(slices, ranges, model_only ? 1 : 3);
  auto fill = [&](size_t unit, size_t dataset, int64_t first, std::span<float> dst) -> Status {
    return fill_from_runs(slices[unit], masters, unit, dataset, first, dst);
  };
  CheckpointFileOptions options;
  if (kill_midway) kill_midway_through(options, static_cast<size_t>(units / 2), rank, path);
  auto written = write_checkpoint_file(path.string(), groups, fill, options);
  return written.is_ok() ? Status::ok() : written.status();
}

namespace {

// The slices of one rank file that overlap what this rank holds, read into the optimizer state;
// covered[u] grows by the elements of unit u read.
Status load_rank_file(const fs::path& path, const std::vector<std::vector<Slice>>& mine,
                      const std::vector<int64_t>& unpadded, int datasets, OptimizerStateTransfer& masters,
                      std::vector<int64_t>& covered) {
  GLM_ASSIGN_OR_RETURN(const CheckpointFileReader file, CheckpointFileReader::open(path.string()));
  std::vector<float> host;
  for (size_t u = 0; u < mine.size(); ++u) {
    const int unit = static_cast<int>(u);
    GLM_ASSIGN_OR_RETURN(const CheckpointGroupReader group, file.group(checkpoint_unit_group(unit)));
    GLM_ASSIGN_OR_RETURN(const std::vector<FileRun> runs, file_runs(group, path.string(), unit));
    for (const FileRun& run : runs) {
      for (const Slice& held : mine[u]) {
        // The overlap of the file's run, this rank's run and the unit's real extent.
        const int64_t lo = std::max(run.begin, held.begin);
        const int64_t hi = std::min({run.begin + run.count, held.begin + held.count, unpadded[u]});
        if (lo >= hi) continue;
        host.resize(static_cast<size_t>(hi - lo));
        for (int d = 0; d < datasets; ++d) {
          GLM_RETURN_IF_ERROR(group.read(kCheckpointDatasets[d], lo - (run.begin - run.stored), host));
          GLM_RETURN_IF_ERROR(held.upload(masters, d, lo - held.begin, host.data(), hi - lo));
        }
        covered[u] += hi - lo;
      }
    }
  }
  return Status::ok();
}

// Every element this rank holds below the unit's real extent was read exactly once.
Status check_coverage(const fs::path& dir, const std::vector<std::vector<Slice>>& mine,
                      const std::vector<int64_t>& unpadded, const std::vector<int64_t>& covered) {
  for (size_t u = 0; u < mine.size(); ++u) {
    int64_t need = 0;
    for (const Slice& held : mine[u])
      need += std::max<int64_t>(0, std::min(held.begin + held.count, unpadded[u]) - held.begin);
    if (covered[u] != need)
      return GLM_USER_ERROR("checkpoint '", dir.string(), "': ", checkpoint_unit_group(static_cast<int>(u)), " covers ",
                            covered[u], " of the ", need,
                            " elements this rank needs (rank files overlap or are missing slices)");
  }
  return Status::ok();
}

// Adam starts over: zero moments, as a fresh optimizer has.
Status zero_moments(TrainingEngine& engine) {
  OptimizerStateTransfer state(engine.backend());
  for (size_t u = 0; u < engine.layout().units().size(); ++u)
    GLM_RETURN_IF_ERROR(state.zero_moments(engine.optimizer_shard(static_cast<int>(u))));
  return Status::ok();
}

}  // namespace

// Writes straight into the optimizer state and, where masters are split, into the live bf16
// parameters (their high halves): a load that fails partway leaves the engine unusable, which is
// fine while every caller gives up on a load error (a fallback to an older checkpoint would first
// need a fresh engine or a full reload).
Status load_rank_slices(TrainingEngine& engine, const fs::path& dir, int saved_world,
                        const std::vector<int64_t>& unpadded, bool weights_only) {
  const int units = engine.layout().home_units();
  std::vector<int64_t> covered(static_cast<size_t>(units), 0);
  std::vector<std::vector<Slice>> mine;
  for (int u = 0; u < units; ++u) mine.push_back(owned_slices(engine, u));
  OptimizerStateTransfer masters(engine.backend());
  for (int r = 0; r < saved_world; ++r) {
    const fs::path path = dir / checkpoint_rank_file(r);
    if (!fs::exists(path)) return GLM_USER_ERROR("checkpoint '", dir.string(), "' misses ", checkpoint_rank_file(r));
    GLM_RETURN_IF_ERROR(load_rank_file(path, mine, unpadded, weights_only ? 1 : 3, masters, covered));
  }
  if (weights_only) GLM_RETURN_IF_ERROR(zero_moments(engine));
  GLM_RETURN_IF_ERROR(check_coverage(dir, mine, unpadded, covered));
  return engine.backend().synchronize();
}

}  // namespace glm
