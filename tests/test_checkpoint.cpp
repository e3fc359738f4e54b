// Checkpoints on one process: pruning, latest, and damaged or mismatched checkpoints, each refused
// with the file and the reason before anything trains. (Resume and resharding across world sizes
// and ZeRO stages are in test_zero, under mpirun.)
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "mpi/local_communicator.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/engine.h"
#include "train/trainer.h"

namespace glm::test {
namespace {

namespace fs = std::filesystem;

TrainConfig tiny(const fs::path& out) {
  TrainConfig t;
  ModelConfig& m = t.model;
  m = test::tiny_glm4();
  m.intermediate_size = 48;
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

// This process's scratch directory, removed when the test program ends.
fs::path scratch_root() { return fs::temp_directory_path() / ("glm_ckpt_tests_" + std::to_string(::getpid())); }
[[maybe_unused]] const ::testing::Environment* const kRemoveScratch =
    ::testing::AddGlobalTestEnvironment(new RemoveDirectoryAtEnd(scratch_root()));

fs::path fresh(const std::string& name) {
  const fs::path dir = scratch_root() / name;
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
    // One flipped byte in unit_00001's exp_avg: its CRC32C block fails, named with file and dataset.
    const fs::path d = copy("corrupt");
    const fs::path file = d / "rank_00000.h5";
    int64_t at = -1;
    {
      const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
      const hid_t ds = H5Dopen2(f, "unit_00001/exp_avg", H5P_DEFAULT);
      at = static_cast<int64_t>(H5Dget_offset(ds));
      H5Dclose(ds);
      H5Fclose(f);
    }
    ASSERT_GT(at, 0);
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    char c = 0;
    f.seekg(at + 5);
    f.read(&c, 1);
    f.seekp(at + 5);
    c = static_cast<char>(c ^ 0x5a);
    f.write(&c, 1);
    f.close();
    expect_refused(out, d.string(), file.string() + ": unit_00001/exp_avg is corrupt: elements [0, ");
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

nlohmann::json meta_of(const fs::path& checkpoint) {
  std::ifstream in(checkpoint / "meta.json");
  return nlohmann::json::parse(in);
}

// A hand-edited meta.json that is still valid JSON: every field of the wrong type or outside what a
// save could have written is refused by resume and by export alike, naming meta.json and the field,
// exit code 2, before anything trains: no uncaught json type_error, no segfault at step -7, no NaN
// from a negative optimizer step blamed on the learning rate.
TEST(Checkpoint, HandEditedMetaFieldsAreRefusedNamingTheField) {
  const fs::path out = trained("meta_fields");
  // checkpoint-2 of a one-rank run of 2 samples a step: step 2, optimizer_steps 2, consumed_samples 4.
  const nlohmann::json saved = meta_of(out / "checkpoint-2");
  ASSERT_EQ(saved["step"], 2);
  ASSERT_EQ(saved["consumed_samples"], 4);
  const std::pair<nlohmann::json, std::string> edits[] = {
      {{{"step", "abc"}}, "field 'step' must be an integer >= 0, got \"abc\""},
      {{{"step", -7}}, "field 'step' must be an integer >= 0, got -7"},
      {{{"step", nullptr}}, "field 'step' is missing"},
      {{{"units", "x"}}, "field 'units' must be a list of integers >= 0, got \"x\""},
      {{{"units", {1, "x"}}}, "field 'units[1]' must be an integer >= 0, got \"x\""},
      {{{"optimizer_steps", -3}}, "field 'optimizer_steps' must be an integer in [0, 2], got -3"},
      {{{"optimizer_steps", 9}}, "field 'optimizer_steps' must be an integer in [0, 2], got 9"},
      {{{"consumed_samples", -1}}, "field 'consumed_samples' must be an integer >= 0, got -1"},
      {{{"consumed_samples", 1e15}}, "field 'consumed_samples' must be an integer >= 0, got 1e+15"},
      {{{"consumed_samples", 1000000000000001}}, "field 'consumed_samples' is 1000000000000001, which 2 steps"},
      {{{"consumed_samples", 1}}, "field 'consumed_samples' is 1, which 2 steps on 1 rank(s) cannot have consumed"},
      {{{"seed", -1}}, "field 'seed' must be an integer >= 0, got -1"},
      {{{"world_size", "1"}}, "field 'world_size' must be an integer in [1, 1000000], got \"1\""},
      {{{"world_size", 0}}, "field 'world_size' must be an integer in [1, 1000000], got 0"},
      {{{"zero_stage", 7}}, "field 'zero_stage' must be an integer in [0, 3], got 7"},
      {{{"train_type", "qlora"}}, "field 'train_type' must be full or lora, got 'qlora'"},
      {{{"train_type", 3}}, "field 'train_type' must be a string, got 3"},
      {{{"model", "x"}}, "field 'model' must be an object, got \"x\""},
      {{{"model_config", 1}}, "field 'model_config' must be an object, got 1"},
      {{{"tokenizer", "bytes"}}, "field 'tokenizer' must be an object, got \"bytes\""},
      {{{"tokenizer", {{"content_hash", 5}}}}, "field 'tokenizer.content_hash' must be a string, got 5"},
      {{{"eval_loss", "low"}}, "field 'eval_loss' must be a finite number, got \"low\""},
      {{{"best_metric", 1.5}, {"best_global_step", 9}}, "field 'best_global_step' must be an integer in [0, 2]"},
      {{{"best_metric", 1.5}, {"best_global_step", 1}, {"best_model_checkpoint", "../x"}},
       "field 'best_model_checkpoint' must name a checkpoint directory beside this one"},
  };
  int k = 0;
  for (const auto& [edit, needle] : edits) {
    const fs::path d = out / ("edited_" + std::to_string(k++));
    fs::copy(out / "checkpoint-2", d, fs::copy_options::recursive);
    nlohmann::json meta = saved;
    for (const auto& [field, value] : edit.items()) meta[field] = value;
    std::ofstream(d / "meta.json", std::ios::trunc) << meta.dump(2);
    SCOPED_TRACE(edit.dump());
    expect_refused(out, d.string(), (d / "meta.json").string() + ": " + needle);
    auto info = read_checkpoint_info(d.string());  // glm_hpc export reads it the same way
    ASSERT_FALSE(info.is_ok());
    EXPECT_EQ(info.status().exit_code(), 2);
    EXPECT_NE(info.status().message().find(needle), std::string::npos) << info.status().message();
  }

  // glm_hpc copies the run's args.json into every checkpoint: consumed_samples must then be exactly
  // step x its global batch (6 passes the multiple-of-world-size rule above, not this one).
  const fs::path d = out / "with_args";
  fs::copy(out / "checkpoint-2", d, fs::copy_options::recursive);
  auto write_args = [&](const nlohmann::json& per_device) {
    const nlohmann::json args = {{"command", "train"},
                                 {"options",
                                  {{"per_device_train_batch_size", {{"value", per_device}, {"source", "default"}}},
                                   {"gradient_accumulation_steps", {{"value", 1}, {"source", "default"}}}}}};
    std::ofstream(d / "args.json", std::ios::trunc) << args.dump(2);
  };
  write_args(2);
  nlohmann::json meta = saved;
  meta["consumed_samples"] = 6;
  std::ofstream(d / "meta.json", std::ios::trunc) << meta.dump(2);
  expect_refused(out, d.string(),
                 "meta.json: field 'consumed_samples' is 6, but 2 steps of the run that saved it consume 4 "
                 "(per_device_train_batch_size x gradient_accumulation_steps 2 in its args.json, x 1 rank(s))");
  write_args("two");
  expect_refused(out, d.string(),
                 "args.json: field 'options.per_device_train_batch_size.value' must be an integer >= 1, got \"two\"");
  write_args(2);
  std::ofstream(d / "meta.json", std::ios::trunc) << saved.dump(2);
  EXPECT_TRUE(read_checkpoint_info(d.string()).is_ok()) << "the saved values agree with args.json";
}

// The same checkpoint in version 1's layout (glm_hpc before block checksums): chunked datasets with
// HDF5's Fletcher-32, no checksum_block_bytes attribute, "version": 1 in meta.json.
void rewrite_as_version1(const fs::path& dir) {
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".h5") continue;
    const fs::path old_path = entry.path().string() + ".v2";
    fs::rename(entry.path(), old_path);
    const hid_t in = H5Fopen(old_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    const hid_t out = H5Fcreate(entry.path().c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(in, 0);
    ASSERT_GE(out, 0);
    for (int u = 0;; ++u) {
      char name[32];
      std::snprintf(name, sizeof(name), "unit_%05d", u);
      if (H5Lexists(in, name, H5P_DEFAULT) <= 0) break;
      const hid_t gi = H5Gopen2(in, name, H5P_DEFAULT),
                  go = H5Gcreate2(out, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      int64_t bc[2];
      const hid_t ai = H5Aopen(gi, "begin_count", H5P_DEFAULT);
      ASSERT_GE(H5Aread(ai, H5T_NATIVE_INT64, bc), 0);
      H5Aclose(ai);
      const hsize_t two = 2;
      const hid_t aspace = H5Screate_simple(1, &two, nullptr);
      const hid_t ao = H5Acreate2(go, "begin_count", H5T_STD_I64LE, aspace, H5P_DEFAULT, H5P_DEFAULT);
      ASSERT_GE(H5Awrite(ao, H5T_NATIVE_INT64, bc), 0);
      H5Aclose(ao);
      H5Sclose(aspace);
      for (const char* ds_name : {"master", "exp_avg", "exp_avg_sq"}) {
        if (bc[1] == 0) break;
        std::vector<float> v(static_cast<size_t>(bc[1]));
        const hid_t di = H5Dopen2(gi, ds_name, H5P_DEFAULT);
        ASSERT_GE(H5Dread(di, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0);
        H5Dclose(di);
        const hsize_t n = v.size(), chunk = std::min<hsize_t>(n, 100);
        const hid_t plist = H5Pcreate(H5P_DATASET_CREATE);
        ASSERT_GE(H5Pset_chunk(plist, 1, &chunk), 0);
        ASSERT_GE(H5Pset_fletcher32(plist), 0);
        const hid_t space = H5Screate_simple(1, &n, nullptr);
        const hid_t d = H5Dcreate2(go, ds_name, H5T_IEEE_F32LE, space, H5P_DEFAULT, plist, H5P_DEFAULT);
        ASSERT_GE(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0);
        H5Dclose(d);
        H5Sclose(space);
        H5Pclose(plist);
      }
      H5Gclose(gi);
      H5Gclose(go);
    }
    H5Fclose(in);
    H5Fclose(out);
    fs::remove(old_path);
  }
  std::ifstream in(dir / "meta.json");
  nlohmann::json meta = nlohmann::json::parse(in);
  meta["version"] = 1;
  std::ofstream(dir / "meta.json") << meta.dump(2);
}

// Checkpoints written before block checksums (version 1) resume exactly as today's do; a version
// from the future is refused by number.
TEST(Checkpoint, Version1CheckpointsStillResume) {
  const fs::path out = trained("version1");
  fs::copy(out / "checkpoint-2", out / "v1", fs::copy_options::recursive);
  rewrite_as_version1(out / "v1");
  LocalCommunicator comm;
  auto backend = make_cpu_backend(DType::f32);
  TrainConfig c = tiny(out / "from_v2");
  c.save_strategy = SaveStrategy::no;
  c.resume_from_checkpoint = (out / "checkpoint-2").string();
  auto from_v2 = train(c, data(), comm, *backend);
  ASSERT_TRUE(from_v2.is_ok()) << from_v2.status().message();
  c.output_dir = (out / "from_v1").string();
  c.resume_from_checkpoint = (out / "v1").string();
  auto from_v1 = train(c, data(), comm, *backend);
  ASSERT_TRUE(from_v1.is_ok()) << from_v1.status().message();
  ASSERT_EQ(from_v1.value().losses.size(), 2u);
  EXPECT_EQ(from_v1.value().losses, from_v2.value().losses);

  // Version 3 (runs per unit, ZeRO-3 persistent tensors: test_zero) is read; 4 is the future.
  fs::copy(out / "checkpoint-2", out / "v4", fs::copy_options::recursive);
  nlohmann::json meta = nlohmann::json::parse(std::ifstream(out / "v4" / "meta.json"));
  meta["version"] = 4;
  std::ofstream(out / "v4" / "meta.json") << meta.dump(2);
  expect_refused(out, (out / "v4").string(), "checkpoint version 4 is not one this glm_hpc reads (1 to 3)");
}

// --resume_only_model from a checkpoint whose weights are the initial ones (two steps at learning
// rate 0) is exactly a fresh run: zero moments, optimizer step 0, schedule and data from the start.
// From a trained checkpoint the same run starts lower: the weights did come from it.
TEST(Checkpoint, ResumeOnlyModelStartsOptimizerScheduleAndDataOver) {
  const fs::path out = fresh("only_model");
  LocalCommunicator comm;
  auto backend = make_cpu_backend(DType::f32);
  TrainConfig frozen = tiny(out / "frozen");
  frozen.max_steps = 2;
  frozen.learning_rate = 0.0;
  ASSERT_TRUE(train(frozen, data(), comm, *backend).is_ok());

  TrainConfig c = tiny(out / "fresh");
  c.save_strategy = SaveStrategy::no;
  auto straight = train(c, data(), comm, *backend);
  ASSERT_TRUE(straight.is_ok()) << straight.status().message();
  c.output_dir = (out / "only").string();
  c.resume_from_checkpoint = (out / "frozen" / "checkpoint-2").string();
  c.resume_only_model = true;
  auto only = train(c, data(), comm, *backend);
  ASSERT_TRUE(only.is_ok()) << only.status().message();
  EXPECT_EQ(only.value().losses, straight.value().losses) << "4 steps from step 0, bit for bit";

  c.resume_only_model = false;  // the full resume continues the frozen run's step count instead
  auto full = train(c, data(), comm, *backend);
  ASSERT_TRUE(full.is_ok()) << full.status().message();
  EXPECT_EQ(full.value().losses.size(), 2u);

  const fs::path trained_out = trained("only_model_trained");
  c.resume_from_checkpoint = (trained_out / "checkpoint-4").string();
  c.resume_only_model = true;
  auto from_trained = train(c, data(), comm, *backend);
  ASSERT_TRUE(from_trained.is_ok()) << from_trained.status().message();
  ASSERT_EQ(from_trained.value().losses.size(), 4u);
  EXPECT_LT(from_trained.value().losses[0], straight.value().losses[0] - 0.05);
}

// Each checkpoint records its step's eval loss and the best so far; --save_total_limit prunes the
// oldest but keeps the best checkpoint as well as the newest, also across a resume.
TEST(Checkpoint, MetaRecordsEvaluationAndPruningKeepsTheBest) {
  Dataset training = data(), held;
  ASSERT_TRUE(split_dataset(training, 0.1, 5, held).is_ok());
  const fs::path out = fresh("best");
  TrainConfig c = tiny(out);
  c.max_steps = 5;
  c.eval_steps = 1;
  c.save_total_limit = 2;
  // A constant, large rate makes the held-out loss jump about (the preconditions below say how).
  c.lr_scheduler_type = LrSchedulerType::constant;
  c.learning_rate = 0.1;
  LocalCommunicator comm;
  auto backend = make_cpu_backend(DType::f32);
  auto r = train(c, training, comm, *backend, {}, &held);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  auto best_of = [](const std::vector<std::pair<int64_t, double>>& evals) {
    return *std::min_element(evals.begin(), evals.end(),
                             [](const auto& a, const auto& b) { return a.second < b.second; });
  };
  auto kept = [&] {
    std::vector<int64_t> steps;
    for (int64_t step = 1; step <= 10; ++step)
      if (fs::exists(out / ("checkpoint-" + std::to_string(step)))) steps.push_back(step);
    return steps;
  };
  std::vector<std::pair<int64_t, double>> evals = r.value().eval_losses;
  ASSERT_EQ(evals.size(), 5u);
  const auto best = best_of(evals);
  ASSERT_LT(best.first, 4) << "precondition: the best is older than the two newest checkpoints";
  const std::string best_name = "checkpoint-" + std::to_string(best.first);
  EXPECT_EQ(kept(), (std::vector<int64_t>{best.first, 5}));
  const nlohmann::json last = meta_of(out / "checkpoint-5"), at_best = meta_of(out / best_name);
  EXPECT_EQ(last["eval_loss"].get<double>(), evals.back().second);
  EXPECT_EQ(last["best_metric"].get<double>(), best.second);
  EXPECT_EQ(last["best_global_step"].get<int64_t>(), best.first);
  EXPECT_EQ(last["best_model_checkpoint"], best_name);
  EXPECT_EQ(at_best["eval_loss"].get<double>(), best.second);
  EXPECT_EQ(at_best["best_model_checkpoint"], best_name);

  // Resumed to step 7, the record carries on: checkpoint-6 still names the old best, and once a
  // later evaluation beats it the old best may go.
  TrainConfig more = c;
  more.max_steps = 7;
  more.resume_from_checkpoint = "latest";
  auto resumed = train(more, training, comm, *backend, {}, &held);
  ASSERT_TRUE(resumed.is_ok()) << resumed.status().message();
  for (const auto& e : resumed.value().eval_losses) evals.push_back(e);
  ASSERT_EQ(evals.size(), 7u);
  ASSERT_GT(evals[5].second, best.second) << "precondition: step 6 does not beat the best";
  ASSERT_LT(evals[6].second, best.second) << "precondition: step 7 does";
  EXPECT_EQ(meta_of(out / "checkpoint-6")["best_model_checkpoint"], best_name);
  EXPECT_EQ(meta_of(out / "checkpoint-7")["best_model_checkpoint"], "checkpoint-7");
  EXPECT_EQ(kept(), (std::vector<int64_t>{6, 7}));
}

// The tokenizer's content hash travels in meta.json; another tokenizer is refused naming both.
TEST(Checkpoint, ResumeWithAnotherTokenizerIsRefused) {
  const fs::path out = fresh("tokenizer");
  TrainConfig c = tiny(out);
  c.max_steps = 2;
  c.tokenizer = "/models/a/tokenizer.model";
  c.tokenizer_hash = "fnv1a64:00000000000000aa";
  LocalCommunicator comm;
  auto backend = make_cpu_backend(DType::f32);
  ASSERT_TRUE(train(c, data(), comm, *backend).is_ok());
  const nlohmann::json meta = meta_of(out / "checkpoint-2");
  EXPECT_EQ(meta["tokenizer"]["path"], c.tokenizer);
  EXPECT_EQ(meta["tokenizer"]["content_hash"], c.tokenizer_hash);
  EXPECT_TRUE(meta["eval_loss"].is_null()) << "no validation set";
  auto other = [](TrainConfig& t) {
    t.tokenizer = "/models/b/tokenizer.model";
    t.tokenizer_hash = "fnv1a64:00000000000000bb";
  };
  expect_refused(out, (out / "checkpoint-2").string(),
                 "tokenizer '/models/a/tokenizer.model' (content hash fnv1a64:00000000000000aa), this run's tokenizer "
                 "'/models/b/tokenizer.model' has content hash fnv1a64:00000000000000bb",
                 other);
  expect_refused(out, (out / "checkpoint-2").string(), "content hash fnv1a64:00000000000000bb", [&](TrainConfig& t) {
    other(t);
    t.resume_only_model = true;  // the embeddings would mean other tokens all the same
  });
  TrainConfig same = tiny(out / "same");
  same.max_steps = 3;
  same.tokenizer = c.tokenizer;
  same.tokenizer_hash = c.tokenizer_hash;
  same.resume_from_checkpoint = (out / "checkpoint-2").string();
  auto r = train(same, data(), comm, *backend);
  EXPECT_TRUE(r.is_ok()) << r.status().message();
}

// Token accuracy counts the target tokens whose logits' argmax is the label: checked against the
// logits themselves on a model that memorised one batch (so that some, not all, are right).
TEST(Evaluation, TokenAccuracyCountsArgmaxHitsOfTheLogits) {
  TrainConfig c = tiny(fresh("accuracy"));
  HostMicroBatch batch;
  for (int64_t i = 0; i < 3; ++i) append_document(batch, data().sample(i));
  LocalCommunicator comm;
  auto backend = make_cpu_backend(DType::f32);
  auto made =
      TrainingEngine::create({.model = c.model, .max_tokens = batch.size(), .adam = AdamWOptions{}}, *backend, comm);
  ASSERT_TRUE(made.is_ok()) << made.status().message();
  auto engine = made.take();
  ASSERT_TRUE(engine->initialize_parameters(3).is_ok());
  for (int s = 0; s < 15; ++s) ASSERT_TRUE(engine->step({&batch, 1}, 1e-2).is_ok());
  auto e = engine->evaluate(batch);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  std::vector<float> logits;
  ASSERT_TRUE(engine->logits(batch, logits).is_ok());
  const int64_t vocab = c.model.vocab_size;
  int64_t hits = 0;
  for (int64_t t = 0; t < batch.size(); ++t) {
    if (batch.targets[static_cast<size_t>(t)] < 0) continue;
    const float* row = logits.data() + t * vocab;
    hits += std::max_element(row, row + vocab) - row == batch.targets[static_cast<size_t>(t)];
  }
  EXPECT_EQ(e.value().targets, batch.target_count);
  EXPECT_EQ(e.value().correct, hits);
  EXPECT_GT(hits, 0);
  EXPECT_LT(hits, batch.target_count);
  EXPECT_DOUBLE_EQ(e.value().token_accuracy(), static_cast<double>(hits) / static_cast<double>(batch.target_count));
}

// Finite weights whose logits overflow give a non-finite evaluation loss: an error saying so, never
// an eval_loss of nan or inf printed as a result.
TEST(Evaluation, NonFiniteLossIsAnError) {
  TrainConfig c = tiny(fresh("overflow"));
  LocalCommunicator comm;
  auto backend = make_cpu_backend(DType::f32);
  auto made = TrainingEngine::create({.model = c.model, .max_tokens = 8 * 256, .adam = AdamWOptions{}}, *backend, comm);
  ASSERT_TRUE(made.is_ok()) << made.status().message();
  auto engine = made.take();
  ASSERT_TRUE(engine->initialize_parameters(3).is_ok());
  const ParamEntry& head = engine->layout().entry(engine->layout().output());
  ASSERT_TRUE(engine->set_parameter(engine->layout().output(), std::vector<float>(head.numel, 3e38f)).is_ok());
  ASSERT_TRUE(engine->parameters_updated().is_ok());
  auto e = evaluate_dataset(*engine, data(), 8, comm);
  ASSERT_FALSE(e.is_ok()) << "mean loss " << e.value().mean_loss();
  EXPECT_NE(e.status().message().find("the evaluation loss over "), std::string::npos) << e.status().message();
  EXPECT_NE(e.status().message().find("the model's logits are not finite"), std::string::npos)
      << e.status().message();
}

}  // namespace
}  // namespace glm::test
