// Checkpoints on one process: pruning, latest, and damaged or mismatched checkpoints, each refused
// with the file and the reason before anything trains. (Resume and resharding across world sizes
// and ZeRO stages are in test_zero, under mpirun.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "data/dataset.h"
#include "mpi/local_communicator.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace glm::test {
namespace {

namespace fs = std::filesystem;

TrainConfig tiny(const fs::path& out) {
  TrainConfig t;
  ModelConfig& m = t.model;
  m.vocab_size = 272;
  m.hidden_size = 32;
  m.intermediate_size = 48;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = 8;
  m.max_position_embeddings = 512;
  m.rope_theta = 5e6;
  EXPECT_TRUE(m.finalize_and_validate().is_ok());
  t.max_length = 256;
  t.max_steps = 4;
  t.per_device_train_batch_size = 2;
  t.learning_rate = 1e-3;
  t.log_to_console = false;
  t.output_dir = out.string();
  t.save_steps = 1;
  return t;
}

const Dataset& data() {
  static ByteTokenizer tokenizer;
  static Dataset d =
      load_dataset({std::string(GLM_SOURCE_DIR) + "/data/sample/conversations.jsonl"}, &tokenizer, 256, 272).take();
  return d;
}

fs::path fresh(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("glm_ckpt_tests_" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// Trains 4 steps saving every step into a fresh directory; returns it.
fs::path trained(const std::string& name, int64_t limit = -1) {
  const fs::path out = fresh(name);
  TrainConfig c = tiny(out);
  c.save_total_limit = limit;
  LocalCommunicator comm;
  auto backend = make_cpu_backend(DType::f32);
  auto r = train(c, data(), comm, *backend);
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return out;
}

// Resuming from `spec` must fail before training with a message containing `needle`, exit code 2.
void expect_refused(const fs::path& out, const std::string& spec, const std::string& needle,
                    const std::function<void(TrainConfig&)>& change = {}) {
  TrainConfig c = tiny(out / "again");
  c.max_steps = 6;
  c.resume_from_checkpoint = spec;
  if (change) change(c);
  LocalCommunicator comm;
  auto backend = make_cpu_backend(DType::f32);
  auto r = train(c, data(), comm, *backend);
  ASSERT_FALSE(r.is_ok()) << "expected: " << needle;
  EXPECT_EQ(r.status().exit_code(), 2) << r.status().message();
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
}

TEST(Checkpoint, LatestAndPruning) {
  const fs::path out = trained("prune", /*limit=*/2);
  EXPECT_FALSE(fs::exists(out / "checkpoint-1"));
  EXPECT_FALSE(fs::exists(out / "checkpoint-2"));
  EXPECT_TRUE(fs::exists(out / "checkpoint-3" / "COMPLETE"));
  EXPECT_TRUE(fs::exists(out / "checkpoint-4" / "COMPLETE"));
  auto latest = resolve_checkpoint("latest", out.string());
  ASSERT_TRUE(latest.is_ok()) << latest.status().message();
  EXPECT_EQ(fs::path(latest.value()).filename(), "checkpoint-4");
  // A save that died before publication left only a temporary directory: latest is unaffected.
  fs::create_directories(out / ".checkpoint-5.tmp");
  std::ofstream(out / ".checkpoint-5.tmp" / "rank_00000.h5") << "half";
  EXPECT_EQ(fs::path(resolve_checkpoint("latest", out.string()).value()).filename(), "checkpoint-4");
  // latest naming a directory that lost its marker falls back to the newest complete one.
  fs::remove(out / "checkpoint-4" / "COMPLETE");
  EXPECT_EQ(fs::path(resolve_checkpoint("latest", out.string()).value()).filename(), "checkpoint-3");
  EXPECT_FALSE(resolve_checkpoint("latest", fresh("empty").string()).is_ok());
}

TEST(Checkpoint, DamagedOrForeignCheckpointsAreRefused) {
  const fs::path out = trained("damage");
  auto copy = [&](const std::string& name) {
    const fs::path dir = out / name;
    fs::copy(out / "checkpoint-2", dir, fs::copy_options::recursive);
    return dir;
  };
  {
    const fs::path d = copy("missing_rank");
    fs::remove(d / "rank_00000.h5");
    expect_refused(out, d.string(), "misses rank_00000.h5");
  }
  {
    const fs::path d = copy("truncated");
    fs::resize_file(d / "rank_00000.h5", fs::file_size(d / "rank_00000.h5") / 2);
    expect_refused(out, d.string(), "rank_00000.h5");
  }
  {
    // Flip bytes inside the data (past the metadata at the front): the Fletcher-32 checksum fails.
    const fs::path d = copy("corrupt");
    const auto size = fs::file_size(d / "rank_00000.h5");
    std::fstream f(d / "rank_00000.h5", std::ios::in | std::ios::out | std::ios::binary);
    for (std::streamoff at = static_cast<std::streamoff>(size) / 2; at < static_cast<std::streamoff>(size) / 2 + 64;
         ++at) {
      f.seekg(at);
      char c = 0;
      f.read(&c, 1);
      f.seekp(at);
      c = static_cast<char>(c ^ 0x5a);
      f.write(&c, 1);
    }
    f.close();
    expect_refused(out, d.string(), "cannot be read (truncated or corrupt");
  }
  {
    const fs::path d = copy("incomplete");
    fs::remove(d / "COMPLETE");
    expect_refused(out, d.string(), "is incomplete");
  }
  expect_refused(out, (out / "checkpoint-2").string(), "the checkpoint's intermediate_size is 48, this run's 64",
                 [](TrainConfig& c) { c.model.intermediate_size = 64; });
  expect_refused(out, (out / "nowhere").string(), "is not a directory");
}

}  // namespace
}  // namespace glm::test
