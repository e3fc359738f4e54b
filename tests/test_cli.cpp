// The glm_hpc binary as a user runs it: mpirun -np 2 with bad input must print one clear message,
// exit 2 on every rank and never hang; a good short run writes args.json and logging.jsonl.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace glm::test {
namespace {

// Per test process (ctest runs each case as its own process, and other runs may share the machine).
std::filesystem::path scratch_root() {
  const auto root = std::filesystem::temp_directory_path() / ("glm_hpc_cli_tests_" + std::to_string(::getpid()));
  std::filesystem::create_directories(root);
  return root;
}

struct RunResult {
  int exit_code = -1;
  std::string output;
};

// The shell command running glm_hpc under mpirun with a hard time limit (a hang shows up as exit
// code 124). A train run without --output_dir gets this test's own: the default ('output' in the
// source tree) would be one directory for every test, which one run at a time may hold; and draws
// no charts unless the test asks.
std::string glm_command(const std::string& args, int ranks, const std::string& before) {
  const bool other_command = args.rfind("prepare", 0) == 0 || args.rfind("export", 0) == 0 ||
                             args.rfind("eval", 0) == 0 || args.rfind("plan", 0) == 0 ||
                             args.rfind("infer", 0) == 0;
  std::string output_dir = other_command || args.find("--output_dir") != std::string::npos
                               ? std::string()
                               : " --output_dir " + (scratch_root() / "default_output").string() +
                                     " --overwrite_output_dir true";
  // Charts at the end of training cost a gnuplot run each; ctest plot_charts covers them.
  if (!other_command && args.find("--plot_format") == std::string::npos) output_dir += " --plot_format none";
  // Open MPI refuses root unless told; CI and the dev machines run as root. The dataset cache goes
  // to a scratch directory, not the home directory (`before` may export another).
  return "export XDG_CACHE_HOME=" + (scratch_root() / "xdg_cache").string() + "; cd " + GLM_TEST_WORKDIR + " && " +
         before + "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout " +
         std::to_string(120 * GLM_TEST_TIMEOUT_SCALE) + " " + GLM_MPIEXEC +
         " --oversubscribe -np " + std::to_string(ranks) + " " + GLM_BINARY + " " + args + output_dir;
}

// The iterations of a shell polling loop (`for i in ...; do ...; sleep 0.1; done`) of 60 s, scaled as
// the tests' limits are.
std::string poll_60s() { return "$(seq " + std::to_string(600 * GLM_TEST_TIMEOUT_SCALE) + ")"; }

RunResult run_glm(const std::string& args, int ranks = 2, const std::string& before = "") {
  const std::string cmd = glm_command(args, ranks, before) + " 2>&1";
  RunResult r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), buf.size(), pipe) != nullptr) r.output += buf.data();
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string write_file(const std::string& name, const std::string& content) {
  const auto dir = scratch_root();
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path) << content;
  return path;
}

int count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t p = haystack.find(needle); p != std::string::npos; p = haystack.find(needle, p + 1)) ++n;
  return n;
}

void expect_bad_input(const std::string& args, const std::string& message) {
  RunResult r = run_glm(args);
  EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(message), std::string::npos) << "expected '" << message << "'\n" << r.output;
  EXPECT_EQ(count(r.output, "glm_hpc: error:"), 1) << "exactly one message\n" << r.output;
  EXPECT_EQ(count(r.output, "step "), 0) << "no training may start\n" << r.output;
}

const std::string kTiny = "--hidden_size 32 --intermediate_size 48 --head_dim 8 --max_length 512 ";

TEST(CliBadInput, MissingConfigFile) {
  expect_bad_input("--config /nonexistent/glm4.cfg", "cannot open config file '/nonexistent/glm4.cfg'");
}
TEST(CliBadInput, UnknownCommandLineOption) { expect_bad_input("--learning_rat 1e-4", "learning_rat"); }
TEST(CliBadInput, UnknownConfigKeyNamesFileAndLine) {
  const std::string cfg = write_file("unknown.cfg", "hidden_size = 64\n# note\nlearnin_rate = 1e-4\n");
  expect_bad_input("--config " + cfg, "unknown.cfg:3: unknown option 'learnin_rate'");
}
TEST(CliBadInput, HeadsNotDivisibleByKvGroups) {
  const std::string cfg = write_file("gqa.cfg", "num_attention_heads = 4\nnum_key_value_heads = 3\n");
  expect_bad_input("--config " + cfg, "must be divisible by num_key_value_heads");
}
TEST(CliBadInput, OddRotaryDimension) {
  expect_bad_input("--head_dim 10 --partial_rotary_factor 0.5", "must be an even integer");
}
TEST(CliBadInput, LoraOptions) {
  expect_bad_input("--train_type qlora", "--train_type must be full or lora, got 'qlora'");
  expect_bad_input("--train_type lora --save_strategy no --target_modules query_key_value,q_proj",
                   "--target_modules: unknown module 'q_proj'");
  expect_bad_input("--train_type lora --save_strategy no --lora_dropout 1", "--lora_dropout must be in [0, 1)");
  expect_bad_input("--train_type lora --save_strategy no --lora_dropout -0.1", "--lora_dropout must be in [0, 1)");
  expect_bad_input("--train_type lora --save_strategy no --lora_rank 0", "--lora_rank must be >= 1");
}
TEST(CliBadInput, HiddenSizeNotMatchingHeads) {
  expect_bad_input("--head_dim 0 --hidden_size 130", "divisible by num_attention_heads");
}
TEST(CliBadInput, BadValue) { expect_bad_input("--max_steps many", "max_steps"); }
TEST(CliBadInput, MissingDatasetFile) {
  expect_bad_input(kTiny + "--dataset /nonexistent/train.jsonl", "cannot open dataset file '/nonexistent/train.jsonl'");
}
TEST(CliBadInput, BrokenJsonNamesLine) {
  const std::string data = write_file(
      "broken.jsonl",
      "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}\n"
      "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"a\"}\n");
  expect_bad_input(kTiny + "--dataset " + data, "broken.jsonl:2: malformed JSON");
}
TEST(CliBadInput, EverySampleTooLong) { expect_bad_input("--max_length 16", "longer than --max_length 16"); }
// Without a GPU (CI) no CUDA device is visible; with one, two ranks need NCCL: exit 2 either way.
TEST(CliBadInput, CudaDeviceUnavailable) { expect_bad_input("--device cuda", "CUDA"); }

TEST(CliBadInput, EvalNeedsAModel) {
  expect_bad_input("eval", "--model_id_or_path (or --ckpt_dir DIR, or --adapters DIR) is required by 'glm_hpc eval'");
}
TEST(CliBadInput, ModelShapeConflictsWithCheckpoint) {
  expect_bad_input(std::string("--model_id_or_path ") + GLM_TEST_WORKDIR + "/tests/data/glm_a --num_hidden_layers 4",
                   "--num_hidden_layers conflicts with --model_id_or_path");
}
// A copy of the 3-layer fixture glm_b whose config.json says `layers` layers (its weights unchanged).
std::filesystem::path glm_b_with_layers(const std::string& name, const std::string& layers) {
  const auto dir = scratch_root() / name;
  std::filesystem::remove_all(dir);
  std::filesystem::copy(std::string(GLM_TEST_WORKDIR) + "/tests/data/glm_b", dir);
  std::ifstream in(dir / "config.json");
  std::string cfg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string three = "\"num_hidden_layers\": 3";
  const auto at = cfg.find(three);
  EXPECT_NE(at, std::string::npos) << "glm_b's config.json";
  if (at != std::string::npos) cfg = cfg.substr(0, at) + "\"num_hidden_layers\": " + layers + cfg.substr(at + three.size());
  std::ofstream(dir / "config.json", std::ios::trunc) << cfg;
  return dir;
}
TEST(CliBadInput, CheckpointMissingATensor) {
  const auto dir = glm_b_with_layers("three_layers", "4");
  expect_bad_input("eval --model_id_or_path " + dir.string(), "has no tensor 'model.layers.3.input_layernorm.weight'");
}

// The fixture's samples as a pre-tokenized jsonl file (input_ids and labels per line).
std::string golden_samples(const std::string& model) {
  std::ifstream in(std::string(GLM_TEST_WORKDIR) + "/tests/data/" + model + "/golden.json");
  auto golden = nlohmann::json::parse(in);
  std::string lines;
  for (size_t row = 0; row < golden["input_ids"].size(); ++row)
    lines += nlohmann::json({{"input_ids", golden["input_ids"][row]}, {"labels", golden["labels"][row]}}).dump() + "\n";
  return write_file(model + "_samples.jsonl", lines);
}

// A NaN in one weight of --model_id_or_path is found when the weights are read, naming the tensor,
// instead of an eval that exits 0 printing eval_loss: nan.
TEST(CliBadInput, NonFiniteWeightIsNamedWhenLoaded) {
  const auto dir = scratch_root() / "nan_weight";
  std::filesystem::remove_all(dir);
  std::filesystem::copy(std::string(GLM_TEST_WORKDIR) + "/tests/data/glm_a", dir);
  const std::string tensor = "model.layers.1.mlp.down_proj.weight";
  {
    std::fstream f(dir / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header_bytes = 0;
    f.read(reinterpret_cast<char*>(&header_bytes), 8);
    std::string header(header_bytes, '\0');
    f.read(header.data(), static_cast<std::streamsize>(header_bytes));
    const auto meta = nlohmann::json::parse(header);
    ASSERT_EQ(meta[tensor]["dtype"], "F32");
    const uint64_t at = 8 + header_bytes + meta[tensor]["data_offsets"][0].get<uint64_t>() + 4 * 17;
    const float nan = std::nanf("");
    f.seekp(static_cast<std::streamoff>(at));
    f.write(reinterpret_cast<const char*>(&nan), 4);
  }
  RunResult r = run_glm("eval --model_id_or_path " + dir.string() + " --dataset " + golden_samples("glm_a"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tensor '" + tensor + "' in '" + (dir / "model.safetensors").string() +
                          "' holds nan at element 17 of 98304"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("eval_loss"), std::string::npos) << r.output;
}

// Inputs that are not what their option expects are refused before anything opens them: a FIFO
// would block the reader forever, /dev/zero would never end (a hang shows up as exit code 124).
TEST(CliBadInput, SpecialFilesAsDataOrConfig) {
  const std::string fifo = (scratch_root() / "fifo").string();
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_bad_input("--dataset /dev/zero", "--dataset: '/dev/zero' is a character device, not a regular file or a "
                                          "directory");
  expect_bad_input("--dataset " + fifo, "--dataset: '" + fifo + "' is a FIFO (named pipe)");
  expect_bad_input("--val_dataset " + fifo, "--val_dataset: '" + fifo + "' is a FIFO (named pipe)");
  expect_bad_input("--config /dev/zero", "--config: '/dev/zero' is a character device, not a regular file");
  expect_bad_input("--config " + fifo, "--config: '" + fifo + "' is a FIFO (named pipe), not a regular file");
}
TEST(CliBadInput, SpecialFilesAsModelTokenizerOrProfile) {
  const std::string fifo = (scratch_root() / "fifo").string();
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_bad_input("--tokenizer /dev/zero", "--tokenizer: '/dev/zero' is a character device");
  expect_bad_input("--model_id_or_path " + fifo, "--model_id_or_path: '" + fifo + "' is a FIFO (named pipe), not a "
                                                 "directory");
  expect_bad_input("--reduce_bucket_size auto --comm_profile " + fifo, "--comm_profile: '" + fifo + "' is a FIFO");
  // A file inside the model directory: its config.json.
  const auto dir = scratch_root() / "fifo_config";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ASSERT_EQ(::mkfifo((dir / "config.json").c_str(), 0600), 0);
  expect_bad_input("eval --model_id_or_path " + dir.string(),
                   "--model_id_or_path: '" + (dir / "config.json").string() + "' is a FIFO (named pipe)");
}

// Sizes that no run could use are refused with their bound before anything is allocated (they
// ended in std::bad_alloc, or the kernel's OOM killer, before).
TEST(CliBadInput, HugeSizesAreBoundedBeforeAllocating) {
  expect_bad_input("--gradient_accumulation_steps 1000000000000",
                   "--gradient_accumulation_steps 1000000000000 x --per_device_train_batch_size 4 x --max_length 512");
  expect_bad_input("--num_hidden_layers 1000000000000",
                   "num_hidden_layers 1000000000000 exceeds 65536, the most glm_hpc builds");
  expect_bad_input("--hidden_size 10000000000 --head_dim 8", "parameters, more than the 2^44");
  const auto dir = glm_b_with_layers("deep_model", "1000000000000");
  expect_bad_input("eval --model_id_or_path " + dir.string(), "num_hidden_layers 1000000000000 exceeds 65536");
}

// glm_hpc eval on a pre-tokenized file reproduces the loss transformers computed for the fixture.
TEST(Cli, EvalMatchesTransformersLoss) {
  std::ifstream in(std::string(GLM_TEST_WORKDIR) + "/tests/data/glm_a/golden.json");
  auto golden = nlohmann::json::parse(in);
  std::string lines;
  for (size_t row = 0; row < golden["input_ids"].size(); ++row)
    lines += nlohmann::json({{"input_ids", golden["input_ids"][row]}, {"labels", golden["labels"][row]}}).dump() + "\n";
  const std::string data = write_file("golden_a.jsonl", lines);
  RunResult r = run_glm(std::string("eval --model_id_or_path ") + GLM_TEST_WORKDIR +
                        "/tests/data/chatglm_a --dataset " + data + " --per_device_eval_batch_size 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto at = r.output.find("eval_loss: ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const double loss = std::stod(r.output.substr(at + 11));
  EXPECT_NEAR(loss, golden["loss"].get<double>(), 1e-5 * golden["loss"].get<double>());
  const auto ppl = r.output.find("eval_ppl: ");
  ASSERT_NE(ppl, std::string::npos);
  EXPECT_NEAR(std::stod(r.output.substr(ppl + 10)), std::exp(loss), 1e-4 * std::exp(loss));
}

// A jsonl of `lines` conversations of about 1 KB of varied words each: a few seconds of
// tokenization per 10,000 lines on two cores.
std::string write_large_dataset(const std::string& name, int lines) {
  const std::string path = (scratch_root() / name).string();
  std::ofstream out(path, std::ios::trunc);
  const char* words[] = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
                         "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon"};
  uint64_t state = 12345;
  for (int i = 0; i < lines; ++i) {
    std::string text;
    while (text.size() < 1000) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      text += words[(state >> 33) % 20];
      text += (state >> 40) % 7 == 0 ? ", " : " ";
    }
    out << R"({"messages": [{"role": "user", "content": "question )" << i << R"("}, {"role": "assistant", "content": ")"
        << text << "\"}]}\n";
  }
  return path;
}

// A background shell command for run_glm's `before`: once `ranks` processes whose command line holds
// `marker` catch SIGTERM (bit 15 of SigCgt in /proc: glm_hpc has installed its handlers), wait
// `delay` seconds and send `signal` to each of them (the ranks, not mpirun).
std::string signal_ranks_when_ready(const std::string& marker, int ranks, const char* signal, double delay) {
  const std::string pattern = "'^[^ ]*glm_hpc .*" + marker + "'";
  return "(for i in " + poll_60s() + "; do n=0; for p in $(pgrep -f " + pattern +
         "); do m=$(awk '/^SigCgt/{print $2}' /proc/$p/status 2>/dev/null); m=${m#${m%????}}; "
         "[ -n \"$m\" ] && [ $((0x$m & 16384)) -ne 0 ] && n=$((n+1)); done; [ $n -ge " +
         std::to_string(ranks) + " ] && break; sleep 0.05; done; sleep " + std::to_string(delay) + "; pkill -" + signal +
         " -f " + pattern + ") & ";
}

// SIGTERM (Slurm, timeout) or SIGINT (Ctrl-C) to every rank while the dataset is being tokenized:
// the job stops within seconds (it used to tokenize on, and then train), says so once, exits 75 on
// every rank and leaves nothing in the tokenization cache.
void expect_prompt_stop(const char* signal, const char* name) {
  const std::string data = write_large_dataset("large.jsonl", 60000);
  const std::string marker = std::string("glm_hpc_stop_marker_") + signal + std::to_string(::getpid());
  const auto out = scratch_root() / marker;
  const auto cache = scratch_root() / "xdg_cache";
  std::filesystem::remove_all(cache);
  const auto start = std::chrono::steady_clock::now();
  RunResult r = run_glm("--dataset " + data + " --max_length 2048 --max_steps 1 --output_dir " + out.string(), 2,
                        signal_ranks_when_ready(marker, 2, signal, 1.0));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::filesystem::remove(data);
  EXPECT_EQ(r.exit_code, 75) << r.output;
  // While tokenizing, or in a slow (sanitizer) build while still hashing the file for the cache key.
  const std::string said = std::string("glm_hpc: stopped by ") + name + " while ";
  EXPECT_EQ(count(r.output, said + "tokenizing '" + data) + count(r.output, said + "hashing '" + data), 1) << r.output;
  EXPECT_NE(r.output.find("before training started; nothing was saved; exit code 75"), std::string::npos)
      << r.output;
  EXPECT_EQ(count(r.output, "step "), 0) << r.output;
  EXPECT_LT(seconds, 20.0 * GLM_TEST_TIMEOUT_SCALE) << r.output;
  EXPECT_FALSE(std::filesystem::exists(out / "args.json"));
  const auto entries = cache / "glm_hpc" / "datasets";
  if (std::filesystem::exists(entries))
    EXPECT_TRUE(std::filesystem::is_empty(entries)) << "no entry and no temporary in the cache";
}
TEST(CliStop, SigtermWhileTokenizingStopsAtOnce) { expect_prompt_stop("TERM", "SIGTERM"); }
TEST(CliStop, SigintWhileTokenizingStopsAtOnce) { expect_prompt_stop("INT", "SIGINT"); }

// A background shell command for run_glm's `before`: once the run in `dir` has logged a step (its
// logging.jsonl is not empty; 60 s at most), SIGKILL the newest process whose command line names
// `dir` (a rank: --output_dir is unique to the test).
std::string kill_after_first_step(const std::filesystem::path& dir) {
  const std::string log = (dir / "logging.jsonl").string();
  return "(for i in " + poll_60s() + "; do [ -s '" + log +
         "' ] && break; sleep 0.1; done; sleep 0.5; pkill -9 -f -n 'glm_hpc.*" + dir.filename().string() + "') & ";
}

// A rank killed with SIGKILL in the middle of training: the job ends (non-zero) within seconds,
// with a message naming the killed rank; nothing hangs (the 120 s timeout would report 124).
TEST(CliFaults, KilledRankEndsTheJob) {
  const auto out = scratch_root() / "killed";
  std::filesystem::remove_all(out);
  const std::string marker = "glm_hpc_kill_marker_" + std::to_string(::getpid());
  // A unique argument (--output_dir) lets pgrep find exactly this job's ranks.
  const std::string killer = kill_after_first_step(out / marker);
  const auto start = std::chrono::steady_clock::now();
  RunResult r =
      run_glm(kTiny + "--zero_stage 2 --max_steps 100000 --logging_steps 1 --collective_timeout 30 --output_dir " +
                  (out / marker).string(),
              3, killer);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "the job hung until the test's timeout\n" << r.output;
  EXPECT_LT(seconds, 60.0 * GLM_TEST_TIMEOUT_SCALE) << r.output;
  EXPECT_NE(r.output.find("step "), std::string::npos) << "training had started\n" << r.output;
  EXPECT_NE(r.output.find("signal 9"), std::string::npos) << "the launcher names the killed rank\n" << r.output;
}

// Preemption as slurm/train_*.sh use it: SIGUSR1 to mpirun/mpiexec (which forwards it to every rank) once
// training is under way. All ranks stop after the same step with a complete checkpoint and latest,
// say so once, and mpirun exits 75; --resume_from_checkpoint latest goes on from that step.
TEST(CliPreemption, UsrOneToMpirunSavesExits75AndResumes) {
  const auto out = scratch_root() / "preempted";
  std::filesystem::remove_all(out);
  const std::string marker = "glm_hpc_preempt_marker_" + std::to_string(::getpid());
  const auto dir = out / marker;
  const std::string signaller = "(for i in " + poll_60s() + "; do [ -s '" + (dir / "logging.jsonl").string() +
                                "' ] && break; sleep 0.1; done; pkill -USR1 -n -f '^[^ ]*mpi(run|exec) .*" + marker +
                                "') & ";
  const std::string args =
      kTiny + "--max_steps 100000 --save_steps 100000 --logging_steps 1 --output_dir " + dir.string();
  RunResult r = run_glm(args, 3, signaller);
  ASSERT_EQ(r.exit_code, 75) << r.output;
  const std::string prefix = "glm_hpc: preempted: SIGUSR1 received; every rank stopped after step ";
  EXPECT_EQ(count(r.output, prefix), 1) << "rank 0 says it once\n" << r.output;
  const size_t at = r.output.find(prefix);
  ASSERT_NE(at, std::string::npos) << r.output;
  const int step = std::stoi(r.output.substr(at + prefix.size()));
  ASSERT_GE(step, 1);
  const std::string checkpoint = "checkpoint-" + std::to_string(step);
  EXPECT_NE(r.output.find("saved " + (dir / checkpoint).string()), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir / checkpoint / "COMPLETE")) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    char name[32];
    std::snprintf(name, sizeof(name), "rank_%05d.h5", rank);
    EXPECT_TRUE(std::filesystem::exists(dir / checkpoint / name)) << name;
  }
  std::ifstream latest(dir / "latest");
  std::string named;
  latest >> named;
  EXPECT_EQ(named, checkpoint);

  RunResult resumed = run_glm(kTiny + "--max_steps " + std::to_string(step + 2) +
                                  " --logging_steps 1 --resume_from_checkpoint latest --output_dir " + dir.string(),
                              3);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(
      resumed.output.find("glm_hpc: resumed from " + (dir / checkpoint).string() + " at step " + std::to_string(step)),
      std::string::npos)
      << resumed.output;
  EXPECT_EQ(count(resumed.output, "\nstep "), 2) << "only the two steps after the checkpoint\n" << resumed.output;
}

// SIGTERM as Slurm sends it at a time limit or scancel: to every rank of the job at once (not through
// mpirun, which does not forward it). The ranks stop after the same step with a complete checkpoint,
// exit 75, and run_status.json says preempted by SIGTERM.
TEST(CliPreemption, SigtermToEveryRankSavesAndExits75) {
  const auto out = scratch_root() / "terminated";
  std::filesystem::remove_all(out);
  const std::string marker = "glm_hpc_term_marker_" + std::to_string(::getpid());
  const auto dir = out / marker;
  const std::string signaller = "(for i in " + poll_60s() + "; do [ -s '" + (dir / "logging.jsonl").string() +
                                "' ] && break; sleep 0.1; done; pkill -TERM -f '^[^ ]*glm_hpc .*" + marker + "') & ";
  // --save_only_model: the preemption's checkpoint is whole all the same, for the resume.
  RunResult r = run_glm(kTiny + "--max_steps 100000 --save_steps 100000 --save_only_model true --logging_steps 1 "
                                "--output_dir " +
                            dir.string(),
                        2, signaller);
  ASSERT_EQ(r.exit_code, 75) << r.output;
  const std::string prefix = "glm_hpc: preempted: SIGTERM received; every rank stopped after step ";
  EXPECT_EQ(count(r.output, prefix), 1) << r.output;
  const size_t at = r.output.find(prefix);
  ASSERT_NE(at, std::string::npos) << r.output;
  const int step = std::stoi(r.output.substr(at + prefix.size()));
  EXPECT_TRUE(std::filesystem::exists(dir / ("checkpoint-" + std::to_string(step)) / "COMPLETE")) << r.output;
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(dir / ("checkpoint-" + std::to_string(step)) / "meta.json"))["model_only"],
            false);
  const auto status = nlohmann::json::parse(std::ifstream(dir / "run_status.json"));
  EXPECT_EQ(status["status"], "preempted") << status;
  EXPECT_EQ(status["exit_code"], 75) << status;
  EXPECT_EQ(status["signal"], "SIGTERM") << status;
  EXPECT_EQ(status["steps"], step) << status;
}

// The same on two GPUs: the surviving rank is inside an NCCL collective when its peer dies; the
// launcher or the collective watchdog (--collective_timeout) ends it. Skipped without 2 GPUs.
TEST(CliFaults, KilledRankEndsTheJobOnGpus) {
  FILE* smi = popen("nvidia-smi -L 2>/dev/null | grep -c '^GPU '", "r");
  int gpus = 0;
  if (smi != nullptr) {
    if (fscanf(smi, "%d", &gpus) != 1) gpus = 0;
    pclose(smi);
  }
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs, found " << gpus;
  const auto out = scratch_root() / "killed_gpu";
  std::filesystem::remove_all(out);
  const std::string marker = "glm_hpc_kill_marker_gpu_" + std::to_string(::getpid());
  const std::string killer = kill_after_first_step(out / marker);
  const auto start = std::chrono::steady_clock::now();
  RunResult r = run_glm(kTiny +
                            "--device cuda --zero_stage 3 --max_steps 100000 --logging_steps 1 "
                            "--collective_timeout 20 --output_dir " +
                            (out / marker).string(),
                        2, killer);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "the job hung until the test's timeout\n" << r.output;
  EXPECT_LT(seconds, 60.0 * GLM_TEST_TIMEOUT_SCALE) << r.output;
  EXPECT_NE(r.output.find("step "), std::string::npos) << "training had started\n" << r.output;
}

// --context_parallel_size (Megatron's name) and ms-swift's --sequence_parallel_size for it: at least 1,
// dividing the world size, and the two names never disagreeing.
TEST(CliBadInput, ContextParallelSize) {
  expect_bad_input("--context_parallel_size 0", "--context_parallel_size must be >= 1");
  expect_bad_input("--sequence_parallel_size -2", "--sequence_parallel_size must be >= 1");
  expect_bad_input("--context_parallel_size 2 --sequence_parallel_size 4",
                   "--sequence_parallel_size contradicts --context_parallel_size 2");
  expect_bad_input("--context_parallel_size 3", "--context_parallel_size 3 must divide the world size 2");
  expect_bad_input("--sequence_parallel_size 4", "--context_parallel_size 4 must divide the world size 2");
}

// Fine-tuning a pretrained model without --learning_rate takes ms-swift's default for the training
// type (LoRA 1e-4, full 1e-5); the built-in tiny model from scratch keeps 2e-3; a given one wins.
TEST(CliDefaults, LearningRateFollowsTheTrainingType) {
  const std::string model = std::string(GLM_TEST_WORKDIR) + "/tests/data/glm_a";
  struct Case {
    std::string args;
    double lr;
  };
  for (const Case& c : {Case{"--model_id_or_path " + model + " --train_type lora", 1e-4},
                        Case{"--model " + model, 1e-5}, Case{kTiny, 2e-3},
                        Case{"--model_id_or_path " + model + " --learning_rate 3e-5", 3e-5}}) {
    const auto out = scratch_root() / "lr_default";
    std::filesystem::remove_all(out);
    RunResult r = run_glm(c.args + " --max_steps 1 --output_dir " + out.string(), 1);
    ASSERT_EQ(r.exit_code, 0) << c.args << "\n" << r.output;
    std::ifstream args(out / "args.json");
    EXPECT_DOUBLE_EQ(nlohmann::json::parse(args)["options"]["learning_rate"]["value"].get<double>(), c.lr) << c.args;
  }
}

// --deepspeed: the DeepSpeed guide's ZeRO-2 offload config is refused for its fp16 with an account
// of every key (the refused one marked); without fp16 it trains with the optimizer on the host; a
// config glm_hpc can honour sets the options below the command line, which must agree with it;
// args.json says which options came from it.
TEST(CliDeepSpeed, ConfigsAreAccountedAppliedOrRefused) {
  const std::string ds = std::string(GLM_TEST_WORKDIR) + "/tests/data/deepspeed/";
  RunResult guide = run_glm("--deepspeed " + ds + "guide_zero2_offload.json");
  EXPECT_EQ(guide.exit_code, 2) << guide.output;
  EXPECT_EQ(count(guide.output, "glm_hpc: error:"), 1) << guide.output;
  EXPECT_EQ(count(guide.output, ": REFUSED: "), 1) << "fp16.enabled\n" << guide.output;
  EXPECT_NE(guide.output.find("zero_optimization.overlap_comm true: --overlap_comm true"), std::string::npos)
      << guide.output;
  EXPECT_NE(guide.output.find("zero_optimization.offload_optimizer.device \"cpu\": --offload_optimizer cpu"),
            std::string::npos)
      << guide.output;
  {
    std::ifstream in(ds + "guide_zero2_offload.json");
    nlohmann::json bf16 = nlohmann::json::parse(in);
    bf16.erase("fp16");
    const auto file = scratch_root() / "guide_zero2_offload_bf16.json";
    std::ofstream(file) << bf16.dump(2);
    const auto out = scratch_root() / "deepspeed_offload";
    std::filesystem::remove_all(out);
    RunResult offload = run_glm(kTiny + "--deepspeed " + file.string() + " --max_steps 2 --output_dir " + out.string());
    ASSERT_EQ(offload.exit_code, 0) << offload.output;
    EXPECT_NE(offload.output.find("in host memory ("), std::string::npos) << offload.output;
    EXPECT_NE(offload.output.find("ZeRO-2"), std::string::npos) << offload.output;
  }
  expect_bad_input("--deepspeed zero3 --zero_stage 1",
                   "--deepspeed zero3: zero_optimization.stage 3 sets --zero_stage 3, which contradicts --zero_stage 1");
  expect_bad_input("--deepspeed /nonexistent/ds.json", "/nonexistent/ds.json");
  expect_bad_input("--warmup_ratio 0.1 --deepspeed " + ds + "zero3_bf16.json",
                   "scheduler.params.warmup_num_steps 3 sets --warmup_steps 3, which contradicts --warmup_ratio");
  const auto out = scratch_root() / "deepspeed_zero3";
  std::filesystem::remove_all(out);
  RunResult r = run_glm(kTiny + "--deepspeed " + ds +
                        "zero3_bf16.json --max_grad_norm 0.5 --overlap_comm yes --max_steps 2 --output_dir " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "glm_hpc: --deepspeed "), 1) << "rank 0 gives the account once\n" << r.output;
  EXPECT_NE(r.output.find("ZeRO-3"), std::string::npos) << r.output;
  std::ifstream args(out / "args.json");
  const auto j = nlohmann::json::parse(args);
  EXPECT_EQ(j["options"]["zero_stage"]["value"], 3);
  EXPECT_EQ(j["options"]["zero_stage"]["source"], "deepspeed");
  EXPECT_EQ(j["options"]["adam_beta2"]["value"], 0.95);
  EXPECT_EQ(j["options"]["max_grad_norm"]["source"], "command_line") << "given on both, and they agree";
}

// Options that would do nothing in their combination are errors saying what to add, and the names
// users of transformers and ms-swift type first are accepted with their meaning or refused by name.
TEST(CliBadInput, IgnoredCombinationsAndFamiliarNames) {
  const std::string data = std::string(GLM_TEST_WORKDIR) + "/data/sample/conversations.jsonl";
  expect_bad_input("--lora_rank 4", "--lora_rank applies to LoRA training: add --train_type lora");
  expect_bad_input("--target_modules all-linear", "--target_modules applies to LoRA training");
  expect_bad_input("--eval_steps 5", "--eval_steps needs validation data: add --val_dataset FILE or "
                                     "--split_dataset_ratio R");
  expect_bad_input("--val_dataset " + data + " --eval_steps 0",
                   "--eval_steps 0: --val_dataset would never be evaluated");
  expect_bad_input("--split_dataset_ratio 0.1 --eval_strategy no",
                   "--eval_strategy no: --split_dataset_ratio would never be evaluated");
  expect_bad_input("--eval_strategy steps", "--eval_strategy steps needs validation data");
  expect_bad_input("--offload_optimizer cpu", "--offload_optimizer cpu needs --zero_stage 1, 2 or 3");
  expect_bad_input("--offload_threads 4", "--offload_threads applies to an offloaded optimizer: add --offload_optimizer cpu");
  expect_bad_input("--offload_optimizer cpu --zero_stage 2 --train_type lora",
                   "--offload_optimizer cpu with --train_type lora");
  expect_bad_input("--offload_optimizer gpu", "--offload_optimizer");
  expect_bad_input("--eval_strategy sometimes", "--eval_strategy");
  expect_bad_input("eval --model_id_or_path " + std::string(GLM_TEST_WORKDIR) + "/tests/data/glm_a --output_dir x",
                   "'glm_hpc eval' writes no files");
  expect_bad_input("--fp16 true", "--fp16: glm_hpc has no fp16 path");
  expect_bad_input("--report_to none,wandb", "--report_to wandb: glm_hpc reports to TensorBoard event files");
  expect_bad_input("--torch_dtype float16", "--torch_dtype: glm_hpc has no fp16 path");
  expect_bad_input("--torch_dtype float32", "--torch_dtype float32: GPUs compute in bf16");
  expect_bad_input("--bf16 false", "--bf16 false: the CUDA backend computes in bf16");
  expect_bad_input("--model a --model_id_or_path b", "--model 'a' contradicts --model_id_or_path 'b'");
}

// The familiar names that mean what glm_hpc does run: --bf16 true, --torch_dtype bfloat16, --model,
// and validation data without --eval_steps evaluates every --save_steps (ms-swift's default).
TEST(Cli, FamiliarNamesRun) {
  RunResult r = run_glm("--max_steps 4 --save_steps 2 --split_dataset_ratio 0.05 --bf16 true --torch_dtype bfloat16 "
                        "--eval_strategy steps --logging_steps 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "eval at step 2/4"), 1) << r.output;
  EXPECT_EQ(count(r.output, "eval at step 4/4"), 1) << r.output;
  RunResult m =
      run_glm("eval --model " + std::string(GLM_TEST_WORKDIR) + "/tests/data/glm_a --dataset " + golden_samples("glm_a"));
  ASSERT_EQ(m.exit_code, 0) << m.output;
  EXPECT_NE(m.output.find("eval_loss"), std::string::npos) << "--model is --model_id_or_path\n" << m.output;
}

// DeepSpeed's spellings (1e5, 100000), never negative or fractional; inf for no model budget.
TEST(CliBadInput, PersistenceThresholds) {
  expect_bad_input("--param_persistence_threshold=-1", "--param_persistence_threshold must be an element count >= 0");
  expect_bad_input("--param_persistence_threshold 1.5", "--param_persistence_threshold must be");
  expect_bad_input("--param_persistence_threshold lots", "--param_persistence_threshold must be");
  expect_bad_input("--model_persistence_threshold=-5", "--model_persistence_threshold must be");
}

// ZeRO-3 keeps the small tensors whole (the start-up report says which), args.json records the
// option; the planner counts DeepSpeed's default (GLM-4-9B: 40 x (2 norms + QKV bias) + final norm)
// and nothing at 0 or below stage 3.
TEST(Cli, Zero3PersistenceIsReportedRecordedAndPlanned) {
  const auto out = scratch_root() / "persist";
  std::filesystem::remove_all(out);
  RunResult r = run_glm(kTiny +
                        "--zero_stage 3 --param_persistence_threshold 1e3 --max_steps 2 --logging_steps 1 "
                        "--save_strategy no --output_dir " +
                        out.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "ZeRO-3 keeps 7 tensors of at most 1000 elements"), 1) << r.output;
  EXPECT_EQ(count(r.output, "step "), 2) << r.output;
  std::ifstream args(out / "args.json");
  ASSERT_TRUE(args.good());
  auto j = nlohmann::json::parse(args);
  EXPECT_EQ(j["options"]["param_persistence_threshold"]["value"], 1000);
  EXPECT_EQ(j["options"]["model_persistence_threshold"]["value"], "inf");
  const std::string plan = "plan --config configs/glm4-9b-chat.cfg --world_size 2 --max_length 4096 ";
  const std::string line = "ZeRO-3 persistent tensors (--param_persistence_threshold 100000): 121 tensors, 516096";
  for (const char* more : {"--zero_stage 3", "--zero_stage 3 --param_persistence_threshold 100000"}) {
    RunResult p = run_glm(plan + more, 1);
    EXPECT_EQ(p.exit_code, 0) << p.output;
    EXPECT_EQ(count(p.output, line), 1) << more << "\n" << p.output;
  }
  for (const char* more : {"--zero_stage 3 --param_persistence_threshold 0", "--zero_stage 2"}) {
    RunResult p = run_glm(plan + more, 1);
    EXPECT_EQ(p.exit_code, 0) << p.output;
    EXPECT_EQ(count(p.output, "persistent"), 0) << more << "\n" << p.output;
  }
}

// `plan --train_type lora` plans the frozen base and the adapters (less than full training of the
// same shapes), and the start-up report counts the adapters: all of a LoRA run's gradients and
// optimizer state are theirs.
TEST(Cli, LoraIsPlannedAndReportedAtStart) {
  auto total_gib = [](const std::string& out) {
    const std::string key = "total (predicted peak)";
    const size_t at = out.find(key);
    return at == std::string::npos ? -1.0 : std::stod(out.substr(at + key.size()));
  };
  const std::string plan = "plan --config configs/glm4-9b-chat.cfg --max_length 8192 ";
  RunResult full = run_glm(plan, 1);
  RunResult lora = run_glm(plan + "--train_type lora --lora_rank 16 --target_modules query_key_value,dense", 1);
  ASSERT_EQ(full.exit_code, 0) << full.output;
  ASSERT_EQ(lora.exit_code, 0) << lora.output;
  EXPECT_EQ(count(lora.output, "LoRA rank 16 (alpha 32, dropout 0.05) on query_key_value,dense: "), 1) << lora.output;
  EXPECT_EQ(count(lora.output, "base parameters (bf16, frozen)"), 1) << lora.output;
  EXPECT_EQ(count(full.output, "LoRA"), 0) << full.output;
  EXPECT_GT(total_gib(lora.output), 0) << lora.output;
  EXPECT_LT(total_gib(lora.output), total_gib(full.output) - 100) << "no 14 bytes per base parameter\n" << lora.output;

  // Rank 256: adapters of 0.7 MiB, visible at the report's 0.1 MiB resolution.
  RunResult r = run_glm(kTiny + "--train_type lora --lora_rank 256 --max_steps 1 --save_strategy no", 2);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "glm_hpc: memory per rank"), 1) << "rank 0 says it once for both\n" << r.output;
  for (const char* kind : {"gradients", "optimizer"}) {
    {
      const std::string line = "glm_hpc: memory per rank (ZeRO-0), ranks 0-1 of 2: ";
      const size_t begin = r.output.find(line);
      ASSERT_NE(begin, std::string::npos) << r.output;
      const std::string report = r.output.substr(begin, r.output.find('\n', begin) - begin);
      const size_t at = report.find(std::string(kind) + " ");
      ASSERT_NE(at, std::string::npos) << report;
      const std::string value = report.substr(at + std::string(kind).size() + 1);
      const std::string mib = value.substr(0, value.find(' '));
      EXPECT_EQ(value.find(mib + " MiB (of which LoRA " + mib + " MiB)"), 0u) << kind << ": " << report;
      EXPECT_NE(mib, "0.0") << report;
    }
  }
}

// `plan` with an offloaded optimizer: no optimizer rows on the GPU, the host memory per rank and per
// node instead; and the cheapest settings that fit a card: the DeepSpeed guide's full fine-tune on
// 4 x 24 GB GPUs needs ZeRO-3, full recomputation and the offload; the A100 LoRA recipe (2 x 40 GB,
// seq 8192) needs only recomputation.
TEST(Cli, OffloadIsPlannedAndTheCheapestFittingSettingsNamed) {
  const std::string plan = "plan --config configs/glm4-9b-chat.cfg --max_length 4096 ";
  RunResult guide = run_glm(plan + "--world_size 4 --gpu_memory_gib 24", 1);
  ASSERT_EQ(guide.exit_code, 0) << guide.output;
  EXPECT_EQ(count(guide.output, "fits in 24.0 GiB: no"), 1) << guide.output;
  EXPECT_EQ(count(guide.output, "cheapest settings that fit in 24.0 GiB: --zero_stage 3 --recompute full "
                                "--offload_optimizer cpu ("),
            1)
      << guide.output;
  RunResult offload = run_glm(plan + "--world_size 4 --gpu_memory_gib 24 --gpus_per_node 4 --zero_stage 3 "
                                     "--recompute full --offload_optimizer cpu",
                              1);
  ASSERT_EQ(offload.exit_code, 0) << offload.output;
  EXPECT_EQ(count(offload.output, "  optimizer: fp32"), 0) << "nothing of it on the GPU\n" << offload.output;
  EXPECT_EQ(count(offload.output, "offloaded optimizer: fp32 master + Adam moments"), 1) << offload.output;
  EXPECT_EQ(count(offload.output, "per node of 4 GPUs"), 1) << offload.output;
  EXPECT_EQ(count(offload.output, "fits in 24.0 GiB: yes"), 1) << offload.output;
  EXPECT_EQ(count(offload.output, "): these options"), 1) << offload.output;
  RunResult lora = run_glm("plan --config configs/glm4-9b-chat.cfg --max_length 8192 --world_size 2 "
                           "--gpu_memory_gib 40 --train_type lora",
                           1);
  ASSERT_EQ(lora.exit_code, 0) << lora.output;
  EXPECT_EQ(count(lora.output, "cheapest settings that fit in 40.0 GiB: --zero_stage 0 --recompute full ("), 1)
      << lora.output;
  RunResult tiny_card = run_glm(plan + "--world_size 1 --gpu_memory_gib 8", 1);
  ASSERT_EQ(tiny_card.exit_code, 0) << tiny_card.output;
  EXPECT_EQ(count(tiny_card.output, "nothing fits in 8.0 GiB per GPU at world size 1"), 1) << tiny_card.output;
  // 20 layers on one 24 GB card fit with the layers' inputs in host memory beside the optimizer
  // (activations cross PCIe once each way, less than the parameters would every step); a 20 GB card
  // needs a share of the parameter shards on the host too.
  RunResult one_card = run_glm(plan + "--num_hidden_layers 20 --world_size 1 --gpu_memory_gib 24", 1);
  ASSERT_EQ(one_card.exit_code, 0) << one_card.output;
  EXPECT_EQ(count(one_card.output, "cheapest settings that fit in 24.0 GiB: --zero_stage 2 --recompute full "
                                   "--offload_activations true --offload_optimizer cpu ("),
            1)
      << one_card.output;
  RunResult smaller_card = run_glm(plan + "--num_hidden_layers 20 --world_size 1 --gpu_memory_gib 20", 1);
  ASSERT_EQ(smaller_card.exit_code, 0) << smaller_card.output;
  EXPECT_EQ(count(smaller_card.output, "cheapest settings that fit in 20.0 GiB: --zero_stage 3 --recompute full "
                                       "--offload_optimizer cpu --offload_param cpu --offload_param_ratio 0."),
            1)
      << "the smallest share of the shards on the host that fits\n"
      << smaller_card.output;
  // The layers' inputs offloaded: the GPU keeps 3 of them, the host the rest.
  RunResult inputs = run_glm(plan + "--world_size 1 --train_type lora --recompute full --offload_activations true", 1);
  ASSERT_EQ(inputs.exit_code, 0) << inputs.output;
  EXPECT_EQ(count(inputs.output, "offloaded activations: the layers' inputs (bf16)"), 1) << inputs.output;
  EXPECT_EQ(count(inputs.output, "recompute full, the layers' inputs offloaded"), 1) << inputs.output;
  RunResult params = run_glm(plan + "--num_hidden_layers 20 --world_size 1 --gpu_memory_gib 24 --zero_stage 3 "
                                    "--recompute full --offload_optimizer cpu --offload_param cpu",
                             1);
  ASSERT_EQ(params.exit_code, 0) << params.output;
  EXPECT_EQ(count(params.output, "parameters (bf16): persistent tensors"), 1) << params.output;
  EXPECT_EQ(count(params.output, "offloaded parameters: bf16 shards"), 1) << params.output;
  EXPECT_EQ(count(params.output, "fits in 24.0 GiB: yes"), 1) << params.output;
  // One micro-batch a step: the gradient shards go to host memory too, unless --offload_gradients false.
  for (const bool on : {true, false}) {
    RunResult ga1 = run_glm(plan + "--num_hidden_layers 20 --world_size 1 --gpu_memory_gib 24 --zero_stage 3 "
                                   "--recompute full --offload_optimizer cpu --offload_param cpu "
                                   "--gradient_accumulation_steps 1" +
                                   std::string(on ? "" : " --offload_gradients false"),
                            1);
    ASSERT_EQ(ga1.exit_code, 0) << ga1.output;
    EXPECT_EQ(count(ga1.output, "offloaded gradients: bf16 shards"), on ? 1 : 0) << ga1.output;
    EXPECT_EQ(count(ga1.output, "  gradients (bf16)"), on ? 0 : 1) << ga1.output;
  }
  // Half of the shards resident: GPU and host rows share them, and what the GPU holds is named.
  RunResult half = run_glm(plan + "--num_hidden_layers 20 --world_size 1 --gpu_memory_gib 24 --zero_stage 3 "
                                  "--recompute full --offload_optimizer cpu --offload_param cpu --offload_param_ratio 0.5",
                           1);
  ASSERT_EQ(half.exit_code, 0) << half.output;
  EXPECT_EQ(count(half.output, "parameters (bf16): persistent tensors and resident shards"), 1) << half.output;
  EXPECT_EQ(count(half.output, "offloaded parameters: bf16 shards"), 1) << half.output;
  for (const char* bad : {"--offload_param_ratio 0", "--offload_param_ratio 1.5", "--offload_param_ratio nan"}) {
    RunResult r = run_glm(plan + "--world_size 2 --zero_stage 3 --offload_optimizer cpu --offload_param cpu " + bad, 1);
    EXPECT_EQ(r.exit_code, 2) << bad << "\n" << r.output;
    EXPECT_EQ(count(r.output, "must be in (0, 1]") + count(r.output, "must be a finite number"), 1) << bad << "\n"
                                                                                                  << r.output;
  }
  RunResult no_params = run_glm(plan + "--world_size 2 --zero_stage 3 --offload_optimizer cpu --offload_param_ratio 0.5", 1);
  EXPECT_EQ(no_params.exit_code, 2) << no_params.output;
  EXPECT_EQ(count(no_params.output, "applies to offloaded parameters: add --offload_param cpu"), 1) << no_params.output;
  // The delayed update's host buffers are planned; it needs the optimizer offloaded.
  RunResult delayed = run_glm(plan + "--world_size 2 --zero_stage 2 --offload_optimizer cpu --offload_delayed_update true", 1);
  ASSERT_EQ(delayed.exit_code, 0) << delayed.output;
  EXPECT_EQ(count(delayed.output, "delayed update: the step's gradient + working copy (bf16)"), 1) << delayed.output;
  RunResult undelayable = run_glm(plan + "--world_size 2 --zero_stage 2 --offload_delayed_update true", 1);
  EXPECT_EQ(undelayable.exit_code, 2) << undelayable.output;
  EXPECT_EQ(count(undelayable.output, "applies to an offloaded optimizer"), 1) << undelayable.output;
  // Refused where DeepSpeed refuses it, and without the optimizer offloaded.
  for (const char* bad : {"--zero_stage 2 --offload_optimizer cpu --offload_param cpu",
                          "--zero_stage 3 --offload_param cpu"}) {
    RunResult r = run_glm(plan + "--world_size 2 " + bad, 1);
    EXPECT_EQ(r.exit_code, 2) << bad << "\n" << r.output;
    EXPECT_EQ(count(r.output, "--offload_param cpu needs"), 1) << bad << "\n" << r.output;
  }
}

TEST(Cli, HelpListsOptionsOnce) {
  RunResult r = run_glm("--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(count(r.output, "--gradient_accumulation_steps"), 1) << "printed by rank 0 only\n" << r.output;
}

TEST(Cli, ShortRunWritesArgsAndLog) {
  const auto out = scratch_root() / "run";
  std::filesystem::remove_all(out);
  RunResult r = run_glm(
      kTiny + "--max_steps 3 --logging_steps 1 --per_device_train_batch_size 2 --output_dir " + out.string(), 3);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "step "), 3) << r.output;
  std::ifstream args(out / "args.json");
  ASSERT_TRUE(args.good());
  auto j = nlohmann::json::parse(args);
  EXPECT_EQ(j["options"]["max_steps"]["value"], 3);
  EXPECT_EQ(j["options"]["max_steps"]["source"], "command_line");
  EXPECT_EQ(j["options"]["learning_rate"]["source"], "default");
  std::ifstream log(out / "logging.jsonl");
  std::string line;
  int lines = 0;
  int saves = 0;
  while (std::getline(log, line)) {
    auto rec = nlohmann::json::parse(line);
    if (rec.contains("checkpoint")) {  // the save at the end: its size and duration
      ++saves;
      EXPECT_EQ(rec["step"], 3);
      EXPECT_GT(rec["save_bytes"].get<int64_t>(), 0);
      EXPECT_GT(rec["save_seconds"].get<double>(), 0.0);
      continue;
    }
    EXPECT_EQ(rec["step"], ++lines);
    for (const char* key :
         {"loss", "learning_rate", "grad_norm", "tokens_per_second", "elapsed_seconds", "eta_seconds"})
      EXPECT_TRUE(rec.contains(key)) << key;
  }
  EXPECT_EQ(lines, 3);
  EXPECT_EQ(saves, 1);
}

// A glm_hpc run started in the background: its output goes to `log`, its exit code to `log`.rc when
// it ends. A run still going when the test ends (a failed expectation) is killed then, found by an
// argument only it has, so that no run outlives its test.
class BackgroundRun {
 public:
  BackgroundRun(const std::string& args, int ranks, std::filesystem::path log, std::string unique)
      : log_(std::move(log)), unique_(std::move(unique)) {
    const std::string cmd =
        "(" + glm_command(args, ranks, "") + " > " + log_.string() + " 2>&1; echo $? > " + log_.string() + ".rc) &";
    started_ = std::system(cmd.c_str()) == 0;
  }
  BackgroundRun(const BackgroundRun&) = delete;
  BackgroundRun& operator=(const BackgroundRun&) = delete;
  ~BackgroundRun() {
    if (started_ && !std::filesystem::exists(log_.string() + ".rc"))
      (void)std::system(("pkill -KILL -f -- '" + unique_ + "'").c_str());
  }
  bool started() const { return started_; }

 private:
  std::filesystem::path log_;
  std::string unique_;
  bool started_ = false;
};

// Polls (every 0.1 s, at most `seconds`, scaled as the tests' limits are) until `ready` holds.
template <typename Ready>
bool eventually(Ready ready, double seconds = 90) {
  seconds *= GLM_TEST_TIMEOUT_SCALE;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!ready()) {
    if (std::chrono::steady_clock::now() > end) return false;
    ::usleep(100 * 1000);
  }
  return true;
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The exit code a BackgroundRun wrote, once it has ended (-1: still running after 60 s, scaled).
int exit_code_of(const std::filesystem::path& log) {
  const std::filesystem::path rc = log.string() + ".rc";
  if (!eventually([&] { return !read_text(rc).empty(); }, 60)) return -1;
  return std::stoi(read_text(rc));
}

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in, nullptr, false);
}

// Two runs on one --output_dir: the second is refused at start (exit 2 on every rank, the holder
// named) and the first's args.json, logging.jsonl and checkpoints stay its own.
TEST(CliRunDirectory, SecondRunIsRefusedAndTheFirstKeepsItsFiles) {
  namespace fs = std::filesystem;
  const std::string marker = "glm_hpc_lock_marker_" + std::to_string(::getpid());
  const fs::path dir = scratch_root() / marker, log = scratch_root() / "first.log";
  fs::remove_all(dir);
  const BackgroundRun first(kTiny + "--max_steps 100000 --save_steps 3 --logging_steps 1 --output_dir " + dir.string(),
                            1, log, marker);
  ASSERT_TRUE(first.started());
  ASSERT_TRUE(eventually([&] { return fs::exists(dir / "checkpoint-3" / "COMPLETE"); })) << read_text(log);
  const nlohmann::json holder = read_json(dir / ".glm_hpc.lock");
  ASSERT_TRUE(holder.is_object()) << "the first run holds the lock";

  RunResult second = run_glm(kTiny + "--max_steps 2 --save_steps 1 --output_dir " + dir.string(), 2);
  EXPECT_EQ(second.exit_code, 2) << second.output;
  const std::string named = "--output_dir '" + dir.string() + "' is in use by another glm_hpc run: train on host " +
                            holder["host"].get<std::string>() + " (pid " + std::to_string(holder["pid"].get<int>()) +
                            ") since " + holder["started"].get<std::string>();
  EXPECT_NE(second.output.find(named), std::string::npos) << second.output;
  EXPECT_EQ(count(second.output, "glm_hpc: error:"), 1) << second.output;
  EXPECT_EQ(count(second.output, "step "), 0) << second.output;

  // The first goes on until SIGUSR1 to its mpirun, then saves and exits 75.
  ASSERT_EQ(std::system(("pkill -USR1 -n -f '^[^ ]*mpi(run|exec) .*" + marker + "'").c_str()), 0);
  EXPECT_EQ(exit_code_of(log), 75) << read_text(log);
  EXPECT_EQ(read_json(dir / "args.json")["options"]["max_steps"]["value"], 100000) << "the first run's options";
  std::ifstream jsonl(dir / "logging.jsonl");
  std::string line;
  int64_t steps = 0;
  while (std::getline(jsonl, line)) {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    ASSERT_TRUE(record.is_object()) << "a torn record: " << line;
    if (record.contains("loss")) EXPECT_EQ(record["step"], ++steps) << "one run's steps, in order";
  }
  EXPECT_GE(steps, 3);
  int checkpoints = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("checkpoint-", 0) != 0) continue;
    ++checkpoints;
    EXPECT_TRUE(fs::exists(entry.path() / "COMPLETE")) << name;
    EXPECT_EQ(read_json(entry.path() / "meta.json")["step"], std::stoll(name.substr(11))) << name;
    EXPECT_EQ(read_json(entry.path() / "args.json")["options"]["max_steps"]["value"], 100000) << name;
  }
  EXPECT_GE(checkpoints, 1);
  const nlohmann::json status = read_json(dir / "run_status.json");
  EXPECT_EQ(status["status"], "preempted") << status;
  EXPECT_EQ(status["exit_code"], 75) << status;
  EXPECT_EQ(status["signal"], "SIGUSR1") << status;
  EXPECT_FALSE(fs::exists(dir / ".glm_hpc.lock")) << "released at exit";
}

// A run into an --output_dir that holds an earlier run's log and checkpoints is refused, saying
// how to continue or replace it, and nothing there changes; --resume_from_checkpoint continues it;
// --overwrite_output_dir true removes the earlier log and checkpoints first and says so.
TEST(CliRunDirectory, EarlierRunIsKeptUnlessResumedOrOverwritten) {
  namespace fs = std::filesystem;
  const fs::path dir = scratch_root() / "earlier_run";
  fs::remove_all(dir);
  const std::string args = kTiny + "--logging_steps 1 --save_steps 1 --output_dir " + dir.string() + " ";
  ASSERT_EQ(run_glm(args + "--max_steps 2", 1).exit_code, 0);
  const std::string log_before = read_text(dir / "logging.jsonl");
  RunResult refused = run_glm(args + "--max_steps 2", 2);
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("--output_dir '" + dir.string() + "' holds an earlier run's logging.jsonl with 2 "
                                "logged steps and 2 checkpoints (checkpoint-1 .. checkpoint-2): continue it with "
                                "--resume_from_checkpoint latest, replace it with --overwrite_output_dir true, or "
                                "choose another --output_dir"),
            std::string::npos)
      << refused.output;
  EXPECT_EQ(count(refused.output, "glm_hpc: error:"), 1) << refused.output;
  EXPECT_EQ(read_text(dir / "logging.jsonl"), log_before) << "the earlier log is untouched";
  EXPECT_TRUE(fs::exists(dir / "checkpoint-2" / "COMPLETE"));
  // Starting over from its weights is not continuing it; a replacement whose input is bad removes nothing.
  RunResult weights_only =
      run_glm(args + "--max_steps 2 --resume_from_checkpoint latest --resume_only_model true", 2);
  EXPECT_EQ(weights_only.exit_code, 2) << weights_only.output;
  EXPECT_NE(weights_only.output.find("holds an earlier run's"), std::string::npos) << weights_only.output;
  RunResult bad = run_glm(args + "--max_steps 2 --overwrite_output_dir true --dataset " + (dir / "none.jsonl").string(), 2);
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_EQ(read_text(dir / "logging.jsonl"), log_before) << "still untouched";
  EXPECT_TRUE(fs::exists(dir / "checkpoint-2" / "COMPLETE"));

  RunResult resumed = run_glm(args + "--max_steps 3 --resume_from_checkpoint latest", 2);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(fs::exists(dir / "checkpoint-3" / "COMPLETE"));

  RunResult replaced = run_glm(args + "--max_steps 1 --overwrite_output_dir true", 2);
  ASSERT_EQ(replaced.exit_code, 0) << replaced.output;
  EXPECT_NE(replaced.output.find("glm_hpc: --overwrite_output_dir: removed the earlier run's logging.jsonl with 3 "
                                 "logged steps and 3 checkpoints (checkpoint-1 .. checkpoint-3) from " +
                                 dir.string()),
            std::string::npos)
      << replaced.output;
  EXPECT_FALSE(fs::exists(dir / "checkpoint-3")) << "the earlier run's checkpoints are gone";
  EXPECT_TRUE(fs::exists(dir / "checkpoint-1" / "COMPLETE")) << "this run's own";
  int records = 0;
  std::ifstream log(dir / "logging.jsonl");
  for (std::string line; std::getline(log, line);) records += line.find("\"loss\"") != std::string::npos ? 1 : 0;
  EXPECT_EQ(records, 1);
}

// kill -9 of the holder leaves its lock: the next run takes it over, says so, and removes what the
// killed run left (here: a save's temporary directory) before it trains.
TEST(CliRunDirectory, KilledRunsLockIsTakenOver) {
  namespace fs = std::filesystem;
  const fs::path dir = scratch_root() / "killed_holder", log = scratch_root() / "killed.log";
  fs::remove_all(dir);
  const BackgroundRun holder_run(
      kTiny + "--max_steps 100000 --save_steps 100000 --logging_steps 1 --output_dir " + dir.string(), 1, log,
      dir.string());
  ASSERT_TRUE(holder_run.started());
  ASSERT_TRUE(eventually([&] { return !read_text(dir / "logging.jsonl").empty(); })) << read_text(log);
  const nlohmann::json holder = read_json(dir / ".glm_hpc.lock");
  ASSERT_TRUE(holder.is_object());
  const int pid = holder["pid"].get<int>();
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  EXPECT_NE(exit_code_of(log), 0) << read_text(log);
  ASSERT_TRUE(fs::exists(dir / ".glm_hpc.lock")) << "SIGKILL leaves the lock";
  EXPECT_EQ(read_json(dir / "run_status.json")["status"], "running") << "died without ending itself";
  const std::string leftover = ".checkpoint-7.tmp-node1-" + std::to_string(pid) + "-0123456789abcdef";
  fs::create_directories(dir / leftover);

  RunResult next =
      run_glm(kTiny + "--max_steps 2 --logging_steps 1 --overwrite_output_dir true --output_dir " + dir.string(), 2);
  ASSERT_EQ(next.exit_code, 0) << next.output;
  EXPECT_NE(next.output.find("glm_hpc: --overwrite_output_dir: removed the earlier run's logging.jsonl with "),
            std::string::npos)
      << next.output;
  EXPECT_NE(
      next.output.find("glm_hpc: took over the stale lock " + (dir / ".glm_hpc.lock").string() + " of train on host " +
                       holder["host"].get<std::string>() + " (pid " + std::to_string(pid) + ")"),
      std::string::npos)
      << next.output;
  EXPECT_NE(next.output.find("process " + std::to_string(pid) + " is gone"), std::string::npos) << next.output;
  EXPECT_NE(next.output.find("glm_hpc: removed what earlier runs left in " + dir.string() + ": " + leftover +
                             " (directory)\n"),
            std::string::npos)
      << next.output;
  EXPECT_FALSE(fs::exists(dir / leftover));
  const nlohmann::json status = read_json(dir / "run_status.json");
  EXPECT_EQ(status["status"], "completed") << status;
  EXPECT_EQ(status["exit_code"], 0) << status;
  EXPECT_FALSE(fs::exists(dir / ".glm_hpc.lock"));
}

// A full disk names the file and the reason: --output_dir on a 12 KiB tmpfs holds the lock and
// run_status.json (a page each) but not args.json (two pages). Skipped where no tmpfs can be mounted
// (not root, or no CAP_SYS_ADMIN); test_run_directory's DurableFile tests cover the same path.
TEST(CliRunDirectory, FullDiskNamesTheFileAndTheReason) {
  namespace fs = std::filesystem;
  const fs::path dir = scratch_root() / "full";
  fs::create_directories(dir);
  if (std::system(("mount -t tmpfs -o size=12k glm_full_disk_test " + dir.string() + " 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here";
  struct Unmount {
    std::string dir;
    ~Unmount() { (void)std::system(("umount " + dir).c_str()); }
  } unmount{dir.string()};
  RunResult r = run_glm(kTiny + "--max_steps 1 --dataset_cache false --output_dir " + dir.string(), 2);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(
      r.output.find("glm_hpc: error: cannot write '" + (dir / "args.json").string() + "': No space left on device"),
      std::string::npos)
      << r.output;
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(dir)) left.push_back(entry.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"run_status.json"}) << "no temporaries, no lock";
  const nlohmann::json status = read_json(dir / "run_status.json");
  EXPECT_EQ(status["status"], "failed") << status;
  EXPECT_EQ(status["exit_code"], 1) << status;
}

}  // namespace
}  // namespace glm::test

namespace glm::test {
namespace {

const std::string kTinyModel = "--hidden_size 32 --intermediate_size 48 --head_dim 8 ";

std::string conversation_line(const std::string& user, const std::string& assistant) {
  return nlohmann::json(
             {{"messages", {{{"role", "user"}, {"content", user}}, {{"role", "assistant"}, {"content", assistant}}}}})
             .dump() +
         "\n";
}

// The first line of `output` that starts with `prefix`, or "".
std::string line_starting(const std::string& output, const std::string& prefix) {
  for (size_t at = output.find(prefix); at != std::string::npos; at = output.find(prefix, at + 1))
    if (at == 0 || output[at - 1] == '\n') return output.substr(at, output.find('\n', at) - at);
  return "";
}

TEST(CliPrepare, ReportsLengthsAndMarksTrainedTokens) {
  const std::string data = write_file("prepare.jsonl", conversation_line("hi", "yo") +
                                                           conversation_line("a longer question", "a longer answer") +
                                                           conversation_line("q", "a"));
  RunResult r = run_glm("prepare --dataset " + data + " --print_example 0 --system SYS");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "glm_hpc: dataset 3 of 3 samples kept (max_length 512"), 1) << "rank 0 only\n" << r.output;
  EXPECT_NE(r.output.find("token lengths p50 "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("sample 0 of 3 (" + data + ":1): 16 tokens, 4 trained"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[gMASK]<sop><|system|>\nSYS<|user|>\nhi<|assistant|>[[\nyo<|user|>]]\n"), std::string::npos)
      << r.output;
  EXPECT_EQ(count(r.output, "step "), 0) << "prepare never trains\n" << r.output;
  EXPECT_EQ(count(r.output, "packing"), 0) << r.output;

  RunResult packed = run_glm("prepare --dataset " + data + " --packing true --max_length 20", 1);
  ASSERT_EQ(packed.exit_code, 0) << packed.output;
  EXPECT_NE(packed.output.find("packing: 3 samples into 2 rows of up to 20 tokens"), std::string::npos)
      << packed.output;
}

TEST(CliPrepare, BadDataAndBadExampleExitTwo) {
  const std::string broken = write_file("prepare_broken.jsonl", conversation_line("q", "a") + "{\"messages\": 5}\n");
  expect_bad_input("prepare --dataset " + broken, "prepare_broken.jsonl:2: \"messages\" must be a non-empty array");
  const std::string ok = write_file("prepare_ok.jsonl", conversation_line("q", "a"));
  expect_bad_input("prepare --dataset " + ok + " --print_example 1", "--print_example 1 is not a sample: 1 samples");
  expect_bad_input("prepare --dataset " + ok + " --print_example -2", "--print_example must be a sample index");
  expect_bad_input("--packing maybe", "packing");
}

// Training prints the very report prepare prints.
TEST(CliPrepare, TrainPrintsTheSameReport) {
  const auto out = scratch_root() / "same_report";
  const std::string args = "--dataset " + std::string(GLM_TEST_WORKDIR) +
                           "/data/sample/alpaca.jsonl --max_length 150 --truncation_strategy left --packing true";
  RunResult prepared = run_glm("prepare " + args, 1);
  ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
  RunResult trained = run_glm(kTinyModel + args + " --max_steps 1 --output_dir " + out.string(), 1);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const std::string report = line_starting(prepared.output, "glm_hpc: dataset ");
  ASSERT_FALSE(report.empty()) << prepared.output;
  EXPECT_EQ(report.find(", 0 truncated"), std::string::npos) << "some alpaca samples exceed 150 tokens\n" << report;
  EXPECT_EQ(line_starting(trained.output, "glm_hpc: dataset "), report) << trained.output;
  const std::string packing = line_starting(prepared.output, "glm_hpc: packing: ");
  ASSERT_FALSE(packing.empty()) << prepared.output;
  EXPECT_EQ(line_starting(trained.output, "glm_hpc: packing: "), packing) << trained.output;
}

// With --packing an epoch is the packed rows: steps = ceil(rows / global batch).
TEST(CliPacking, StepsPerEpochCountPackedRows) {
  std::string lines;
  for (int i = 0; i < 30; ++i)
    lines += conversation_line("question " + std::to_string(i), "answer " + std::to_string(i));
  const std::string data = write_file("packing.jsonl", lines);
  const auto out = scratch_root() / "packing";
  RunResult r = run_glm(kTinyModel + "--dataset " + data +
                        " --packing true --max_length 96 --num_train_epochs 1 --per_device_train_batch_size 2 "
                        "--logging_steps 1 --output_dir " +
                        out.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string packing = line_starting(r.output, "glm_hpc: packing: 30 samples into ");
  ASSERT_FALSE(packing.empty()) << r.output;
  const int rows = std::stoi(packing.substr(std::string("glm_hpc: packing: 30 samples into ").size()));
  EXPECT_LT(rows, 30) << "short samples share rows";
  const std::string report = line_starting(r.output, "glm_hpc: dataset 30 of 30 samples kept");
  const size_t tokens_at = report.find("), ");
  ASSERT_NE(tokens_at, std::string::npos) << r.output;
  const int tokens = std::stoi(report.substr(tokens_at + 3));
  EXPECT_GE(rows, (tokens + 95) / 96) << "no row holds more than 96 of the " << tokens << " tokens";
  const int steps = (rows + 3) / 4;  // 2 per device x 2 ranks
  EXPECT_NE(r.output.find("global batch 4 packed rows = 2 per device x 2 ranks x 1 accumulation; " +
                          std::to_string(steps) + " steps"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(count(r.output, "step "), steps) << r.output;
}

}  // namespace
}  // namespace glm::test

namespace glm::test {
namespace {

// "loss X | lr Y | grad_norm Z" of every step line (the rest holds timings).
std::vector<std::string> step_values(const std::string& output) {
  std::vector<std::string> values;
  for (size_t at = output.find("step "); at != std::string::npos; at = output.find("step ", at + 1)) {
    if (at > 0 && output[at - 1] != '\n') continue;
    const size_t from = output.find("| loss ", at), to = output.find(" | tokens/s", at);
    if (from != std::string::npos && to != std::string::npos) values.push_back(output.substr(from, to - from));
  }
  return values;
}

const std::string kTinyModelForShards = "--hidden_size 32 --intermediate_size 48 --head_dim 8 ";

// prepare --output_dir writes shards; training on them gives the steps training on the jsonl gives.
TEST(CliShards, PreparedDirectoryTrainsLikeItsJsonl) {
  const auto root = scratch_root() / "shards";
  std::filesystem::remove_all(root);
  const std::string data = std::string(GLM_TEST_WORKDIR) + "/data/sample/alpaca.jsonl";
  const std::string prepared = (root / "prepared").string();
  RunResult p =
      run_glm("prepare --dataset " + data + " --max_length 150 --truncation_strategy left --output_dir " + prepared);
  ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_EQ(count(p.output, "glm_hpc: wrote 20 samples"), 1) << "rank 0 writes\n" << p.output;
  EXPECT_TRUE(std::filesystem::exists(root / "prepared" / "shard_00000.bin"));

  const std::string train = kTinyModelForShards + "--max_steps 3 --logging_steps 1 --per_device_train_batch_size 2 ";
  RunResult from_jsonl = run_glm(train + "--dataset " + data + " --max_length 150 --truncation_strategy left " +
                                 "--output_dir " + (root / "a").string());
  RunResult from_shards = run_glm(train + "--dataset " + prepared + " --output_dir " + (root / "b").string());
  ASSERT_EQ(from_jsonl.exit_code, 0) << from_jsonl.output;
  ASSERT_EQ(from_shards.exit_code, 0) << from_shards.output;
  EXPECT_NE(from_shards.output.find("glm_hpc: samples memory-mapped from " + prepared + " (prepared from " + data),
            std::string::npos)
      << from_shards.output;
  EXPECT_EQ(line_starting(from_shards.output, "glm_hpc: dataset "), line_starting(p.output, "glm_hpc: dataset "));
  const auto expected = step_values(from_jsonl.output);
  ASSERT_EQ(expected.size(), 3u) << from_jsonl.output;
  EXPECT_EQ(step_values(from_shards.output), expected) << from_shards.output;
}

TEST(CliShards, DamagedOrForeignDirectoriesExitTwo) {
  const auto root = scratch_root() / "shards_bad";
  std::filesystem::remove_all(root);
  const std::string data = std::string(GLM_TEST_WORKDIR) + "/data/sample/sharegpt.jsonl";
  RunResult p = run_glm("prepare --dataset " + data + " --output_dir " + (root / "d").string(), 1);
  ASSERT_EQ(p.exit_code, 0) << p.output;
  std::filesystem::resize_file(root / "d" / "shard_00000.bin",
                               std::filesystem::file_size(root / "d" / "shard_00000.bin") - 8);
  expect_bad_input(kTinyModelForShards + "--dataset " + (root / "d").string(), "shard_00000.bin' is truncated");
  std::filesystem::create_directories(root / "foreign");
  std::ofstream(root / "foreign" / "keep.txt") << "x";
  expect_bad_input("prepare --dataset " + data + " --output_dir " + (root / "foreign").string(),
                   "holds files that glm_hpc prepare did not write");
}

}  // namespace
}  // namespace glm::test

namespace glm::test {
namespace {

namespace fs = std::filesystem;

const std::string kSampleTokenizer = std::string(GLM_TEST_WORKDIR) + "/data/sample/tokenizer.model";
const std::string kSampleTokenizerLine =
    "glm_hpc: tokenizer " + kSampleTokenizer + ": vocab 1514 (1500 ranks + 14 special tokens), content hash fnv1a64:";

fs::path cli_scratch(const std::string& name) {
  const fs::path dir = scratch_root() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// The number that follows `key` in `text`; NaN when `key` is absent.
double number_after(const std::string& text, const std::string& key) {
  const size_t at = text.find(key);
  return at == std::string::npos ? std::nan("") : std::stod(text.substr(at + key.size()));
}

// README's first command (glm_hpc with no options, here from another working directory and with
// a scratch --output_dir) trains the embedded tiny GLM-4 with the project's BPE tokenizer, and learns.
TEST(CliTokenizer, DefaultRunUsesTheSampleTokenizerAndLearns) {
  const fs::path out = cli_scratch("default_run");
  RunResult r = run_glm("--output_dir " + out.string(), 2, "cd " + out.string() + " && ");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, kSampleTokenizerLine), 1) << "rank 0 names the tokenizer once\n" << r.output;
  EXPECT_NE(r.output.find("; model vocab_size 1536"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("glm_hpc: dataset 200 of 200 samples kept"), std::string::npos) << r.output;
  // About 2.8 bytes per token: the 200 conversations are some 100 kB of text.
  const double tokens = number_after(line_starting(r.output, "glm_hpc: dataset "), "left without trained tokens), ");
  EXPECT_LT(tokens, 40000) << r.output;
  const double first = number_after(r.output, "first loss "), final = number_after(r.output, "final loss ");
  EXPECT_NEAR(first, std::log(1536.0), 0.5) << "an untrained model is uniform over the vocabulary\n" << r.output;
  EXPECT_LT(final, first - 1.5) << r.output;
  std::ifstream args(out / "args.json");
  auto j = nlohmann::json::parse(args);
  EXPECT_EQ(j["options"]["tokenizer"]["value"], kSampleTokenizer);
  EXPECT_EQ(j["options"]["tokenizer"]["source"], "default");
  EXPECT_EQ(j["options"]["tokenizer"]["content_hash"].get<std::string>().rfind("fnv1a64:", 0), 0u);
}

TEST(CliTokenizer, PrintExampleShowsMergedTokens) {
  const std::string data =
      write_file("merged.jsonl", conversation_line("Please review this change.", "The review is done."));
  RunResult bpe = run_glm("prepare --dataset " + data + " --print_example 0", 1);
  RunResult bytes = run_glm("prepare --tokenizer bytes --vocab_size 272 --dataset " + data + " --print_example 0", 1);
  ASSERT_EQ(bpe.exit_code, 0) << bpe.output;
  ASSERT_EQ(bytes.exit_code, 0) << bytes.output;
  EXPECT_NE(bytes.output.find("glm_hpc: tokenizer bytes (built in): vocab 270 (256 bytes + 14 special tokens)"),
            std::string::npos)
      << bytes.output;
  const std::string text =
      "[gMASK]<sop><|user|>\nPlease review this change.<|assistant|>[[\nThe review is done.<|user|>]]\n";
  EXPECT_NE(bpe.output.find(text), std::string::npos) << bpe.output;
  EXPECT_NE(bytes.output.find(text), std::string::npos) << bytes.output;
  // Bytes: 1 + 1 + 1 + 27 + 1 + 20 + 1 tokens; BPE merges words with their leading space.
  EXPECT_EQ(number_after(bytes.output, "(" + data + ":1): "), 52) << bytes.output;
  EXPECT_LT(number_after(bpe.output, "(" + data + ":1): "), 25) << bpe.output;
  EXPECT_NE(bpe.output.find("| review| this| change|.|<|assistant|>|\\n|The| review| is|"), std::string::npos)
      << bpe.output;
  EXPECT_NE(bytes.output.find("|\\n|T|h|e| |r|e|v|i|e|w|"), std::string::npos) << bytes.output;
}

TEST(CliTokenizer, MissingOrCorruptTokenizerIsOneClearError) {
  expect_bad_input(
      "--tokenizer /nonexistent/tokenizer.model",
      "--tokenizer /nonexistent/tokenizer.model: cannot open tokenizer file '/nonexistent/tokenizer.model'");
  std::ifstream in(kSampleTokenizer, std::ios::binary);
  const std::string ranks((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string corrupt = write_file("corrupt.model", ranks + "bm9wZQ== x\n");
  expect_bad_input("prepare --tokenizer " + corrupt, "corrupt.model:1501: rank 'x' is not an integer");
  expect_bad_input("--tokenizer " + cli_scratch("no_tokenizer").string(),
                   "holds neither tokenizer.model nor tokenizer.json");
}

TEST(CliTokenizer, VocabularySmallerThanTheTokenizerIsAClearError) {
  expect_bad_input("--vocab_size 1000",
                   "vocab_size (1000) is smaller than the tokenizer's 1514 ids (" + kSampleTokenizer + ")");
}

// A model directory's tokenizer.model is used without --tokenizer.
TEST(CliTokenizer, ModelDirectoryTokenizerIsUsed) {
  const fs::path dir = cli_scratch("model_with_tokenizer");
  fs::copy(std::string(GLM_TEST_WORKDIR) + "/tests/data/glm_a", dir / "model");
  // The first 480 ranks of a BPE rank file are a rank file (every merge joins lower ranks): with
  // the specials 494 ids, within the fixture's 512.
  std::ifstream in(kSampleTokenizer);
  std::ofstream out(dir / "model" / "tokenizer.model");
  std::string line;
  for (int i = 0; i < 480 && std::getline(in, line); ++i) out << line << "\n";
  out.close();
  RunResult r = run_glm("eval --model_id_or_path " + (dir / "model").string() + " --dataset " + GLM_TEST_WORKDIR +
                            "/data/sample/sharegpt.jsonl",
                        1);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("glm_hpc: tokenizer " + (dir / "model" / "tokenizer.model").string() +
                          ": vocab 494 (480 ranks + 14 special tokens)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("eval_loss: "), std::string::npos) << r.output;
}

// Token shards remember their tokenizer; training with another one is refused before it starts.
TEST(CliTokenizer, ShardsOfAnotherTokenizerAreRefused) {
  const fs::path root = cli_scratch("shards_tokenizer");
  const std::string data = std::string(GLM_TEST_WORKDIR) + "/data/sample/sharegpt.jsonl";
  RunResult p = run_glm("prepare --tokenizer bytes --dataset " + data + " --output_dir " + (root / "d").string(), 1);
  ASSERT_EQ(p.exit_code, 0) << p.output;
  std::ifstream manifest(root / "d" / "prepared.json");
  const auto m = nlohmann::json::parse(manifest);
  EXPECT_EQ(m["prepared_from"]["tokenizer"], "bytes");
  EXPECT_EQ(m["prepared_from"]["tokenizer_hash"].get<std::string>().rfind("fnv1a64:", 0), 0u);
  expect_bad_input(kTinyModel + "--dataset " + (root / "d").string(),
                   "d' was tokenized with bytes (" + m["prepared_from"]["tokenizer_hash"].get<std::string>() +
                       ") but this run's tokenizer is " + kSampleTokenizer);
  RunResult same = run_glm(kTinyModel + "--tokenizer bytes --dataset " + (root / "d").string() +
                               " --max_steps 1 --output_dir " + (root / "out").string(),
                           1);
  EXPECT_EQ(same.exit_code, 0) << same.output;
}

// glm_hpc given jsonl tokenizes once: the second run maps the cached shards and trains exactly as
// the first; changing the file, an option or --dataset_cache false tokenizes again.
TEST(CliDatasetCache, SecondRunReadsTheCacheWithIdenticalSteps) {
  const fs::path root = cli_scratch("dataset_cache");
  const fs::path cache = root / "xdg" / "glm_hpc" / "datasets";
  const std::string before = "export XDG_CACHE_HOME=" + (root / "xdg").string() + "; ";
  fs::copy_file(std::string(GLM_TEST_WORKDIR) + "/data/sample/alpaca.jsonl", root / "data.jsonl");
  const std::string args = kTinyModel + "--dataset " + (root / "data.jsonl").string() +
                           " --max_steps 3 --logging_steps 1 --per_device_train_batch_size 2 --overwrite_output_dir "
                           "true --output_dir " +
                           (root / "out").string() + " ";
  auto entries = [&] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(cache)) n += e.is_directory() ? 1 : 0;
    return n;
  };

  RunResult first = run_glm(args, 2, before);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_EQ(count(first.output, "glm_hpc: tokenization cache: wrote " + cache.string() + "/"), 1) << first.output;
  ASSERT_EQ(entries(), 1);
  RunResult second = run_glm(args, 2, before);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(count(second.output, "glm_hpc: tokenization cache: read " + cache.string() + "/"), 1) << second.output;
  const auto steps = step_values(first.output);
  ASSERT_EQ(steps.size(), 3u) << first.output;
  EXPECT_EQ(step_values(second.output), steps) << second.output;
  EXPECT_EQ(line_starting(second.output, "glm_hpc: dataset "), line_starting(first.output, "glm_hpc: dataset "));

  RunResult uncached = run_glm(args + "--dataset_cache false", 2, before);
  ASSERT_EQ(uncached.exit_code, 0) << uncached.output;
  EXPECT_EQ(count(uncached.output, "tokenization cache"), 0) << uncached.output;
  EXPECT_EQ(step_values(uncached.output), steps) << uncached.output;

  RunResult option = run_glm(args + "--max_length 150 --truncation_strategy left", 2, before);
  ASSERT_EQ(option.exit_code, 0) << option.output;
  EXPECT_EQ(count(option.output, "glm_hpc: tokenization cache: wrote "), 1) << "another option, another entry\n"
                                                                            << option.output;
  // The same length and bytes, one changed letter: the content hash, not the size or time, decides.
  std::ifstream in(root / "data.jsonl", std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  ASSERT_NE(text.find("\"output\": \""), std::string::npos);
  const size_t at = text.find("\"output\": \"") + 11;
  text[at] = text[at] == 'A' ? 'B' : 'A';
  std::ofstream(root / "data.jsonl", std::ios::binary | std::ios::trunc) << text;
  RunResult changed = run_glm(args, 2, before);
  ASSERT_EQ(changed.exit_code, 0) << changed.output;
  EXPECT_EQ(count(changed.output, "glm_hpc: tokenization cache: wrote "), 1) << changed.output;
  EXPECT_EQ(entries(), 3);
}

// A damaged cache entry is reported, replaced, and never fails the run.
TEST(CliDatasetCache, DamagedEntryIsTokenizedAgain) {
  const fs::path root = cli_scratch("dataset_cache_damaged");
  const std::string before = "export XDG_CACHE_HOME=" + (root / "xdg").string() + "; ";
  const std::string args = kTinyModel + "--dataset " + GLM_TEST_WORKDIR +
                           "/data/sample/sharegpt.jsonl --max_steps 1 --overwrite_output_dir true --output_dir " +
                           (root / "out").string();
  ASSERT_EQ(run_glm(args, 1, before).exit_code, 0);
  const fs::path cache = root / "xdg" / "glm_hpc" / "datasets";
  fs::path shard;
  for (const auto& e : fs::recursive_directory_iterator(cache))
    if (e.path().filename() == "shard_00000.bin") shard = e.path();
  ASSERT_FALSE(shard.empty());
  fs::resize_file(shard, fs::file_size(shard) - 8);
  RunResult r = run_glm(args, 2, before);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "glm_hpc: tokenization cache: ignoring the damaged "), 1) << r.output;
  EXPECT_EQ(count(r.output, "glm_hpc: tokenization cache: wrote "), 1) << r.output;
  RunResult again = run_glm(args, 2, before);
  EXPECT_EQ(count(again.output, "glm_hpc: tokenization cache: read "), 1) << again.output;
}

// glm_hpc export of a default run (the sample tokenizer): the directory carries the run's
// tokenizer.model and its special ids, and glm_hpc evaluates it as a Hugging Face model directory.
// --save_only_model true: checkpoints hold the master weights alone (about a third of a full
// checkpoint's bytes), marked in meta.json; export and --resume_only_model read them, and a full
// resume is refused saying what to add. Full training and LoRA.
TEST(CliCheckpoint, SaveOnlyModelIsExportedAndResumedWeightsOnly) {
  namespace fs = std::filesystem;
  auto bytes_of = [](const fs::path& dir) {
    uintmax_t total = 0;
    for (const auto& e : fs::directory_iterator(dir)) total += e.is_regular_file() ? e.file_size() : 0;
    return total;
  };
  for (const std::string lora : {"", "--train_type lora "}) {
    const fs::path root = scratch_root() / (lora.empty() ? "model_only_full" : "model_only_lora");
    fs::remove_all(root);
    const std::string args = kTinyModel + lora + "--save_steps 2 ";
    ASSERT_EQ(run_glm(args + "--max_steps 2 --output_dir " + (root / "all").string(), 1).exit_code, 0);
    RunResult saved =
        run_glm(args + "--max_steps 2 --save_only_model true --output_dir " + (root / "model").string(), 1);
    ASSERT_EQ(saved.exit_code, 0) << saved.output;
    const fs::path full = root / "all" / "checkpoint-2", model = root / "model" / "checkpoint-2";
    std::ifstream meta(model / "meta.json");
    EXPECT_EQ(nlohmann::json::parse(meta)["model_only"], true);
    EXPECT_LT(static_cast<double>(bytes_of(model)), 0.45 * static_cast<double>(bytes_of(full))) << lora;
    RunResult refused = run_glm(args + "--max_steps 3 --resume_from_checkpoint " + model.string() +
                                    " --output_dir " + (root / "resumed").string(),
                                1);
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    EXPECT_NE(refused.output.find(model.string() + " holds the weights only (saved with --save_only_model true): no "
                                                   "optimizer state to resume; add --resume_only_model true"),
              std::string::npos)
        << refused.output;
    RunResult weights = run_glm(args + "--max_steps 2 --resume_from_checkpoint " + model.string() +
                                    " --resume_only_model true --output_dir " + (root / "weights").string(),
                                1);
    EXPECT_EQ(weights.exit_code, 0) << weights.output;
    RunResult exported = run_glm("export --ckpt_dir " + model.string() + " --save_dir " + (root / "hf").string(), 1);
    EXPECT_EQ(exported.exit_code, 0) << exported.output;
  }
}

TEST(CliExport, DefaultRunExportsAndEvaluates) {
  const fs::path root = cli_scratch("export");
  const std::string out = (root / "out").string(), hf = (root / "hf").string();
  ASSERT_EQ(run_glm(kTinyModel + "--max_steps 2 --save_steps 2 --output_dir " + out, 2).exit_code, 0);
  RunResult r = run_glm("export --ckpt_dir " + out + " --save_dir " + hf, 1);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("glm_hpc: exported"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model.safetensors"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(root / "hf" / "tokenizer.model"));
  std::ifstream in(root / "hf" / "config.json");
  const nlohmann::json cfg = nlohmann::json::parse(in);
  EXPECT_EQ(cfg["model_type"], "glm");
  EXPECT_EQ(cfg["pad_token_id"], 1500);  // data/sample/tokenizer.model: 1500 ranks, then the specials
  EXPECT_EQ(cfg["eos_token_id"], nlohmann::json({1500, 1507, 1509}));
  RunResult eval = run_glm("eval --model_id_or_path " + hf, 1);
  EXPECT_EQ(eval.exit_code, 0) << eval.output;
  EXPECT_NE(eval.output.find("eval_loss: "), std::string::npos) << eval.output;
  // A second export into the same directory, a missing --save_dir, a bad size: one message, exit 2.
  RunResult again = run_glm("export --ckpt_dir " + out + " --save_dir " + hf, 1);
  EXPECT_EQ(again.exit_code, 2) << again.output;
  EXPECT_NE(again.output.find("is not empty; give --overwrite true"), std::string::npos) << again.output;
  expect_bad_input("export --ckpt_dir " + out, "--save_dir is required by 'glm_hpc export'");
  expect_bad_input("export --ckpt_dir " + out + " --save_dir " + hf + "2 --max_shard_size 5XB",
                   "--max_shard_size '5XB' is not a size");
  expect_bad_input("export --ckpt_dir " + out + " --save_dir " + hf + "2 --export_format gguf",
                   "--export_format must be hf or chatglm");
  expect_bad_input("export --ckpt_dir " + out + " --save_dir " + hf + "2 --merge_lora true",
                   "is a full-training checkpoint (train_type full)");
}

// A LoRA run's checkpoint: PEFT's adapter files, or with --merge_lora the whole model, which glm_hpc
// evaluates as a Hugging Face directory. --merge_lora belongs to export.
TEST(CliExport, LoraCheckpointExportsAdaptersOrTheMergedModel) {
  const fs::path root = cli_scratch("lora_export");
  const std::string out = (root / "out").string();
  ASSERT_EQ(run_glm(kTinyModel + "--train_type lora --max_steps 2 --save_steps 2 --output_dir " + out, 2).exit_code, 0);
  RunResult adapters = run_glm("export --ckpt_dir " + out + " --save_dir " + (root / "adapter").string(), 1);
  ASSERT_EQ(adapters.exit_code, 0) << adapters.output;
  EXPECT_NE(adapters.output.find("in PEFT's format"), std::string::npos) << adapters.output;
  EXPECT_TRUE(fs::exists(root / "adapter" / "adapter_config.json"));
  EXPECT_TRUE(fs::exists(root / "adapter" / "adapter_model.safetensors"));
  RunResult merged =
      run_glm("export --merge_lora true --ckpt_dir " + out + " --save_dir " + (root / "merged").string(), 1);
  ASSERT_EQ(merged.exit_code, 0) << merged.output;
  EXPECT_NE(merged.output.find("merged: the random initialisation with seed 42"), std::string::npos) << merged.output;
  EXPECT_TRUE(fs::exists(root / "merged" / "tokenizer.model"));
  RunResult eval = run_glm("eval --model_id_or_path " + (root / "merged").string(), 1);
  EXPECT_EQ(eval.exit_code, 0) << eval.output;
  EXPECT_NE(eval.output.find("eval_loss: "), std::string::npos) << eval.output;
  expect_bad_input(kTinyModel + "--merge_lora true --max_steps 1", "--merge_lora is an option of 'glm_hpc export'");
}

}  // namespace
}  // namespace glm::test

// glm_hpc infer as a user runs it: a trained checkpoint answers a prompt file split over ranks
// (one result file in input order, the same as on one rank), sampling is reproducible by seed, a
// chat keeps its history, and bad prompt files and options get one message and exit code 2.
namespace glm::test {
namespace {

namespace fs = std::filesystem;

// A tiny model trained a few steps: its checkpoint directory.
std::string trained_checkpoint(const std::string& name) {
  const fs::path out = scratch_root() / name;
  const RunResult r =
      run_glm(kTiny + "--max_steps 8 --save_steps 8 --logging_steps 8 --output_dir " + out.string(), 1);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return (out / "checkpoint-8").string();
}

std::string prompt_file(const std::string& name) {
  std::string text;
  const char* users[] = {"Review: int n = v.size() - 1;", "What does ZeRO-3 shard?", "Say hi.",
                         "Explain RMSNorm briefly.", "Is bf16 enough for Adam moments?"};
  for (int i = 0; i < 5; ++i) {
    nlohmann::json messages = {{{"role", "user"}, {"content", users[i]}}};
    if (i % 2 == 0) messages.push_back({{"role", "assistant"}, {"content", "reference " + std::to_string(i)}});
    text += nlohmann::json({{"messages", messages}}).dump() + "\n";
  }
  text += R"({"instruction": "Name a GPU.", "output": "H200"})" "\n";
  text += R"({"input_ids": [3, 17, 250, 9]})" "\n";
  return write_file(name, text);
}

std::vector<nlohmann::json> result_rows(const std::string& path) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

// What must not depend on the number of ranks: everything but the timings.
std::vector<nlohmann::json> without_timings(std::vector<nlohmann::json> rows) {
  for (auto& r : rows) {
    r.erase("time_to_first_token_s");
    r.erase("latency_s");
  }
  return rows;
}

TEST(CliInfer, PromptsSplitOverRanksGiveOneFileInInputOrder) {
  const std::string ckpt = trained_checkpoint("infer_batch");
  const std::string prompts = prompt_file("infer_prompts.jsonl");
  const std::string one = (scratch_root() / "infer_np1.jsonl").string(), two = (scratch_root() / "infer_np2.jsonl").string();
  const RunResult r1 = run_glm("infer --ckpt_dir " + ckpt + " --val_dataset " + prompts +
                               " --max_new_tokens 12 --result_path " + one, 1);
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  EXPECT_NE(r1.output.find("glm_hpc: greedy"), std::string::npos) << r1.output;
  EXPECT_NE(r1.output.find("glm_hpc: infer: 7 replies"), std::string::npos) << r1.output;
  const RunResult r2 = run_glm("infer --ckpt_dir " + ckpt + " --val_dataset " + prompts +
                               " --max_new_tokens 12 --result_path " + two, 2);
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  EXPECT_EQ(count(r2.output, "glm_hpc: results in "), 1) << r2.output;
  const std::vector<nlohmann::json> rows = result_rows(one);
  ASSERT_EQ(rows.size(), 7u);
  EXPECT_EQ(without_timings(result_rows(two)), without_timings(rows));
  for (size_t i = 0; i < rows.size(); ++i) {
    const nlohmann::json& row = rows[i];
    EXPECT_EQ(row["index"], i);
    EXPECT_EQ(row["source"], prompts + ":" + std::to_string(i + 1));
    EXPECT_GE(row["response_tokens"].get<int>(), 0);
    EXPECT_LE(row["response_tokens"].get<int>(), 12);
    EXPECT_EQ(row["finish_reason"] == "length", row["response_tokens"] == 12) << row;
    EXPECT_GE(row["latency_s"].get<double>(), row["time_to_first_token_s"].get<double>());
  }
  EXPECT_EQ(rows[0]["labels"], "reference 0");
  EXPECT_TRUE(rows[1]["labels"].is_null());
  EXPECT_EQ(rows[0]["messages"], nlohmann::json::parse(R"([{"role": "user", "content": "Review: int n = v.size() - 1;"}])"));
  EXPECT_EQ(rows[5]["labels"], "H200") << "alpaca's output is the reference";
  EXPECT_TRUE(rows[6].contains("response_ids")) << "pre-tokenized prompts get ids back";
  EXPECT_EQ(rows[6]["prompt_tokens"], 4);
  EXPECT_FALSE(rows[6].contains("messages"));
}

TEST(CliInfer, SamplingIsReproducibleBySeed) {
  const std::string ckpt = trained_checkpoint("infer_sampling");
  const std::string prompts = prompt_file("infer_sampling.jsonl");
  auto responses = [&](int seed, int ranks) {
    const std::string path = (scratch_root() / ("sampled_" + std::to_string(seed) + "_" + std::to_string(ranks))).string();
    const RunResult r = run_glm("infer --ckpt_dir " + ckpt + " --val_dataset " + prompts +
                                    " --max_new_tokens 16 --temperature 1.5 --top_k 0 --top_p 0.95 --seed " +
                                    std::to_string(seed) + " --result_path " + path,
                                ranks);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("temperature 1.5, top_p 0.95, top_k 0, seed " + std::to_string(seed)), std::string::npos)
        << r.output;
    std::vector<std::string> out;
    for (const auto& row : result_rows(path)) out.push_back(row.value("response", row.dump()));
    return out;
  };
  const std::vector<std::string> first = responses(5, 2);
  ASSERT_EQ(first.size(), 7u);
  EXPECT_EQ(responses(5, 1), first) << "the same seed on another number of ranks";
  EXPECT_NE(responses(6, 2), first) << "another seed draws other tokens";
}

TEST(CliInfer, ChatKeepsTheConversationUntilCleared) {
  const std::string ckpt = trained_checkpoint("infer_chat");
  const std::string input = write_file("chat_input.txt", "Hello there\nAnd again\nclear\nNew topic\nexit\nnever read\n");
  const RunResult r = run_glm("infer --ckpt_dir " + ckpt + " --system 'Be brief.' --max_new_tokens 6 < " + input, 1);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "<<< "), 5) << "four lines read, then the prompt that 'exit' answers\n" << r.output;
  EXPECT_EQ(count(r.output, "(a new conversation)"), 1) << r.output;
  EXPECT_EQ(count(r.output, "glm_hpc: error"), 0) << r.output;
}

// --compare_with: two checkpoints of one run answer the same prompts; the blinded file, de-blinded
// with the key, gives each model's own replies, and A is not always the first model.
TEST(CliInfer, ComparisonIsBlindedAndTheKeyRestoresEachModel) {
  const fs::path out = scratch_root() / "compare_run";
  const RunResult trained =
      run_glm(kTiny + "--max_steps 8 --save_steps 4 --logging_steps 8 --output_dir " + out.string(), 1);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  std::string prompts;
  for (int i = 0; i < 12; ++i)
    prompts += nlohmann::json({{"messages", {{{"role", "user"}, {"content", "Question " + std::to_string(i)}}}}}).dump() +
               "\n";
  const std::string file = write_file("compare_prompts.jsonl", prompts);
  const std::string result = (scratch_root() / "compare" / "side_by_side.jsonl").string();
  const RunResult r = run_glm("infer --ckpt_dir " + (out / "checkpoint-8").string() + " --compare_with " +
                                  (out / "checkpoint-4").string() + " --val_dataset " + file +
                                  " --max_new_tokens 6 --temperature 1 --seed 3 --result_path " + result,
                              2);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "glm_hpc: infer: 12 replies"), 2) << r.output;
  const fs::path stem = fs::path(result).replace_extension("");
  const std::vector<nlohmann::json> blinded = result_rows(result), first = result_rows(stem.string() + ".model.jsonl"),
                                    second = result_rows(stem.string() + ".compare_with.jsonl");
  ASSERT_EQ(blinded.size(), 12u);
  ASSERT_EQ(first.size(), 12u);
  ASSERT_EQ(second.size(), 12u);
  std::ifstream key_in(stem.string() + ".key.json");
  const nlohmann::json key = nlohmann::json::parse(key_in);
  EXPECT_NE(key["model"].get<std::string>().find("checkpoint-8"), std::string::npos) << key;
  EXPECT_NE(key["compare_with"].get<std::string>().find("checkpoint-4"), std::string::npos) << key;
  int a_is_model = 0;
  for (size_t i = 0; i < 12; ++i) {
    const bool a_first = key["a_is"][i] == "model";
    a_is_model += a_first;
    EXPECT_EQ(blinded[i]["response_a"], (a_first ? first : second)[i]["response"]) << i;
    EXPECT_EQ(blinded[i]["response_b"], (a_first ? second : first)[i]["response"]) << i;
    EXPECT_FALSE(blinded[i].contains("model")) << "the blinded file names no model";
  }
  EXPECT_GT(a_is_model, 0);
  EXPECT_LT(a_is_model, 12);
  std::ifstream md(stem.string() + ".md");
  std::string table((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  EXPECT_EQ(count(table, "\n"), 14) << table;
  EXPECT_NE(table.find("| 11 | Question 11 |"), std::string::npos) << table;
}

// A Hugging Face model directory's generation_config.json sets the sampling unless options do, and
// its eos_token_id (here [], as transformers reads it: no end token) the stop ids.
TEST(CliInfer, GenerationConfigSetsTheDefaults) {
  const fs::path model = scratch_root() / "glm_a_sampling";
  fs::remove_all(model);
  fs::copy(std::string(GLM_TEST_WORKDIR) + "/tests/data/glm_a", model);
  std::ofstream(model / "generation_config.json")
      << R"({"do_sample": true, "temperature": 0.7, "top_p": 0.9, "eos_token_id": [], "max_new_tokens": 9})";
  const std::string prompts = write_file("gc_prompts.jsonl", R"({"messages": [{"role": "user", "content": "hi"}]})" "\n");
  const std::string result = (scratch_root() / "gc_result.jsonl").string();
  const RunResult r = run_glm("infer --model_id_or_path " + model.string() + " --val_dataset " + prompts +
                                  " --result_path " + result, 1);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("temperature 0.7, top_p 0.9, top_k 50, seed 42 (from options, then " +
                          (model / "generation_config.json").string() + "); up to 9 new tokens"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("stop ids []"), std::string::npos) << r.output;
  EXPECT_EQ(result_rows(result).at(0)["response_tokens"], 9) << "no end token: max_new_tokens ends it";
  const RunResult greedy = run_glm("infer --model_id_or_path " + model.string() + " --val_dataset " + prompts +
                                       " --temperature 0 --max_new_tokens 3 --result_path " + result, 1);
  ASSERT_EQ(greedy.exit_code, 0) << greedy.output;
  EXPECT_NE(greedy.output.find("glm_hpc: greedy (from options, then"), std::string::npos) << greedy.output;
  EXPECT_NE(greedy.output.find("up to 3 new tokens"), std::string::npos) << greedy.output;
}

// Beam search set as transformers sets it (generation_config.json's num_beams, length_penalty and
// early_stopping, options over them): the reply of transformers' generate(num_beams=4) to the first
// beam fixture prompt (tests/data/glm_a/beam_search.json, its end tokens), on one rank and two.
TEST(CliInfer, BeamSearchGivesTransformersReply) {
  std::ifstream in(std::string(GLM_TEST_WORKDIR) + "/tests/data/glm_a/beam_search.json");
  const nlohmann::json golden = nlohmann::json::parse(in);
  const nlohmann::json& c = golden["cases"][1];
  ASSERT_EQ(c["num_beams"], 4);
  const fs::path model = scratch_root() / "glm_a_beams";
  fs::remove_all(model);
  fs::copy(std::string(GLM_TEST_WORKDIR) + "/tests/data/glm_a", model);
  std::ofstream(model / "generation_config.json") << nlohmann::json({{"do_sample", false},
                                                                     {"num_beams", 4},
                                                                     {"length_penalty", 0.5},
                                                                     {"early_stopping", "never"},
                                                                     {"eos_token_id", c["eos_token_id"][0]},
                                                                     {"max_new_tokens", c["max_new_tokens"]}})
                                                         .dump();
  const std::string prompt = nlohmann::json({{"input_ids", golden["prompts"][0]}}).dump() + "\n";
  const std::string prompts = write_file("beam_prompts.jsonl", prompt + prompt + prompt);
  std::vector<int32_t> expected = c["replies"][0].get<std::vector<int32_t>>();
  expected.pop_back();  // its end token
  for (const int ranks : {1, 2}) {
    const std::string result = (scratch_root() / ("beams_" + std::to_string(ranks) + ".jsonl")).string();
    const RunResult r =
        run_glm("infer --model_id_or_path " + model.string() + " --val_dataset " + prompts +
                    " --length_penalty 1 --early_stopping false --max_batch_size 2 --result_path " + result,
                ranks);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("glm_hpc: beam search of 4 beams (length_penalty 1, early_stopping false), greedy (from "
                            "options, then "),
              std::string::npos)
        << r.output;
    const std::vector<nlohmann::json> rows = result_rows(result);
    ASSERT_EQ(rows.size(), 3u);
    for (const nlohmann::json& row : rows) {
      EXPECT_EQ(row["response_ids"].get<std::vector<int32_t>>(), expected) << row;
      EXPECT_EQ(row["finish_reason"], "stop") << row;
      EXPECT_NEAR(row["beam_score"].get<double>(), c["scores"][0].get<double>(), 1e-4) << row;
    }
  }
  const std::string result = (scratch_root() / "beams_off.jsonl").string();
  const RunResult greedy = run_glm("infer --model_id_or_path " + model.string() + " --val_dataset " + prompts +
                                       " --num_beams 1 --result_path " + result,
                                   1);
  ASSERT_EQ(greedy.exit_code, 0) << greedy.output;
  EXPECT_NE(greedy.output.find("glm_hpc: greedy (from options, then"), std::string::npos) << greedy.output;
  EXPECT_FALSE(result_rows(result).at(0).contains("beam_score"));
  expect_bad_input("infer --model_id_or_path " + model.string() + " --val_dataset " + prompts + " --num_beams 0",
                   "--num_beams must be >= 1");
  expect_bad_input(
      "infer --model_id_or_path " + model.string() + " --val_dataset " + prompts + " --early_stopping sometimes",
      "--early_stopping must be false, true or never or model");
}

// eval opens models as infer does: a checkpoint scores as its export does (up to the export's bf16).
TEST(CliInfer, EvalScoresACheckpointAsItsExport) {
  const std::string ckpt = trained_checkpoint("eval_ckpt");
  const std::string data = std::string(GLM_TEST_WORKDIR) + "/data/sample/conversations.jsonl";
  const RunResult direct = run_glm("eval --ckpt_dir " + ckpt + " --dataset " + data, 2);
  ASSERT_EQ(direct.exit_code, 0) << direct.output;
  EXPECT_NE(direct.output.find("glm_hpc: eval of checkpoint " + ckpt), std::string::npos) << direct.output;
  const std::string exported = (scratch_root() / "eval_exported").string();
  const RunResult e = run_glm("export --ckpt_dir " + ckpt + " --save_dir " + exported, 1);
  ASSERT_EQ(e.exit_code, 0) << e.output;
  const RunResult via_export = run_glm("eval --model_id_or_path " + exported + " --dataset " + data, 2);
  ASSERT_EQ(via_export.exit_code, 0) << via_export.output;
  auto loss = [](const std::string& out) {
    const size_t at = out.find("eval_loss: ");
    return at == std::string::npos ? -1.0 : std::stod(out.substr(at + 11));
  };
  ASSERT_GT(loss(direct.output), 0) << direct.output;
  EXPECT_NEAR(loss(direct.output), loss(via_export.output), 1e-2 * loss(direct.output));
}

TEST(CliInfer, BadPromptsAndOptionsExitTwoWithOneMessage) {
  const std::string ckpt = trained_checkpoint("infer_bad");
  const std::string bad = write_file("bad_prompts.jsonl",
                                     R"({"messages": [{"role": "user", "content": "fine"}]})" "\n"
                                     "{broken\n"
                                     R"({"messages": [{"role": "user", "content": "q"}, {"role": "system", "content": "s"}]})" "\n"
                                     R"({"input_ids": [1, 99999]})" "\n");
  const RunResult r = run_glm("infer --ckpt_dir " + ckpt + " --val_dataset " + bad, 2);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(count(r.output, "glm_hpc: error:"), 1) << r.output;
  EXPECT_NE(r.output.find("3 bad prompt(s)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bad_prompts.jsonl:2: malformed JSON"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bad_prompts.jsonl:3: nothing to answer"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bad_prompts.jsonl:4: input_ids[1] = 99999 is not a token id"), std::string::npos)
      << r.output;
  expect_bad_input("infer", "--model_id_or_path (or --ckpt_dir DIR, or --adapters DIR) is required");
  expect_bad_input("infer --ckpt_dir " + ckpt + " --temperature -1", "--temperature must be >= 0");
  expect_bad_input("infer --ckpt_dir " + ckpt + " --top_k many", "--top_k must be an integer or model");
  expect_bad_input("infer --ckpt_dir " + ckpt + " --result_path x.jsonl", "--result_path needs --val_dataset");
  expect_bad_input(kTiny + "--max_new_tokens 5", "--max_new_tokens is an option of 'glm_hpc infer'");
  expect_bad_input("infer --ckpt_dir " + ckpt, "an interactive chat runs on one process");
  expect_bad_input("infer --ckpt_dir " + (scratch_root() / "nothing_here").string() + " --val_dataset " +
                       prompt_file("fine.jsonl"),
                   "nothing_here' is not a directory");
}

}  // namespace
}  // namespace glm::test
