// The GLM-4 tokenizer: rank-file errors with file:line, BPE merge order on hand-made ranks, both
// merge searches agreeing, special tokens at the spec's ids, exact bytes back for invalid UTF-8,
// and ids identical to npm tiktoken's (tools/tiktoken_peer) on tests/data/tokenizer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "data/bpe_trainer.h"
#include "data/sharded_loader.h"
#include "data/tiktoken_tokenizer.h"

namespace glm::test {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / "glm_hpc_tokenizer_tests" / concat(name, "_", getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string base64(std::string_view bytes) {
  const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t group = 0;
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    for (size_t k = 0; k < n; ++k)
      group |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + k])) << (16 - 8 * k);
    for (size_t k = 0; k < 4; ++k) out += k <= n ? alphabet[(group >> (18 - 6 * k)) & 63] : '=';
  }
  return out;
}

// A rank file: the 256 single bytes in byte order (ranks 0..255), then `merges` from rank 256.
std::string rank_file(const std::vector<std::string>& merges) {
  std::string text;
  for (int b = 0; b < 256; ++b) text += concat(base64(std::string(1, static_cast<char>(b))), " ", b, "\n");
  for (size_t i = 0; i < merges.size(); ++i) text += concat(base64(merges[i]), " ", 256 + i, "\n");
  return text;
}

TiktokenTokenizer make_tokenizer(const std::vector<std::string>& merges) {
  auto ranks = BpeRanks::parse(rank_file(merges), "test.model");
  EXPECT_TRUE(ranks.is_ok()) << ranks.status().message();
  auto tokenizer = TiktokenTokenizer::create(ranks.take());
  EXPECT_TRUE(tokenizer.is_ok()) << tokenizer.status().message();
  return tokenizer.take();
}

std::vector<int32_t> merge(const BpeRanks& ranks, std::string_view piece, MergeSearch search) {
  std::vector<int32_t> out;
  BpeScratch scratch;
  byte_pair_encode(ranks, piece, out, scratch, search);
  return out;
}

void expect_parse_error(const std::string& text, const std::string& needle) {
  auto r = BpeRanks::parse(text, "bad.model");
  ASSERT_FALSE(r.is_ok()) << "expected an error containing '" << needle << "'";
  EXPECT_EQ(r.status().kind(), ErrorKind::user_input);
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
}

TEST(BpeRanks, MalformedFilesNameFileAndLine) {
  const std::string good = rank_file({});
  expect_parse_error(good + "YWI=\n", "bad.model:257: expected '<base64 token bytes> <rank>', got 'YWI='");
  expect_parse_error(good + "YWI= 256 7\n", "bad.model:257: expected");
  expect_parse_error(good + "YW*= 256\n", "bad.model:257: token 'YW*=' is not base64");
  expect_parse_error(good + "YWI 256\n", "bad.model:257: token 'YWI' is not base64");
  expect_parse_error(good + "YWI= -1\n", "bad.model:257: rank '-1' is not an integer");
  expect_parse_error(good + "YWI= 2x\n", "bad.model:257: rank '2x' is not an integer");
  expect_parse_error(good + "YWI= 99999999999\n", "bad.model:257: rank '99999999999' is not an integer");
  expect_parse_error(good + "YWI= 3\n", "bad.model:257: duplicate rank 3 (also on line 4)");
  expect_parse_error(good + "YWI= 300\n", "bad.model:257: rank 300 is out of range: the file's 257 tokens");
  expect_parse_error(good + "YQ== 256\n", "bad.model:257: token 'YQ==' already has rank 97 (line 98)");
  expect_parse_error("", "bad.model: no ranks");
  expect_parse_error("\n\n", "bad.model: no ranks");
  // Bytes 0..254 only: the missing byte could not be encoded at all.
  std::string no_ff;
  for (int b = 0; b < 255; ++b) no_ff += concat(base64(std::string(1, static_cast<char>(b))), " ", b, "\n");
  expect_parse_error(no_ff, "bad.model: byte 0xff has no rank");
}

TEST(BpeRanks, ParsesBlankLinesAndCrlf) {
  std::string text = "\n";
  text += rank_file({"ab"});
  text += "\r\n";
  auto r = BpeRanks::parse(text, "ok.model");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r.value().size(), 257);
  EXPECT_EQ(r.value().find("ab"), 256);
  EXPECT_EQ(r.value().find("ba"), BpeRanks::kNoRank);
  EXPECT_EQ(r.value().bytes(256), "ab");
  EXPECT_EQ(r.value().byte_rank('a'), 97);
}

// A rank file is read whole: one past 1 GiB (a sparse file here, nothing is written) is refused by
// its size before any byte is read, naming the bound.
TEST(TiktokenTokenizer, RankFileOverItsBoundIsRefusedUnread) {
  const fs::path dir = scratch("huge");
  const fs::path path = dir / "tokenizer.model";
  std::ofstream(path).close();
  fs::resize_file(path, (uintmax_t{1} << 30) + 1);
  auto huge = load_tokenizer(path.string());
  ASSERT_FALSE(huge.is_ok());
  EXPECT_EQ(huge.status().exit_code(), 2);
  EXPECT_NE(huge.status().message().find("a tiktoken rank file may hold"), std::string::npos)
      << huge.status().message();
  fs::remove_all(dir);
}

TEST(TiktokenTokenizer, LoadsFileOrModelDirectoryWithClearErrors) {
  const fs::path dir = scratch("load");
  auto missing = TiktokenTokenizer::load((dir / "nope.model").string());
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("cannot open tokenizer file '" + (dir / "nope.model").string()),
            std::string::npos)
      << missing.status().message();

  auto empty_dir = TiktokenTokenizer::load(dir.string());
  ASSERT_FALSE(empty_dir.is_ok());
  EXPECT_NE(empty_dir.status().message().find("holds neither tokenizer.model nor tokenizer.json"), std::string::npos);

  write_file(dir / "tokenizer.json", "{}");
  auto hf_only = TiktokenTokenizer::load(dir.string());
  ASSERT_FALSE(hf_only.is_ok());
  EXPECT_NE(hf_only.status().message().find("tokenizer.json: \"model\" is not a BPE model"), std::string::npos)
      << hf_only.status().message();
  fs::remove(dir / "tokenizer.json");

  write_file(dir / "tokenizer.model", rank_file({"ab"}) + "bad line\n");
  auto bad = load_tokenizer(dir.string());
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find((dir / "tokenizer.model").string() + ":258:"), std::string::npos)
      << bad.status().message();

  write_file(dir / "tokenizer.model", rank_file({"ab"}));
  auto from_dir = load_tokenizer(dir.string());
  ASSERT_TRUE(from_dir.is_ok()) << from_dir.status().message();
  auto from_file = load_tokenizer((dir / "tokenizer.model").string());
  ASSERT_TRUE(from_file.is_ok()) << from_file.status().message();
  EXPECT_EQ(from_dir.value()->encode("abab"), (std::vector<int32_t>{256, 256}));
  EXPECT_EQ(from_file.value()->vocab_size(), 257 + 14);
  fs::remove_all(dir);
}

TEST(BytePairEncode, MergesLowestRankFirstAndLeftmostOnTies) {
  // "bc" ranks below "ab", so "abc" is a + bc, then a + bc = "abc" if that has a rank.
  TiktokenTokenizer t1 = make_tokenizer({"bc", "ab", "abc"});
  // "ab" ranks below "bc": ab + c, and "abc" is never formed from a + bc.
  TiktokenTokenizer t2 = make_tokenizer({"ab", "bc", "bca"});
  // Equal ranks: the leftmost "aa" merges first, so "aaa" = aa + a (not a + aa).
  TiktokenTokenizer t3 = make_tokenizer({"aa", "aaaa"});
  for (MergeSearch search : {MergeSearch::scan, MergeSearch::heap}) {
    SCOPED_TRACE(search == MergeSearch::scan ? "scan" : "heap");
    EXPECT_EQ(merge(t1.ranks(), "abc", search), (std::vector<int32_t>{258}));
    EXPECT_EQ(merge(t1.ranks(), "abcbc", search), (std::vector<int32_t>{258, 256}));
    EXPECT_EQ(merge(t2.ranks(), "abca", search), (std::vector<int32_t>{256, 'c', 'a'}));
    EXPECT_EQ(merge(t3.ranks(), "aaa", search), (std::vector<int32_t>{256, 'a'}));
    EXPECT_EQ(merge(t3.ranks(), "aaaaa", search), (std::vector<int32_t>{257, 'a'}));
    EXPECT_EQ(merge(t3.ranks(), "aaaaaa", search), (std::vector<int32_t>{257, 256}));
    EXPECT_EQ(merge(t3.ranks(), "xy", search), (std::vector<int32_t>{'x', 'y'}));
  }
}

TEST(BytePairEncode, ScanAndHeapAgreeOnRandomPieces) {
  // Many overlapping merges over a 4-letter alphabet make long merge chains and many ties.
  SplitMix64 rng(7);
  const std::string alphabet = "ab c";
  auto random_string = [&](size_t length) {
    std::string s;
    for (size_t i = 0; i < length; ++i) s += alphabet[rng.next() % alphabet.size()];
    return s;
  };
  std::vector<std::string> merges;
  std::set<std::string> seen;
  while (merges.size() < 300) {
    std::string s = random_string(2 + rng.next() % 5);
    if (seen.insert(s).second) merges.push_back(s);
  }
  TiktokenTokenizer t = make_tokenizer(merges);
  for (int trial = 0; trial < 500; ++trial) {
    const std::string piece = random_string(1 + rng.next() % 400);
    const std::vector<int32_t> scan = merge(t.ranks(), piece, MergeSearch::scan);
    ASSERT_EQ(scan, merge(t.ranks(), piece, MergeSearch::heap)) << "piece '" << piece << "'";
    ASSERT_EQ(t.decode(scan), piece);
  }
}

TEST(TiktokenTokenizer, SpecialTokensFollowTheRanksAtTheSpecIds) {
  // GLM-4's tokenizer.model has 151329 ranks, so the specials are 151329..151342 (GLM4_SPEC.md 5.3).
  std::vector<std::string> merges;
  for (int i = 0; static_cast<int>(merges.size()) + 256 < 151329; ++i) merges.push_back(concat("t", i));
  TiktokenTokenizer t = make_tokenizer(merges);
  EXPECT_EQ(t.vocab_size(), 151343);
  EXPECT_EQ(t.special_id(SpecialToken::endoftext), 151329);
  EXPECT_EQ(t.special_id(SpecialToken::gmask), 151331);
  EXPECT_EQ(t.special_id(SpecialToken::sop), 151333);
  EXPECT_EQ(t.special_id(SpecialToken::user), 151336);
  EXPECT_EQ(t.special_id(SpecialToken::observation), 151338);
  EXPECT_EQ(t.special_id(SpecialToken::end_of_video), 151342);
  EXPECT_EQ(t.encode_special("<|assistant|>").value(), 151337);
  EXPECT_EQ(t.encode_special("[gMASK]").value(), 151331);
  auto unknown = t.encode_special("<|nope|>");
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_NE(unknown.status().message().find("'<|nope|>' is not a GLM-4 special token"), std::string::npos);

  // In ordinary text the special strings are text (spec 5.3), and decode gives the bytes back.
  const std::string text = "<|user|>\nhi<|assistant|>[gMASK]<sop><|endoftext|>";
  const std::vector<int32_t> ids = t.encode(text);
  for (int32_t id : ids) EXPECT_LT(id, 151329) << "a special id came out of ordinary text";
  EXPECT_EQ(t.decode(ids), text);
  const std::vector<int32_t> specials = {151331, 151333, 151336, 151342};
  EXPECT_EQ(t.decode(specials), "[gMASK]<sop><|user|><|end_of_video|>");
  EXPECT_EQ(t.decode(std::vector<int32_t>{151343, -1}), "<|unk|><|unk|>");
}

TEST(TiktokenTokenizer, InvalidUtf8IsItsOwnPieceAndRoundTrips) {
  TiktokenTokenizer t = make_tokenizer({"ab", " a", "\xe4\xbd", "\xff\xfe"});
  const std::vector<std::string> invalid = {
      "\xff",         "\xff\xfe",         "\x80",         "\xe4\xbd",     "\xc0\xaf",
      "\xed\xa0\x80", "\xf5\x80\x80\x80", "\xf0\x9f\x98", "\xc3\x28\x80", "\xe4\xbd\xe4\xbd"};
  const std::vector<std::string> valid = {"", "ab", " ab ", "x  ", "'s", "12345", "中文", "\n\n", "!!"};
  for (const std::string& bad : invalid) {
    for (const std::string& before : valid) {
      for (const std::string& after : valid) {
        const std::string text = before + bad + after;
        const std::vector<int32_t> ids = t.encode(text);
        ASSERT_EQ(t.decode(ids), text);
        // The invalid bytes act like the end and the start of a text: the valid parts encode as
        // they would alone.
        std::vector<int32_t> parts = t.encode(before);
        t.encode_append(bad, parts);
        t.encode_append(after, parts);
        EXPECT_EQ(ids, parts) << "before '" << before << "' after '" << after << "'";
      }
    }
  }
  // The merges still apply inside an invalid run.
  EXPECT_EQ(t.encode("\xff\xfe"), (std::vector<int32_t>{259}));
  EXPECT_EQ(t.pretokenize("ab\xff\xfe cd"), (std::vector<std::string_view>{"ab", "\xff\xfe", " cd"}));

  // Random bytes, mostly invalid UTF-8, come back exactly.
  SplitMix64 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    const size_t length = rng.next() % 200;
    for (size_t i = 0; i < length; ++i) text += static_cast<char>(rng.next() & 0xff);
    ASSERT_EQ(t.decode(t.encode(text)), text);
  }
}

TEST(TiktokenTokenizer, MegabytePiecesStayFast) {
  // One regex match of a megabyte each; the scan would need ~1e12 steps, the heap a second or less.
  TiktokenTokenizer t = make_tokenizer({"aa", "aaaa", "  ", "    ", "!!", "99"});
  const size_t n = 1 << 20;
  for (const std::string& text : {std::string(n, 'a'), std::string(n, ' ') + "x", std::string(n, '!'),
                                  std::string(n, '9'), std::string(n, '\n') + " ", std::string(n / 2, '\t') + "\n"}) {
    const std::vector<int32_t> ids = t.encode(text);
    ASSERT_EQ(t.decode(ids), text);
  }
  EXPECT_EQ(t.encode(std::string(n, 'a')).size(), n / 4);
}

TEST(ByteTokenizer, EncodeSpecialByName) {
  ByteTokenizer b;
  EXPECT_EQ(b.encode_special("<|user|>").value(), 256 + 7);
  EXPECT_EQ(special_token_from_text("<|end_of_video|>"), SpecialToken::end_of_video);
  EXPECT_FALSE(special_token_from_text("<|user|> ").has_value());
}

// --- learning merges: data/sample/tokenizer.model -------------------------------------------------

TEST(BpeTrainer, MergesTheMostFrequentPairFirstWithinPieces) {
  // Pieces "abab" once and " abab" twice: ab (6 times), then abab (3), then " abab" (2); then no
  // pair is left, so fewer ranks than asked for.
  auto tokens = learn_bpe_tokens({"abab abab abab"}, 300);
  ASSERT_TRUE(tokens.is_ok()) << tokens.status().message();
  ASSERT_EQ(tokens.value().size(), 259u);
  EXPECT_EQ(tokens.value()[97], "a");
  EXPECT_EQ(std::vector<std::string>(tokens.value().begin() + 256, tokens.value().end()),
            (std::vector<std::string>{"ab", "abab", " abab"}));
  // Equal counts go to the smaller pair of ids; a pair seen once is never merged; the order of
  // the texts does not matter.
  auto tied = learn_bpe_tokens({"zw", "xy", "zw", "xy", "uv"}, 300);
  auto reordered = learn_bpe_tokens({"uv", "xy", "xy", "zw", "zw"}, 300);
  ASSERT_TRUE(tied.is_ok() && reordered.is_ok());
  EXPECT_EQ(std::vector<std::string>(tied.value().begin() + 256, tied.value().end()),
            (std::vector<std::string>{"xy", "zw"}));
  EXPECT_EQ(tied.value(), reordered.value());
  // Stops at the asked size.
  auto two = learn_bpe_tokens({"abab abab abab"}, 257);
  ASSERT_TRUE(two.is_ok());
  EXPECT_EQ(two.value().size(), 257u);
  EXPECT_FALSE(learn_bpe_tokens({"ab"}, 255).is_ok());
}

// The committed tokenizer of the tiny configuration is exactly what the tool makes from the
// committed sample data (README: how to regenerate it), and it is a proper BPE rank file.
TEST(SampleTokenizer, RegeneratesByteForByteAndRoundTripsTheSamples) {
  const fs::path sample = fs::path(GLM_SOURCE_DIR) / "data" / "sample";
  auto texts = conversation_texts({(sample / "alpaca.jsonl").string(), (sample / "conversations.jsonl").string(),
                                   (sample / "sharegpt.jsonl").string()});
  ASSERT_TRUE(texts.is_ok()) << texts.status().message();
  auto tokens = learn_bpe_tokens(texts.value(), 1500);
  ASSERT_TRUE(tokens.is_ok()) << tokens.status().message();
  ASSERT_EQ(tokens.value().size(), 1500u);
  EXPECT_EQ(format_rank_file(tokens.value()), read_file(sample / "tokenizer.model"))
      << "data/sample/tokenizer.model differs from what glm_train_tokenizer makes of data/sample/*.jsonl";

  auto loaded = TiktokenTokenizer::load((sample / "tokenizer.model").string());
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  const TiktokenTokenizer& t = loaded.value();
  EXPECT_EQ(t.vocab_size(), 1514);
  // Every merge joins two tokens of lower rank.
  for (int32_t r = 256; r < t.ranks().size(); ++r) {
    const std::string_view bytes = t.ranks().bytes(r);
    bool split = false;
    for (size_t k = 1; k < bytes.size() && !split; ++k) {
      const int32_t left = t.ranks().find(bytes.substr(0, k)), right = t.ranks().find(bytes.substr(k));
      split = left < r && right < r;
    }
    EXPECT_TRUE(split) << "rank " << r << " '" << bytes << "' is not two lower ranks joined";
  }
  int64_t bytes = 0, ids = 0;
  for (const std::string& text : texts.value()) {
    const std::vector<int32_t> encoded = t.encode(text);
    ASSERT_EQ(t.decode(encoded), text);
    bytes += static_cast<int64_t>(text.size());
    ids += static_cast<int64_t>(encoded.size());
  }
  EXPECT_GT(static_cast<double>(bytes) / static_cast<double>(ids), 2.5) << "the merges compress the samples";
}

TEST(TokenizerIdentity, ContentHashFollowsTheRanksNotTheFile) {
  const fs::path dir = scratch("identity");
  write_file(dir / "lf.model", rank_file({"ab", "abc"}));
  std::string crlf;
  for (const char c : rank_file({"ab", "abc"})) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  write_file(dir / "crlf.model", "\n" + crlf);
  write_file(dir / "other.model", rank_file({"ab", "abd"}));
  auto lf = load_tokenizer((dir / "lf.model").string());
  auto crlf_tokenizer = load_tokenizer((dir / "crlf.model").string());
  auto other = load_tokenizer((dir / "other.model").string());
  ASSERT_TRUE(lf.is_ok() && crlf_tokenizer.is_ok() && other.is_ok());
  EXPECT_EQ(lf.value()->content_hash(), crlf_tokenizer.value()->content_hash());
  EXPECT_NE(lf.value()->content_hash(), other.value()->content_hash());
  EXPECT_NE(lf.value()->content_hash(), ByteTokenizer().content_hash());
  EXPECT_EQ(lf.value()->source(), (dir / "lf.model").string()) << "an absolute path";
  EXPECT_EQ(lf.value()->describe(),
            concat((dir / "lf.model").string(), ": vocab 272 (258 ranks + 14 special tokens), content hash ",
                   lf.value()->content_hash()));
  fs::remove_all(dir);
}

// --- npm tiktoken as the oracle -------------------------------------------------------------------

const fs::path kPeerDir = fs::path(GLM_SOURCE_DIR) / "tools" / "tiktoken_peer";
const fs::path kCorpus = fs::path(GLM_SOURCE_DIR) / "tests" / "data" / "tokenizer" / "peer_corpus.json";

// Runs `node peer.cjs args...`; an empty string when it worked, otherwise why not.
std::string run_peer(const std::string& args, const fs::path& log) {
  const std::string command =
      concat("\"", GLM_NODE, "\" \"", (kPeerDir / "peer.cjs").string(), "\" ", args, " 2>\"", log.string(), "\"");
  const int rc = std::system(command.c_str());
  if (rc == 0) return "";
  return concat("`", command, "` failed (status ", rc, "): ", read_file(log));
}

// cl100k_base's ranks and tiktoken's ids for the corpus, made once per test process.
class TiktokenPeer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(kPeerDir / "node_modules" / "tiktoken" / "package.json")) {
      setup_error_ = concat(kPeerDir.string(), "/node_modules/tiktoken is missing: run `bash scripts/setup.sh` ",
                            "(it installs node, npm and the pinned tiktoken package)");
      return;
    }
    dir_ = new fs::path(scratch("peer"));
    const fs::path ranks = *dir_ / "cl100k_base.tiktoken", ids = *dir_ / "peer_ids.json";
    setup_error_ = run_peer(concat("ranks \"", ranks.string(), "\""), *dir_ / "log");
    if (setup_error_.empty())
      setup_error_ = run_peer(concat("encode \"", kCorpus.string(), "\" \"", ids.string(), "\""), *dir_ / "log");
    if (!setup_error_.empty()) return;
    auto tokenizer = TiktokenTokenizer::load(ranks.string());
    if (!tokenizer.is_ok()) {
      setup_error_ = tokenizer.status().message();
      return;
    }
    tokenizer_ = new TiktokenTokenizer(tokenizer.take());
    expected_ = new nlohmann::json(nlohmann::json::parse(read_file(ids)));
    corpus_ = new std::vector<std::string>(nlohmann::json::parse(read_file(kCorpus)).get<std::vector<std::string>>());
  }
  static void TearDownTestSuite() {
    if (dir_ != nullptr) fs::remove_all(*dir_);
    delete dir_;
    delete tokenizer_;
    delete expected_;
    delete corpus_;
  }
  void SetUp() override { ASSERT_TRUE(setup_error_.empty()) << setup_error_; }

  // On a mismatch: where the ids first differ, and our pieces there (regex or merging?).
  void expect_same_ids(const std::string& text, const std::vector<int32_t>& expected, const std::string& what) {
    const std::vector<int32_t> ids = tokenizer_->encode(text);
    if (ids == expected) return;
    size_t first = 0;
    while (first < ids.size() && first < expected.size() && ids[first] == expected[first]) ++first;
    auto window = [&](const std::vector<int32_t>& v) {
      const size_t begin = first >= 4 ? first - 4 : 0, end = std::min(v.size(), first + 8);
      return nlohmann::json(std::vector<int32_t>(v.begin() + begin, v.begin() + end)).dump();
    };
    const std::vector<int32_t> agreed(ids.begin(), ids.begin() + first);
    const size_t byte = tokenizer_->decode(agreed).size();
    std::ostringstream pieces;
    for (std::string_view p : tokenizer_->pretokenize(text.substr(byte, 80)))
      pieces << nlohmann::json(std::string(p)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << " ";
    ADD_FAILURE() << what << ": ids differ from tiktoken's from token " << first << " (byte " << byte
                  << ")\n  ours:     ..." << window(ids) << "\n  tiktoken: ..." << window(expected)
                  << "\n  our pieces from there: " << pieces.str();
  }

  static inline std::string setup_error_;
  static inline fs::path* dir_ = nullptr;
  static inline TiktokenTokenizer* tokenizer_ = nullptr;
  static inline nlohmann::json* expected_ = nullptr;
  static inline std::vector<std::string>* corpus_ = nullptr;
};

TEST_F(TiktokenPeer, Cl100kRanksLoad) {
  EXPECT_EQ(tokenizer_->ranks().size(), 100256);
  EXPECT_EQ(tokenizer_->special_id(SpecialToken::endoftext), 100256);  // GLM-4's rule: after the last rank
  EXPECT_EQ(tokenizer_->encode("\n"), (std::vector<int32_t>{198}));
}

TEST_F(TiktokenPeer, SameIdsPerDocument) {
  const auto& documents = (*expected_)["documents"];
  ASSERT_EQ(documents.size(), corpus_->size());
  for (size_t i = 0; i < corpus_->size(); ++i)
    expect_same_ids((*corpus_)[i], documents[i].get<std::vector<int32_t>>(), concat("document ", i));
}

TEST_F(TiktokenPeer, SameIdsForTheJoinedCorpus) {
  std::string joined;
  for (size_t i = 0; i < corpus_->size(); ++i) joined += (i > 0 ? "\n" : "") + (*corpus_)[i];
  expect_same_ids(joined, (*expected_)["joined"].get<std::vector<int32_t>>(), "joined corpus");
}

TEST_F(TiktokenPeer, DecodeReturnsTheExactBytes) {
  for (const std::string& text : *corpus_) EXPECT_EQ(tokenizer_->decode(tokenizer_->encode(text)), text);
}

// --- Hugging Face tokenizer.json --------------------------------------------------------------------

const fs::path kJsonDir = fs::path(GLM_SOURCE_DIR) / "tests" / "data" / "tokenizer_json";
const fs::path kSampleRanks = fs::path(GLM_SOURCE_DIR) / "data" / "sample" / "tokenizer.model";

// tokenizer.json of the sample rank file as HF `tokenizers` 0.23 built and encoded it
// (tools/make_tokenizer_json.py, on the GPU machine): our reading of it gives tokenizers' ids for
// every text of the peer corpus, the rank file's ids, the same decoded text and content hash (the
// same ranks: caches and shards of either file are interchangeable).
TEST(TokenizerJson, GivesTheIdsOfHfTokenizersAndOfTheRankFile) {
  auto from_json = TiktokenTokenizer::load((kJsonDir / "tokenizer.json").string());
  ASSERT_TRUE(from_json.is_ok()) << from_json.status().message();
  auto from_ranks = TiktokenTokenizer::load(kSampleRanks.string());
  ASSERT_TRUE(from_ranks.is_ok()) << from_ranks.status().message();
  EXPECT_EQ(from_json.value().vocab_size(), from_ranks.value().vocab_size());
  EXPECT_EQ(from_json.value().content_hash(), from_ranks.value().content_hash());
  std::ifstream in(kJsonDir / "tokenizer_json_ids.json");
  const nlohmann::json peer = nlohmann::json::parse(in);
  ASSERT_EQ(peer["texts"].size(), peer["ids"].size());
  size_t ids = 0, with_specials = 0;
  for (size_t i = 0; i < peer["texts"].size(); ++i) {
    const std::string text = peer["texts"][i].get<std::string>();
    const std::vector<int32_t> expected = peer["ids"][i].get<std::vector<int32_t>>();
    EXPECT_EQ(from_json.value().encode(text), from_ranks.value().encode(text)) << "text " << i << ": " << text;
    EXPECT_EQ(from_json.value().decode(expected), text) << "text " << i;
    // tokenizers matches special-token spellings inside text as the specials; encode() keeps text as
    // text (the chat template inserts specials by id), so such texts are compared between our loaders only.
    bool special = false;
    for (int t = 0; t < static_cast<int>(SpecialToken::count); ++t)
      special |= text.find(special_token_text(static_cast<SpecialToken>(t))) != std::string::npos;
    if (special) {
      ++with_specials;
      continue;
    }
    EXPECT_EQ(from_json.value().encode(text), expected) << "text " << i << ": " << text;
    ids += expected.size();
  }
  EXPECT_GT(ids, 3000u);
  EXPECT_LE(with_specials, 3u);
  // A model directory with tokenizer.json alone loads it.
  const fs::path dir = scratch("json_only");
  fs::copy_file(kJsonDir / "tokenizer.json", dir / "tokenizer.json");
  auto loaded = load_tokenizer(dir.string());
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  EXPECT_EQ(loaded.value()->encode("Hello, world!"), from_ranks.value().encode("Hello, world!"));
  EXPECT_EQ(loaded.value()->special_id(SpecialToken::user), from_ranks.value().special_id(SpecialToken::user));
  fs::remove_all(dir);
}

// What tiktoken's merging cannot reproduce, or is not GLM-4's layout, is refused by name.
TEST(TokenizerJson, OtherTokenizersAreRefusedByName) {
  std::ifstream in(kJsonDir / "tokenizer.json");
  const nlohmann::json good = nlohmann::json::parse(in);
  const fs::path dir = scratch("json_refused");
  auto refused = [&](const std::function<void(nlohmann::json&)>& change, const std::string& needle) {
    nlohmann::json j = good;
    change(j);
    const fs::path path = dir / "tokenizer.json";
    std::ofstream(path) << j.dump();
    auto t = TiktokenTokenizer::load(path.string());
    ASSERT_FALSE(t.is_ok()) << needle;
    EXPECT_EQ(t.status().exit_code(), 2);
    EXPECT_NE(t.status().message().find(needle), std::string::npos) << t.status().message();
  };
  refused([](nlohmann::json& j) { std::swap(j["model"]["merges"][3], j["model"]["merges"][40]); }, "out of rank order");
  refused([](nlohmann::json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+"; },
          "not GLM-4's");
  refused([](nlohmann::json& j) { j["added_tokens"][7]["id"] = 1; }, "special token <|user|> is id 1");
  refused([](nlohmann::json& j) { j["model"]["type"] = "WordPiece"; }, "is not a BPE model");
  refused([](nlohmann::json& j) { j["model"]["vocab"]["\u4e2d"] = 5; }, "has id 5");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace glm::test
