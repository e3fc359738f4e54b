// The collective checkpoint entry points (see checkpoint.h): save and load, each rank's part agreed
// across ranks. The parts: checkpoint_dir (publication), checkpoint_meta (meta.json),
// checkpoint_resume (compatibility), checkpoint_shards (rank files), lora_checkpoint (adapters.h5).
#include "train/checkpoint.h"

#include <array>
#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "base/temp_names.h"
#include "train/checkpoint_dir.h"
#include "train/checkpoint_format.h"
#include "train/checkpoint_meta.h"
#include "train/checkpoint_resume.h"
#include "train/checkpoint_shards.h"
#include "train/lora_checkpoint.h"

namespace glm {
namespace {

namespace fs = std::filesystem;

// Every rank's status, agreed: ok only if ok everywhere; a failing rank keeps its own message.
Status agree(Communicator& comm, const Status& local, const char* what) {
  int32_t failed = local.is_ok() ? 0 : 1;
  GLM_RETURN_IF_ERROR(comm.all_reduce(&failed, &failed, 1, CommType::i32, ReduceOp::max));
  if (!local.is_ok()) return local;
  if (failed != 0) return GLM_ERROR(ErrorKind::io, what, " failed on another rank (its message is above)");
  return Status::ok();
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

// This rank's part of a save: its rank file, or for LoRA adapters.h5 on rank 0 only; bytes: its size.
Status write_own_file(TrainingEngine& engine, const fs::path& tmp, int rank, int world, int64_t step, bool model_only,
                      int64_t& bytes) {
  const bool lora = engine.lora_layout() != nullptr;
  // LoRA: the replicated adapters' state, written once (by rank 0); else every rank's slices.
  if (lora && rank != 0) return Status::ok();
  const fs::path mine = tmp / (lora ? std::string(kLoraCheckpointFile) : checkpoint_rank_file(rank));
  // write_rank_file and write_lora_file end with the file's fdatasync.
  GLM_RETURN_IF_ERROR(
      lora ? write_lora_file(engine, engine.backend(), mine, model_only)
           : write_rank_file(engine, engine.backend(), mine, rank, world, model_only, test_kill_during_save(rank, step)));
  std::error_code ec;
  bytes = static_cast<int64_t>(fs::file_size(mine, ec));
  if (ec) return GLM_ERROR(ErrorKind::io, "cannot stat '", mine.string(), "': ", ec.message());
  return Status::ok();
}

// This rank's part of a load: meta.json checked against this run, then its optimizer state read.
Result<CheckpointMeta> load_own_part(TrainingEngine& engine, const fs::path& dir, const ResumeExpectation& expect,
                                     double base_sum_squares) {
  GLM_ASSIGN_OR_RETURN(CheckpointMeta meta, read_checkpoint_meta(dir));
  const std::vector<int64_t> units = unpadded_units(engine.config());
  GLM_RETURN_IF_ERROR(check_resume_compatible(meta, engine, expect, units, base_sum_squares));
  GLM_RETURN_IF_ERROR(engine.lora_layout() != nullptr
                          ? load_lora_file(engine, dir, expect.weights_only)
                          : load_rank_slices(engine, dir, meta.world_size, units, expect.weights_only));
  return meta;
}

// Rank 0 names this save's temporary directory (unique to its process: base/temp_names.h); every
// rank writes its file into it.
Result<fs::path> agreed_temp_dir(Communicator& comm, const fs::path& final_dir) {
  std::array<char, 256> name{};
  if (comm.rank() == 0) temp_path_for(final_dir).filename().string().copy(name.data(), name.size() - 1);
  GLM_RETURN_IF_ERROR(comm.broadcast(name.data(), name.size(), CommType::u8, 0));
  return final_dir.parent_path() / std::string(name.data());
}

}  // namespace

Result<SaveReport> save_checkpoint(TrainingEngine& engine, Communicator& comm, const std::string& output_dir,
                                   const CheckpointState& state, int64_t save_total_limit) {
  const auto started = std::chrono::steady_clock::now();
  const fs::path out(output_dir), final_dir = checkpoint_dir_path(out, state.step);
  GLM_ASSIGN_OR_RETURN(const fs::path tmp, agreed_temp_dir(comm, final_dir));
  const int rank = comm.rank(), world = comm.size();
  // A failed save leaves nothing behind (after publication the temporary is gone already).
  struct RemoveUnpublished {
    const fs::path& dir;
    bool owner;
    ~RemoveUnpublished() {
      std::error_code ec;
      if (owner) fs::remove_all(dir, ec);
    }
  } unpublished{tmp, rank == 0};
  GLM_RETURN_IF_ERROR(
      agree(comm, rank == 0 ? make_checkpoint_temp_dir(tmp) : Status::ok(), "creating the checkpoint directory"));
  double base_sum_squares = 0;
  if (engine.lora_layout() != nullptr) {
    GLM_ASSIGN_OR_RETURN(base_sum_squares, engine.base_checksum());  // collective
  }
  GLM_RETURN_IF_ERROR(engine.settle_optimizer());  // deferred embedding rows: every row at this step
  GLM_RETURN_IF_ERROR(engine.backend().synchronize());
  int64_t bytes = 0;
  GLM_RETURN_IF_ERROR(
      agree(comm, write_own_file(engine, tmp, rank, world, state.step, state.model_only, bytes),
            "writing the checkpoint"));
  GLM_RETURN_IF_ERROR(comm.all_reduce(&bytes, &bytes, 1, CommType::i64, ReduceOp::sum));
  Status published = Status::ok();
  if (rank == 0)
    published = publish_checkpoint(tmp, final_dir, out, checkpoint_meta_json(engine, state, world, base_sum_squares),
                                   save_total_limit, state.best ? state.best->checkpoint : "");
  GLM_RETURN_IF_ERROR(agree(comm, published, "publishing the checkpoint"));
  SaveReport report;
  report.dir = final_dir.string();
  report.bytes = bytes;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return report;
}

Result<CheckpointState> load_checkpoint(TrainingEngine& engine, Communicator& comm, const std::string& dir_name,
                                        const ResumeExpectation& expect) {
  double base_sum_squares = 0;
  if (engine.lora_layout() != nullptr) {
    GLM_ASSIGN_OR_RETURN(base_sum_squares, engine.base_checksum());  // collective
  }
  auto meta = load_own_part(engine, fs::path(dir_name), expect, base_sum_squares);
  GLM_RETURN_IF_ERROR(agree(comm, meta.is_ok() ? Status::ok() : meta.status(), "loading the checkpoint"));
  // Weights only: the optimizer starts at step 0 (bias correction from scratch) with zero moments.
  GLM_RETURN_IF_ERROR(engine.optimizer_restored(expect.weights_only ? 0 : meta.value().optimizer_steps));
  return meta.value().state;
}

}  // namespace glm
