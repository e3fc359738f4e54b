// Pre-tokenization with PCRE2 (UTF + UCP, JIT), per-piece BPE, special tokens, and load_tokenizer.
#include "data/tiktoken_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <filesystem>

#include "data/bpe_trainer.h"
#include "data/content_hash.h"
#include "data/tokenizer_json.h"
#include "mpi/fatal.h"

namespace glm {
namespace {

// Unicode White_Space, which Python `regex` and Rust's regex (tiktoken) mean by \s. PCRE2's own \s
// under UCP differs: 10.42 also matches U+180E, which Unicode stopped counting as a space in 6.3
// (the peer test's corpus catches that).
constexpr std::string_view kWhiteSpace =
    R"(\t\n\x{0B}\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// `pattern` with \s and \S replaced by the White_Space class, inside and outside brackets.
Result<std::string> spell_out_whitespace(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's')
        out += in_class ? std::string(kWhiteSpace) : concat("[", kWhiteSpace, "]");
      else if (e == 'S' && !in_class)
        out += concat("[^", kWhiteSpace, "]");
      else if (e == 'S')
        return GLM_INTERNAL_ERROR("\\S inside a character class cannot be spelled out: ", pattern);
      else
        out += {c, e};
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];  // a leading ] is literal
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

using MatchData = std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)>;

}  // namespace

struct TiktokenTokenizer::Regex {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Regex() { pcre2_code_free(code); }
};

TiktokenTokenizer::TiktokenTokenizer(BpeRanks ranks, std::unique_ptr<Regex> regex)
    : ranks_(std::move(ranks)), regex_(std::move(regex)) {
  ContentHash h;
  h.field("tiktoken").field(kGlm4PretokenizePattern);
  for (int32_t r = 0; r < ranks_.size(); ++r) h.field(ranks_.bytes(r));
  content_hash_ = h.hex();
}
TiktokenTokenizer::TiktokenTokenizer(TiktokenTokenizer&&) noexcept = default;
TiktokenTokenizer& TiktokenTokenizer::operator=(TiktokenTokenizer&&) noexcept = default;
TiktokenTokenizer::~TiktokenTokenizer() = default;

Result<TiktokenTokenizer> TiktokenTokenizer::create(BpeRanks ranks) {
  GLM_ASSIGN_OR_RETURN(const std::string pattern, spell_out_whitespace(kGlm4PretokenizePattern));
  auto regex = std::make_unique<Regex>();
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  // MATCH_INVALID_UTF: invalid UTF-8 in the text is a barrier no match crosses, instead of an
  // error for the whole call.
  regex->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &error_offset, nullptr);
  if (regex->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return GLM_INTERNAL_ERROR("PCRE2 rejects the pre-tokenization pattern at offset ", error_offset, ": ",
                              reinterpret_cast<const char*>(message));
  }
  // Without JIT (a platform PCRE2 has no JIT for) the interpreter gives the same matches, slower.
  regex->jit = pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE) == 0;
  return TiktokenTokenizer(std::move(ranks), std::move(regex));
}

Result<TiktokenTokenizer> TiktokenTokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string file = path;
  if (fs::is_directory(path, ec)) {
    file = (fs::path(path) / "tokenizer.model").string();
    if (!fs::exists(file, ec)) file = (fs::path(path) / "tokenizer.json").string();
    if (!fs::exists(file, ec)) return GLM_USER_ERROR(path, " holds neither tokenizer.model nor tokenizer.json");
  }
  BpeRanks ranks;
  if (fs::path(file).extension() == ".json") {  // Hugging Face's tokenizer.json: the same ranks
    GLM_ASSIGN_OR_RETURN(const std::vector<std::string> tokens, read_tokenizer_json_ranks(file));
    GLM_ASSIGN_OR_RETURN(ranks, BpeRanks::parse(format_rank_file(tokens), file));
  } else {
    GLM_ASSIGN_OR_RETURN(ranks, BpeRanks::load(file));
  }
  GLM_ASSIGN_OR_RETURN(TiktokenTokenizer tokenizer, create(std::move(ranks)));
  // Absolute: shard manifests and args.json name it for runs from other directories.
  tokenizer.source_ = fs::absolute(file, ec).lexically_normal().string();
  if (ec) tokenizer.source_ = file;
  return tokenizer;
}

std::string TiktokenTokenizer::describe() const {
  return concat(source_, ": vocab ", vocab_size(), " (", ranks_.size(), " ranks + 14 special tokens), content hash ",
                content_hash_);
}

// Calls on_piece for each regex match and for each run of bytes between matches, in order. The
// pattern matches every valid character, so bytes between matches are exactly the invalid UTF-8.
template <typename OnPiece>
void TiktokenTokenizer::for_each_piece(std::string_view text, OnPiece&& on_piece) const {
  MatchData match(pcre2_match_data_create_from_pattern(regex_->code, nullptr), &pcre2_match_data_free);
  GLM_CHECK(match != nullptr, "out of memory for PCRE2 match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
  // Created only if a match outgrows JIT's default 32 KiB stack (never seen with this pattern,
  // whose repeats are single characters, but the text is arbitrary).
  std::unique_ptr<pcre2_jit_stack, decltype(&pcre2_jit_stack_free)> big_stack(nullptr, &pcre2_jit_stack_free);
  std::unique_ptr<pcre2_match_context, decltype(&pcre2_match_context_free)> context(nullptr, &pcre2_match_context_free);
  size_t offset = 0;
  while (offset < text.size()) {
    int rc = regex_->jit ? pcre2_jit_match(regex_->code, subject, text.size(), offset, 0, match.get(), context.get())
                         : pcre2_match(regex_->code, subject, text.size(), offset, 0, match.get(), context.get());
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH && context == nullptr) {
      context.reset(pcre2_match_context_create(nullptr));
      big_stack.reset(pcre2_jit_stack_create(32 * 1024, 512 * 1024 * 1024, nullptr));
      GLM_CHECK(context != nullptr && big_stack != nullptr, "out of memory for a PCRE2 stack");
      pcre2_jit_stack_assign(context.get(), nullptr, big_stack.get());
      pcre2_set_match_limit(context.get(), std::numeric_limits<uint32_t>::max());
      pcre2_set_heap_limit(context.get(), std::numeric_limits<uint32_t>::max());
      continue;
    }
    if (rc == PCRE2_ERROR_NOMATCH) {
      on_piece(text.substr(offset));
      return;
    }
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      GLM_FATAL("pre-tokenization failed at byte ", offset, ": ", reinterpret_cast<const char*>(message));
    }
    const size_t start = ovector[0], end = ovector[1];
    // Every alternative consumes at least one character.
    GLM_CHECK(start >= offset && end > start, "empty pre-tokenization match at byte ", start);
    if (start > offset) on_piece(text.substr(offset, start - offset));
    on_piece(text.substr(start, end - start));
    offset = end;
  }
}

std::vector<int32_t> TiktokenTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  encode_append(text, ids);
  return ids;
}

void TiktokenTokenizer::encode_append(std::string_view text, std::vector<int32_t>& out) const {
  BpeScratch scratch;
  for_each_piece(text, [&](std::string_view piece) {
    // Most pieces (words with their leading space, short numbers) are tokens themselves.
    if (piece.size() == 1) {
      out.push_back(ranks_.byte_rank(static_cast<unsigned char>(piece[0])));
      return;
    }
    if (const int32_t whole = ranks_.find(piece); whole != BpeRanks::kNoRank) {
      out.push_back(whole);
      return;
    }
    byte_pair_encode(ranks_, piece, out, scratch);
  });
}

std::vector<std::string_view> TiktokenTokenizer::pretokenize(std::string_view text) const {
  std::vector<std::string_view> pieces;
  for_each_piece(text, [&](std::string_view piece) { pieces.push_back(piece); });
  return pieces;
}

void TiktokenTokenizer::pretokenize(std::string_view text,
                                    const std::function<void(std::string_view)>& on_piece) const {
  for_each_piece(text, on_piece);
}

std::string TiktokenTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (const int32_t id : ids) {
    if (id >= 0 && id < ranks_.size())
      out += ranks_.bytes(id);
    else if (id >= ranks_.size() && id < vocab_size())
      out += special_token_text(static_cast<SpecialToken>(id - ranks_.size()));
    else
      out += "<|unk|>";
  }
  return out;
}

Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& path) {
  GLM_ASSIGN_OR_RETURN(TiktokenTokenizer tokenizer, TiktokenTokenizer::load(path));
  return std::unique_ptr<Tokenizer>(std::make_unique<TiktokenTokenizer>(std::move(tokenizer)));
}

}  // namespace glm
