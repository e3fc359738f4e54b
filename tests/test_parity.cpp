// Parity with Hugging Face transformers' GlmForCausalLM: fixtures written by
// tools/make_parity_fixtures.py (transformers 5.17, float32 on the CPU) hold random models, a
// batch with ignored positions, logits, the loss, every parameter's gradient and a 10-step AdamW
// loss trajectory. The CPU backend must reproduce them from the safetensors checkpoints, in both
// the transformers `glm` layout and the THUDM `chatglm` layout.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/model_source.h"
#include "io/hf_import.h"
#include "io/safetensors.h"
#include "mpi/local_communicator.h"
#include "test_util.h"
#include "train/cached_generator.h"
#include "train/engine.h"
#include "train/generate.h"

namespace glm::test {
namespace {

// fp32 against fp32 in another summation order: ~1e-7 relative per op, ~1e-6 through the model;
// the bound is 1e-5 (norm-wise per tensor: ||ours - theirs|| / ||theirs||).
constexpr double kFp32Relative = 1e-5;
// Ten AdamW steps amplify fp32 differences (v is tiny early on): the bound is 1e-4.
constexpr double kTrajectoryRelative = 1e-4;

const std::string kData = std::string(GLM_SOURCE_DIR) + "/tests/data/";

std::vector<float> golden_tensor(const SafetensorsFile& f, const std::string& name) {
  const StTensorInfo* t = f.find(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  std::vector<float> v(static_cast<size_t>(t->numel()));
  EXPECT_TRUE(read_as_f32(f, *t, v).is_ok());
  return v;
}

struct Fixture {
  HfModel model;
  nlohmann::json golden;
  HostMicroBatch batch;
};

Fixture load(const std::string& model_dir, const std::string& golden_dir) {
  Fixture fx;
  auto m = read_hf_config(kData + model_dir);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  fx.model = m.take();
  std::ifstream in(kData + golden_dir + "/golden.json");
  fx.golden = nlohmann::json::parse(in);
  const auto& ids = fx.golden["input_ids"];
  const auto& labels = fx.golden["labels"];
  for (size_t row = 0; row < ids.size(); ++row) {
    TokenizedSample s;
    for (size_t t = 0; t < ids[row].size(); ++t) {
      s.tokens.push_back(ids[row][t].get<int32_t>());
      const int32_t l = labels[row][t].get<int32_t>();
      s.labels.push_back(l == -100 ? -1 : l);
    }
    append_document(fx.batch, s);  // each row is its own causal sequence
  }
  return fx;
}

std::unique_ptr<TrainingEngine> make_engine(const Fixture& fx, Backend& backend, Communicator& comm) {
  const auto& a = fx.golden["adamw"];
  AdamWOptions adam{a["betas"][0].get<double>(), a["betas"][1].get<double>(), a["eps"].get<double>(),
                    a["weight_decay"].get<double>()};
  const EngineConfig ec{.model = fx.model.config,
                        .max_tokens = fx.batch.size(),
                        .adam = adam,
                        .max_grad_norm = a["max_grad_norm"].get<double>()};
  auto e = TrainingEngine::create(ec, backend, comm);
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  auto engine = e.take();
  Status s = load_hf_weights(fx.model, engine->layout(),
                             [&](int entry, std::span<const float> v) { return engine->set_parameter(entry, v); });
  EXPECT_TRUE(s.is_ok()) << s.message();
  EXPECT_TRUE(engine->parameters_updated().is_ok());
  return engine;
}

void check_fixture(const std::string& model_dir, const std::string& golden_dir) {
  Fixture fx = load(model_dir, golden_dir);
  auto golden_file = SafetensorsFile::open(kData + golden_dir + "/golden.safetensors");
  ASSERT_TRUE(golden_file.is_ok()) << golden_file.status().message();
  const SafetensorsFile& golden = golden_file.value();
  auto backend = make_cpu_backend(DType::f32);
  LocalCommunicator comm;
  auto engine = make_engine(fx, *backend, comm);

  std::vector<float> logits;
  ASSERT_TRUE(engine->logits(fx.batch, logits).is_ok());
  const double logits_error = relative_error(logits, golden_tensor(golden, "logits"));
  EXPECT_LT(logits_error, kFp32Relative) << "logits";
  double worst_grad = 0, worst_step = 0;

  const auto& adamw = fx.golden["adamw"];
  const double lr = adamw["lr"].get<double>();
  std::vector<HostMicroBatch> window = {fx.batch};
  auto first = engine->step(window, lr);
  ASSERT_TRUE(first.is_ok()) << first.status().message();
  const double loss = fx.golden["loss"].get<double>();
  EXPECT_NEAR(first.value().loss, loss, kFp32Relative * loss) << "loss";

  // Gradients of the first step (before the update touched them) against transformers', by name.
  HfModel glm_names = fx.model;
  glm_names.layout = HfLayout::glm;
  const ParamLayout& layout = engine->layout();
  const float* grads = engine->gradients().as<float>();
  for (int i = 0; i < static_cast<int>(layout.entries().size()); ++i) {
    const ParamEntry& e = layout.entry(i);
    for (const HfPiece& piece : hf_pieces(glm_names, layout, i)) {
      std::vector<float> theirs = golden_tensor(golden, "grad." + piece.name);
      std::span<const float> ours(grads + e.offset + piece.offset, theirs.size());
      const double err = relative_error(ours, theirs);
      worst_grad = std::max(worst_grad, err);
      EXPECT_LT(err, kFp32Relative) << piece.name << " (our " << e.name << ")";
    }
  }

  std::vector<double> losses = {first.value().loss}, norms = {first.value().grad_norm};
  for (size_t s = 1; s < adamw["losses"].size(); ++s) {
    auto r = engine->step(window, lr);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    losses.push_back(r.value().loss);
    norms.push_back(r.value().grad_norm);
  }
  for (size_t s = 0; s < losses.size(); ++s) {
    const double ref = adamw["losses"][s].get<double>();
    EXPECT_NEAR(losses[s], ref, kTrajectoryRelative * ref) << "AdamW step " << s + 1;
    worst_step = std::max(worst_step, std::fabs(losses[s] - ref) / ref);
    const double ref_norm = adamw["grad_norms"][s].get<double>();
    EXPECT_NEAR(norms[s], ref_norm, kTrajectoryRelative * 10 * ref_norm) << "grad_norm at step " << s + 1;
  }
  std::printf("%s vs transformers: logits %.1e, loss %.1e, worst gradient %.1e, worst of 10 AdamW losses %.1e\n",
              model_dir.c_str(), logits_error, std::fabs(first.value().loss - loss) / loss, worst_grad, worst_step);
}

TEST(Parity, TransformersLayoutTwoKvGroups) { check_fixture("glm_a", "glm_a"); }
TEST(Parity, ThudmLayoutShardedCheckpoint) { check_fixture("chatglm_a", "glm_a"); }
TEST(Parity, FourKvGroupsLongSequence) { check_fixture("glm_b", "glm_b"); }
// The pad token among the inputs: its embedding row gets no gradient, as transformers' padding_idx.
TEST(Parity, PadTokenRowNeverTrains) { check_fixture("glm_pad", "glm_pad"); }

// A generation fixture: the golden file of golden_dir, and the model of model_dir as `infer` opens
// it, on the CPU in fp32, for forwards of up to kGenerationTokens tokens.
constexpr int64_t kGenerationTokens = 128;
struct GenerationFixture {
  nlohmann::json golden;
  std::unique_ptr<Backend> backend = make_cpu_backend(DType::f32);
  LocalCommunicator comm;
  std::unique_ptr<TrainingEngine> engine;
};
void open_generation_fixture(const std::string& model_dir, const std::string& golden_file, GenerationFixture& f) {
  std::ifstream in(kData + golden_file);
  ASSERT_TRUE(in) << "missing " << golden_file;
  f.golden = nlohmann::json::parse(in);
  auto source = ModelSource::open({kData + model_dir, "", ""});
  ASSERT_TRUE(source.is_ok()) << source.status().message();
  const EngineConfig ec{.model = source.value().config(), .max_tokens = kGenerationTokens, .max_grad_norm = 0.0};
  auto engine = TrainingEngine::create(ec, *f.backend, f.comm);
  ASSERT_TRUE(engine.is_ok()) << engine.status().message();
  f.engine = engine.take();
  ASSERT_TRUE(source.value().load(*f.engine).is_ok());
}

// transformers' generate(do_sample=False) continues three prompts (1, 9 and 57 tokens) by 32 tokens
// (tools/make_generate_fixtures.py, fp32 on the CPU); glm_hpc's greedy generation from the model as
// `infer` opens it must choose the same tokens, in both layouts. Its step margins (the chosen logit
// over the runner-up, at least 2e-4 here) are far above fp32 differences (~1e-6), so any
// difference is a defect, not a tie broken the other way.
void check_greedy(const std::string& model_dir, const std::string& golden_dir) {
  GenerationFixture f;
  ASSERT_NO_FATAL_FAILURE(open_generation_fixture(model_dir, golden_dir + "/generate.json", f));
  const nlohmann::json& golden = f.golden;
  GenerationOptions options;
  options.sampling.temperature = 0;
  options.max_new_tokens = golden["max_new_tokens"].get<int64_t>();
  options.max_tokens = kGenerationTokens;
  ASSERT_EQ(golden["prompts"].size(), 3u);
  for (size_t i = 0; i < golden["prompts"].size(); ++i) {
    const std::vector<int32_t> prompt = golden["prompts"][i].get<std::vector<int32_t>>();
    auto g = generate(*f.engine, prompt, options, i);
    ASSERT_TRUE(g.is_ok()) << g.status().message();
    EXPECT_EQ(g.value().tokens, golden["greedy"][i].get<std::vector<int32_t>>()) << "prompt " << i;
    EXPECT_FALSE(g.value().stopped);
  }
}

TEST(Parity, GreedyGenerationFollowsTransformers) {
  check_greedy("glm_a", "glm_a");
  check_greedy("chatglm_a", "glm_a");
  check_greedy("glm_b", "glm_b");
}

// transformers' generate(num_beams=N, do_sample=False) of the same prompts under five settings
// (tools/make_generate_fixtures.py: 2 to 5 beams; end tokens its beams produce, so hypotheses end
// early; length penalties 2, 1, 0 and -1; early_stopping false, true and "never"; a repetition
// penalty): the best hypothesis' tokens (its end token included) and score, by the reference
// search (recomputing every beam) and by the cached generator, which shares the prompt's rows and
// must stop after as many steps as transformers' search (its early-stopping heuristic).
void check_beams(const std::string& model_dir, const std::string& golden_dir) {
  GenerationFixture f;
  ASSERT_NO_FATAL_FAILURE(open_generation_fixture(model_dir, golden_dir + "/beam_search.json", f));
  const nlohmann::json& golden = f.golden;
  const auto prompts = golden["prompts"].get<std::vector<std::vector<int32_t>>>();
  int checked = 0;
  for (const nlohmann::json& c : golden["cases"]) {
    GenerationOptions options;
    options.sampling.temperature = 0;
    options.sampling.repetition_penalty = c["repetition_penalty"].get<double>();
    options.beams.num_beams = c["num_beams"].get<int64_t>();
    options.beams.length_penalty = c["length_penalty"].get<double>();
    const nlohmann::json& early = c["early_stopping"];
    options.beams.early_stopping = early.is_string()   ? EarlyStopping::never
                                   : early.get<bool>() ? EarlyStopping::when_full
                                                       : EarlyStopping::heuristic;
    options.max_new_tokens = c["max_new_tokens"].get<int64_t>();
    options.max_tokens = kGenerationTokens;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const std::string where = concat(golden_dir, " case with ", options.beams.num_beams, " beams, length_penalty ",
                                       options.beams.length_penalty, ", prompt ", i);
      options.stop_ids = c["eos_token_id"][i].get<std::vector<int32_t>>();
      std::vector<int32_t> expected = c["replies"][i].get<std::vector<int32_t>>();
      const bool ended = !expected.empty() && std::find(options.stop_ids.begin(), options.stop_ids.end(),
                                                        expected.back()) != options.stop_ids.end();
      if (ended) expected.pop_back();
      const float score = c["scores"][i].get<float>();
      auto g = generate(*f.engine, prompts[i], options, i);
      ASSERT_TRUE(g.is_ok()) << g.status().message();
      EXPECT_EQ(g.value().tokens, expected) << where;
      EXPECT_EQ(g.value().stopped, ended) << where;
      ASSERT_TRUE(g.value().beam_score.has_value()) << where;
      EXPECT_NEAR(*g.value().beam_score, score, 1e-4 * std::fabs(score)) << where;
      auto generator = CachedGenerator::create(*f.engine, options, 1024, 2);
      ASSERT_TRUE(generator.is_ok()) << generator.status().message();
      const GenerationRequest request{prompts[i], i};
      Generation cached;
      ASSERT_TRUE(generator.value()->run({&request, 1}, [&](size_t, Generation r) { cached = std::move(r); }).is_ok());
      EXPECT_EQ(cached.tokens, expected) << where << " (cached)";
      ASSERT_TRUE(cached.beam_score.has_value()) << where;
      EXPECT_NEAR(*cached.beam_score, score, 1e-4 * std::fabs(score)) << where << " (cached)";
      // The prompt fits one forward: a forward a search step, as many as transformers took.
      EXPECT_EQ(generator.value()->forwards(), c["steps"][i].get<int64_t>()) << where << " (steps)";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 15);
}

TEST(Parity, BeamSearchFollowsTransformers) {
  check_beams("glm_a", "glm_a");
  check_beams("chatglm_a", "glm_a");
  check_beams("glm_b", "glm_b");
}

TEST(Parity, ConfigsOfBothLayoutsAgree) {
  auto a = read_hf_config(kData + "glm_a");
  auto t = read_hf_config(kData + "chatglm_a");
  ASSERT_TRUE(a.is_ok() && t.is_ok());
  const ModelConfig& x = a.value().config;
  const ModelConfig& y = t.value().config;
  EXPECT_EQ(x.rope_theta, 5e6);
  EXPECT_EQ(y.rope_theta, 5e6);
  EXPECT_EQ(x.num_key_value_heads, 2);
  EXPECT_EQ(y.num_key_value_heads, 2);
  EXPECT_EQ(x.rotary_dim(), 16);
  EXPECT_EQ(x.parameter_count(), y.parameter_count());
  EXPECT_EQ(x.rms_norm_eps, y.rms_norm_eps);
}

}  // namespace
}  // namespace glm::test
