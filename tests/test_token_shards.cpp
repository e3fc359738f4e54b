// Token shards: a prepared directory reads back as the dataset that was written (samples, labels,
// report, loader batches), and every kind of damage to it is one precise user error.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "base/input_path.h"
#include "base/stop_signal.h"
#include "base/text.h"
#include "data/content_hash.h"
#include "data/dataset_cache.h"
#include "data/packing.h"
#include "data/sharded_loader.h"
#include "data/token_shards.h"

namespace glm::test {
namespace {

namespace fs = std::filesystem;

// Per process: ctest runs every test case as its own process, in parallel.
fs::path fresh_dir_root() { return fs::temp_directory_path() / ("glm_hpc_shard_tests_" + std::to_string(::getpid())); }

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fresh_dir_root() / name;
  fs::remove_all(dir);
  fs::create_directories(dir.parent_path());
  return dir;
}

std::string write_text(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  return path.string();
}

// Conversations of varied length, one too long for max_length 40 (truncated left), and a
// pre-tokenized line whose labels differ from its tokens.
Dataset source_dataset() {
  std::string lines;
  for (int i = 0; i < 25; ++i)
    lines += R"({"messages": [{"role": "user", "content": "question )" + std::to_string(i) +
             R"("}, {"role": "assistant", "content": ")" + std::string(static_cast<size_t>(i % 7), 'x') + R"(a"}]})" +
             "\n";
  lines += R"({"messages": [{"role": "user", "content": "a long question that needs truncation"}, )"
           R"({"role": "assistant", "content": "and a long answer"}]})"
           "\n";
  lines += R"({"input_ids": [1, 2, 3, 4], "labels": [-100, 2, 271, 4]})"
           "\n";
  const std::string path = write_text(fresh_dir("source") / "data.jsonl", lines);
  ByteTokenizer tok;
  auto d = load_dataset({path}, &tok, 40, 272, false, Truncation::left);
  EXPECT_TRUE(d.is_ok()) << d.status().message();
  EXPECT_EQ(d.value().report.truncated, 1);
  return d.take();
}

PrepareInfo info() {
  PrepareInfo p;
  p.datasets = {"data.jsonl"};
  p.max_length = 40;
  p.truncation = Truncation::left;
  p.loss_scale = LossScale::assistant;
  p.tokenizer = "bytes";
  p.tokenizer_hash = ByteTokenizer().content_hash();
  return p;
}

void expect_same_samples(const Dataset& a, const Dataset& b) {
  ASSERT_EQ(a.size(), b.size());
  for (int64_t i = 0; i < a.size(); ++i) {
    const SampleView x = a.sample(i), y = b.sample(i);
    EXPECT_TRUE(std::equal(x.tokens.begin(), x.tokens.end(), y.tokens.begin(), y.tokens.end())) << "sample " << i;
    EXPECT_TRUE(std::equal(x.labels.begin(), x.labels.end(), y.labels.begin(), y.labels.end())) << "sample " << i;
  }
}

TEST(TokenShards, RoundTripAcrossSeveralShards) {
  const Dataset d = source_dataset();
  const fs::path dir = fresh_dir("round_trip");
  ASSERT_TRUE(write_token_shards(d, 272, info(), dir.string(), 200).is_ok());
  EXPECT_TRUE(fs::exists(dir / "shard_00002.bin")) << "200-token shards: several files";
  EXPECT_FALSE(fs::exists(dir / "shard_00000.bin.tmp"));
  ASSERT_TRUE(is_prepared_dir(dir.string()));
  auto loaded = load_dataset({dir.string()}, nullptr, 40, 272);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  const Dataset& m = loaded.value();
  EXPECT_TRUE(m.samples.empty()) << "mapped, not copied";
  expect_same_samples(d, m);
  EXPECT_EQ(m.sample(26).labels[2], 271) << "a label other than its token survives";
  EXPECT_EQ(m.report.describe(), d.report.describe());
  EXPECT_EQ(m.report.lengths, d.report.lengths);
  EXPECT_NE(m.prepared.find("prepared from data.jsonl, loss_scale default"), std::string::npos) << m.prepared;
  // The loader and the packer see the same data.
  auto plan_a = pack_dataset(d, 40), plan_b = pack_dataset(m, 40);
  ASSERT_TRUE(plan_a.is_ok() && plan_b.is_ok());
  EXPECT_EQ(plan_a.value().sample_order, plan_b.value().sample_order);
  ShardedLoader la(d, 5, 0, 1, 3, 1), lb(m, 5, 0, 1, 3, 1);
  for (int64_t step = 0; step < 12; ++step) {
    const HostMicroBatch x = la.micro_batch(step, 0), y = lb.micro_batch(step, 0);
    EXPECT_EQ(x.tokens, y.tokens);
    EXPECT_EQ(x.targets, y.targets);
    EXPECT_EQ(x.doc_start, y.doc_start);
  }
  // A validation split of a mapped dataset selects from the same shards.
  Dataset train = m, held;
  ASSERT_TRUE(split_dataset(train, 0.2, 3, held).is_ok());
  EXPECT_EQ(train.size() + held.size(), m.size());
  EXPECT_EQ(held.size(), 5);
  auto tokens_of = [](const Dataset& part, std::multiset<std::vector<int32_t>>& into) {
    for (int64_t i = 0; i < part.size(); ++i) into.emplace(part.sample(i).tokens.begin(), part.sample(i).tokens.end());
  };
  std::multiset<std::vector<int32_t>> all, parts;
  tokens_of(m, all);
  tokens_of(train, parts);
  tokens_of(held, parts);
  EXPECT_EQ(parts, all) << "every sample in exactly one part";
  EXPECT_EQ(held.report.kept, 5);
}

TEST(TokenShards, RewritingAPreparedDirectoryReplacesIt) {
  const Dataset d = source_dataset();
  const fs::path dir = fresh_dir("rewrite");
  ASSERT_TRUE(write_token_shards(d, 272, info(), dir.string(), 100).is_ok());
  ASSERT_TRUE(fs::exists(dir / "shard_00004.bin"));
  ASSERT_TRUE(write_token_shards(d, 272, info(), dir.string()).is_ok());
  EXPECT_FALSE(fs::exists(dir / "shard_00004.bin")) << "stale shards are removed";
  auto loaded = load_prepared(dir.string(), 272);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  expect_same_samples(d, loaded.value());
  const fs::path foreign = fresh_dir("foreign");
  write_text(foreign / "notes.txt", "mine");
  Status s = write_token_shards(d, 272, info(), foreign.string());
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("holds files that glm_hpc prepare did not write"), std::string::npos) << s.message();
}

// A line that is not UTF-8 skipped with --on_bad_sample skip: its reason (with the parser's excerpt
// of the raw bytes) is kept as \xNN, and the manifest that records it is written and read back.
TEST(TokenShards, SkippedInvalidUtf8LineIsRecorded) {
  const std::string good = R"({"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"ok"}]})";
  const std::string bad =
      "{\"messages\":[{\"role\":\"user\",\"content\":\"caf\xe9 x\"},"
      "{\"role\":\"assistant\",\"content\":\"ok\"}]}";
  const std::string path = write_text(fresh_dir("utf8") / "u.jsonl", good + "\n" + bad + "\n");
  ByteTokenizer tok;
  auto d = load_dataset({path}, &tok, 0, 272, /*skip_bad=*/true);
  ASSERT_TRUE(d.is_ok()) << d.status().message();
  EXPECT_EQ(d.value().report.skipped_bad, 1);
  EXPECT_TRUE(is_valid_utf8(d.value().report.skipped_reasons)) << d.value().report.skipped_reasons;
  EXPECT_NE(d.value().report.skipped_reasons.find("u.jsonl:2: malformed JSON"), std::string::npos);
  EXPECT_NE(d.value().report.skipped_reasons.find("caf\\xe9"), std::string::npos) << d.value().report.skipped_reasons;
  // A dataset path that is not UTF-8 either (file names are bytes): stored with U+FFFD, no exception.
  PrepareInfo p = info();
  p.datasets = {"caf\xe9.jsonl"};
  const fs::path dir = fresh_dir("utf8_prepared");
  Status wrote = write_token_shards(d.value(), 272, p, dir.string());
  ASSERT_TRUE(wrote.is_ok()) << wrote.message();
  auto loaded = load_prepared(dir.string(), 272);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  EXPECT_EQ(loaded.value().report.skipped_reasons, d.value().report.skipped_reasons);
  EXPECT_NE(loaded.value().prepared.find("caf\xef\xbf\xbd.jsonl"), std::string::npos) << loaded.value().prepared;
}

// dir holds exactly the one-shard preparation of d written before, and it loads as d.
void expect_earlier_preparation_whole(const fs::path& dir, const Dataset& d) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"prepared.json", "shard_00000.bin"}));
  auto loaded = load_prepared(dir.string(), 272);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  expect_same_samples(d, loaded.value());
}

// A write that fails (here: past the process's file-size limit, ulimit -f, as glm_hpc ignores
// SIGXFSZ) names the file and the reason, leaves no temporary behind and the earlier preparation in
// the directory loadable as it was.
TEST(TokenShards, FailedWriteLeavesNoTemporaries) {
  const Dataset d = source_dataset();
  const fs::path dir = fresh_dir("failed_write");
  ASSERT_TRUE(write_token_shards(d, 272, info(), dir.string()).is_ok());
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  const auto previous = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 16;  // not even a shard's header
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  Status s = write_token_shards(d, 272, info(), dir.string(), 100);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  std::signal(SIGXFSZ, previous);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("cannot write '" + (dir / "shard_00000.bin").string() + "': "), std::string::npos)
      << s.message();
  expect_earlier_preparation_whole(dir, d);
}

// Clears the stop flag whichever way a test leaves.
struct StopFlagReset {
  StopFlagReset() { clear_stop_signal(); }
  ~StopFlagReset() { clear_stop_signal(); }
};

// A stop by signal (the flag the handlers set) ends hashing, tokenizing and writing with an
// ErrorKind::stopped status (exit code 75), and leaves no temporary file: not in a prepared
// directory, whose earlier preparation stays loadable, nor in the tokenization cache.
TEST(TokenShards, StopBySignalEndsCleanly) {
  StopFlagReset reset;
  const Dataset d = source_dataset();
  const fs::path dir = fresh_dir("stopped");
  ASSERT_TRUE(write_token_shards(d, 272, info(), dir.string()).is_ok());
  const std::string jsonl = write_text(fresh_dir("stopped_source") / "x.jsonl",
                                       R"({"input_ids": [1, 2, 3], "labels": [1, 2, 3]})"
                                       "\n");
  const fs::path cache = fresh_dir("stopped_cache");
  fs::create_directories(cache);
  request_stop(SIGTERM);
  Status wrote = write_token_shards(d, 272, info(), dir.string(), 100);
  ASSERT_FALSE(wrote.is_ok());
  EXPECT_EQ(wrote.kind(), ErrorKind::stopped);
  EXPECT_EQ(wrote.exit_code(), 75);
  EXPECT_NE(wrote.message().find("stopped by SIGTERM while writing"), std::string::npos) << wrote.message();
  auto hashed = hash_file(jsonl);
  ASSERT_FALSE(hashed.is_ok());
  EXPECT_NE(hashed.status().message().find("stopped by SIGTERM while hashing"), std::string::npos);
  ByteTokenizer tok;
  auto read = load_dataset({jsonl}, &tok, 0, 272);
  ASSERT_FALSE(read.is_ok());
  EXPECT_NE(read.status().message().find("stopped by SIGTERM while tokenizing '" + jsonl), std::string::npos)
      << read.status().message();
  DatasetLoadOptions options;
  options.tokenizer = &tok;
  options.vocab_size = 272;
  auto cached = load_dataset_cached(cache.string(), true, {jsonl}, options);
  ASSERT_FALSE(cached.is_ok());
  EXPECT_EQ(cached.status().kind(), ErrorKind::stopped);
  clear_stop_signal();
  EXPECT_TRUE(fs::is_empty(cache)) << "nothing written to the cache";
  expect_earlier_preparation_whole(dir, d);
  // Without a stop the same calls succeed.
  EXPECT_TRUE(hash_file(jsonl).is_ok());
  EXPECT_TRUE(load_dataset_cached(cache.string(), true, {jsonl}, options).is_ok());
}

// What each reader is given is checked before it opens it: FIFOs and devices never reach open().
TEST(InputPath, SpecialFilesAreRefusedWithoutOpeningThem) {
  const fs::path dir = fresh_dir("special");
  fs::create_directories(dir);
  const std::string fifo = (dir / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string file = write_text(dir / "file.jsonl", "{}\n");
  EXPECT_TRUE(check_input_path(file).is_ok());
  EXPECT_TRUE(check_input_path((dir / "missing").string()).is_ok()) << "the reader says it cannot open it";
  EXPECT_TRUE(check_input_path(dir.string(), InputKind::directory).is_ok());
  EXPECT_TRUE(check_input_path(dir.string(), InputKind::file_or_directory).is_ok());
  EXPECT_EQ(check_input_path(fifo).message(), "'" + fifo + "' is a FIFO (named pipe), not a regular file");
  EXPECT_EQ(check_input_path("/dev/zero").message(), "'/dev/zero' is a character device, not a regular file");
  EXPECT_EQ(check_input_path(dir.string()).exit_code(), 2);
  EXPECT_EQ(check_input_path(file, InputKind::directory).message(), "'" + file + "' is a regular file, not a directory");
  // The readers: a dataset, its hash for the cache key, a tokenizer rank file.
  ByteTokenizer tok;
  auto d = load_dataset({fifo}, &tok, 0, 272);
  ASSERT_FALSE(d.is_ok());
  EXPECT_NE(d.status().message().find("is a FIFO (named pipe), not a regular file"), std::string::npos);
  EXPECT_FALSE(hash_file("/dev/zero").is_ok());
  auto t = load_tokenizer("/dev/zero");
  ASSERT_FALSE(t.is_ok());
  EXPECT_NE(t.status().message().find("'/dev/zero' is a character device"), std::string::npos);
}

TEST(PrintableText, EscapesExactlyTheIllFormedBytes) {
  EXPECT_EQ(printable_text("plain, tab\t and newline\n"), "plain, tab\t and newline\n");
  EXPECT_EQ(printable_text("caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80"), "caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80");
  EXPECT_EQ(printable_text("caf\xe9 x"), "caf\\xe9 x");                   // Latin-1
  EXPECT_EQ(printable_text("\x80"), "\\x80");                             // a stray continuation byte
  EXPECT_EQ(printable_text("\xc0\xaf"), "\\xc0\\xaf");                    // overlong '/'
  EXPECT_EQ(printable_text("\xed\xa0\x80"), "\\xed\\xa0\\x80");           // a UTF-16 surrogate
  EXPECT_EQ(printable_text("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
  EXPECT_EQ(printable_text("ab\xe4\xb8"), "ab\\xe4\\xb8");                // truncated at the end
  EXPECT_EQ(printable_text("\xe4\xb8x"), "\\xe4\\xb8x");                  // truncated in the middle
  EXPECT_TRUE(is_valid_utf8(printable_text("\xff\xfe\xc3")));
  // Status messages are always valid UTF-8, whatever was quoted into them.
  EXPECT_EQ(GLM_USER_ERROR("cannot open '", std::string("caf\xe9"), "'").message(), "cannot open 'caf\\xe9'");
}

// Shards keep the content hash of their tokenizer: loading them for another tokenizer is refused,
// for the same one (or without a tokenizer, or when none made them) accepted.
TEST(TokenShards, AnotherTokenizerIsRefused) {
  const Dataset d = source_dataset();
  const fs::path dir = fresh_dir("tokenizer");
  ASSERT_TRUE(write_token_shards(d, 272, info(), dir.string()).is_ok());
  ByteTokenizer bytes;
  EXPECT_TRUE(load_prepared(dir.string(), 272, &bytes).is_ok());
  EXPECT_TRUE(load_prepared(dir.string(), 272, nullptr).is_ok());
  auto tiktoken = load_tokenizer(std::string(GLM_SOURCE_DIR) + "/data/sample/tokenizer.model");
  ASSERT_TRUE(tiktoken.is_ok()) << tiktoken.status().message();
  auto refused = load_dataset({dir.string()}, tiktoken.value().get(), 40, 2000);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().kind(), ErrorKind::user_input);
  EXPECT_NE(refused.status().message().find(concat("was tokenized with bytes (", bytes.content_hash(),
                                                   ") but this run's tokenizer is ", tiktoken.value()->source())),
            std::string::npos)
      << refused.status().message();

  // Pre-tokenized data prepared without a tokenizer records none: any tokenizer may read it.
  PrepareInfo none = info();
  none.tokenizer = none.tokenizer_hash = "";
  ASSERT_TRUE(write_token_shards(d, 272, none, dir.string()).is_ok());
  EXPECT_TRUE(load_prepared(dir.string(), 2000, tiktoken.value().get()).is_ok());

  // A manifest from before tokenizer hashes were recorded: prepare it again.
  const fs::path manifest = dir / "prepared.json";
  nlohmann::json m = nlohmann::json::parse(std::ifstream(manifest));
  m["prepared_from"].erase("tokenizer_hash");
  std::ofstream(manifest, std::ios::trunc) << m.dump();
  auto old = load_prepared(dir.string(), 272, &bytes);
  ASSERT_FALSE(old.is_ok());
  EXPECT_NE(old.status().message().find("does not record the content hash of the tokenizer"), std::string::npos)
      << old.status().message();
}

// 64-bit FNV-1a over little-endian words, as the format defines the checksum.
uint64_t checksum(const std::string& payload) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i + 8 <= payload.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, payload.data() + i, 8);
    h = (h ^ w) * 0x100000001b3ULL;
  }
  return h;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Each case damages a fresh copy of one prepared directory and expects this message.
class DamagedShards : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(write_token_shards(source_dataset(), 272, info(), pristine().string()).is_ok());
  }
  static fs::path pristine() { return fresh_dir_root() / "pristine"; }
  fs::path copy(const std::string& name) {
    const fs::path dir = fresh_dir(name);
    fs::copy(pristine(), dir);
    return dir;
  }
  void expect_error(const fs::path& dir, const std::string& needle, int64_t vocab = 272) {
    auto r = load_dataset({dir.string()}, nullptr, 0, vocab);
    ASSERT_FALSE(r.is_ok()) << "expected: " << needle;
    EXPECT_EQ(r.status().exit_code(), 2) << r.status().message();
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  }
};

TEST_F(DamagedShards, TruncatedOrExtendedFiles) {
  const fs::path cut = copy("cut");
  std::string bytes = read_bytes(cut / "shard_00000.bin");
  write_text(cut / "shard_00000.bin", bytes.substr(0, bytes.size() - 4));
  expect_error(cut, "shard_00000.bin' is truncated: " + std::to_string(bytes.size() - 4) +
                        " bytes, its header promises " + std::to_string(bytes.size()));
  write_text(cut / "shard_00000.bin", bytes.substr(0, 10));
  expect_error(cut, "is truncated: 10 bytes, less than its 64-byte header");
  write_text(cut / "shard_00000.bin", "");
  expect_error(cut, "is truncated: 0 bytes");
  write_text(cut / "shard_00000.bin", bytes + "garbage!");
  expect_error(cut, "has 8 bytes after its data");
}

TEST_F(DamagedShards, CorruptHeaderOrContents) {
  const fs::path dir = copy("corrupt");
  const std::string good = read_bytes(dir / "shard_00000.bin");
  std::string bytes = good;
  bytes[0] = 'X';
  write_text(dir / "shard_00000.bin", bytes);
  expect_error(dir, "is not a glm_hpc token shard (wrong magic)");
  bytes = good;
  bytes[8] = 2;  // version
  write_text(dir / "shard_00000.bin", bytes);
  expect_error(dir, "has format version 2; this glm_hpc reads version 1");
  bytes = good;
  bytes[bytes.size() - 6] ^= 0x10;  // one bit of one label
  write_text(dir / "shard_00000.bin", bytes);
  expect_error(dir, "is corrupt: its checksum does not match its contents");
  // A consistent checksum over insane values: a token id outside the vocabulary.
  bytes = good;
  int64_t samples;
  std::memcpy(&samples, bytes.data() + 24, 8);
  const size_t first_token = 64 + 8 * static_cast<size_t>(samples + 1);
  const int32_t big = 5000;
  std::memcpy(bytes.data() + first_token, &big, 4);
  const uint64_t sum = checksum(bytes.substr(64));
  std::memcpy(bytes.data() + 40, &sum, 8);
  write_text(dir / "shard_00000.bin", bytes);
  expect_error(dir, "token 0 (id 5000, label -1) is outside the vocabulary of 272");
  write_text(dir / "shard_00000.bin", good);
  expect_error(dir, "was prepared for vocab_size 272, above the model's 200", 200);
}

TEST_F(DamagedShards, BrokenManifest) {
  const fs::path dir = copy("manifest");
  const std::string good = read_bytes(dir / "prepared.json");
  write_text(dir / "prepared.json", good.substr(0, good.size() / 2));
  expect_error(dir, "prepared.json' is not valid JSON");
  nlohmann::json m = nlohmann::json::parse(good);
  m["shards"][0]["samples"] = 3;
  write_text(dir / "prepared.json", m.dump());
  expect_error(dir, "holds 27 samples and");
  m = nlohmann::json::parse(good);
  m["shards"][0]["file"] = "../pristine/shard_00000.bin";
  write_text(dir / "prepared.json", m.dump());
  expect_error(dir, "names a shard outside its directory");
  m = nlohmann::json::parse(good);
  m.erase("report");
  write_text(dir / "prepared.json", m.dump());
  expect_error(dir, "prepared.json: field 'report' is missing");
  m = nlohmann::json::parse(good);
  m["shards"][0]["samples"] = "27";
  write_text(dir / "prepared.json", m.dump());
  expect_error(dir, "prepared.json: field 'shards[0].samples' must be an integer >= 0, got \"27\"");
  m = nlohmann::json::parse(good);
  m["report"]["lengths"][2] = -4;
  write_text(dir / "prepared.json", m.dump());
  expect_error(dir, "prepared.json: field 'report.lengths[2]' must be an integer >= 0, got -4");
  m = nlohmann::json::parse(good);
  m["version"] = "1";
  write_text(dir / "prepared.json", m.dump());
  expect_error(dir, "has version \"1\"; this glm_hpc reads 1");
  write_text(dir / "prepared.json", good);
  fs::remove(dir / "shard_00000.bin");
  expect_error(dir, "cannot open token shard");
}

TEST_F(DamagedShards, LengthAndMixingRules) {
  auto r = load_dataset({pristine().string()}, nullptr, 20, 272);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("holds samples of up to 40 tokens (prepared with max_length 40), longer than "
                                      "--max_length 20"),
            std::string::npos)
      << r.status().message();
  const std::string jsonl = write_text(fresh_dir("mix") / "x.jsonl", R"({"input_ids": [1, 2], "labels": [1, 2]})");
  auto mixed = load_dataset({jsonl, pristine().string()}, nullptr, 0, 272);
  ASSERT_FALSE(mixed.is_ok());
  EXPECT_NE(mixed.status().message().find("is a prepared directory: give it as the only --dataset"), std::string::npos)
      << mixed.status().message();
}

}  // namespace
}  // namespace glm::test
