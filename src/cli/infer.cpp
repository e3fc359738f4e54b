// glm_hpc infer (see infer.h).
#include "cli/infer.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <numeric>
#include <random>

#include "base/json_text.h"
#include "base/stop_signal.h"
#include "cli/export.h"
#include "data/chat_template.h"
#include "io/durable_file.h"
#include "io/peft_adapter.h"

namespace glm {

namespace fs = std::filesystem;

namespace {

bool given(const CliOptions& o, const char* name) {
  return o.effective.contains(name) && o.effective[name].value("source", "default") != "default";
}

// The command line, then generation_config.json, then transformers' defaults (greedy unless the
// model's config samples; top_k 50 when sampling).
SamplingOptions resolve_sampling(const CliOptions& o, const GenerationDefaults& d) {
  SamplingOptions s;
  s.temperature = o.temperature ? *o.temperature : (d.do_sample.value_or(false) ? d.temperature.value_or(1.0) : 0.0);
  s.top_p = o.top_p ? *o.top_p : d.top_p.value_or(1.0);
  s.top_k = o.top_k ? *o.top_k : d.top_k.value_or(50);
  s.repetition_penalty = o.repetition_penalty ? *o.repetition_penalty : d.repetition_penalty.value_or(1.0);
  s.seed = o.train.seed;
  return s;
}

BeamOptions resolve_beams(const CliOptions& o, const GenerationDefaults& d) {
  BeamOptions b;
  b.num_beams = o.num_beams ? *o.num_beams : d.num_beams.value_or(1);
  b.length_penalty = o.length_penalty ? *o.length_penalty : d.length_penalty.value_or(1.0);
  b.early_stopping = o.early_stopping ? *o.early_stopping : d.early_stopping.value_or(EarlyStopping::heuristic);
  return b;
}

// generation_config.json's eos ids (none when it sets null or []), else GLM-4's end tokens.
std::vector<int32_t> stop_ids(const GenerationDefaults& d, const Tokenizer* tokenizer, int64_t vocab_size) {
  if (d.eos_token_ids) return *d.eos_token_ids;
  return glm4_end_ids(tokenizer, vocab_size);
}

std::string now_text(const char* format) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// The bytes of `text` that form whole UTF-8 characters: a reply streamed token by token may end
// inside one, which the next token completes.
size_t complete_utf8_prefix(const std::string& text) {
  size_t end = text.size(), back = 0;
  while (back < 4 && back < end && (static_cast<unsigned char>(text[end - 1 - back]) & 0xC0) == 0x80) ++back;
  if (back == end) return end;
  const unsigned char lead = static_cast<unsigned char>(text[end - 1 - back]);
  const size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  return need > back + 1 ? end - 1 - back : end;
}

// A reply as the result file and the chat show it: GLM-4 starts its turn with a newline after
// <|assistant|> (GLM4_SPEC.md 6.1), which is the template's, not the answer's.
std::string reply_text(const Tokenizer& tokenizer, std::span<const int32_t> tokens) {
  std::string text = tokenizer.decode(tokens);
  if (!text.empty() && text.front() == '\n') text.erase(0, 1);
  return text;
}

Status write_result_file(const std::string& path, const std::string& text) {
  std::error_code ec;
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path(), ec);
  if (ec) return GLM_USER_ERROR("cannot create the directory of --result_path '", path, "': ", ec.message());
  return write_file_durably(path, text);
}

}  // namespace

InferJob::~InferJob() = default;

Result<std::unique_ptr<InferJob>> InferJob::prepare(const CliOptions& options, const ProcessInfo& proc,
                                                    Backend& backend) {
  std::unique_ptr<InferJob> job(new InferJob(options, proc));
  const CliOptions& o = job->options_;
  backend.set_out_of_memory_hint(
      "infer holds the whole model on each GPU with its forwards' activations and the KV cache: lower "
      "--max_batch_size, --max_new_tokens or --max_length, or use a GPU with more memory or --device cpu");
  if (job->interactive() && proc.world_size > 1)
    return GLM_USER_ERROR("an interactive chat runs on one process: give --val_dataset FILE to spread prompts over ",
                          proc.world_size, " ranks");
  GLM_ASSIGN_OR_RETURN(ModelSource model, ModelSource::open({o.model_id_or_path, o.ckpt_dir, o.adapters}));
  job->model_ = std::move(model);
  const ModelSource& m = *job->model_;
  GLM_ASSIGN_OR_RETURN(job->tokenizer_, m.tokenizer(o.tokenizer));
  if (job->interactive() && job->tokenizer_ == nullptr)
    return GLM_USER_ERROR(m.describe(), " has no tokenizer.model: an interactive chat needs one (give --tokenizer)");
  GLM_ASSIGN_OR_RETURN(const GenerationDefaults defaults, m.generation_defaults());
  GenerationOptions& g = job->generation_;
  g.sampling = resolve_sampling(o, defaults);
  GLM_RETURN_IF_ERROR(g.sampling.validate());
  g.beams = resolve_beams(o, defaults);
  GLM_RETURN_IF_ERROR(g.beams.validate());
  g.max_new_tokens = given(o, "max_new_tokens") || !defaults.max_new_tokens ? o.max_new_tokens : *defaults.max_new_tokens;
  g.stop_ids = stop_ids(defaults, job->tokenizer_.get(), m.config().vocab_size);
  job->sampling_source_ = defaults.source.empty() ? "options and transformers' defaults"
                                                  : concat("options, then ", defaults.source);
  const int64_t window = given(o, "max_length") ? o.train.max_length : m.config().max_position_embeddings;
  if (job->interactive()) {  // a conversation of up to --max_length tokens (8192 unless given)
    g.max_tokens = given(o, "max_length") ? window : std::min<int64_t>(window, 8192);
    const int64_t rows = g.max_tokens + (g.beams.num_beams - 1) * std::min(g.max_new_tokens, g.max_tokens);
    GLM_RETURN_IF_ERROR(job->create_generator(backend, 0, rows, 1));
    return job;
  }
  GLM_ASSIGN_OR_RETURN(job->prompts_, read_infer_prompts(o.val_datasets, job->tokenizer_.get(), m.config().vocab_size,
                                                         o.train.system));
  int64_t longest = 0, too_long_count = 0;
  std::string too_long;
  for (const InferPrompt& p : job->prompts_) {
    longest = std::max(longest, static_cast<int64_t>(p.ids.size()));
    if (static_cast<int64_t>(p.ids.size()) >= window && too_long_count++ < 5)
      too_long += concat("\n  ", p.source, ": ", p.ids.size(), " tokens");
  }
  if (too_long_count > 0)
    return GLM_USER_ERROR(too_long_count, " prompt(s) leave no room for a reply within ", window, " tokens (",
                          given(o, "max_length") ? "--max_length" : "the model's max_position_embeddings", "):",
                          too_long);
  g.max_tokens = window;
  const int64_t mine = (static_cast<int64_t>(job->prompts_.size()) - proc.rank + proc.world_size - 1) / proc.world_size;
  const int64_t batch = std::max<int64_t>(1, std::min(o.max_batch_size, mine));
  // The cache rows of the longest sequence: its prompt and longest reply, and each other beam's.
  const int64_t rows =
      std::min(window, longest + g.max_new_tokens) + (g.beams.num_beams - 1) * std::min(g.max_new_tokens, window);
  GLM_RETURN_IF_ERROR(job->create_generator(backend, longest, rows, batch));
  return job;
}

Result<int64_t> forward_tokens(const ModelConfig& c, int64_t free, int64_t act, int64_t stats, int64_t longest,
                               int64_t per_sequence, int64_t batch, int64_t beams) {
  constexpr int64_t kTokens = 8192, kFewest = 512;
  const int64_t step = batch * beams;  // a decode step's tokens
  int64_t tokens = std::max(step, std::min(per_sequence * batch, std::max(longest, kTokens)));
  if (free < 0) return tokens;
  const int64_t weights = ParamLayout(c).total_numel() * act, per_token = KvCache::bytes_per_token(c, act);
  const auto activations = [&](int64_t n) {
    return Glm4Model::planned_activation_bytes(c, n, act, stats, Recompute::full, false, /*forward_only=*/true);
  };
  // A decode step's logits (f32, a row a sequence and beam) beside the reserve: many beams make them large.
  const int64_t logits = step * c.vocab_size * 4;
  const int64_t budget = free - weights - logits - per_sequence * batch * per_token - kForwardReserve;
  while (tokens > std::max(step, kFewest) && activations(tokens) > budget) tokens = std::max(step, tokens / 2);
  const int64_t least = weights + logits + activations(tokens) + per_sequence * per_token;
  if (least > free) {
    const auto gib = [](int64_t bytes) { return static_cast<double>(bytes) / static_cast<double>(int64_t{1} << 30); };
    return GLM_USER_ERROR(
        "infer holds the whole model on each GPU: ", gib(weights), " GiB of weights, with ", gib(activations(tokens)),
        " GiB for forwards of ", tokens, " tokens and ", gib(per_sequence * per_token),
        " GiB for the KV cache of one sequence of ", per_sequence, " tokens, more than the ", gib(free),
        " GiB free on this GPU (lower --max_new_tokens, --max_length or --num_beams, or use a GPU with more "
        "memory or --device cpu)");
  }
  return tokens;
}

Status InferJob::create_generator(Backend& backend, int64_t longest, int64_t per_sequence, int64_t batch) {
  const ModelSource& m = *model_;
  GLM_ASSIGN_OR_RETURN(const int64_t chunk, forward_tokens(m.config(), backend.device_memory_free(),
                                                           static_cast<int64_t>(dtype_size(backend.compute_dtype())),
                                                           static_cast<int64_t>(dtype_size(backend.stats_dtype())),
                                                           longest, per_sequence, batch, generation_.beams.num_beams));
  EngineConfig config{.model = m.config(), .max_tokens = chunk, .max_grad_norm = 0.0, .forward_only = true};
  config.lora = m.lora();
  GLM_ASSIGN_OR_RETURN(engine_, TrainingEngine::create(config, backend, comm_));
  GLM_RETURN_IF_ERROR(m.load(*engine_));
  // The cache: every sequence of the batch at its longest, within 90% of what the device has left.
  int64_t tokens = per_sequence * batch;
  const int64_t free = backend.device_memory_free();
  const int64_t per_token = KvCache::bytes_per_token(m.config(), static_cast<int64_t>(dtype_size(backend.compute_dtype())));
  if (free >= 0) tokens = std::min(tokens, static_cast<int64_t>(0.9 * static_cast<double>(free)) / per_token);
  if (tokens < per_sequence)
    return GLM_USER_ERROR("the GPU has memory left for a KV cache of ", tokens, " tokens, and one sequence may need ",
                          per_sequence, ": lower --max_new_tokens, --max_length or --num_beams");
  GLM_ASSIGN_OR_RETURN(generator_, CachedGenerator::create(*engine_, generation_, tokens, batch));
  return Status::ok();
}

std::string InferJob::describe() const {
  const SamplingOptions& s = generation_.sampling;
  std::string sampling =
      s.temperature == 0 ? std::string("greedy")
                         : concat("temperature ", s.temperature, ", top_p ", s.top_p, ", top_k ", s.top_k, ", seed ",
                                  s.seed);
  if (s.repetition_penalty != 1.0) sampling += concat(", repetition_penalty ", s.repetition_penalty);
  const BeamOptions& b = generation_.beams;
  if (b.num_beams > 1)
    sampling =
        concat(s.temperature == 0 ? "beam search" : "beam sample", " of ", b.num_beams, " beams (length_penalty ",
               b.length_penalty, ", early_stopping ", enum_name(b.early_stopping), "), ", sampling);
  std::string stops;
  for (const int32_t id : generation_.stop_ids) stops += concat(stops.empty() ? "" : ", ", id);
  std::string text = concat("glm_hpc: infer with ", model_->describe(), "\nglm_hpc: ", sampling, " (from ",
                            sampling_source_, "); up to ", generation_.max_new_tokens, " new tokens, ",
                            generation_.max_tokens, " in all; stop ids [", stops, "]\n");
  text += concat("glm_hpc: KV cache of ", generator_->cache_tokens(), " tokens (",
                 static_cast<double>(generator_->cache_bytes()) / 1048576.0, " MiB); forwards of up to ",
                 engine_->max_tokens(), " tokens (activations ",
                 static_cast<double>(engine_->activation_bytes()) / 1048576.0, " MiB)\n");
  if (!interactive())
    text += concat("glm_hpc: ", prompts_.size(), " prompts over ", proc_.world_size, " rank(s), up to ",
                   options_.max_batch_size, " at once per rank\n");
  return text;
}

std::string InferJob::result_line(size_t index, const Generation& g) const {
  const InferPrompt& p = prompts_[index];
  nlohmann::ordered_json j;
  j["index"] = index;
  j["source"] = p.source;
  if (!p.pretokenized) j["messages"] = p.messages;
  if (tokenizer_ != nullptr) j["response"] = reply_text(*tokenizer_, g.tokens);
  if (p.pretokenized) j["response_ids"] = g.tokens;
  j["labels"] = p.reference ? nlohmann::ordered_json(*p.reference) : nlohmann::ordered_json();
  j["prompt_tokens"] = p.ids.size();
  j["response_tokens"] = g.tokens.size();
  j["finish_reason"] = g.stopped ? "stop" : "length";
  j["time_to_first_token_s"] = g.first_token_seconds;
  j["latency_s"] = g.seconds;
  if (g.beam_score) j["beam_score"] = *g.beam_score;
  return json_text(j);
}

Status InferJob::generate_share() {
  const auto start = std::chrono::steady_clock::now();
  const size_t ranks = static_cast<size_t>(proc_.world_size);
  std::vector<GenerationRequest> requests;
  std::vector<size_t> index;
  for (size_t i = static_cast<size_t>(proc_.rank); i < prompts_.size(); i += ranks) {
    requests.push_back({prompts_[i].ids, i});
    index.push_back(i);
  }
  if (!requests.empty())
    GLM_RETURN_IF_ERROR(generator_->run(requests, [&](size_t r, Generation g) {
      lines_.emplace_back(index[r], result_line(index[r], g));
    }));
  generate_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return Status::ok();
}

Result<std::string> result_path_of(const CliOptions& o) {
  if (!o.result_path.empty()) return o.result_path;
  const std::string name = concat("infer_result/", now_text("%Y%m%d-%H%M%S"), ".jsonl");
  const std::string beside = !o.ckpt_dir.empty() ? o.ckpt_dir : o.adapters;
  if (beside.empty() || is_peft_adapter_dir(beside)) return name;
  GLM_ASSIGN_OR_RETURN(const std::string checkpoint, resolve_export_checkpoint(beside));
  return (fs::path(checkpoint) / name).string();
}

Result<CliOptions> comparison_options(const CliOptions& o) {
  CliOptions b = o;
  GLM_ASSIGN_OR_RETURN(b.result_path, result_path_of(o));
  b.model_id_or_path.clear();
  b.ckpt_dir.clear();
  b.adapters.clear();
  std::error_code ec;
  const fs::path p(o.compare_with);
  if (is_peft_adapter_dir(p))
    return GLM_USER_ERROR("--compare_with '", o.compare_with, "' holds LoRA adapters: compare with a model directory, ",
                          "a checkpoint, or the adapters merged (glm_hpc export --merge_lora true)");
  bool checkpoint = fs::exists(p / "meta.json", ec) || fs::exists(p / "latest", ec);
  for (const auto& e : fs::directory_iterator(p, ec))
    checkpoint = checkpoint || e.path().filename().string().rfind("checkpoint-", 0) == 0;
  (checkpoint ? b.ckpt_dir : b.model_id_or_path) = o.compare_with;
  b.compare_with.clear();
  return b;
}

Result<std::string> InferJob::result_path() const { return result_path_of(options_); }

Result<InferResults> InferJob::gather(MPI_Comm comm) {
  std::string mine;
  for (const auto& [index, line] : lines_) mine += concat(index, " ", line, "\n");
  const double seconds = generate_seconds_;
  int size = static_cast<int>(mine.size());
  std::vector<int> sizes(static_cast<size_t>(proc_.world_size));
  std::vector<double> times(static_cast<size_t>(proc_.world_size));
  if (MPI_Gather(&size, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, comm) != MPI_SUCCESS ||
      MPI_Gather(&seconds, 1, MPI_DOUBLE, times.data(), 1, MPI_DOUBLE, 0, comm) != MPI_SUCCESS)
    return GLM_INTERNAL_ERROR("MPI_Gather of the results failed");
  std::vector<int> displs(sizes.size(), 0);
  std::partial_sum(sizes.begin(), sizes.end() - 1, displs.begin() + 1);
  std::string all(proc_.rank == 0 ? static_cast<size_t>(displs.back() + sizes.back()) : 0, '\0');
  if (MPI_Gatherv(mine.data(), size, MPI_CHAR, all.data(), sizes.data(), displs.data(), MPI_CHAR, 0, comm) !=
      MPI_SUCCESS)
    return GLM_INTERNAL_ERROR("MPI_Gatherv of the results failed");
  InferResults r;
  if (proc_.rank != 0) return r;
  r.lines.resize(prompts_.size());
  std::vector<double> first, latency;
  int64_t generated = 0;
  for (size_t at = 0; at < all.size();) {
    const size_t space = all.find(' ', at), end = all.find('\n', at);
    const size_t index = std::stoull(all.substr(at, space - at));
    r.lines.at(index) = all.substr(space + 1, end - space - 1);
    const nlohmann::json j = nlohmann::json::parse(r.lines[index]);
    first.push_back(j["time_to_first_token_s"].get<double>());
    latency.push_back(j["latency_s"].get<double>());
    generated += j["response_tokens"].get<int64_t>();
    at = end + 1;
  }
  const double wall = *std::max_element(times.begin(), times.end());
  r.summary = concat("glm_hpc: infer: ", prompts_.size(), " replies, ", generated, " tokens in ", wall, " s (",
                     wall > 0 ? static_cast<double>(generated) / wall : 0.0, " tokens/s over ", proc_.world_size,
                     " rank(s)); time to first token median ", median(first), " s, latency median ",
                     median(latency), " s\n");
  r.model = model_->describe();
  return r;
}

Result<std::string> InferJob::write(const std::vector<std::string>& lines) const {
  GLM_ASSIGN_OR_RETURN(const std::string path, result_path());
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  GLM_RETURN_IF_ERROR(write_result_file(path, text));
  return concat("glm_hpc: results in ", path, "\n");
}

Result<std::string> InferJob::write_comparison(const InferResults& a, const InferResults& b) const {
  GLM_ASSIGN_OR_RETURN(const std::string path, result_path());
  const fs::path stem = fs::path(path).replace_extension("");
  if (a.lines.size() != b.lines.size())
    return GLM_INTERNAL_ERROR("the compared models answered ", a.lines.size(), " and ", b.lines.size(), " prompts");
  // Which model is "A" on each line: a seeded coin per prompt, kept in the key file alone.
  std::mt19937_64 coin(options_.train.seed);
  std::string blinded, table = "| # | prompt | A | B | better (A, B or =) |\n|---|---|---|---|---|\n";
  nlohmann::ordered_json key = {{"model", a.model}, {"compare_with", b.model}, {"a_is", nlohmann::ordered_json::array()}};
  auto cell = [](std::string text) {
    std::string out;
    for (const char c : text) out += c == '|' ? std::string("\\|") : c == '\n' ? std::string("<br>") : std::string(1, c);
    return out;
  };
  for (size_t i = 0; i < a.lines.size(); ++i) {
    const nlohmann::ordered_json ja = nlohmann::ordered_json::parse(a.lines[i]);
    const nlohmann::ordered_json jb = nlohmann::ordered_json::parse(b.lines[i]);
    const bool swap = (coin() & 1) != 0;
    const nlohmann::ordered_json& first = swap ? jb : ja;
    const nlohmann::ordered_json& second = swap ? ja : jb;
    const auto reply = [](const nlohmann::ordered_json& j) {
      return j.contains("response") ? j["response"] : j["response_ids"];
    };
    nlohmann::ordered_json line = {{"index", i}, {"source", ja["source"]}};
    if (ja.contains("messages")) line["messages"] = ja["messages"];
    line["labels"] = ja["labels"];
    line["response_a"] = reply(first);
    line["response_b"] = reply(second);
    blinded += json_text(line) + "\n";
    key["a_is"].push_back(swap ? "compare_with" : "model");
    const std::string prompt = ja.contains("messages") && !ja["messages"].empty()
                                   ? ja["messages"].back().value("content", "")
                                   : ja["source"].get<std::string>();
    const auto text = [](const nlohmann::ordered_json& j) { return j.is_string() ? j.get<std::string>() : j.dump(); };
    table += concat("| ", i, " | ", cell(prompt), " | ", cell(text(line["response_a"])), " | ",
                    cell(text(line["response_b"])), " |  |\n");
  }
  std::string model_lines, compare_lines;
  for (const std::string& l : a.lines) model_lines += l + "\n";
  for (const std::string& l : b.lines) compare_lines += l + "\n";
  const std::string key_path = stem.string() + ".key.json", md = stem.string() + ".md";
  GLM_RETURN_IF_ERROR(write_result_file(path, blinded));
  GLM_RETURN_IF_ERROR(write_result_file(md, table));
  GLM_RETURN_IF_ERROR(write_result_file(key_path, json_text(key, 2) + "\n"));
  GLM_RETURN_IF_ERROR(write_result_file(stem.string() + ".model.jsonl", model_lines));
  GLM_RETURN_IF_ERROR(write_result_file(stem.string() + ".compare_with.jsonl", compare_lines));
  return concat("glm_hpc: blinded side by side in ", path, " and ", md, " (A and B shuffled per prompt); the key in ",
                key_path, "; each model's results in ", stem.string(), ".model.jsonl and ", stem.string(),
                ".compare_with.jsonl\n");
}

Status InferJob::chat(std::istream& in, std::ostream& out) {
  const ChatTemplate chat(*tokenizer_);
  Conversation conversation;
  auto reset = [&] {
    conversation.messages.clear();
    if (!options_.train.system.empty()) conversation.messages.emplace_back(Role::system, options_.train.system);
  };
  reset();
  out << "glm_hpc: chat; 'exit' or end of input ends it, 'clear' starts a new conversation\n";
  uint64_t turn = 0;
  for (std::string line;;) {
    out << "<<< " << std::flush;
    if (!std::getline(in, line)) break;
    if (line == "exit" || line == "quit") break;
    if (line == "clear") {
      reset();
      out << "(a new conversation)\n";
      continue;
    }
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    conversation.messages.emplace_back(Role::user, line);
    const std::vector<int32_t> prompt = chat.generation_prompt(conversation);
    if (static_cast<int64_t>(prompt.size()) >= generation_.max_tokens) {
      conversation.messages.pop_back();
      out << "(the conversation has reached " << generation_.max_tokens
          << " tokens (--max_length): 'clear' starts a new one)\n";
      continue;
    }
    std::vector<int32_t> reply;
    size_t shown = 0;
    auto stream = [&](size_t, int32_t token) {
      if (!options_.stream) return;
      reply.push_back(token);
      const std::string text = reply_text(*tokenizer_, reply);
      const size_t ready = complete_utf8_prefix(text);
      if (ready > shown) out << text.substr(shown, ready - shown) << std::flush;
      shown = std::max(shown, ready);
    };
    Generation g;
    const GenerationRequest request{prompt, turn++};
    GLM_RETURN_IF_ERROR(generator_->run({&request, 1}, [&](size_t, Generation done) { g = std::move(done); }, stream));
    const std::string text = reply_text(*tokenizer_, g.tokens);
    out << (shown < text.size() ? text.substr(shown) : "") << "\n" << std::flush;
    conversation.messages.emplace_back(Role::assistant, text);
  }
  out << "\n";
  return Status::ok();
}

}  // namespace glm
