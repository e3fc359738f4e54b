// Pieces of the trainer that need no MPI: LR schedule, chat template targets, loader, options.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "cli/infer.h"
#include "cli/options.h"
#include "cli/prepare.h"
#include "data/chat_template.h"
#include "data/conversation_reader.h"
#include "data/dataset.h"
#include "data/sharded_loader.h"
#include "test_util.h"
#include "train/lr_schedule.h"
#include "train/trainer.h"

namespace glm::test {
namespace {

std::string temp_file(const std::string& name, const std::string& content) {
  const auto dir = std::filesystem::temp_directory_path() / "glm_hpc_tests";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

TEST(LrSchedule, WarmupThenCosineLikeTransformers) {
  LrSchedule s{LrSchedulerType::cosine, 1e-3, 10, 110};
  EXPECT_EQ(s.at(0), 0.0);  // transformers' first warmup step uses lr 0
  EXPECT_NEAR(s.at(5), 5e-4, 1e-15);
  EXPECT_NEAR(s.at(10), 1e-3, 1e-15);
  EXPECT_NEAR(s.at(60), 5e-4, 1e-12);  // half way through the decay
  EXPECT_NEAR(s.at(110), 0.0, 1e-15);
  LrSchedule lin{LrSchedulerType::linear, 1.0, 0, 4};
  EXPECT_NEAR(lin.at(1), 0.75, 1e-15);
  EXPECT_EQ(resolve_warmup_steps(0, 0.05, 75), 4);
  EXPECT_EQ(resolve_warmup_steps(3, 0.5, 75), 3);
}

// infer's forward size on GLM-4-9B-Chat shapes: without a memory bound a long prompt is one forward
// and short ones share forwards of 8192 tokens (or of the whole cache); with a device's free memory
// it is the largest halving whose activations fit beside the weights, the cache and the reserve,
// down to 512, never below a decode step of the batch; where not even the weights fit, a user error
// that names the sizes.
TEST(InferForward, TakesTheLongestPromptWholeWhereTheMemoryAllows) {
  const ModelConfig c = glm4_9b_chat();
  EXPECT_EQ(forward_tokens(c, -1, 2, 4, 32768, 32769, 1).value(), 32768);
  EXPECT_EQ(forward_tokens(c, -1, 2, 4, 500, 756, 32).value(), 8192);
  EXPECT_EQ(forward_tokens(c, -1, 2, 4, 40, 56, 32).value(), 56 * 32);
  EXPECT_EQ(forward_tokens(c, -1, 2, 4, 20000, 20256, 64).value(), 20000);
  const int64_t gib = int64_t{1} << 30;
  const auto planned = [&](int64_t tokens) {
    return Glm4Model::planned_activation_bytes(c, tokens, 2, 4, Recompute::full, false, /*forward_only=*/true);
  };
  EXPECT_EQ(forward_tokens(c, 139 * gib, 2, 4, 32768, 33024, 1).value(), 32768);  // an H200
  EXPECT_EQ(forward_tokens(c, 39 * gib, 2, 4, 32768, 33024, 1).value(), 32768);   // a 40 GB A100
  // A 24 GB GPU: the weights leave about 3 GB.
  const int64_t free = 23 * gib;
  const int64_t budget =
      free - ParamLayout(c).total_numel() * 2 - 33024 * KvCache::bytes_per_token(c, 2) - kForwardReserve;
  const int64_t tokens = forward_tokens(c, free, 2, 4, 32768, 33024, 1).value();
  EXPECT_LT(tokens, 32768);
  EXPECT_GE(tokens, 4096);
  EXPECT_LE(planned(tokens), budget);
  EXPECT_GT(planned(2 * tokens), budget);
  EXPECT_EQ(32768 % tokens, 0);
  EXPECT_EQ(forward_tokens(c, 19 * gib, 2, 4, 32768, 33024, 1).value(), 512);
  EXPECT_EQ(forward_tokens(c, 19 * gib, 2, 4, 100, 300, 700).value(), 700);
  // A 16 GB GPU cannot hold the weights: a user error naming the sizes.
  const Result<int64_t> refused = forward_tokens(c, 15 * gib, 2, 4, 100, 300, 1);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().kind(), ErrorKind::user_input);
  EXPECT_NE(refused.status().message().find("GiB of weights"), std::string::npos) << refused.status().message();
}

TEST(ChatTemplate, TargetsAreAssistantNewlineContentAndTerminator) {
  ByteTokenizer tok;
  Conversation c;
  c.messages = {
      {Role::system, "S"}, {Role::user, "Q"}, {Role::assistant, "AB"}, {Role::user, "R"}, {Role::assistant, "C"}};
  TokenizedSample s = ChatTemplate(tok).render(c);
  const int32_t g = tok.special_id(SpecialToken::gmask), sop = tok.special_id(SpecialToken::sop);
  const int32_t sys = tok.special_id(SpecialToken::system), usr = tok.special_id(SpecialToken::user);
  const int32_t ast = tok.special_id(SpecialToken::assistant);
  const std::vector<int32_t> expected = {g,   sop, sys, '\n', 'S', usr, '\n', 'Q', ast, '\n',
                                         'A', 'B', usr, '\n', 'R', ast, '\n', 'C', usr};
  const std::vector<uint8_t> mask = {0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1};
  EXPECT_EQ(s.tokens, expected);
  ASSERT_EQ(s.labels.size(), mask.size());
  for (size_t t = 0; t < mask.size(); ++t) EXPECT_EQ(s.labels[t], mask[t] ? expected[t] : -1) << t;
  EXPECT_EQ(s.target_count(), 7);
  EXPECT_EQ(tok.decode(s.tokens),
            "[gMASK]<sop><|system|>\nS<|user|>\nQ<|assistant|>\nAB<|user|>\nR<|assistant|>\nC<|user|>");
  // Special-token text inside content stays ordinary bytes.
  Conversation lit;
  lit.messages = {{Role::user, "<|user|>"}, {Role::assistant, "x"}};
  TokenizedSample t = ChatTemplate(tok).render(lit);
  EXPECT_EQ(t.tokens[4], '<');
}

// Generation continues after <|assistant|>: a final assistant turn is the reference, not prompt;
// an earlier one stays as history.
TEST(ChatTemplate, GenerationPromptEndsWithTheAssistantToken) {
  ByteTokenizer tok;
  Conversation c;
  c.messages = {{Role::system, "S"}, {Role::user, "Q"}, {Role::assistant, "A"}, {Role::user, "R"}, {Role::assistant, "C"}};
  EXPECT_EQ(tok.decode(ChatTemplate(tok).generation_prompt(c)),
            "[gMASK]<sop><|system|>\nS<|user|>\nQ<|assistant|>\nA<|user|>\nR<|assistant|>");
  EXPECT_EQ(ChatTemplate::reference_answer(c), std::optional<std::string>("C"));
  c.messages.pop_back();
  EXPECT_EQ(tok.decode(ChatTemplate(tok).generation_prompt(c)),
            "[gMASK]<sop><|system|>\nS<|user|>\nQ<|assistant|>\nA<|user|>\nR<|assistant|>");
  EXPECT_EQ(ChatTemplate::reference_answer(c), std::nullopt);
}

TEST(ShardedLoader, GlobalBatchIsTheSameSetAtEveryWorldSize) {
  Dataset d;
  for (int i = 0; i < 37; ++i) {
    TokenizedSample s;
    s.tokens = {i, i + 1};
    s.labels = {-1, i + 1};
    d.samples.push_back(s);
  }
  auto collect = [&](int world, int64_t per_device, int64_t accumulation, int64_t step) {
    std::multiset<int32_t> ids;
    for (int r = 0; r < world; ++r) {
      ShardedLoader loader(d, 11, r, world, per_device, accumulation);
      for (int64_t m = 0; m < accumulation; ++m) {
        HostMicroBatch b = loader.micro_batch(step, m);
        for (size_t t = 0; t < b.tokens.size(); t += 2) ids.insert(b.tokens[t]);
        EXPECT_EQ(b.target_count, per_device);
      }
    }
    return ids;
  };
  for (int64_t step : {0, 3, 5}) {  // step 3 crosses into the second epoch
    auto reference = collect(1, 1, 12, step);
    EXPECT_EQ(reference.size(), 12u);
    EXPECT_EQ(collect(2, 2, 3, step), reference);
    EXPECT_EQ(collect(3, 1, 4, step), reference);
    EXPECT_EQ(collect(4, 3, 1, step), reference);
  }
  // Within one epoch every sample appears exactly once.
  std::set<int32_t> epoch;
  ShardedLoader one(d, 11, 0, 1, 37, 1);
  HostMicroBatch all = one.micro_batch(0, 0);
  for (size_t t = 0; t < all.tokens.size(); t += 2) epoch.insert(all.tokens[t]);
  EXPECT_EQ(epoch.size(), 37u);
}

TEST(ShardedLoader, PackedDocumentsHaveOwnPositionsAndTargets) {
  TokenizedSample a{{5, 6, 7}, {-1, 6, 99}}, b{{8, 9}, {-1, -1}};
  HostMicroBatch batch;
  append_document(batch, a);
  append_document(batch, b);
  EXPECT_EQ(batch.targets, (std::vector<int32_t>{6, 99, -1, -1, -1}));  // labels may differ from tokens
  EXPECT_EQ(batch.positions, (std::vector<int32_t>{0, 1, 2, 0, 1}));
  EXPECT_EQ(batch.doc_start, (std::vector<int32_t>{0, 0, 0, 3, 3}));
  EXPECT_EQ(batch.target_count, 2);
}

TEST(ConversationReader, ReportsEveryBadLineWithFileAndLine) {
  const std::string path = temp_file(
      "bad.jsonl",
      "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}\n"
      "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}\n"
      "{\"messages\": [{\"role\": \"wizard\", \"content\": \"q\"}]}\n"
      "{\"messages\": [{\"role\": \"user\", \"content\": \"only a question\"}]}\n"
      "{\"messages\": [{\"role\": \"user\", \"content\": \"\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}\n"
      "[1, 2]\n");
  ByteTokenizer tok;
  auto r = load_dataset({path}, &tok, 0, 272);
  ASSERT_FALSE(r.is_ok());
  const std::string& m = r.status().message();
  EXPECT_EQ(r.status().exit_code(), 2);
  EXPECT_NE(m.find("5 bad sample(s)"), std::string::npos) << m;
  EXPECT_NE(m.find("bad.jsonl:2: malformed JSON"), std::string::npos) << m;
  EXPECT_NE(m.find("bad.jsonl:3: messages[0] has unknown role \"wizard\""), std::string::npos) << m;
  EXPECT_NE(m.find("bad.jsonl:4: no assistant message"), std::string::npos) << m;
  EXPECT_NE(m.find("bad.jsonl:5: messages[0] has empty content"), std::string::npos) << m;
  EXPECT_NE(m.find("bad.jsonl:6: expected a JSON object"), std::string::npos) << m;
  auto missing = load_dataset({"/nonexistent/x.jsonl"}, &tok, 0, 272);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("cannot open dataset file '/nonexistent/x.jsonl'"), std::string::npos);
}

Result<CliOptions> parse(std::vector<std::string> args) {
  args.insert(args.begin(), "glm_hpc");
  std::vector<const char*> argv;
  for (auto& a : args) argv.push_back(a.c_str());
  return parse_options(static_cast<int>(argv.size()), argv.data());
}

TEST(Options, DefaultsAreTheTinyRecipeAndTheCommandLineOverridesTheConfig) {
  auto d = parse({});
  ASSERT_TRUE(d.is_ok()) << d.status().message();
  EXPECT_EQ(d.value().train.model.hidden_size, 128);
  EXPECT_EQ(d.value().train.model.rope_theta, 5e6);
  EXPECT_EQ(d.value().effective["hidden_size"]["source"], "default");
  const std::string cfg = temp_file("ok.cfg",
                                    "# comment\nhidden_size = 64\nnum_attention_heads = 4 # inline\n"
                                    "head_dim = 16\nrope_ratio = 10000\nlearning_rate = 1e-4\n");
  auto o = parse({"--config", cfg, "--learning_rate", "3e-4"});
  ASSERT_TRUE(o.is_ok()) << o.status().message();
  EXPECT_EQ(o.value().train.model.hidden_size, 64);
  EXPECT_EQ(o.value().train.model.rope_theta, 1e8);
  EXPECT_DOUBLE_EQ(o.value().train.learning_rate, 3e-4);
  EXPECT_EQ(o.value().effective["hidden_size"]["source"], "config");
  EXPECT_EQ(o.value().effective["learning_rate"]["source"], "command_line");
}

void expect_user_error(const Result<CliOptions>& r, const std::string& needle) {
  ASSERT_FALSE(r.is_ok()) << "expected an error containing: " << needle;
  EXPECT_EQ(r.status().exit_code(), 2);
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
}

TEST(Options, BadInputNamesTheOptionOrFileLine) {
  expect_user_error(parse({"--config", "/nonexistent.cfg"}), "cannot open config file '/nonexistent.cfg'");
  expect_user_error(parse({"--no_such_option", "1"}), "no_such_option");
  expect_user_error(parse({"--learning_rat", "1"}), "unknown option '--learning_rat' (did you mean --learning_rate?)");
  expect_user_error(parse({"--lora_rnak", "4"}), "(did you mean --lora_rank?)");
  expect_user_error(parse({"--config", temp_file("t.cfg", "max_step = 3\n")}),
                    "t.cfg:1: unknown option 'max_step' (did you mean --max_steps?)");
  {
    auto far = parse({"--completely_unrelated", "1"});
    ASSERT_FALSE(far.is_ok());
    EXPECT_EQ(far.status().message().find("did you mean"), std::string::npos) << far.status().message();
  }
  expect_user_error(parse({"--hidden_size", "abc"}), "hidden_size");
  expect_user_error(parse({"fly"}), "unknown command 'fly'");
  expect_user_error(parse({"--config", temp_file("u.cfg", "hidden_size = 64\n\nbogus_key = 1\n")}),
                    "u.cfg:3: unknown option 'bogus_key'");
  expect_user_error(parse({"--config", temp_file("v.cfg", "max_steps = 3\nhidden_size = lots\n")}), "v.cfg:2:");
  expect_user_error(parse({"--config", temp_file("s.cfg", "max_steps 3\n")}), "s.cfg:1: expected 'key = value'");
  expect_user_error(parse({"--config", temp_file("d.cfg", "max_steps = 3\nmax_steps = 4\n")}),
                    "d.cfg:2: 'max_steps' is already set on line 1");
  expect_user_error(parse({"--config", temp_file("k.cfg", "num_attention_heads = 4\nnum_key_value_heads = 3\n")}),
                    "k.cfg:1: num_attention_heads: invalid model shape");
  expect_user_error(parse({"--head_dim", "6"}), "even integer");
  expect_user_error(parse({"--head_dim", "0", "--hidden_size", "130"}), "divisible by num_attention_heads");
  expect_user_error(parse({"--rope_ratio", "500", "--rope_theta", "10000"}), "contradicts");
  expect_user_error(parse({"--per_device_train_batch_size", "0"}), "--per_device_train_batch_size must be >= 1");
  expect_user_error(parse({"--device", "tpu"}), "--device must be auto, cpu or cuda");
  expect_user_error(parse({"--max_length", "4096", "--max_position_embeddings", "1024"}), "exceeds max_position");
}

// Nonsense numbers are refused where they are given, not carried into a run that then does something
// else quietly (clipping off with nan, a flat loss with an infinite epsilon, one step of 1e30 epochs,
// the seed -1 wrapped to 2^64 - 1).
TEST(Options, NumbersMustBeFiniteAndUnsignedOnesUnsigned) {
  expect_user_error(parse({"--max_grad_norm", "nan"}), "--max_grad_norm must be a finite number, got 'nan'");
  expect_user_error(parse({"--adam_epsilon", "inf"}), "--adam_epsilon must be a finite number, got 'inf'");
  expect_user_error(parse({"--num_train_epochs", "inf"}), "--num_train_epochs must be a finite number, got 'inf'");
  expect_user_error(parse({"--weight_decay", "inf"}), "--weight_decay must be a finite number");
  expect_user_error(parse({"--rope_theta", "nan"}), "--rope_theta must be a finite number, got 'nan'");
  expect_user_error(parse({"--collective_timeout", "inf"}), "--collective_timeout must be a finite number");
  expect_user_error(parse({"--config", temp_file("n.cfg", "max_steps = 3\nlearning_rate = nan\n")}),
                    "n.cfg:2: learning_rate must be a finite number, got 'nan'");
  expect_user_error(parse({"--seed", "-1"}), "--seed must be a non-negative integer, got '-1'");
  expect_user_error(parse({"--config", temp_file("seed.cfg", "seed = -5\n")}),
                    "seed.cfg:1: seed must be a non-negative integer, got '-5'");
  expect_user_error(parse({"--seed", "18446744073709551616"}), "seed");  // past uint64
  auto big = parse({"--seed", "18446744073709551615", "--max_grad_norm", "0"});
  ASSERT_TRUE(big.is_ok()) << big.status().message();
  EXPECT_EQ(big.value().train.seed, 18446744073709551615ull);
  // The command line's value is the one checked when the config file gives another.
  auto overridden = parse({"--config", temp_file("seed_ok.cfg", "seed = -5\n"), "--seed", "7"});
  ASSERT_TRUE(overridden.is_ok()) << overridden.status().message();
  EXPECT_EQ(overridden.value().train.seed, 7u);
}

// Epochs are finite but still bounded by use: every sample of the run is numbered in the loader's
// int64 stream, so 1e30 epochs is refused naming the option (not cast into a single step).
TEST(Options, StepCountMustFitTheSampleStream) {
  TrainConfig c;
  c.per_device_train_batch_size = 4;
  c.num_train_epochs = 3;
  EXPECT_EQ(total_training_steps(c, 100, 2).value(), 38);  // ceil(300 / 8)
  c.num_train_epochs = 1e30;
  auto huge = total_training_steps(c, 100, 2);
  ASSERT_FALSE(huge.is_ok());
  EXPECT_EQ(huge.status().exit_code(), 2);
  EXPECT_NE(huge.status().message().find("--num_train_epochs 1e+30 over 100 samples per epoch"), std::string::npos)
      << huge.status().message();
  c.num_train_epochs = 1e12;  // large, but its samples fit: a long run, not an error
  EXPECT_EQ(total_training_steps(c, 100, 2).value(), 12'500'000'000'000);
  c.max_steps = int64_t{1} << 62;
  auto steps = total_training_steps(c, 100, 2);
  ASSERT_FALSE(steps.is_ok());
  EXPECT_NE(steps.status().message().find("--max_steps 4611686018427387904 x a global batch of 8"), std::string::npos)
      << steps.status().message();
}

// Enums and element counts are typed once, by the parser: every accepted name (aliases too) gives
// its value, every other text is refused naming the option (or file:line) and all the choices, and
// args.json records the typed value under the option's spelling.
TEST(Options, EnumsAndCountsAreTypedByTheParser) {
  auto d = parse({});
  ASSERT_TRUE(d.is_ok()) << d.status().message();
  const CliOptions& def = d.value();
  EXPECT_EQ(def.train.train_type, TrainType::full);
  EXPECT_EQ(def.train.truncation_strategy, Truncation::remove);
  EXPECT_EQ(def.train.loss_scale, LossScale::assistant);
  EXPECT_EQ(def.train.zero_options.reduce_bucket_size, ZeroOptions::kDefaultBucketSize);
  EXPECT_EQ(def.train.zero_options.param_persistence_threshold, ZeroOptions::kDeepSpeedParamPersistenceThreshold);
  EXPECT_EQ(def.backend.lm_head_scratch_bytes, BackendConfig{}.lm_head_scratch_bytes) << "one default";
  EXPECT_EQ(def.effective["truncation_strategy"]["value"], "delete");
  EXPECT_EQ(def.effective["reduce_bucket_size"]["value"], ZeroOptions::kDefaultBucketSize);
  EXPECT_EQ(def.effective["model_persistence_threshold"]["value"], "inf");

  auto o = parse({"--train_type",
                  "lora",
                  "--truncation_strategy",
                  "left",
                  "--loss_scale",
                  "last_round",
                  "--on_bad_sample",
                  "skip",
                  "--lr_scheduler_type",
                  "constant",
                  "--save_strategy",
                  "no",
                  "--recompute",
                  "selective",
                  "--grad_reduce_dtype",
                  "bf16",
                  "--reduce_bucket_size",
                  "auto",
                  "--prefetch_bucket_size",
                  "0",
                  "--model_persistence_threshold",
                  "2e6",
                  "--device",
                  "cpu",
                  "--gemm_autotune",
                  "large",
                  "--attention_kernel",
                  "mma"});
  ASSERT_TRUE(o.is_ok()) << o.status().message();
  const CliOptions& c = o.value();
  EXPECT_EQ(c.train.train_type, TrainType::lora);
  EXPECT_EQ(c.train.truncation_strategy, Truncation::left);
  EXPECT_EQ(c.train.loss_scale, LossScale::last_round);
  EXPECT_EQ(c.train.on_bad_sample, OnBadSample::skip);
  EXPECT_EQ(c.train.lr_scheduler_type, LrSchedulerType::constant);
  EXPECT_EQ(c.train.save_strategy, SaveStrategy::no);
  EXPECT_EQ(c.train.recompute, Recompute::selective);
  EXPECT_EQ(c.train.zero_options.grad_reduce_dtype, DType::bf16);
  EXPECT_EQ(c.train.zero_options.reduce_bucket_size, ZeroOptions::kAutoBucketSize);
  EXPECT_EQ(c.train.zero_options.unmeasured_reduce_bucket_size(), ZeroOptions::kDefaultBucketSize);
  EXPECT_EQ(c.train.zero_options.prefetch_bucket_size, 0);
  EXPECT_EQ(c.train.zero_options.model_persistence_threshold, 2'000'000);
  EXPECT_EQ(c.device, Device::cpu);
  EXPECT_EQ(c.backend.gemm_autotune, GemmAutotune::large);
  EXPECT_EQ(c.backend.attention_kernel, AttentionKernel::mma);
  // The alias is recorded under the value's own spelling; counts as numbers, words as words.
  EXPECT_EQ(c.effective["lr_scheduler_type"]["value"], "constant_with_warmup");
  EXPECT_EQ(c.effective["reduce_bucket_size"]["value"], "auto");
  EXPECT_EQ(c.effective["model_persistence_threshold"]["value"], 2'000'000);
  EXPECT_EQ(c.effective["grad_reduce_dtype"]["value"], "bf16");

  expect_user_error(parse({"--lr_scheduler_type", "cosin"}),
                    "--lr_scheduler_type must be cosine, linear, constant_with_warmup or constant, got 'cosin'");
  expect_user_error(parse({"--train_type", "qlora"}), "--train_type must be full or lora, got 'qlora'");
  expect_user_error(parse({"--loss_scale", "assistant"}), "--loss_scale must be default, last_round or all");
  expect_user_error(parse({"--reduce_bucket_size", "0"}), "--reduce_bucket_size must be a positive element count");
  expect_user_error(parse({"--allgather_bucket_size", "auto"}), "--allgather_bucket_size must be a positive");
  expect_user_error(parse({"--config", temp_file("e.cfg", "max_steps = 3\ngrad_reduce_dtype = fp16\n")}),
                    "e.cfg:2: grad_reduce_dtype must be fp32 or bf16, got 'fp16'");
}

TEST(EnumNames, FirstNameIsTheSpellingLaterOnesAreAliases) {
  EXPECT_EQ(enum_name(LrSchedulerType::constant), "constant_with_warmup");
  EXPECT_EQ(enum_from_name<LrSchedulerType>("constant"), LrSchedulerType::constant);
  EXPECT_EQ(enum_from_name<LrSchedulerType>("Cosine"), std::nullopt) << "names are exact";
  EXPECT_EQ(enum_choices<SaveStrategy>(), "steps or no");
  EXPECT_EQ(enum_choices<Recompute>(), "none, selective or full");
  // Every value of these enums has a name, and each name reads back as its value.
  for (Truncation t : {Truncation::remove, Truncation::left, Truncation::right})
    EXPECT_EQ(enum_from_name<Truncation>(enum_name(t)), t);
  for (HfLayout l : {HfLayout::glm, HfLayout::chatglm}) EXPECT_EQ(enum_from_name<HfLayout>(enum_name(l)), l);
}

TEST(Options, HelpListsEveryOptionWithDefault) {
  const std::string h = help_text();
  for (const char* name : {"--per_device_train_batch_size", "--gradient_accumulation_steps", "--learning_rate",
                           "--warmup_ratio", "--max_steps", "--device", "--output_dir", "--num_key_value_heads",
                           "--rope_ratio", "--dataset", "--logging_steps", "--max_grad_norm"})
    EXPECT_NE(h.find(name), std::string::npos) << name;
  EXPECT_NE(h.find("(=0.002)"), std::string::npos) << "defaults are shown";
}

}  // namespace
}  // namespace glm::test

namespace glm::test {
namespace {

TEST(Configs, ShippedConfigsParseWithTheSpecShapes) {
  const std::string dir = std::string(GLM_SOURCE_DIR) + "/configs/";
  auto tiny = parse({"--config", dir + "glm4-tiny.cfg"});
  ASSERT_TRUE(tiny.is_ok()) << tiny.status().message();
  auto builtin = parse({});
  ASSERT_TRUE(builtin.is_ok());
  // The embedded default and configs/glm4-tiny.cfg describe the same model and recipe.
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                          "num_key_value_heads", "head_dim", "rope_theta", "partial_rotary_factor", "max_length",
                          "per_device_train_batch_size", "learning_rate", "num_train_epochs", "warmup_ratio"})
    EXPECT_EQ(tiny.value().effective[key]["value"], builtin.value().effective[key]["value"]) << key;
  auto chat = parse({"--config", dir + "glm4-9b-chat.cfg"});
  ASSERT_TRUE(chat.is_ok()) << chat.status().message();
  EXPECT_EQ(chat.value().train.model.parameter_count(), 9399951360LL);
  EXPECT_EQ(chat.value().train.model.rope_theta, 5e6);
  EXPECT_EQ(chat.value().train.model.rotary_dim(), 64);
  auto long_ctx = parse({"--config", dir + "glm4-9b-chat-1m.cfg"});
  ASSERT_TRUE(long_ctx.is_ok()) << long_ctx.status().message();
  EXPECT_EQ(long_ctx.value().train.model.parameter_count(), 9483857920LL);
  EXPECT_EQ(long_ctx.value().train.model.rope_theta, 1e8);
}

}  // namespace
}  // namespace glm::test

namespace glm::test {
namespace {

// The same conversation in the three formats renders to the same tokens and labels.
TEST(DatasetFormats, AlpacaShareGptAndMessagesAgree) {
  const std::string messages = temp_file(
      "fmt_messages.jsonl", R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "q1"},)"
                            R"( {"role": "assistant", "content": "a1"}, {"role": "user", "content": "do X\nwith Y"},)"
                            R"( {"role": "assistant", "content": "done"}]})"
                            "\n");
  const std::string alpaca = temp_file(
      "fmt_alpaca.jsonl",
      R"({"system": "S", "history": [["q1", "a1"]], "instruction": "do X", "input": "with Y", "output": "done"})"
      "\n");
  const std::string sharegpt =
      temp_file("fmt_sharegpt.jsonl",
                R"({"system": "S", "conversations": [{"from": "human", "value": "q1"}, {"from": "gpt", "value": "a1"},)"
                R"( {"from": "human", "value": "do X\nwith Y"}, {"from": "gpt", "value": "done"}]})"
                "\n");
  ByteTokenizer tok;
  auto m = load_dataset({messages}, &tok, 0, 272);
  auto a = load_dataset({alpaca}, &tok, 0, 272);
  auto g = load_dataset({sharegpt}, &tok, 0, 272);
  ASSERT_TRUE(m.is_ok() && a.is_ok() && g.is_ok()) << a.status().message() << g.status().message();
  EXPECT_EQ(a.value().samples[0].tokens, m.value().samples[0].tokens);
  EXPECT_EQ(a.value().samples[0].labels, m.value().samples[0].labels);
  EXPECT_EQ(g.value().samples[0].tokens, m.value().samples[0].tokens);
  EXPECT_EQ(g.value().samples[0].labels, m.value().samples[0].labels);
  // The bundled examples of every format load.
  const std::string dir = std::string(GLM_SOURCE_DIR) + "/data/sample/";
  auto all = load_dataset({dir + "conversations.jsonl", dir + "alpaca.jsonl", dir + "sharegpt.jsonl"}, &tok, 0, 272);
  ASSERT_TRUE(all.is_ok()) << all.status().message();
  EXPECT_EQ(all.value().report.kept, 240);
}

TEST(DatasetFormats, BadRecordsNameLineAndReason) {
  ByteTokenizer tok;
  const std::string bad = temp_file("fmt_bad.jsonl", R"({"conversations": [{"from": "wizard", "value": "x"}]})"
                                                     "\n"
                                                     R"({"instruction": "no output here"})"
                                                     "\n"
                                                     R"({"prompt": "q", "completion": "a"})"
                                                     "\n"
                                                     R"({"instruction": "q", "output": "a", "history": [["only one"]]})"
                                                     "\n");
  auto r = load_dataset({bad}, &tok, 0, 272);
  ASSERT_FALSE(r.is_ok());
  const std::string& msg = r.status().message();
  EXPECT_NE(msg.find("fmt_bad.jsonl:1: conversations[0] has unknown \"from\": \"wizard\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("fmt_bad.jsonl:2: missing field \"output\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("fmt_bad.jsonl:3: unknown sample format"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fmt_bad.jsonl:4: history[0] must be a [query, answer] pair"), std::string::npos) << msg;
}

}  // namespace
}  // namespace glm::test

namespace glm::test {
namespace {

TEST(DatasetFormats, OnBadSampleSkipDropsAndCounts) {
  ByteTokenizer tok;
  const std::string mixed =
      temp_file("mixed.jsonl",
                R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "an answer"}]})"
                "\n"
                R"({"messages": [{"role": "user", "content": "q"})"
                "\n"
                R"({"messages": [{"role": "user", "content": "only a question"}]})"
                "\n"
                R"({"instruction": "q", "output": "a good answer"})"
                "\n");
  EXPECT_FALSE(load_dataset({mixed}, &tok, 0, 272).is_ok()) << "error is the default";
  auto r = load_dataset({mixed}, &tok, 0, 272, true);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r.value().report.kept, 2);
  EXPECT_EQ(r.value().report.skipped_bad, 2);
  EXPECT_NE(r.value().report.skipped_reasons.find("mixed.jsonl:3: no assistant message"), std::string::npos);
  const std::string all_bad = temp_file("all_bad.jsonl", "not json\n");
  auto none = load_dataset({all_bad}, &tok, 0, 272, true);
  ASSERT_FALSE(none.is_ok());
  EXPECT_NE(none.status().message().find("holds no usable samples (1 skipped"), std::string::npos)
      << none.status().message();
}

}  // namespace
}  // namespace glm::test

namespace glm::test {
namespace {

TEST(DatasetLength, TruncationStrategiesAndReport) {
  ByteTokenizer tok;
  // [gMASK] <sop> <|user|> \n q <|assistant|> \n a b c d e f <|user|>: 14 tokens, 8 trained.
  const std::string f = temp_file(
      "long.jsonl", R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "abcdef"}]})"
                    "\n");
  auto del = load_dataset({f}, &tok, 10, 272, false, Truncation::remove);
  ASSERT_FALSE(del.is_ok());  // the only sample deleted: nothing to train on
  auto left = load_dataset({f}, &tok, 10, 272, false, Truncation::left);
  ASSERT_TRUE(left.is_ok()) << left.status().message();
  const auto& s = left.value().samples[0];
  ASSERT_EQ(s.tokens.size(), 10u);
  EXPECT_EQ(s.tokens.back(), tok.special_id(SpecialToken::user));  // the end survives
  EXPECT_EQ(left.value().report.truncated, 1);
  auto right = load_dataset({f}, &tok, 10, 272, false, Truncation::right);
  ASSERT_TRUE(right.is_ok());
  EXPECT_EQ(right.value().samples[0].tokens.front(), tok.special_id(SpecialToken::gmask));  // the start survives
  // A long prompt cut on the right loses every trained token: dropped and counted; a short one stays.
  const std::string prompt =
      temp_file("prompt.jsonl",
                R"({"messages": [{"role": "user", "content": "0123456789"}, {"role": "assistant", "content": "a"}]})"
                "\n");
  auto cut = load_dataset({prompt, temp_file("short.jsonl", R"({"instruction": "q", "output": "a"})"
                                                            "\n")},
                          &tok, 12, 272, false, Truncation::right);
  ASSERT_TRUE(cut.is_ok()) << cut.status().message();
  EXPECT_EQ(cut.value().report.deleted_no_target, 1);
  EXPECT_EQ(cut.value().report.kept, 1);
  EXPECT_NE(left.value().report.length_summary().find("max 14"), std::string::npos)
      << left.value().report.length_summary();
}

}  // namespace
}  // namespace glm::test

namespace glm::test {
namespace {

// Trained tokens (labels >= 0 after position 0) of a two-round conversation under each option.
std::vector<int32_t> trained(const Conversation& c, LossScale scale) {
  ByteTokenizer tok;
  TokenizedSample s = ChatTemplate(tok).render(c, scale);
  std::vector<int32_t> out;
  for (size_t t = 1; t < s.labels.size(); ++t)
    if (s.labels[t] >= 0) out.push_back(s.tokens[t]);
  return out;
}

TEST(ChatTemplate, LossScaleAndPerMessageLoss) {
  ByteTokenizer tok;
  const int32_t usr = tok.special_id(SpecialToken::user);
  Conversation c;
  c.messages = {{Role::user, "Q"}, {Role::assistant, "A"}, {Role::user, "R"}, {Role::assistant, "B"}};
  EXPECT_EQ(trained(c, LossScale::assistant), (std::vector<int32_t>{'\n', 'A', usr, '\n', 'B', usr}));
  EXPECT_EQ(trained(c, LossScale::last_round), (std::vector<int32_t>{'\n', 'B', usr}));
  ByteTokenizer t2;
  EXPECT_EQ(trained(c, LossScale::all).size(), ChatTemplate(t2).render(c).tokens.size() - 1) << "every token";
  c.messages[1].loss = false;  // ms-swift's per-message override
  c.messages[2].loss = true;
  EXPECT_EQ(trained(c, LossScale::assistant),
            (std::vector<int32_t>{'\n', 'R', tok.special_id(SpecialToken::assistant), '\n', 'B', usr}));
}

TEST(DatasetFormats, DefaultSystemPromptOnlyWhereMissing) {
  ByteTokenizer tok;
  const std::string f = temp_file(
      "system.jsonl",
      R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})"
      "\n"
      R"({"messages": [{"role": "system", "content": "own"}, {"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "loss": false}, {"role": "user", "content": "q2"}, {"role": "assistant", "content": "b"}]})"
      "\n");
  ConversationOptions opt;
  opt.system = "SYS";
  auto d = load_dataset({f}, &tok, 0, 272, false, Truncation::remove, opt);
  ASSERT_TRUE(d.is_ok()) << d.status().message();
  const std::string first = tok.decode(d.value().samples[0].tokens), second = tok.decode(d.value().samples[1].tokens);
  EXPECT_EQ(first.find("<|system|>\nSYS<|user|>"), 12u) << first;
  EXPECT_EQ(second.find("SYS"), std::string::npos) << second;
  EXPECT_NE(second.find("<|system|>\nown"), std::string::npos) << second;
  const std::string bad = temp_file(
      "badloss.jsonl",
      R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "loss": "yes"}]})"
      "\n");
  auto r = load_dataset({bad}, &tok, 0, 272);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("badloss.jsonl:1: messages[1] has a non-boolean \"loss\""), std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace glm::test

namespace glm::test {
namespace {

TEST(PrepareExample, MarksTrainedRunsAndShowsLabelsOrIds) {
  Dataset d;
  // Positions 1-2 trained as themselves, position 4 trained with a label that differs from its input.
  d.samples.push_back({{'a', 'b', 'c', 'd', 'e'}, {-1, 'b', 'c', -1, 'X'}});
  d.files = {"f.jsonl"};
  d.sources = {{0, 7}};
  ByteTokenizer tok;
  auto text = format_example(d, 0, &tok);
  ASSERT_TRUE(text.is_ok()) << text.status().message();
  EXPECT_NE(text.value().find("sample 0 of 1 (f.jsonl:7): 5 tokens, 3 trained"), std::string::npos) << text.value();
  EXPECT_NE(text.value().find("1 trained position(s) carry a label other than their input token"), std::string::npos)
      << text.value();
  EXPECT_NE(text.value().find(":\na[[bc]]d[[X]]\n"), std::string::npos) << text.value();
  auto ids = format_example(d, 0, nullptr);
  ASSERT_TRUE(ids.is_ok());
  EXPECT_NE(ids.value().find(":\n97 [[98 99]] 100 [[88]]\n"), std::string::npos) << ids.value();
  auto beyond = format_example(d, 1, &tok);
  ASSERT_FALSE(beyond.is_ok());
  EXPECT_EQ(beyond.status().exit_code(), 2);
}

}  // namespace
}  // namespace glm::test

namespace glm::test {
namespace {

// Samples keep their file:line through loading and the validation split.
TEST(DatasetSources, LoadAndSplitKeepFileAndLine) {
  std::string lines;
  for (int i = 0; i < 10; ++i)
    lines += "{\"messages\": [{\"role\": \"user\", \"content\": \"q" + std::to_string(i) +
             "\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}\n" + (i == 4 ? "\n" : "");
  const std::string path = temp_file("sources.jsonl", lines);
  ByteTokenizer tok;
  auto d = load_dataset({path}, &tok, 0, 272);
  ASSERT_TRUE(d.is_ok()) << d.status().message();
  EXPECT_EQ(d.value().source_of(5), path + ":7") << "the blank line 6 counts";
  Dataset train = d.take(), held;
  ASSERT_TRUE(split_dataset(train, 0.3, 9, held).is_ok());
  ASSERT_EQ(train.sources.size(), train.samples.size());
  ASSERT_EQ(held.sources.size(), held.samples.size());
  for (const Dataset* part : {&train, &held})
    for (size_t i = 0; i < part->samples.size(); ++i) {
      // The user turn "q<k>" of line L is sample k, on line k + 1 (k + 2 after the blank line).
      const std::string text = tok.decode(part->samples[i].tokens);
      const int k = text[text.find("\nq") + 2] - '0';
      EXPECT_EQ(part->source_of(i), path + ":" + std::to_string(k + (k > 4 ? 2 : 1))) << text;
    }
}

TEST(Options, PackingAndPrepare) {
  auto o = parse({"prepare", "--packing", "true", "--print_example", "3"});
  ASSERT_TRUE(o.is_ok()) << o.status().message();
  EXPECT_EQ(o.value().command, "prepare");
  EXPECT_TRUE(o.value().train.packing);
  EXPECT_EQ(o.value().print_example, 3);
  EXPECT_EQ(o.value().effective["packing"]["value"], true);
  auto d = parse({});
  ASSERT_TRUE(d.is_ok());
  EXPECT_FALSE(d.value().train.packing) << "packing is off by default, as in ms-swift";
  expect_user_error(parse({"--packing", "sometimes"}), "packing");
  const std::string h = help_text();
  EXPECT_NE(h.find("--packing"), std::string::npos);
  EXPECT_NE(h.find("glm_hpc prepare"), std::string::npos);
  EXPECT_NE(h.find("[[ and ]]"), std::string::npos) << "the example markers are documented";
}

}  // namespace
}  // namespace glm::test
