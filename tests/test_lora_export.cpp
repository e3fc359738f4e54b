// glm_hpc export of LoRA checkpoints under mpirun (np 2: ZeRO 0; np 3: ZeRO 3; rank 0 saved the
// adapters): PEFT's format (names, shapes and values against the restored engine's adapters, the
// fused query_key_value adapter split into q/k/v exactly, adapter_config.json), and --merge_lora:
// base + adapters merged, read back by our HF import, gives the adapted model's logits, for a
// random-init base and for a Hugging Face base. Wrong bases, occupied directories and --merge_lora
// on a full checkpoint are refused, leaving nothing. Rank 0 exports; the other ranks only train.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/export.h"
#include "cli/model_source.h"
#include "data/dataset.h"
#include "io/hf_export.h"
#include "io/hf_import.h"
#include "io/peft_adapter.h"
#include "io/safetensors.h"
#include "mpi/local_communicator.h"
#include "mpi/mpi_communicator.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/engine.h"
#include "train/trainer.h"

namespace glm::test {
namespace {

namespace fs = std::filesystem;

// The merged export is bf16: each weight moves by up to 2^-9 relative, which moves the logits of
// this 2-layer model by well under 1% (norm-wise), as for a full checkpoint's export (test_export).
constexpr double kBf16LogitsRelative = 2e-2;
// The adapters must change the logits far more than bf16 rounding does, or the test proves nothing.
constexpr double kAdapterEffectOverRounding = 5;

TrainConfig tiny(TrainType train_type) {
  TrainConfig t;
  ModelConfig& m = t.model;
  m = test::tiny_glm4();
  m.rope_theta = 1e6;
  m.rms_norm_eps = 1e-6;
  m.initializer_range = 0.2;  // a frozen base the adapters can move
  EXPECT_TRUE(m.finalize_and_validate().is_ok());
  t.max_length = 256;
  t.max_steps = 3;
  t.learning_rate = 1e-2;
  t.log_to_console = false;
  t.save_steps = 3;
  t.train_type = train_type;
  t.lora.rank = 4;
  t.lora.alpha = 12;  // scale 3: a forgotten or inverted scale shows
  return t;
}

const Dataset& data() {
  static ByteTokenizer tokenizer;
  static Dataset d =
      load_dataset({std::string(GLM_SOURCE_DIR) + "/data/sample/conversations.jsonl"}, &tokenizer, 256, 272).take();
  return d;
}

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

WeightLoader hf_loader(const std::string& dir) {
  return [dir](TrainingEngine& engine) -> Status {
    GLM_ASSIGN_OR_RETURN(HfModel model, read_hf_config(dir));
    GLM_RETURN_IF_ERROR(load_hf_weights(
        model, engine.layout(), [&](int entry, std::span<const float> v) { return engine.set_parameter(entry, v); }));
    return engine.parameters_updated();
  };
}

CliOptions export_options(const fs::path& ckpt, const fs::path& save, HfLayout format = HfLayout::glm) {
  CliOptions o;
  o.command = "export";
  o.ckpt_dir = ckpt.string();
  o.save_dir = save.string();
  o.export_format = format;
  return o;
}

// Once per job (collective): a full run (1 step) exported as a Hugging Face base, a LoRA run on a
// random-init base and a LoRA run on that Hugging Face base. Same directory on every rank.
struct Runs {
  fs::path root;
  fs::path full_ckpt() const { return root / "full" / "checkpoint-1"; }
  fs::path base_hf() const { return root / "base_hf"; }
  fs::path random_run() const { return root / "lora_random"; }
  fs::path hf_run() const { return root / "lora_hf"; }
};

const Runs& runs() {
  static Runs r = [] {
    MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(120));
    int tag = static_cast<int>(::getpid());
    MPI_Bcast(&tag, 1, MPI_INT, 0, MPI_COMM_WORLD);
    Runs out;
    out.root = fs::temp_directory_path() / ("glm_lora_export_tests_" + std::to_string(tag));
    if (comm.rank() == 0) fs::remove_all(out.root);
    MPI_Barrier(MPI_COMM_WORLD);
    auto run = [&](TrainConfig c, const fs::path& dir, const WeightLoader& loader) {
      c.zero_stage = comm.size() >= 3 ? 3 : 0;
      c.per_device_train_batch_size = 6 / comm.size();
      c.output_dir = dir.string();
      auto backend = make_cpu_backend(DType::f32);
      auto result = train(c, data(), comm, *backend, loader);
      EXPECT_TRUE(result.is_ok()) << result.status().message();
    };
    TrainConfig full = tiny(TrainType::full);
    full.max_steps = 1;
    full.save_steps = 1;
    run(full, out.root / "full", {});
    if (comm.rank() == 0) {
      auto exported = run_export(export_options(out.full_ckpt(), out.base_hf()));
      EXPECT_TRUE(exported.is_ok()) << exported.status().message();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    run(tiny(TrainType::lora), out.random_run(), {});
    TrainConfig on_hf = tiny(TrainType::lora);
    on_hf.base_model = out.base_hf().string();
    run(on_hf, out.hf_run(), hf_loader(on_hf.base_model));
    MPI_Barrier(MPI_COMM_WORLD);
    return out;
  }();
  return r;
}

// The oracle: the checkpoint as training restores it on one process (base, adapters).
struct Restored {
  std::unique_ptr<Backend> backend = make_cpu_backend(DType::f32);
  LocalCommunicator comm;
  std::unique_ptr<TrainingEngine> engine;
};

std::unique_ptr<Restored> restored(const fs::path& run, const std::string& base_dir) {
  TrainConfig c = tiny(TrainType::lora);
  auto r = std::make_unique<Restored>();
  const EngineConfig ec{.model = c.model, .max_tokens = 64, .adam = AdamWOptions{}, .lora = c.lora};
  r->engine = TrainingEngine::create(ec, *r->backend, r->comm).take();
  TrainingEngine& engine = *r->engine;
  EXPECT_TRUE((base_dir.empty() ? engine.initialize_parameters(c.seed) : hf_loader(base_dir)(engine)).is_ok());
  EXPECT_TRUE(engine.initialize_lora(c.seed).is_ok());
  auto ckpt = resolve_checkpoint("latest", run.string());
  EXPECT_TRUE(ckpt.is_ok()) << ckpt.status().message();
  ResumeExpectation expect;
  expect.base_model = base_dir;
  expect.base_seed = c.seed;
  auto loaded = load_checkpoint(engine, r->comm, ckpt.value(), expect);
  EXPECT_TRUE(loaded.is_ok()) << loaded.status().message();
  return r;
}

HostMicroBatch fixed_batch(int64_t vocab) {
  HostMicroBatch batch;
  for (int row = 0; row < 2; ++row) {
    TokenizedSample s;
    for (int t = 0; t < 19 + 6 * row; ++t) {
      s.tokens.push_back((37 * t + 11 * row + 5) % static_cast<int32_t>(vocab));
      s.labels.push_back(-1);
    }
    append_document(batch, s);
  }
  return batch;
}

std::vector<float> engine_logits(TrainingEngine& engine) {
  std::vector<float> logits;
  EXPECT_TRUE(engine.logits(fixed_batch(engine.config().vocab_size), logits).is_ok());
  return logits;
}

using Weights = std::vector<std::vector<float>>;

float bf16_round(float x) {
  const uint32_t bits = static_cast<uint32_t>(float_to_bf16_bits(x)) << 16;
  float y;
  std::memcpy(&y, &bits, 4);
  return y;
}

Weights import_weights(const fs::path& dir) {
  auto m = read_hf_config(dir.string());
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  if (!m.is_ok()) return {};
  const ParamLayout layout(m.value().config, 1);
  Weights w(layout.entries().size());
  Status s = load_hf_weights(m.value(), layout, [&](int e, std::span<const float> v) {
    w[static_cast<size_t>(e)].assign(v.begin(), v.end());
    return Status::ok();
  });
  EXPECT_TRUE(s.is_ok()) << s.message();
  return w;
}

std::vector<float> imported_logits(const fs::path& dir) {
  const Weights w = import_weights(dir);
  const ModelConfig config = read_hf_config(dir.string()).value().config;
  auto backend = make_cpu_backend(DType::f32);
  LocalCommunicator comm;
  auto engine =
      TrainingEngine::create({.model = config, .max_tokens = 64, .max_grad_norm = 0.0}, *backend, comm).take();
  for (size_t e = 0; e < w.size(); ++e) EXPECT_TRUE(engine->set_parameter(static_cast<int>(e), w[e]).is_ok());
  EXPECT_TRUE(engine->parameters_updated().is_ok());
  return engine_logits(*engine);
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

std::vector<float> tensor(const SafetensorsFile& f, const std::string& name, const std::vector<int64_t>& shape) {
  const StTensorInfo* t = f.find(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  EXPECT_EQ(t->dtype, StDType::F32) << name;
  EXPECT_EQ(t->shape, shape) << name;
  std::vector<float> v(static_cast<size_t>(t->numel()));
  EXPECT_TRUE(read_as_f32(f, *t, v).is_ok());
  return v;
}

bool leftovers_beside(const fs::path& save) {
  for (const auto& e : fs::directory_iterator(save.parent_path()))
    if (e.path().filename().string().rfind("." + save.filename().string() + ".", 0) == 0) return true;
  return false;
}

TEST(LoraExport, PeftAdapterHoldsTheEngineAdapters) {
  const Runs& r = runs();
  if (world_rank() != 0) return;
  auto restored_run = restored(r.random_run(), "");
  TrainingEngine& engine = *restored_run->engine;
  const LoraLayout& layout = *engine.lora_layout();
  const std::vector<float> adapters = engine.lora_adapters().value();
  const ModelConfig& c = engine.config();
  const int64_t rank = 4, q = c.q_width(), kv = c.num_key_value_heads * c.head_dim;

  const fs::path peft = r.root / "peft";
  auto report = run_export(export_options(r.random_run(), peft));
  ASSERT_TRUE(report.is_ok()) << report.status().message();
  EXPECT_NE(report.value().find("PEFT's format"), std::string::npos) << report.value();
  EXPECT_NE(report.value().find("random initialisation (seed 42)"), std::string::npos) << report.value();
  EXPECT_EQ(std::distance(fs::directory_iterator(peft), fs::directory_iterator()), 2);
  EXPECT_FALSE(leftovers_beside(peft));

  const nlohmann::json cfg = read_json(peft / "adapter_config.json");
  EXPECT_EQ(cfg["peft_type"], "LORA");
  EXPECT_EQ(cfg["task_type"], "CAUSAL_LM");
  EXPECT_EQ(cfg["r"], 4);
  EXPECT_EQ(cfg["lora_alpha"], 12);
  EXPECT_EQ(cfg["lora_dropout"], tiny(TrainType::lora).lora.dropout) << "the run's, from meta.json (the default 0.05)";
  EXPECT_EQ(cfg["target_modules"],
            nlohmann::json({"q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj"}));
  EXPECT_EQ(cfg["bias"], "none");
  EXPECT_EQ(cfg["fan_in_fan_out"], false);
  EXPECT_EQ(cfg["inference_mode"], true);
  EXPECT_EQ(cfg["init_lora_weights"], true);
  EXPECT_EQ(cfg["use_rslora"], false);
  EXPECT_EQ(cfg["use_dora"], false);
  EXPECT_TRUE(cfg["modules_to_save"].is_null());
  EXPECT_TRUE(cfg["base_model_name_or_path"].is_null()) << "a random-init base has no path";

  // Values: A as stored; PEFT's lora_B.weight [out, r] is our Bt [r, out] transposed, and
  // query_key_value's rows q | k | v become three adapters sharing A.
  auto file = SafetensorsFile::open((peft / "adapter_model.safetensors").string());
  ASSERT_TRUE(file.is_ok()) << file.status().message();
  EXPECT_EQ(file.value().tensors().size(), static_cast<size_t>(c.num_hidden_layers * 12));
  double b_norm = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "base_model.model.model.layers." + std::to_string(l) + ".";
    const struct {
      LoraTarget target;
      std::vector<std::pair<std::string, int64_t>> modules;  // name, first row of B
    } expected[] = {
        {LoraTarget::query_key_value, {{"self_attn.q_proj", 0}, {"self_attn.k_proj", q}, {"self_attn.v_proj", q + kv}}},
        {LoraTarget::dense, {{"self_attn.o_proj", 0}}},
        {LoraTarget::dense_h_to_4h, {{"mlp.gate_up_proj", 0}}},
        {LoraTarget::dense_4h_to_h, {{"mlp.down_proj", 0}}}};
    for (const auto& [target, modules] : expected) {
      const LoraEntry& e = layout.entries()[static_cast<size_t>(layout.find(l, target))];
      const std::vector<float> a_ours(adapters.begin() + e.a_offset,
                                      adapters.begin() + e.a_offset + rank * e.in_features);
      for (size_t m = 0; m < modules.size(); ++m) {
        const auto& [module, first] = modules[m];
        const int64_t rows = modules.size() == 1 ? e.out_features : (m == 0 ? q : kv);
        EXPECT_EQ(tensor(file.value(), p + module + ".lora_A.weight", {rank, e.in_features}), a_ours) << module;
        const std::vector<float> b = tensor(file.value(), p + module + ".lora_B.weight", {rows, rank});
        ASSERT_EQ(b.size(), static_cast<size_t>(rows * rank));
        for (int64_t o = 0; o < rows; ++o)
          for (int64_t k = 0; k < rank; ++k) {
            const float ours = adapters[static_cast<size_t>(e.b_offset + k * e.out_features + first + o)];
            ASSERT_EQ(b[static_cast<size_t>(o * rank + k)], ours) << p << module << " row " << o << " k " << k;
            b_norm += std::fabs(ours);
          }
      }
    }
  }
  EXPECT_GT(b_norm, 0.0) << "training left B zero: the export would prove nothing";

  // THUDM names (ms-swift's GLM-4 adapters): one fused adapter per linear.
  const fs::path chatglm = r.root / "peft_chatglm";
  ASSERT_TRUE(run_export(export_options(r.random_run(), chatglm, HfLayout::chatglm)).is_ok());
  EXPECT_EQ(read_json(chatglm / "adapter_config.json")["target_modules"],
            nlohmann::json({"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"}));
  auto fused = SafetensorsFile::open((chatglm / "adapter_model.safetensors").string());
  ASSERT_TRUE(fused.is_ok());
  EXPECT_EQ(fused.value().tensors().size(), static_cast<size_t>(c.num_hidden_layers * 8));
  const LoraEntry& qkv = layout.entries()[static_cast<size_t>(layout.find(1, LoraTarget::query_key_value))];
  const std::string name = "base_model.model.transformer.encoder.layers.1.self_attention.query_key_value.";
  EXPECT_EQ(
      tensor(fused.value(), name + "lora_A.weight", {rank, c.hidden_size}),
      std::vector<float>(adapters.begin() + qkv.a_offset, adapters.begin() + qkv.a_offset + rank * c.hidden_size));
  const std::vector<float> b = tensor(fused.value(), name + "lora_B.weight", {c.qkv_width(), rank});
  ASSERT_EQ(b.size(), static_cast<size_t>(c.qkv_width() * rank));
  EXPECT_EQ(b[static_cast<size_t>((q + 3) * rank + 1)],
            adapters[static_cast<size_t>(qkv.b_offset + c.qkv_width() + q + 3)]);
  EXPECT_NE(tensor(fused.value(), "base_model.model.transformer.encoder.layers.0.mlp.dense_4h_to_h.lora_A.weight",
                   {rank, c.intermediate_size})
                .size(),
            0u);
}

// --merge_lora: our import of the merged model gives the adapted model's logits (up to bf16), in
// both layouts, for both kinds of base; a base that moved is found with --model_id_or_path.
TEST(LoraExport, MergedExportGivesTheAdaptedLogits) {
  const Runs& r = runs();
  if (world_rank() != 0) return;
  for (const bool hf_base : {false, true}) {
    SCOPED_TRACE(hf_base ? "Hugging Face base" : "random-init base");
    const fs::path run = hf_base ? r.hf_run() : r.random_run();
    auto restored_run = restored(run, hf_base ? r.base_hf().string() : "");
    TrainingEngine& engine = *restored_run->engine;
    const std::vector<float> adapted = engine_logits(engine);

    // Expected weights: bf16(W + (alpha / r) B A) from the restored base and adapters.
    const ParamLayout& params = engine.layout();
    std::vector<float> expected = engine.parameters().value();
    const LoraLayout& lora = *engine.lora_layout();
    const std::vector<float> adapters = engine.lora_adapters().value();
    for (const LoraEntry& e : lora.entries()) {
      const LayerEntries& le = params.layer(e.layer);
      const int entry = e.target == LoraTarget::query_key_value ? le.qkv_weight
                        : e.target == LoraTarget::dense         ? le.dense
                        : e.target == LoraTarget::dense_h_to_4h ? le.h_to_4h
                                                                : le.four_h_to_h;
      const ParamEntry& p = params.entry(entry);
      merge_lora_entry(lora, e, adapters, std::span<float>(expected.data() + p.offset, static_cast<size_t>(p.numel)));
    }
    const std::vector<float> zeros(adapters.size(), 0.0f);
    ASSERT_TRUE(engine.set_lora_adapters(zeros).is_ok());
    const std::vector<float> base_only = engine_logits(engine);
    const fs::path merged = r.root / (hf_base ? "merged_hf_base" : "merged_random_base");
    CliOptions o = export_options(run, merged);
    o.merge_lora = true;
    auto report = run_export(o);
    ASSERT_TRUE(report.is_ok()) << report.status().message();
    EXPECT_NE(report.value().find("merged: "), std::string::npos) << report.value();
    EXPECT_EQ(read_json(merged / "config.json")["model_type"], "glm");
    EXPECT_FALSE(leftovers_beside(merged));
    const Weights exported = import_weights(merged);
    ASSERT_EQ(exported.size(), params.entries().size());
    for (size_t i = 0; i < exported.size(); ++i) {
      const ParamEntry& p = params.entry(static_cast<int>(i));
      std::vector<float> rounded(expected.begin() + p.offset, expected.begin() + p.offset + p.numel);
      for (float& x : rounded) x = bf16_round(x);
      EXPECT_EQ(exported[i], rounded) << p.name;
    }
    // Independently of the merge arithmetic: the model's LoRA path against the merged model.
    const double rounding = relative_error(imported_logits(merged), adapted);
    const double effect = relative_error(base_only, adapted);
    EXPECT_LT(rounding, kBf16LogitsRelative);
    EXPECT_GT(effect, kAdapterEffectOverRounding * kBf16LogitsRelative) << "the adapters barely change the logits";

    const fs::path merged_chatglm = r.root / (hf_base ? "merged_hf_base_chatglm" : "merged_random_base_chatglm");
    CliOptions c = export_options(run, merged_chatglm, HfLayout::chatglm);
    c.merge_lora = true;
    ASSERT_TRUE(run_export(c).is_ok());
    EXPECT_EQ(import_weights(merged_chatglm), import_weights(merged));
  }
  // The Hugging Face base moved (here: the same weights in the THUDM layout): --model_id_or_path.
  const fs::path moved = r.root / "base_chatglm";
  ASSERT_TRUE(run_export(export_options(r.full_ckpt(), moved, HfLayout::chatglm)).is_ok());
  CliOptions o = export_options(r.hf_run(), r.root / "merged_moved_base");
  o.merge_lora = true;
  o.model_id_or_path = moved.string();
  auto report = run_export(o);
  ASSERT_TRUE(report.is_ok()) << report.status().message();
  EXPECT_EQ(import_weights(r.root / "merged_moved_base"), import_weights(r.root / "merged_hf_base"));
  // The adapter export names its base (PEFT's base_model_name_or_path).
  ASSERT_TRUE(run_export(export_options(r.hf_run(), r.root / "peft_hf_base")).is_ok());
  EXPECT_EQ(read_json(r.root / "peft_hf_base" / "adapter_config.json")["base_model_name_or_path"],
            r.base_hf().string());
}

// A CUDA run keeps bf16 parameters: its fingerprint is of the rounded base, which the merge then uses.
TEST(LoraExport, BaseOfACudaRunIsMergedRoundedToBf16) {
  const Runs& r = runs();
  if (world_rank() != 0) return;
  auto restored_run = restored(r.random_run(), "");
  TrainingEngine& engine = *restored_run->engine;
  const std::vector<float> base = engine.parameters().value();
  double rounded_sum = 0;
  for (float x : base) rounded_sum += static_cast<double>(bf16_round(x)) * bf16_round(x);
  const fs::path d = r.root / "cuda_like";
  fs::copy(r.random_run() / "checkpoint-3", d, fs::copy_options::recursive);
  nlohmann::json meta = read_json(d / "meta.json");
  meta["base"]["sum_squares"] = rounded_sum;
  std::ofstream(d / "meta.json") << meta.dump();
  CliOptions o = export_options(d, r.root / "merged_cuda_like");
  o.merge_lora = true;
  auto report = run_export(o);
  ASSERT_TRUE(report.is_ok()) << report.status().message();
  EXPECT_NE(report.value().find("rounded to bf16, as the CUDA run held them"), std::string::npos) << report.value();
  // Layer 1's dense weight: bf16(bf16(W) + (alpha / r) B A), not bf16(W + (alpha / r) B A).
  const ParamLayout& params = engine.layout();
  const int dense = params.layer(1).dense;
  const ParamEntry& p = params.entry(dense);
  const LoraLayout& lora = *engine.lora_layout();
  const LoraEntry& e = lora.entries()[static_cast<size_t>(lora.find(1, LoraTarget::dense))];
  const std::vector<float> adapters = engine.lora_adapters().value();
  auto merged = [&](bool round_base) {
    std::vector<float> w(base.begin() + p.offset, base.begin() + p.offset + p.numel);
    if (round_base)
      for (float& x : w) x = bf16_round(x);
    merge_lora_entry(lora, e, adapters, w);
    for (float& x : w) x = bf16_round(x);
    return w;
  };
  const std::vector<float> expected = merged(true);
  ASSERT_NE(expected, merged(false)) << "rounding the base first must show somewhere, or this test proves nothing";
  EXPECT_EQ(import_weights(r.root / "merged_cuda_like")[static_cast<size_t>(dense)], expected);
}

void expect_refused(const CliOptions& o, const std::string& needle, const std::string& needle2 = "") {
  auto result = run_export(o);
  ASSERT_FALSE(result.is_ok()) << "expected: " << needle;
  EXPECT_EQ(result.status().exit_code(), 2) << result.status().message();
  EXPECT_NE(result.status().message().find(needle), std::string::npos) << result.status().message();
  EXPECT_NE(result.status().message().find(needle2), std::string::npos) << result.status().message();
  EXPECT_FALSE(fs::exists(o.save_dir)) << "nothing may be written for " << needle;
  EXPECT_FALSE(leftovers_beside(o.save_dir));
}

TEST(LoraExport, WrongBasesAndBadRequestsAreRefused) {
  const Runs& r = runs();
  if (world_rank() != 0) return;
  const fs::path out = r.root / "refused";
  const fs::path lora_ckpt = r.random_run() / "checkpoint-3";
  auto merge = [&](const fs::path& ckpt) {
    CliOptions o = export_options(ckpt, out);
    o.merge_lora = true;
    return o;
  };
  // Another seed: the recorded fingerprint says these are not the adapters' base weights.
  {
    const fs::path d = r.root / "other_seed";
    fs::copy(lora_ckpt, d, fs::copy_options::recursive);
    nlohmann::json meta = read_json(d / "meta.json");
    const double recorded = meta["base"]["sum_squares"].get<double>();
    meta["base"]["random_init_seed"] = 43;
    std::ofstream(d / "meta.json") << meta.dump();
    char text[32];
    std::snprintf(text, sizeof(text), "%.12g", recorded);
    expect_refused(merge(d), concat("base.sum_squares (a fingerprint of the base weights) is ", text, ", "),
                   "the random initialisation with seed 43 gives ");
  }
  // A Hugging Face model that is not the base, given as the base.
  {
    CliOptions o = merge(lora_ckpt);
    o.model_id_or_path = r.base_hf().string();
    expect_refused(o, "the Hugging Face model '" + r.base_hf().string() + "' gives ", "not the base");
  }
  // --merge_lora and --model_id_or_path on a full checkpoint.
  expect_refused(merge(r.full_ckpt()), "--merge_lora true", "full-training checkpoint");
  {
    CliOptions o = export_options(r.full_ckpt(), out);
    o.model_id_or_path = r.base_hf().string();
    expect_refused(o, "--model_id_or_path", "full-training checkpoint");
  }
  // A non-empty --save_dir is kept unless --overwrite true.
  const fs::path taken = r.root / "taken";
  fs::create_directories(taken);
  std::ofstream(taken / "precious.txt") << "keep";
  auto refused = run_export(export_options(lora_ckpt, taken));
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("is not empty; give --overwrite true"), std::string::npos)
      << refused.status().message();
  EXPECT_TRUE(fs::exists(taken / "precious.txt"));
  EXPECT_FALSE(leftovers_beside(taken));
  CliOptions again = export_options(lora_ckpt, taken);
  again.overwrite = true;
  ASSERT_TRUE(run_export(again).is_ok());
  EXPECT_FALSE(fs::exists(taken / "precious.txt"));
  EXPECT_TRUE(fs::exists(taken / "adapter_model.safetensors"));
  // Base weights are not in a LoRA checkpoint: reading them is refused, not invented.
  auto info = read_checkpoint_info(lora_ckpt.string());
  ASSERT_TRUE(info.is_ok()) << info.status().message();
  ASSERT_TRUE(info.value().lora.has_value());
  Status masters = read_checkpoint_masters(info.value(), [](int, std::span<const float>) { return Status::ok(); });
  EXPECT_NE(masters.message().find("is a LoRA checkpoint"), std::string::npos) << masters.message();
}

// glm_hpc infer's loader (cli/model_source.h): a LoRA checkpoint (as --ckpt_dir, or as --adapters on
// its base) and its PEFT export (either layout, on the base) give the adapters' logits unmerged,
// exactly; the merged export the same up to bf16.
std::vector<float> source_logits(const ModelSpec& spec) {
  auto source = ModelSource::open(spec);
  EXPECT_TRUE(source.is_ok()) << source.status().message();
  if (!source.is_ok()) return {};
  EXPECT_TRUE(source.value().lora().has_value());
  auto backend = make_cpu_backend(DType::f32);
  LocalCommunicator comm;
  EngineConfig ec{.model = source.value().config(), .max_tokens = 64, .max_grad_norm = 0.0};
  ec.lora = source.value().lora();
  auto engine = TrainingEngine::create(ec, *backend, comm);
  EXPECT_TRUE(engine.is_ok()) << engine.status().message();
  if (!engine.is_ok()) return {};
  const Status loaded = source.value().load(*engine.value());
  EXPECT_TRUE(loaded.is_ok()) << loaded.message();
  return engine_logits(*engine.value());
}

TEST(LoraExport, AdaptersAppliedUnmergedGiveTheAdaptedLogits) {
  const Runs& r = runs();
  if (world_rank() != 0) return;
  const std::vector<float> adapted = engine_logits(*restored(r.hf_run(), r.base_hf().string())->engine);
  const std::string base = r.base_hf().string();
  EXPECT_EQ(source_logits({"", r.hf_run().string(), ""}), adapted) << "--ckpt_dir of a LoRA run";
  EXPECT_EQ(source_logits({base, "", r.hf_run().string()}), adapted) << "--adapters on its base";
  for (const HfLayout layout : {HfLayout::glm, HfLayout::chatglm}) {
    const fs::path peft = r.root / (layout == HfLayout::glm ? "source_peft" : "source_peft_chatglm");
    ASSERT_TRUE(run_export(export_options(r.hf_run(), peft, layout)).is_ok());
    EXPECT_EQ(source_logits({base, "", peft.string()}), adapted) << "PEFT adapters, " << enum_name(layout);
  }
  const fs::path merged = r.root / "source_merged";
  CliOptions o = export_options(r.hf_run(), merged);
  o.merge_lora = true;
  ASSERT_TRUE(run_export(o).is_ok());
  auto merged_source = ModelSource::open({merged.string(), "", ""});
  ASSERT_TRUE(merged_source.is_ok()) << merged_source.status().message();
  EXPECT_FALSE(merged_source.value().lora().has_value());
  EXPECT_LT(relative_error(imported_logits(merged), adapted), kBf16LogitsRelative);

  // transformers' layout with its own lora_A for q_proj, k_proj and v_proj (as PEFT trains it): applied
  // exactly (rank 3r on the fused linear), against the base with every module's B A merged by hand.
  const fs::path peft = r.root / "source_peft";
  auto file = SafetensorsFile::open((peft / "adapter_model.safetensors").string());
  ASSERT_TRUE(file.is_ok());
  std::map<std::string, std::vector<float>> values;
  for (const StTensorInfo& t : file.value().tensors()) {
    std::vector<float>& v = values[t.name];
    v.resize(static_cast<size_t>(t.numel()));
    ASSERT_TRUE(read_as_f32(file.value(), t, v).is_ok());
  }
  std::mt19937 rng(17);
  std::normal_distribution<float> noise(0.0f, 0.05f);
  for (auto& [name, v] : values)  // k_proj's and v_proj's A: their own now
    if (name.find("k_proj.lora_A") != std::string::npos || name.find("v_proj.lora_A") != std::string::npos)
      for (float& x : v) x += noise(rng);
  std::vector<StTensorView> views;
  for (const StTensorInfo& t : file.value().tensors())
    views.push_back({t.name, StDType::F32, t.shape, values[t.name].data()});
  const fs::path split_a = r.root / "peft_split_a";
  fs::create_directories(split_a);
  fs::copy_file(peft / "adapter_config.json", split_a / "adapter_config.json");
  ASSERT_TRUE(write_safetensors((split_a / "adapter_model.safetensors").string(), views).is_ok());
  auto split_source = ModelSource::open({base, "", split_a.string()});
  ASSERT_TRUE(split_source.is_ok()) << split_source.status().message();
  EXPECT_EQ(split_source.value().lora()->rank, 12);
  EXPECT_NE(split_source.value().describe().find("applied as rank 12"), std::string::npos)
      << split_source.value().describe();
  const ModelConfig& c = split_source.value().config();
  Weights merged_weights = import_weights(r.base_hf());
  const ParamLayout params(c, 1);
  const LoraConfig peft_lora = split_source.value().lora().value();
  const double scale = 12.0 / 4.0;  // adapter_config.json's lora_alpha / r (tiny(): 12 and 4)
  const LoraLayout original(c, LoraConfig{.rank = 4, .alpha = 12, .dropout = 0, .targets = peft_lora.targets});
  const std::vector<PeftTensor> tensors = peft_tensors(original, c, HfLayout::glm);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].is_b) continue;
    const PeftTensor& b = tensors[i];
    const PeftTensor& a = tensors[i - 1];  // each B follows its module's A
    const LoraEntry& e = original.entries()[static_cast<size_t>(b.entry)];
    const LayerEntries& le = params.layer(e.layer);
    const int entry = e.target == LoraTarget::query_key_value ? le.qkv_weight
                      : e.target == LoraTarget::dense         ? le.dense
                      : e.target == LoraTarget::dense_h_to_4h ? le.h_to_4h
                                                              : le.four_h_to_h;
    std::vector<float>& w = merged_weights[static_cast<size_t>(entry)];
    const std::vector<float>&bv = values[b.name], &av = values[a.name];
    for (int64_t out_row = 0; out_row < b.shape[0]; ++out_row)
      for (int64_t in = 0; in < e.in_features; ++in) {
        double sum = 0;
        for (int64_t k = 0; k < 4; ++k)
          sum += static_cast<double>(bv[static_cast<size_t>(out_row * 4 + k)]) *
                 av[static_cast<size_t>(k * e.in_features + in)];
        w[static_cast<size_t>((b.first_row + out_row) * e.in_features + in)] += static_cast<float>(scale * sum);
      }
  }
  auto backend = make_cpu_backend(DType::f32);
  LocalCommunicator comm;
  auto merged_engine = TrainingEngine::create({.model = c, .max_tokens = 64, .max_grad_norm = 0.0}, *backend, comm).take();
  for (size_t e = 0; e < merged_weights.size(); ++e)
    ASSERT_TRUE(merged_engine->set_parameter(static_cast<int>(e), merged_weights[e]).is_ok());
  ASSERT_TRUE(merged_engine->parameters_updated().is_ok());
  const std::vector<float> expected = engine_logits(*merged_engine);
  const std::vector<float> unmerged = source_logits({base, "", split_a.string()});
  EXPECT_LT(relative_error(unmerged, expected), 1e-5);
  EXPECT_GT(relative_error(expected, adapted), 1e-3) << "the new A's must change the model, or this proves nothing";
  nlohmann::json cfg = read_json(peft / "adapter_config.json");
  cfg["use_dora"] = true;
  std::ofstream(split_a / "adapter_config.json") << cfg.dump();
  auto dora = ModelSource::open({base, "", split_a.string()});
  ASSERT_FALSE(dora.is_ok());
  EXPECT_NE(dora.status().message().find("\"use_dora\" is true: not supported"), std::string::npos)
      << dora.status().message();
  auto no_base = ModelSource::open({"", "", peft.string()});
  ASSERT_FALSE(no_base.is_ok());
  EXPECT_NE(no_base.status().message().find("give their base model as --model_id_or_path"), std::string::npos);
}

// Last: the scratch directory goes once every rank is done with it.
TEST(LoraExport, ZzScratchRemoved) {
  const Runs& r = runs();
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(r.root);
}

}  // namespace
}  // namespace glm::test
