// glm_hpc export under mpirun: a checkpoint saved by every rank (np 2: ZeRO 0, each rank writing
// its part of the replicated state; np 3: ZeRO 3 with world-size padding) is reassembled exactly
// (the masters equal what resuming restores), exported in both layouts, and read back by our own
// Hugging Face import: every tensor equals the bf16-rounded master, both layouts give identical
// logits, close to the fp32 checkpoint's. Shards, index, config fields and bad input are checked.
// Rank 0 exports; the other ranks only take part in training.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/export.h"
#include "data/dataset.h"
#include "io/hf_export.h"
#include "io/hf_import.h"
#include "io/safetensors.h"
#include "mpi/local_communicator.h"
#include "mpi/mpi_communicator.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace glm::test {
namespace {

namespace fs = std::filesystem;

// Logits of bf16-rounded weights against the fp32 masters: each weight moves by up to 2^-9
// relative, which moves the logits of this 2-layer model by well under 1% (norm-wise).
constexpr double kBf16LogitsRelative = 2e-2;
constexpr const char* kSmallShards = "10KB";  // the 272 x 32 bf16 embedding alone is 17408 bytes

TrainConfig tiny() {
  TrainConfig t;
  ModelConfig& m = t.model;
  m = test::tiny_glm4();
  m.rope_theta = 1e6;
  m.rms_norm_eps = 1e-6;
  EXPECT_TRUE(m.finalize_and_validate().is_ok());
  t.max_length = 256;
  t.max_steps = 3;
  t.learning_rate = 5e-3;
  t.log_to_console = false;
  t.save_steps = 3;
  return t;
}

const Dataset& data() {
  static ByteTokenizer tokenizer;
  static Dataset d =
      load_dataset({std::string(GLM_SOURCE_DIR) + "/data/sample/conversations.jsonl"}, &tokenizer, 256, 272).take();
  return d;
}

// Trains once per job (collective on first use); returns the output directory (same on every rank).
const fs::path& trained_run() {
  static fs::path dir = [] {
    MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
    int tag = static_cast<int>(::getpid());
    MPI_Bcast(&tag, 1, MPI_INT, 0, MPI_COMM_WORLD);
    const fs::path out = fs::temp_directory_path() / ("glm_export_tests_" + std::to_string(tag));
    if (comm.rank() == 0) fs::remove_all(out);
    MPI_Barrier(MPI_COMM_WORLD);
    TrainConfig c = tiny();
    c.zero_stage = comm.size() >= 3 ? 3 : 0;
    c.per_device_train_batch_size = 6 / comm.size();
    c.output_dir = (out / "run").string();
    auto backend = make_cpu_backend(DType::f32);
    auto r = train(c, data(), comm, *backend);
    EXPECT_TRUE(r.is_ok()) << r.status().message();
    MPI_Barrier(MPI_COMM_WORLD);
    return out;
  }();
  return dir;
}

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

CliOptions export_options(const fs::path& ckpt, const fs::path& save, HfLayout format = HfLayout::glm) {
  CliOptions o;
  o.command = "export";
  o.ckpt_dir = ckpt.string();
  o.save_dir = save.string();
  o.export_format = format;
  return o;
}

float bf16_round(float x) {
  const uint32_t bits = static_cast<uint32_t>(float_to_bf16_bits(x)) << 16;
  float y;
  std::memcpy(&y, &bits, 4);
  return y;
}

// Every entry of the layout (unpadded), from a sink of (entry, values).
using Weights = std::vector<std::vector<float>>;

Weights masters_by_entry(const CheckpointInfo& info) {
  const ParamLayout layout(info.config, 1);
  Weights w(layout.entries().size());
  Status s = read_checkpoint_masters(info, [&](int unit, std::span<const float> v) {
    const ParamUnit& u = layout.units()[static_cast<size_t>(unit)];
    for (int e : u.entries) {
      const ParamEntry& p = layout.entry(e);
      w[static_cast<size_t>(e)].assign(v.begin() + (p.offset - u.offset), v.begin() + (p.offset - u.offset) + p.numel);
    }
    return Status::ok();
  });
  EXPECT_TRUE(s.is_ok()) << s.message();
  return w;
}

Weights import_weights(const fs::path& dir, ModelConfig* config = nullptr) {
  auto m = read_hf_config(dir.string());
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  if (!m.is_ok()) return {};
  if (config != nullptr) *config = m.value().config;
  const ParamLayout layout(m.value().config, 1);
  Weights w(layout.entries().size());
  Status s = load_hf_weights(m.value(), layout, [&](int e, std::span<const float> v) {
    w[static_cast<size_t>(e)].assign(v.begin(), v.end());
    return Status::ok();
  });
  EXPECT_TRUE(s.is_ok()) << s.message();
  return w;
}

std::vector<float> logits_of(const ModelConfig& config, const Weights& w) {
  HostMicroBatch batch;
  for (int row = 0; row < 2; ++row) {
    TokenizedSample s;
    for (int t = 0; t < 19 + 6 * row; ++t) {
      s.tokens.push_back((37 * t + 11 * row + 5) % static_cast<int32_t>(config.vocab_size));
      s.labels.push_back(-1);
    }
    append_document(batch, s);
  }
  auto backend = make_cpu_backend(DType::f32);
  LocalCommunicator comm;
  const EngineConfig ec{.model = config, .max_tokens = batch.size(), .max_grad_norm = 0.0};
  auto engine = TrainingEngine::create(ec, *backend, comm).take();
  for (size_t e = 0; e < w.size(); ++e) EXPECT_TRUE(engine->set_parameter(static_cast<int>(e), w[e]).is_ok());
  EXPECT_TRUE(engine->parameters_updated().is_ok());
  std::vector<float> logits;
  EXPECT_TRUE(engine->logits(batch, logits).is_ok());
  return logits;
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

bool leftovers_beside(const fs::path& save) {
  for (const auto& e : fs::directory_iterator(save.parent_path()))
    if (e.path().filename().string().rfind("." + save.filename().string() + ".", 0) == 0) return true;
  return false;
}

TEST(Export, BothLayoutsRoundTripTheReassembledMasters) {
  const fs::path root = trained_run();
  if (world_rank() != 0) return;
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  auto ckpt = resolve_checkpoint("latest", (root / "run").string());
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().message();
  auto info = read_checkpoint_info(ckpt.value());
  ASSERT_TRUE(info.is_ok()) << info.status().message();
  const ModelConfig expected = tiny().model;
  EXPECT_EQ(info.value().world_size, world);
  EXPECT_EQ(info.value().zero_stage, world >= 3 ? 3 : 0);
  EXPECT_EQ(info.value().step, 3);
  EXPECT_EQ(info.value().config.rope_theta, expected.rope_theta);
  EXPECT_EQ(info.value().config.rms_norm_eps, expected.rms_norm_eps);
  EXPECT_EQ(info.value().config.head_dim, expected.head_dim);
  const Weights masters = masters_by_entry(info.value());

  // The oracle: what resuming on one rank restores from the same files.
  {
    auto backend = make_cpu_backend(DType::f32);
    LocalCommunicator comm;
    auto engine =
        TrainingEngine::create({.model = expected, .max_tokens = 64, .adam = AdamWOptions{}}, *backend, comm).take();
    auto loaded = load_checkpoint(*engine, comm, ckpt.value());
    ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
    const ParamLayout& layout = engine->layout();
    for (size_t e = 0; e < masters.size(); ++e) {
      const ParamEntry& p = layout.entry(static_cast<int>(e));
      const auto shard = engine->optimizer_shard(p.unit);
      std::vector<float> restored(static_cast<size_t>(p.numel));
      const int64_t in_unit = p.offset - layout.units()[static_cast<size_t>(p.unit)].offset - shard.unit_begin;
      ASSERT_TRUE(backend->download(restored.data(), shard.master.slice(in_unit, p.numel)).is_ok());
      EXPECT_EQ(restored, masters[e]) << p.name;
    }
  }

  // hf layout from the run's output directory (latest), one file at the default 5GB.
  const fs::path hf = root / "hf";
  auto report = run_export(export_options(root / "run", hf));
  ASSERT_TRUE(report.is_ok()) << report.status().message();
  EXPECT_NE(report.value().find(concat(ParamLayout(expected, 1).parameter_count(), " parameters")), std::string::npos)
      << report.value();
  EXPECT_TRUE(fs::exists(hf / "model.safetensors"));
  EXPECT_FALSE(fs::exists(hf / "model.safetensors.index.json"));
  EXPECT_FALSE(leftovers_beside(hf));
  const nlohmann::json cfg = read_json(hf / "config.json");
  EXPECT_EQ(cfg["model_type"], "glm");
  EXPECT_EQ(cfg["architectures"], nlohmann::json({"GlmForCausalLM"}));
  EXPECT_EQ(cfg["rope_theta"], 1e6);
  EXPECT_EQ(cfg["rope_parameters"]["rope_theta"], 1e6);
  EXPECT_EQ(cfg["partial_rotary_factor"], 0.5);
  EXPECT_EQ(cfg["rms_norm_eps"], 1e-6);
  EXPECT_EQ(cfg["head_dim"], 8);
  EXPECT_EQ(cfg["num_key_value_heads"], 2);
  EXPECT_EQ(cfg["intermediate_size"], 64);
  EXPECT_EQ(cfg["max_position_embeddings"], 512);
  EXPECT_EQ(cfg["attention_bias"], true);
  EXPECT_EQ(cfg["tie_word_embeddings"], false);
  EXPECT_EQ(cfg["torch_dtype"], "bfloat16");
  // No tokenizer recorded (the library run) and a vocabulary too small for GLM-4's ids: null ids.
  EXPECT_TRUE(cfg["pad_token_id"].is_null());
  EXPECT_NE(report.value().find("pad_token_id and eos_token_id are left null"), std::string::npos);
  ModelConfig reread;
  const Weights from_hf = import_weights(hf, &reread);
  EXPECT_EQ(reread.rope_theta, expected.rope_theta);
  EXPECT_EQ(reread.num_key_value_heads, expected.num_key_value_heads);
  ASSERT_EQ(from_hf.size(), masters.size());
  for (size_t e = 0; e < masters.size(); ++e) {
    std::vector<float> rounded(masters[e].size());
    for (size_t i = 0; i < rounded.size(); ++i) rounded[i] = bf16_round(masters[e][i]);
    EXPECT_EQ(from_hf[e], rounded) << ParamLayout(expected, 1).entry(static_cast<int>(e)).name;
  }

  // chatglm layout in shards of at most 10 KB (a tensor over the limit sits alone in its shard).
  const fs::path chatglm = root / "chatglm";
  CliOptions o = export_options(ckpt.value(), chatglm, HfLayout::chatglm);
  o.max_shard_size = kSmallShards;
  auto chat_report = run_export(o);
  ASSERT_TRUE(chat_report.is_ok()) << chat_report.status().message();
  const nlohmann::json index = read_json(chatglm / "model.safetensors.index.json");
  std::set<std::string> shard_names;
  for (const auto& [name, file] : index["weight_map"].items()) shard_names.insert(file.get<std::string>());
  EXPECT_GE(shard_names.size(), 4u);
  uint64_t total = 0;
  size_t tensors = 0;
  for (const auto& name : shard_names) {
    auto f = SafetensorsFile::open((chatglm / name).string());
    ASSERT_TRUE(f.is_ok()) << f.status().message();
    uint64_t bytes = 0;
    for (const auto& t : f.value().tensors()) {
      EXPECT_EQ(t.dtype, StDType::BF16) << t.name;
      EXPECT_EQ(index["weight_map"][t.name], name) << t.name;
      bytes += t.end - t.begin;
    }
    EXPECT_TRUE(bytes <= 10'000 || f.value().tensors().size() == 1) << name << " holds " << bytes << " bytes";
    total += bytes;
    tensors += f.value().tensors().size();
  }
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  EXPECT_EQ(tensors, index["weight_map"].size());
  EXPECT_EQ(tensors, masters.size() + 1);  // + transformer.rotary_pos_emb.inv_freq
  const nlohmann::json chat_cfg = read_json(chatglm / "config.json");
  EXPECT_EQ(chat_cfg["model_type"], "chatglm");
  EXPECT_EQ(chat_cfg["rope_ratio"], 100.0);
  EXPECT_EQ(chat_cfg["kv_channels"], 8);
  EXPECT_EQ(chat_cfg["multi_query_group_num"], 2);
  EXPECT_EQ(chat_cfg["ffn_hidden_size"], 64);
  EXPECT_EQ(chat_cfg["padded_vocab_size"], 272);
  EXPECT_EQ(chat_cfg["seq_length"], 512);
  EXPECT_EQ(chat_cfg["layernorm_epsilon"], 1e-6);
  {
    auto c = SafetensorsCheckpoint::open(chatglm.string());
    ASSERT_TRUE(c.is_ok()) << c.status().message();
    auto inv = c.value().find("transformer.rotary_pos_emb.inv_freq");
    ASSERT_NE(inv.file, nullptr);
    std::vector<float> v(2);  // head_dim 8: THUDM's RotaryEmbedding(4) holds 1/10000^(0/4), 1/10000^(2/4)
    ASSERT_TRUE(read_as_f32(*inv.file, *inv.info, v).is_ok());
    EXPECT_EQ(v[0], 1.0f);
    EXPECT_EQ(v[1], bf16_round(0.01f));
  }
  const Weights from_chatglm = import_weights(chatglm);
  EXPECT_EQ(from_chatglm, from_hf);

  const std::vector<float> ours = logits_of(expected, masters);
  const std::vector<float> exported = logits_of(reread, from_hf);
  EXPECT_EQ(logits_of(expected, from_chatglm), exported);
  const double rel = relative_error(exported, ours);
  EXPECT_LT(rel, kBf16LogitsRelative);
  EXPECT_GT(rel, 0.0) << "bf16 rounding must show: are the exported weights the fp32 masters?";
}

TEST(Export, RunTokenizerGivesTheIds) {
  const fs::path root = trained_run();
  if (world_rank() != 0) return;
  // A run whose args.json names the byte-level tokenizer: its special ids start at 256.
  const fs::path ckpt = root / "bytes_run" / "checkpoint-3";
  fs::create_directories(ckpt.parent_path());
  fs::copy(root / "run" / "checkpoint-3", ckpt, fs::copy_options::recursive);
  std::ofstream(root / "bytes_run" / "args.json")
      << R"({"command": "train", "options": {"tokenizer": {"value": "bytes"}}})";
  auto r = run_export(export_options(ckpt, root / "bytes_hf"));
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const nlohmann::json cfg = read_json(root / "bytes_hf" / "config.json");
  EXPECT_EQ(cfg["pad_token_id"], 256);
  EXPECT_EQ(cfg["eos_token_id"], nlohmann::json({256, 263, 265}));
  EXPECT_EQ(read_json(root / "bytes_hf" / "generation_config.json")["eos_token_id"], nlohmann::json({256, 263, 265}));
  // A tokenizer larger than the model's vocabulary is not this model's.
  CliOptions o = export_options(ckpt, root / "wrong_tokenizer");
  o.tokenizer_dir = std::string(GLM_SOURCE_DIR) + "/data/sample/tokenizer.model";
  auto wrong = run_export(o);
  ASSERT_FALSE(wrong.is_ok());
  EXPECT_NE(wrong.status().message().find("vocab_size 272"), std::string::npos) << wrong.status().message();
  EXPECT_FALSE(fs::exists(root / "wrong_tokenizer"));
}

void expect_refused(const CliOptions& o, const std::string& needle) {
  auto r = run_export(o);
  ASSERT_FALSE(r.is_ok()) << "expected: " << needle;
  EXPECT_EQ(r.status().exit_code(), 2) << r.status().message();
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  EXPECT_FALSE(fs::exists(o.save_dir)) << "nothing may be written for " << needle;
  EXPECT_FALSE(leftovers_beside(o.save_dir));
}

TEST(Export, BadInputIsRefusedAndLeavesNothing) {
  const fs::path root = trained_run();
  if (world_rank() != 0) return;
  const fs::path good = root / "run" / "checkpoint-3";
  const fs::path out = root / "refused";
  auto copy = [&](const std::string& name) {
    const fs::path dir = root / "damaged" / name;
    fs::create_directories(dir.parent_path());
    fs::copy(good, dir, fs::copy_options::recursive);
    return dir;
  };
  {
    const fs::path d = copy("missing_rank");
    fs::remove(d / "rank_00000.h5");
    expect_refused(export_options(d, out), "misses rank_00000.h5");
  }
  {
    // Flip bytes of the master weights themselves (export reads no moments): rank 0's slice of
    // the embedding starts with the embedding's first values; the per-block CRC32C must catch it.
    const fs::path d = copy("corrupt");
    const Weights masters = masters_by_entry(read_checkpoint_info(good.string()).value());
    std::string pattern(32, '\0');
    std::memcpy(pattern.data(), masters[0].data(), pattern.size());
    std::string bytes;
    {
      std::ifstream in(d / "rank_00000.h5", std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    const size_t at = bytes.find(pattern);
    ASSERT_NE(at, std::string::npos) << "the first master values are not in rank_00000.h5";
    for (size_t i = at; i < at + pattern.size(); ++i) bytes[i] = static_cast<char>(bytes[i] ^ 0x5a);
    std::ofstream(d / "rank_00000.h5", std::ios::binary | std::ios::trunc) << bytes;
    expect_refused(export_options(d, out), "rank_00000.h5: unit_00000/master is corrupt");
  }
  {
    const fs::path d = copy("incomplete");
    fs::remove(d / "COMPLETE");
    expect_refused(export_options(d, out), "is incomplete");
  }
  {
    const fs::path d = copy("foreign");
    nlohmann::json meta = read_json(d / "meta.json");
    meta["model"]["intermediate_size"] = 96;
    std::ofstream(d / "meta.json") << meta.dump();
    expect_refused(export_options(d, out), "intermediate_size");
  }
  {
    const fs::path d = copy("bad_world");
    nlohmann::json meta = read_json(d / "meta.json");
    meta["world_size"] = "two";
    std::ofstream(d / "meta.json") << meta.dump();
    expect_refused(export_options(d, out), "field 'world_size' must be an integer");
  }
  expect_refused(export_options(root / "nowhere", out), "is not a directory");
  fs::create_directories(root / "empty_dir");
  expect_refused(export_options(root / "empty_dir", out), "holds neither a checkpoint");

  // A non-empty save_dir is kept unless --overwrite true; then it is replaced whole.
  const fs::path taken = root / "taken";
  fs::create_directories(taken);
  std::ofstream(taken / "precious.txt") << "keep";
  auto refused = run_export(export_options(good, taken));
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("--overwrite true"), std::string::npos) << refused.status().message();
  EXPECT_TRUE(fs::exists(taken / "precious.txt"));
  CliOptions again = export_options(good, taken);
  again.overwrite = true;
  ASSERT_TRUE(run_export(again).is_ok());
  EXPECT_FALSE(fs::exists(taken / "precious.txt"));
  EXPECT_TRUE(fs::exists(taken / "config.json"));
  EXPECT_FALSE(leftovers_beside(taken));
  // Overwriting the directory that holds the checkpoint would destroy it.
  CliOptions self = export_options(good, root / "run");
  self.overwrite = true;
  auto destroyed = run_export(self);
  ASSERT_FALSE(destroyed.is_ok());
  EXPECT_NE(destroyed.status().message().find("holds the checkpoint"), std::string::npos);
  EXPECT_TRUE(fs::exists(good / "COMPLETE"));
}

TEST(Export, ShardSizesAndLayoutLimits) {
  EXPECT_EQ(parse_byte_size("5GB").value(), 5'000'000'000u);
  EXPECT_EQ(parse_byte_size("500MB").value(), 500'000'000u);
  EXPECT_EQ(parse_byte_size("2GiB").value(), uint64_t{2} << 30);
  EXPECT_EQ(parse_byte_size("100KiB").value(), 102'400u);
  EXPECT_EQ(parse_byte_size("10kb").value(), 1'250u);  // bits, as in transformers
  EXPECT_EQ(parse_byte_size("1000").value(), 1'000u);
  for (const char* bad : {"", "GB", "5 GB", "5TB", "1.5GB", "0", "-5GB", "99999999999999999999"}) {
    auto r = parse_byte_size(bad);
    EXPECT_FALSE(r.is_ok()) << bad;
    if (!r.is_ok()) {
      EXPECT_EQ(r.status().exit_code(), 2);
    }
  }
  ModelConfig c = tiny().model;
  c.partial_rotary_factor = 1.0;
  auto chatglm = hf_export_config(c, HfLayout::chatglm, {});
  ASSERT_FALSE(chatglm.is_ok());
  EXPECT_NE(chatglm.status().message().find("partial_rotary_factor"), std::string::npos);
  EXPECT_TRUE(hf_export_config(c, HfLayout::glm, {}).is_ok());
}

// Last: the scratch directory goes once every rank is done with it.
TEST(Export, ZzScratchRemoved) {
  const fs::path root = trained_run();
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(root);
}

}  // namespace
}  // namespace glm::test
