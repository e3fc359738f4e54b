// Option table, INI handling with file:line errors, value validation and args.json.
#include "cli/options.h"

#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "base/enum_names.h"
#include "base/input_path.h"
#include "base/json_text.h"
#include "cli/deepspeed_config.h"
#include "cli/ini_file.h"
#include "data/sharded_loader.h"
#include "io/durable_file.h"
#include "io/hf_export.h"
#include "io/tensorboard.h"

namespace po = boost::program_options;

namespace glm {
namespace {

std::string show(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}
std::string show(bool v) { return v ? "true" : "false"; }
template <typename T>
std::string show(const T& v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// Edits (insert, delete, substitute, swap two neighbours) between two option names.
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

// " (did you mean --name?)" for the closest registered option within a few edits, else "".
std::string did_you_mean(const po::options_description& all, std::string_view typed) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, typed.size() / 4) + 1;
  for (const auto& option : all.options()) {
    const std::string& name = option->long_name();
    const size_t distance = edit_distance(typed, name);
    if (distance < best_distance) {
      best_distance = distance;
      best = name;
    }
  }
  return best.empty() ? "" : concat(" (did you mean --", best, "?)");
}

std::string strip_dashes(std::string s) {
  while (!s.empty() && s.front() == '-') s.erase(s.begin());
  return s;
}

// DeepSpeed writes sizes as 5e8 or 500000000: a whole number of elements, plain or in e-notation.
Result<int64_t> parse_element_count(const std::string& text, bool allow_zero) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !std::isfinite(value) || value != std::floor(value) || value < 0 ||
      value > 4e18 || (value == 0 && !allow_zero))
    return GLM_USER_ERROR("not an element count");
  return static_cast<int64_t>(value);
}

struct Sources {
  std::string config_file;
  std::map<std::string, int> config_lines;  // key -> line (last occurrence)
  std::map<std::string, bool> command_line;
  std::string deepspeed;                              // --deepspeed's file or preset
  std::map<std::string, std::string> deepspeed_keys;  // option -> the DeepSpeed key that set it
  std::string where(const std::string& name) const {
    if (command_line.count(name)) return concat("--", name);
    auto it = config_lines.find(name);
    if (it != config_lines.end()) return concat(config_file, ":", it->second, ": ", name);
    auto ds = deepspeed_keys.find(name);
    if (ds != deepspeed_keys.end()) return concat("--deepspeed ", deepspeed, ": ", ds->second, " (--", name, ")");
    return concat("--", name);
  }
};

// The text of each option as given (the command line's where both give one: it wins).
using OptionTexts = std::map<std::string, std::vector<std::string>>;

bool is_unsigned_integer(const std::type_info& type) {
  return type == typeid(unsigned long long) || type == typeid(unsigned long) || type == typeid(unsigned int) ||
         type == typeid(unsigned short);
}

// Numbers as the option table types them: a floating-point option holds a finite value (no option
// gives nan or inf a meaning), an unsigned one a text without a minus sign (Boost reads "-1" as
// 2^64 - 1).
Status check_numbers(const po::variables_map& vm, const OptionTexts& texts, const Sources& src) {
  for (const auto& [name, value] : vm) {
    const boost::any& held = value.value();
    if (const double* d = boost::any_cast<double>(&held); d != nullptr && !std::isfinite(*d))
      return GLM_USER_ERROR(src.where(name), " must be a finite number, got '", show(*d), "'");
    const auto text = texts.find(name);
    if (!is_unsigned_integer(held.type()) || text == texts.end()) continue;
    for (const std::string& t : text->second) {
      const size_t first = t.find_first_not_of(" \t");
      if (first != std::string::npos && t[first] == '-')
        return GLM_USER_ERROR(src.where(name), " must be a non-negative integer, got '", t, "'");
    }
  }
  return Status::ok();
}

Status check(bool ok, const Sources& src, const std::string& name, const std::string& requirement) {
  if (ok) return Status::ok();
  return GLM_USER_ERROR(src.where(name), " ", requirement);
}

// An element count as DeepSpeed's configs show it: 5e8, 1e5; other values in full.
std::string count_text(int64_t v) {
  int exponent = 0;
  int64_t mantissa = v;
  while (mantissa >= 10 && mantissa % 10 == 0) {
    mantissa /= 10;
    ++exponent;
  }
  return exponent >= 3 && mantissa < 10 ? concat(mantissa, "e", exponent) : std::to_string(v);
}

// What an element-count option accepts: zero or not, and a word that stands for a value (auto, inf).
struct CountRule {
  bool allow_zero = false;
  const char* word = nullptr;
  int64_t word_value = 0;
  const char* requirement = "";  // for the message: "must be <requirement>, got '...'"
};

constexpr std::pair<DType, std::string_view> kReduceDTypes[] = {{DType::f32, "fp32"}, {DType::bf16, "bf16"}};

// The option table: each option is registered once, with its target field (whose value before
// parsing is the default), help and a JSON getter. Enums and element counts are typed as well:
// Boost reads their text, resolve() turns it into the field's value or says where it was set and
// what it must be.
class OptionTable {
 public:
  explicit OptionTable(CliOptions& o) : o_(o) { build(); }
  const po::options_description& all() const { return all_; }
  nlohmann::json values() const {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [name, get] : getters_) j[name] = get();
    return j;
  }
  Status resolve(const Sources& src) const {
    for (const Typed& t : typed_) {
      const std::string failed = t.assign(t.text);
      if (!failed.empty()) return GLM_USER_ERROR(src.where(t.name), " ", failed);
    }
    return Status::ok();
  }

 private:
  struct Typed {
    std::string name;
    std::string text;
    std::function<std::string(const std::string&)> assign;  // "" or the requirement the text failed
    std::function<nlohmann::json()> value;
  };

  template <typename T>
  void add(po::options_description& group, const char* name, T* target, const char* help) {
    group.add_options()(name, po::value<T>(target)->default_value(*target, show(*target)), help);
    getters_.emplace_back(name, [target] { return nlohmann::json(*target); });
  }

  Typed& add_typed(po::options_description& group, const char* name, std::string default_text, const char* help) {
    Typed& t = typed_.emplace_back(Typed{name, std::move(default_text), {}, {}});
    group.add_options()(name, po::value<std::string>(&t.text)->default_value(t.text), help);
    getters_.emplace_back(name, [&t] { return t.value(); });
    return t;
  }

  template <typename E>
  void add_enum(po::options_description& group, const char* name, E* target, const char* help,
                EnumTable<E> table = EnumNames<E>::table) {
    Typed& t = add_typed(group, name, std::string(enum_name(*target, table)), help);
    t.assign = [target, table](const std::string& text) {
      const std::optional<E> value = enum_from_name(text, table);
      if (!value) return concat("must be ", enum_choices(table), ", got '", text, "'");
      *target = *value;
      return std::string();
    };
    t.value = [target, table] { return nlohmann::json(std::string(enum_name(*target, table))); };
  }

  void add_count(po::options_description& group, const char* name, int64_t* target, CountRule rule, const char* help) {
    const bool word = rule.word != nullptr && *target == rule.word_value;
    Typed& t = add_typed(group, name, word ? rule.word : count_text(*target), help);
    t.assign = [target, rule](const std::string& text) {
      if (rule.word != nullptr && text == rule.word) {
        *target = rule.word_value;
        return std::string();
      }
      auto n = parse_element_count(text, rule.allow_zero);
      if (!n.is_ok()) return concat("must be ", rule.requirement, ", got '", text, "'");
      *target = n.value();
      return std::string();
    };
    t.value = [target, rule] {
      if (rule.word != nullptr && *target == rule.word_value) return nlohmann::json(rule.word);
      return nlohmann::json(*target);
    };
  }

  // A number that may be left unset ("model": the model's generation_config.json decides).
  template <typename T>
  void add_model_default(po::options_description& group, const char* name, std::optional<T>* target,
                         const char* help) {
    Typed& t = add_typed(group, name, "model", help);
    t.assign = [target](const std::string& text) {
      if (text == "model") {
        target->reset();
        return std::string();
      }
      try {
        size_t used = 0;
        const T v = std::is_integral_v<T> ? static_cast<T>(std::stoll(text, &used)) : static_cast<T>(std::stod(text, &used));
        if (used == text.size() && std::isfinite(static_cast<double>(v))) {
          *target = v;
          return std::string();
        }
      } catch (const std::exception&) {
      }
      return concat("must be ", std::is_integral_v<T> ? "an integer" : "a finite number",
                    " or model (the model's generation_config.json), got '", text, "'");
    };
    t.value = [target] { return *target ? nlohmann::json(**target) : nlohmann::json("model"); };
  }

  // An enum value that may be left unset ("model": the model's generation_config.json decides).
  template <typename E>
  void add_model_default_enum(po::options_description& group, const char* name, std::optional<E>* target,
                              const char* help, EnumTable<E> table = EnumNames<E>::table) {
    Typed& t = add_typed(group, name, "model", help);
    t.assign = [target, table](const std::string& text) {
      if (text == "model") {
        target->reset();
        return std::string();
      }
      const std::optional<E> value = enum_from_name(text, table);
      if (!value)
        return concat("must be ", enum_choices(table), " or model (the model's generation_config.json), got '", text,
                      "'");
      *target = *value;
      return std::string();
    };
    t.value = [target, table] {
      return *target ? nlohmann::json(std::string(enum_name(**target, table))) : nlohmann::json("model");
    };
  }

  void build() {
    TrainConfig& t = o_.train;
    ModelConfig& m = t.model;
    // Built-in defaults are the embedded tiny GLM-4 recipe (configs/glm4-tiny.cfg holds the same).
    // data/sample/tokenizer.model's 1500 ranks + 14 specials, padded as GLM-4 pads 151343 to 151552.
    m.vocab_size = 1536;
    m.hidden_size = 128;
    m.intermediate_size = 256;
    m.num_hidden_layers = 2;
    m.num_attention_heads = 4;
    m.num_key_value_heads = 2;
    m.head_dim = 32;
    m.max_position_embeddings = 2048;
    m.partial_rotary_factor = 0.5;
    m.rms_norm_eps = 1.5625e-07;
    m.initializer_range = 0.02;
    t.datasets = {"data/sample/conversations.jsonl"};
    t.max_length = 512;
    t.per_device_train_batch_size = 4;
    t.gradient_accumulation_steps = 1;
    t.num_train_epochs = 3;
    t.learning_rate = 2e-3;
    t.weight_decay = 0.01;
    t.warmup_ratio = 0.05;
    t.logging_steps = 5;
    t.output_dir = "output";

    po::options_description general("General");
    general.add_options()("help,h", "print this help and exit")(
        "config", po::value<std::string>(&o_.config_file)->value_name("FILE"),
        "INI file of option defaults (key = value per line); the command line overrides it");
    add_enum(general, "device", &o_.device, "backend: auto (cuda when a GPU and the CUDA backend exist), cpu or cuda");
    add(general, "model_id_or_path", &o_.model_id_or_path,
        "Hugging Face model directory (config.json + safetensors, layout glm or chatglm) to start from");
    add(general, "model", &o_.model, "ms-swift's name for --model_id_or_path");
    add(general, "output_dir", &t.output_dir,
        "directory for args.json and logging.jsonl; for prepare, given on the command line: where the token shards "
        "go");
    add(general, "overwrite_output_dir", &o_.overwrite_output_dir,
        "train into an --output_dir that holds an earlier run's logging.jsonl or checkpoints: true removes them "
        "first; false (default) refuses, unless --resume_from_checkpoint continues that run");
    add(general, "seed", &t.seed, "seed for initialisation and data shuffling");
    add(general, "logging_steps", &t.logging_steps, "log every N optimizer steps (and the last)");
    add(general, "log_gpu_health", &t.log_gpu_health,
        "CUDA: each log line carries every rank's GPU utilisation, power, temperature and clocks (NVML), read "
        "at the logging step");
    add_enum(general, "save_strategy", &t.save_strategy,
             "steps: save output_dir/checkpoint-N every --save_steps and at the end; no: never");
    add(general, "save_steps", &t.save_steps, "optimizer steps between checkpoints");
    add(general, "save_total_limit", &t.save_total_limit, "keep the newest N checkpoints; <= 0 keeps all");
    add(general, "save_only_model", &t.save_only_model,
        "true: checkpoints hold the weights only (a third of the bytes: no Adam moments); export and "
        "--resume_only_model read them, a full resume is refused");
    add(general, "resume_from_checkpoint", &t.resume_from_checkpoint,
        "a checkpoint directory, or latest (the newest complete one in --output_dir): weights, optimizer, "
        "schedule and data position; any world size and ZeRO stage");
    add(general, "resume_only_model", &t.resume_only_model,
        "true: take only the weights of --resume_from_checkpoint; the optimizer moments start at zero and the "
        "step, LR schedule and data position at the beginning (ms-swift's option)");
    add(general, "collective_timeout", &o_.collective_timeout,
        "seconds a collective may wait before all ranks abort (a peer died or hangs)");

    po::options_description model("Model (GLM-4 architecture; transformers GlmConfig names)");
    add(model, "vocab_size", &m.vocab_size, "padded vocabulary size (rows of embedding and lm_head)");
    add(model, "hidden_size", &m.hidden_size, "model width");
    add(model, "intermediate_size", &m.intermediate_size, "SwiGLU inner width (ffn_hidden_size)");
    add(model, "num_hidden_layers", &m.num_hidden_layers, "transformer layers");
    add(model, "num_attention_heads", &m.num_attention_heads, "query heads");
    add(model, "num_key_value_heads", &m.num_key_value_heads, "KV groups (multi_query_group_num)");
    add(model, "head_dim", &m.head_dim, "per-head width (kv_channels); 0 = hidden_size / num_attention_heads");
    add(model, "max_position_embeddings", &m.max_position_embeddings, "longest supported sequence (seq_length)");
    model.add_options()("rope_ratio", po::value<double>()->value_name("R"),
                        "RoPE base multiplier: rope_theta = 10000 x rope_ratio (default 500)")(
        "rope_theta", po::value<double>()->value_name("THETA"), "RoPE base (alternative to rope_ratio; default 5e6)");
    add(model, "partial_rotary_factor", &m.partial_rotary_factor, "fraction of each head's dims that RoPE rotates");
    add(model, "rms_norm_eps", &m.rms_norm_eps, "RMSNorm epsilon (layernorm_epsilon)");
    add(model, "initializer_range", &m.initializer_range, "std of the normal initialisation of weights");
    add(model, "pad_token_id", &m.pad_token_id,
        "the embedding row that starts at zero and never trains (transformers' padding_idx); -1: none. With "
        "--model_id_or_path: config.json's (the glm layout's pad_token_id, default 151329; none for chatglm)");

    po::options_description data("Data");
    data.add_options()("dataset",
                       po::value<std::vector<std::string>>(&t.datasets)
                           ->multitoken()
                           ->composing()
                           ->default_value(t.datasets, "data/sample/conversations.jsonl")
                           ->value_name("FILE..."),
                       "jsonl files (messages, sharegpt, alpaca or pre-tokenized lines), or one directory that "
                       "glm_hpc prepare --output_dir wrote (memory-mapped token shards)");
    getters_.emplace_back("dataset", [&t] { return nlohmann::json(t.datasets); });
    add(data, "tokenizer", &o_.tokenizer,
        "auto: the tokenizer.model of --model_id_or_path, else data/sample/tokenizer.model (the embedded tiny "
        "config's); a tiktoken rank file (GLM-4's tokenizer.model) or a directory holding one; bytes: the built-in "
        "byte-level tokenizer (vocab 270)");
    add(data, "dataset_cache", &o_.dataset_cache,
        "true: train and eval keep tokenized jsonl as token shards in $XDG_CACHE_HOME/glm_hpc/datasets (default "
        "~/.cache/glm_hpc/datasets) and map them again while the files' contents, the tokenizer, the data options "
        "and the glm_hpc binary are unchanged");
    add(data, "max_length", &t.max_length, "longest sample in tokens; longer samples are deleted");
    add_enum(data, "truncation_strategy", &t.truncation_strategy,
             "samples over max_length: delete, left (keep the last tokens) or right (keep the first)");
    data.add_options()(
        "val_dataset",
        po::value<std::vector<std::string>>(&o_.val_datasets)->multitoken()->composing()->value_name("FILE..."),
        "validation files (same formats); evaluated every --eval_steps");
    getters_.emplace_back("val_dataset", [this] { return nlohmann::json(o_.val_datasets); });
    add(data, "split_dataset_ratio", &o_.split_dataset_ratio,
        "without --val_dataset: share of --dataset held out for validation (seeded)");
    add_enum(data, "loss_scale", &t.loss_scale,
             "trained tokens: default (every assistant turn), last_round (the last one) or all");
    add(data, "system", &t.system, "system prompt for conversations that have none");
    add(data, "packing", &t.packing,
        "true: bin-pack whole samples into rows of up to max_length tokens (each keeps its own positions and "
        "attention); a row then counts as one sample for batch sizes and steps per epoch");
    add_enum(data, "on_bad_sample", &t.on_bad_sample,
             "error: report every bad line (file:line) and stop; skip: drop them, report the count");

    po::options_description train("Training (transformers TrainingArguments names)");
    add(train, "per_device_train_batch_size", &t.per_device_train_batch_size, "samples per rank per micro-batch");
    add(train, "gradient_accumulation_steps", &t.gradient_accumulation_steps, "micro-batches per optimizer step");
    add(train, "max_steps", &t.max_steps, "optimizer steps; -1 = num_train_epochs over the dataset");
    add(train, "num_train_epochs", &t.num_train_epochs, "epochs when max_steps is -1");
    add(train, "learning_rate", &t.learning_rate,
        "peak learning rate; default with --model_id_or_path: 1e-4 for LoRA, 1e-5 for full fine-tuning (ms-swift's), "
        "else 2e-3 (the built-in tiny model from scratch)");
    add_enum(train, "lr_scheduler_type", &t.lr_scheduler_type,
             "cosine, linear or constant_with_warmup (constant: the same, transformers' other name)");
    add(train, "warmup_ratio", &t.warmup_ratio, "fraction of steps of linear warmup");
    add(train, "warmup_steps", &t.warmup_steps, "warmup steps (overrides warmup_ratio when > 0)");
    add(train, "weight_decay", &t.weight_decay, "decoupled AdamW weight decay (not on norms and biases)");
    add(train, "adam_beta1", &t.adam_beta1, "AdamW beta1");
    add(train, "adam_beta2", &t.adam_beta2, "AdamW beta2");
    add(train, "adam_epsilon", &t.adam_epsilon, "AdamW epsilon");
    add(train, "max_grad_norm", &t.max_grad_norm, "global gradient-norm clipping; <= 0 disables");
    add(train, "skip_nonfinite_steps", &t.bad_steps.nonfinite,
        "a step whose loss or gradient norm is not finite is skipped on every rank (nothing of it applied, logged with "
        "its batch) instead of ending the run; needs the norm before the update: with --max_grad_norm <= 0 and no "
        "spike check the norm comes with the update, and such a step still ends the run");
    add(train, "skip_loss_zscore", &t.bad_steps.loss_zscore,
        "> 0: skip a step whose loss is this many standard deviations above the mean of the last 128 applied steps "
        "(from the 16th on; llm.c's -sl); 0: off");
    add(train, "skip_grad_norm_zscore", &t.bad_steps.grad_norm_zscore,
        "> 0: the same for the gradient norm (llm.c's -sg); 0: off. A spike check computes the norm before the update "
        "even without clipping (no update inside backward)");
    add(train, "max_skipped_steps", &t.bad_steps.max_consecutive,
        "this many skipped steps in a row end the run (exit code 2) with its last checkpoint as it was; 0: no limit");
    add(train, "eval_steps", &t.eval_steps,
        "evaluate the validation set (--val_dataset or --split_dataset_ratio) every N steps and at the end; "
        "default with validation data: --save_steps (ms-swift's)");
    add_enum(train, "eval_strategy", &o_.eval_strategy,
             "steps: evaluate every --eval_steps when there is validation data; no: never");
    add(train, "bf16", &o_.bf16, "GPUs compute in bf16 with fp32 master weights (true; false is refused)");
    add(train, "fp16", &o_.fp16, "refused when true: glm_hpc has no fp16 path (bf16 on GPUs)");
    add_enum(train, "torch_dtype", &o_.torch_dtype,
             "auto or bfloat16 (what the CUDA backend computes in); float16 and float32 are refused");
    add(train, "zero_stage", &t.zero_stage,
        "ZeRO stage: 0 replicated, 1 optimizer state, 2 + gradients, 3 + parameters sharded over ranks");
    add_enum(train, "recompute", &t.recompute,
             "activation recomputation: none, selective (RMSNorm and SwiGLU outputs recomputed) or full (each layer "
             "recomputed from its input before its backward)");
    add(train, "gradient_checkpointing", &o_.gradient_checkpointing,
        "true is --recompute full (the transformers/ms-swift name)");
    add(train, "offload_activations", &t.offload_activations,
        "the layers' inputs (what --recompute full keeps) wait for their backward in pinned host memory, copied "
        "there and back while other layers compute; the GPU keeps 3 of them: for sequences whose activations do "
        "not fit");
    add(train, "context_parallel_size", &t.context_parallel_size,
        "ranks sharing each sequence (Megatron's name): groups of this many consecutive ranks each hold 1/C of "
        "every row's tokens and attention gathers the row's keys and values; must divide the world size");
    add(train, "sequence_parallel_size", &o_.sequence_parallel_size, "ms-swift's name for --context_parallel_size");
    add(train, "report_to", &o_.report_to,
        "where the metrics go besides logging.jsonl and the step line (transformers' option): tensorboard (event files "
        "in <output_dir>/runs; the default where glm_hpc was built with protobuf), all (the same), none; another "
        "tracker's name is refused");
    add(train, "deepspeed", &o_.deepspeed,
        "a DeepSpeed JSON config (or zero1, zero2, zero3) mapped onto these options: each key is applied, "
        "accepted without effect (the reason is printed once) or refused by name; options given explicitly must "
        "agree with it (docs/DEEPSPEED.md)");
    ZeroOptions& z = t.zero_options;
    z.param_persistence_threshold = ZeroOptions::kDeepSpeedParamPersistenceThreshold;
    add_count(
        train, "reduce_bucket_size", &z.reduce_bucket_size,
        {false, "auto", ZeroOptions::kAutoBucketSize, "a positive element count (5e8, 500000000) or auto"},
        "ZeRO gradient bucket in elements (DeepSpeed's name; 5e8 or 500000000): consecutive layers' gradients are "
        "reduced in one collective up to this size, a larger layer alone; auto: the knee of the bus-bandwidth curve "
        "(90% of its plateau), from --comm_profile or measured at start");
    add_count(train, "allgather_bucket_size", &z.allgather_bucket_size,
              {false, nullptr, 0, "a positive element count (5e8, 500000000)"},
              "ZeRO-1/2 parameter all-gather bucket in elements after the optimizer step");
    add(train, "overlap_comm", &z.overlap_comm,
        "true: start each bucket's collective as soon as it is complete, overlapping backward, the optimizer and "
        "the next layer's forward; false: after its producer, one at a time (a baseline)");
    add_count(train, "prefetch_bucket_size", &z.prefetch_bucket_size,
              {true, nullptr, 0, "an element count >= 0 (5e8, 0 = no prefetch)"},
              "ZeRO-3: gather the next layer ahead while the current one computes when it has at most this many "
              "elements (one layer ahead at most); 0 disables prefetching");
    add_count(train, "param_persistence_threshold", &z.param_persistence_threshold,
              {true, nullptr, 0, "an element count >= 0 (1e5, 100000; 0 = every tensor partitioned)"},
              "ZeRO-3: tensors of at most this many elements (DeepSpeed's stage3_param_persistence_threshold; 1e5 or "
              "100000) are not partitioned: every rank keeps them whole for the whole run, never gathered per layer; "
              "their gradients and optimizer state stay sharded and one all-gather after each optimizer step refreshes "
              "them. 0: every tensor partitioned. No effect at stages 0-2");
    add_count(train, "model_persistence_threshold", &z.model_persistence_threshold,
              {true, "inf", PersistencePolicy::kUnlimited, "an element count >= 0 (1e6, 1000000) or inf"},
              "ZeRO-3: at most this many persistent elements in all (DeepSpeed's stage3_model_persistence_threshold: "
              "tensors taken in layout order, one that would pass it stays partitioned); inf: no limit. No effect at "
              "stages 0-2");
    add_enum<DType>(
        train, "grad_reduce_dtype", &z.grad_reduce_dtype,
        "dtype gradients are reduced in: fp32 (PyTorch FSDP2's reduce_dtype=float32; over exactly two GPUs it "
        "travels as bf16, which gives the same bits) or bf16 (half the traffic)",
        kReduceDTypes);
    add_enum(train, "offload_optimizer", &t.offload_optimizer,
             "none, or cpu (DeepSpeed's offload_optimizer, ZeRO stages 1-3): each rank's fp32 master weights and Adam "
             "moments live in host memory and host threads update them with the GPU kernel's arithmetic (the same "
             "bits); GPU memory keeps the parameters, gradients and activations. LoRA's adapters stay on the GPU");
    add_enum(train, "offload_param", &t.offload_param,
             "none, or cpu (DeepSpeed's offload_param; --zero_stage 3 with --offload_optimizer cpu): each rank's "
             "parameter shards live in host memory, where the host update writes them, and each unit's shard is "
             "copied to the GPU as the unit is gathered, ahead of its use; GPU memory keeps the gathered units, the "
             "persistent tensors, gradients and activations");
    add(train, "offload_param_ratio", &z.offload_param_ratio,
        "with --offload_param cpu: the share of the parameter shards (by elements) kept in host memory, 0 < R <= 1; "
        "the other units' shards stay on the GPU, interleaved with the offloaded ones, and are gathered without "
        "a copy from the host. `glm_hpc plan --gpu_memory_gib G` names the smallest share that fits");
    add(train, "offload_pin_memory", &t.offload_pin_memory,
        "with --offload_optimizer cpu: page-locked host memory (DeepSpeed's pin_memory; faster copies); false: "
        "pageable memory, for hosts whose memory-lock limit is low");
    add(train, "offload_delayed_update", &t.offload_delayed_update,
        "with --offload_optimizer cpu: ZeRO-Offload's one-step delayed parameter update: a step's host update "
        "runs beside the next step's forward and backward, whose gradients are then taken one update late; "
        "evaluation, checkpoints and the end of training land it first (4 bytes a parameter more host memory)");
    add(train, "offload_delayed_update_after", &t.offload_delayed_update_after,
        "with --offload_delayed_update: optimizer steps updated at once before the delay begins (ZeRO-Offload "
        "delays only after the first tens of steps, where the parameters move fastest)");
    add(train, "offload_gradients", &t.offload_gradients,
        "with --offload_optimizer cpu at --gradient_accumulation_steps 1 and ZeRO stage 2 or 3: each bucket's reduced "
        "gradient is copied to pinned host memory during backward and the GPU keeps none (false: the gradients stay "
        "on the GPU until the host update fetches them)");
    add(train, "offload_threads", &t.offload_threads,
        "with --offload_optimizer cpu: host threads per rank for the update; 0: the cores this rank may run on, "
        "shared with the node's other ranks");
    add(train, "comm_profile", &t.comm_profile,
        "bench_comm --json file that --reduce_bucket_size auto reads instead of measuring at start");
    po::options_description tuner("Fine-tuning method (ms-swift names)");
    add_enum(tuner, "train_type", &t.train_type,
             "full: train every parameter; lora: freeze the base model and train LoRA adapters on its linears");
    add(tuner, "lora_rank", &t.lora.rank, "LoRA rank r");
    add(tuner, "lora_alpha", &t.lora.alpha, "LoRA alpha: the adapter output is scaled by alpha / r");
    add(tuner, "lora_dropout", &t.lora.dropout,
        "dropout probability on each adapter's input during training steps (PEFT's lora_dropout; not in "
        "evaluation); 0 disables it");
    add(tuner, "target_modules", &o_.target_modules,
        "all-linear, or a comma list of query_key_value, dense, dense_h_to_4h, dense_4h_to_h (the lm_head is "
        "never adapted)");
    po::options_description plan("Memory planner (glm_hpc plan)");
    add(plan, "world_size", &o_.plan_world_size, "GPUs the plan spreads the model over");
    add(plan, "gpu_memory_gib", &o_.gpu_memory_gib, "memory of one GPU in GiB (default: an H200)");
    add(plan, "gpus_per_node", &o_.plan_gpus_per_node,
        "GPUs of one node, for the host memory an offloaded optimizer needs per node (at most --world_size)");
    add(train, "per_device_eval_batch_size", &o_.per_device_eval_batch_size, "samples per rank per evaluation batch");
    po::options_description prepare("Data preparation (glm_hpc prepare)");
    add(prepare, "print_example", &o_.print_example,
        "print kept sample N (0-based) decoded, its trained tokens between [[ and ]] (a trained token shows its "
        "label); -1 = none");

    po::options_description hf_export("Export to Hugging Face (glm_hpc export)");
    add(hf_export, "ckpt_dir", &o_.ckpt_dir,
        "the checkpoint to export: a checkpoint-N directory, or an --output_dir (its latest checkpoint)");
    add(hf_export, "save_dir", &o_.save_dir,
        "the model directory to write (created; written whole or not at all); glm_hpc plot: where the charts go "
        "(default: RUN_DIR/images of one run, ./images of several)");
    add_enum(hf_export, "export_format", &o_.export_format,
             "hf: transformers GlmForCausalLM (model_type glm); chatglm: the THUDM layout (model_type chatglm, "
             "fused query_key_value, trust_remote_code)");
    add(hf_export, "max_shard_size", &o_.max_shard_size,
        "largest safetensors shard: 5GB, 500MB, 2GiB or bytes, as transformers' save_pretrained");
    add(hf_export, "tokenizer_dir", &o_.tokenizer_dir,
        "tokenizer files to copy (tokenizer.model, tokenizer_config.json, tokenization_chatglm.py, ...), a "
        "directory or a tokenizer.model; default: the training run's --model_id_or_path or tokenizer");
    add(hf_export, "overwrite", &o_.overwrite, "true: replace a non-empty --save_dir");
    add(hf_export, "merge_lora", &o_.merge_lora,
        "a LoRA checkpoint: false writes its adapters in PEFT's format (adapter_config.json, "
        "adapter_model.safetensors); true merges them into their base (checked against the checkpoint's "
        "fingerprint; --model_id_or_path if it moved) and writes the whole model like a full checkpoint");

    po::options_description infer("Inference (glm_hpc infer; ms-swift's and transformers' generation names)");
    add(infer, "adapters", &o_.adapters,
        "LoRA adapters applied without merging: a glm_hpc LoRA checkpoint (or its run's --output_dir), or a PEFT "
        "adapter directory (adapter_config.json + adapter_model.safetensors) on the base --model_id_or_path");
    add(infer, "max_new_tokens", &o_.max_new_tokens,
        "most tokens generated per reply (not given: generation_config.json's max_new_tokens, else 512)");
    add(infer, "max_batch_size", &o_.max_batch_size,
        "prompts each rank generates at once (continuous batching: a finished reply's place goes to the next "
        "prompt)");
    add_model_default(infer, "temperature", &o_.temperature,
                      "sampling temperature; 0: greedy. model: generation_config.json's (greedy unless its "
                      "do_sample is true; without the file greedy)");
    add_model_default(infer, "top_p", &o_.top_p,
                      "nucleus sampling: keep the smallest set of likeliest tokens holding this probability (model: "
                      "generation_config.json's, else 1)");
    add_model_default(infer, "top_k", &o_.top_k,
                      "sample among the k likeliest tokens; 0: no limit (model: generation_config.json's, else 50 "
                      "as transformers)");
    add_model_default(infer, "repetition_penalty", &o_.repetition_penalty,
                      "> 1 discourages tokens already in the sequence (model: generation_config.json's, else 1)");
    add_model_default(infer, "num_beams", &o_.num_beams,
                      "beam search over this many beams, as transformers' generate (with sampling: beam sample); 1: "
                      "none (model: generation_config.json's, else 1)");
    add_model_default(infer, "length_penalty", &o_.length_penalty,
                      "beam search: a finished reply scores its summed log-probability over its length to this power; "
                      "> 0 favours longer replies (model: generation_config.json's, else 1)");
    add_model_default_enum(infer, "early_stopping", &o_.early_stopping,
                           "beam search ends: false when no running beam can still win at its current length, true "
                           "once num_beams replies have finished, never when none could win at the longest length "
                           "(model: generation_config.json's, else false)");
    add(infer, "result_path", &o_.result_path,
        "with --val_dataset: the jsonl of results (default: infer_result/<time>.jsonl in the --ckpt_dir checkpoint, "
        "else in the working directory)");
    add(infer, "compare_with", &o_.compare_with,
        "with --val_dataset: a second model (a model directory or a checkpoint) answers the same prompts; "
        "--result_path then holds both replies per prompt as response_a and response_b in a seeded random order "
        "(blinded), beside a Markdown table to score, the key (.key.json) and each model's own results");
    add(infer, "stream", &o_.stream, "the chat shows each reply as it is generated (false: when it is complete)");

    po::options_description plots("Charts (glm_hpc plot RUN_DIR..., and the end of every training run)");
    add(plots, "plot_smoothing", &o_.plot_smoothing,
        "weight of the loss curve's exponential moving average (TensorBoard's smoothing, debiased), in [0, 1); 0: "
        "the raw curve alone");
    add_enum(plots, "plot_format", &o_.plot_format,
             "png: PNG charts drawn by gnuplot (SVG where gnuplot is missing); svg; none: training draws no charts "
             "(glm_hpc plot then draws PNG)");

    po::options_description kernels("Performance (the same results, other speed or memory)");
    add(kernels, "optimizer_in_backward", &t.optimizer_in_backward,
        "true: without clipping on one rank at ZeRO stage 0, update each layer as soon as backward finished its "
        "gradient, beside the rest of backward (the same arithmetic as after backward)");
    add(kernels, "split_master_weights", &t.split_master_weights,
        "true: a CUDA run keeps each fp32 master weight as its bf16 parameter plus a 16-bit low half (2 bytes a "
        "parameter instead of 4, the same fp32 values); false: whole fp32 masters");
    add(kernels, "defer_embedding_rows", &t.defer_embedding_rows,
        "ZeRO stage 0: embedding rows no token of a step reads are updated when next read, at most this many "
        "optimizer steps late (the same values, less memory traffic); 0: every row every step (at most 64)");
    add(kernels, "optimizer_side_sms", &o_.backend.optimizer_side_sms,
        "CUDA: SMs left to the optimizer while it runs beside backward (GEMMs are planned for the rest; at most a "
        "quarter of the GPU); 0: GEMMs use every SM");
    add_enum(kernels, "gemm_autotune", &o_.backend.gemm_autotune,
             "CUDA: off (cuBLASLt's first heuristic), large (time cuBLASLt's candidates for large GEMM shapes at the "
             "first call and keep the fastest) or all (every shape; glm_hpc infer then times each prompt length's "
             "prefill shape when it first comes, which a file of varied prompts pays for more than it gains)");
    add_enum(kernels, "attention_kernel", &o_.backend.attention_kernel,
             "CUDA: auto (Hopper's wgmma flash attention on sm_90 at head_dim 128, else the mma.sync one; on sm_90 "
             "and later the decode attention's splits merged in thread-block clusters) or mma (the mma.sync kernels "
             "everywhere, a second kernel merging the decode attention's splits)");
    add(kernels, "shared_memory_limit_kib", &o_.backend.shared_memory_limit_kib,
        "CUDA: KiB of shared memory per block the kernels may use, at most the GPU's (0: the GPU's limit); a "
        "larger GPU then runs the kernels a smaller one would (an A100 allows 163, an RTX 4090 or A6000 99; "
        "below Hopper's 227 the wgmma kernels are off)");
    add(kernels, "lm_head_scratch_mb", &o_.lm_head_scratch_mb,
        "CUDA: MiB of bf16 logits the fused lm_head + cross-entropy holds at once (it runs in chunks of rows that "
        "fit)");
    add(kernels, "cuda_graphs", &o_.backend.cuda_graphs,
        "CUDA: glm_hpc infer replays each decode step of a batch size (and attention split count) as one CUDA "
        "graph, captured at its second step, instead of launching its few hundred kernels one by one (the same "
        "kernels: the same tokens); false: op by op; --profile runs op by op");
    add(kernels, "profile", &o_.backend.profile,
        "CUDA: time every op with events and print per-op device time and idle gaps per stream at exit (slower)");
    add(kernels, "profile_trace", &o_.backend.profile_trace,
        "CUDA with --profile: also write the profiled ops' first minute as a Chrome trace to this file");

    all_.add(general)
        .add(model)
        .add(data)
        .add(train)
        .add(tuner)
        .add(kernels)
        .add(plan)
        .add(prepare)
        .add(hf_export)
        .add(infer)
        .add(plots);
  }

  CliOptions& o_;
  po::options_description all_{"glm_hpc options", 100, 50};
  std::vector<std::pair<std::string, std::function<nlohmann::json()>>> getters_;
  std::deque<Typed> typed_;  // a deque: Boost and the getters keep pointers to its elements
};

constexpr const char* kModelShapeOptions[] = {"vocab_size",
                                              "hidden_size",
                                              "intermediate_size",
                                              "num_hidden_layers",
                                              "num_attention_heads",
                                              "num_key_value_heads",
                                              "head_dim",
                                              "max_position_embeddings",
                                              "rope_ratio",
                                              "rope_theta",
                                              "partial_rotary_factor",
                                              "rms_norm_eps",
                                              "pad_token_id"};

Status validate_performance(CliOptions& o, const Sources& src) {
  TrainConfig& t = o.train;
  BackendConfig& b = o.backend;
  GLM_RETURN_IF_ERROR(check(t.defer_embedding_rows >= 0 && t.defer_embedding_rows <= 64, src, "defer_embedding_rows",
                            "must be in [0, 64]"));
  GLM_RETURN_IF_ERROR(check(b.optimizer_side_sms >= 0, src, "optimizer_side_sms", "must be >= 0"));
  GLM_RETURN_IF_ERROR(check(b.shared_memory_limit_kib >= 0 && b.shared_memory_limit_kib <= 1 << 20, src,
                            "shared_memory_limit_kib", "must be in [0, 1048576]"));
  GLM_RETURN_IF_ERROR(check(o.lm_head_scratch_mb >= 1 && o.lm_head_scratch_mb <= (int64_t{1} << 30), src,
                            "lm_head_scratch_mb", "must be a positive number of MiB"));
  b.lm_head_scratch_bytes = o.lm_head_scratch_mb << 20;
  GLM_RETURN_IF_ERROR(check(b.profile_trace.empty() || b.profile, src, "profile_trace", "needs --profile true"));
  GLM_RETURN_IF_ERROR(check(t.offload_threads >= 0, src, "offload_threads", "must be >= 0 (0: automatic)"));
  GLM_RETURN_IF_ERROR(check(t.offload_delayed_update_after >= 0, src, "offload_delayed_update_after", "must be >= 0"));
  const double ratio = t.zero_options.offload_param_ratio;
  GLM_RETURN_IF_ERROR(check(ratio > 0 && ratio <= 1, src, "offload_param_ratio", "must be in (0, 1]"));
  return Status::ok();
}

bool given(const Sources& src, const char* name) {
  return src.command_line.count(name) > 0 || src.config_lines.count(name) > 0;
}

// The names users of transformers and ms-swift type first: accepted with their meaning where
// glm_hpc has it, refused by name where it has not.
Status validate_familiar_names(CliOptions& o, const Sources& src) {
  if (given(src, "model")) {
    if (given(src, "model_id_or_path") && o.model != o.model_id_or_path)
      return GLM_USER_ERROR(src.where("model"), " '", o.model, "' contradicts ", src.where("model_id_or_path"), " '",
                            o.model_id_or_path, "' (the same option)");
    o.model_id_or_path = o.model;
  }
  std::stringstream trackers(o.report_to);
  o.train.report_tensorboard = false;
  for (std::string tracker; std::getline(trackers, tracker, ',');) {
    if (tracker == "none") continue;
    if (tracker != "all" && tracker != "tensorboard")
      return GLM_USER_ERROR(src.where("report_to"), " ", tracker,
                            ": glm_hpc reports to TensorBoard event files, <output_dir>/logging.jsonl and the console; "
                            "give --report_to tensorboard, all or none");
    if (!tensorboard_available()) {
      if (!given(src, "report_to")) continue;  // the default where TensorBoard is not built in: nothing more
      return GLM_USER_ERROR(src.where("report_to"), " ", tracker,
                            ": this glm_hpc was built without protobuf (install libprotobuf-dev and protobuf-compiler "
                            "and build again); --report_to none writes logging.jsonl alone");
    }
    o.train.report_tensorboard = true;
  }
  // ms-swift's learning rates by training type when fine-tuning a pretrained model; the built-in
  // tiny model trained from scratch keeps its own default.
  if (!given(src, "learning_rate") && !src.deepspeed_keys.count("learning_rate") && !o.model_id_or_path.empty())
    o.train.learning_rate = o.train.train_type == TrainType::lora ? 1e-4 : 1e-5;
  if (!o.bf16)
    return GLM_USER_ERROR(src.where("bf16"), " false: the CUDA backend computes in bf16 with fp32 master weights "
                          "(there is no fp32 GPU path); --device cpu computes in fp32");
  if (o.fp16 || o.torch_dtype == TorchDtype::float16)
    return GLM_USER_ERROR(src.where(o.fp16 ? "fp16" : "torch_dtype"),
                          ": glm_hpc has no fp16 path; GPUs train in bf16 (--bf16 true, the default)");
  if (o.torch_dtype == TorchDtype::float32)
    return GLM_USER_ERROR(src.where("torch_dtype"), " float32: GPUs compute in bf16 with fp32 master weights; "
                          "--device cpu computes in fp32");
  return Status::ok();
}

// Options that would do nothing in this combination are an error that says what to add.
Status validate_combinations(CliOptions& o, const Sources& src) {
  TrainConfig& t = o.train;
  if (o.command == "eval" && given(src, "output_dir"))
    return GLM_USER_ERROR(src.where("output_dir"), ": 'glm_hpc eval' writes no files (it prints eval_loss and "
                          "eval_ppl); drop --output_dir");
  if (o.command != "train" && o.command != "plan") return Status::ok();
  if (t.offload_optimizer == OffloadDevice::none) {
    for (const char* name :
         {"offload_pin_memory", "offload_threads", "offload_delayed_update", "offload_delayed_update_after",
          "offload_gradients"})
      if (given(src, name))
        return GLM_USER_ERROR(src.where(name), " applies to an offloaded optimizer: add --offload_optimizer cpu");
  } else if (t.zero_stage == 0) {
    return GLM_USER_ERROR(src.where("offload_optimizer"), " cpu needs --zero_stage 1, 2 or 3 (as DeepSpeed's offload): "
                          "each rank's host then holds only its shard of the optimizer state");
  } else if (t.train_type == TrainType::lora) {
    return GLM_USER_ERROR(src.where("offload_optimizer"), " cpu with --train_type lora: the frozen base has no "
                          "optimizer state and the adapters' is small; drop --offload_optimizer");
  }
  if (t.offload_param != OffloadDevice::cpu && given(src, "offload_param_ratio"))
    return GLM_USER_ERROR(src.where("offload_param_ratio"), " applies to offloaded parameters: add --offload_param cpu");
  if (t.offload_param == OffloadDevice::cpu) {
    if (t.zero_stage != 3)
      return GLM_USER_ERROR(src.where("offload_param"), " cpu needs --zero_stage 3 (as DeepSpeed's offload_param): "
                            "below it every rank holds the whole model on its GPU");
    if (t.offload_optimizer != OffloadDevice::cpu)
      return GLM_USER_ERROR(src.where("offload_param"), " cpu needs --offload_optimizer cpu too: the host update "
                            "then writes the parameters where they live");
  }
  if (o.command != "train") return Status::ok();
  if (t.train_type != TrainType::lora)
    for (const char* name : {"lora_rank", "lora_alpha", "lora_dropout", "target_modules"})
      if (given(src, name))
        return GLM_USER_ERROR(src.where(name), " applies to LoRA training: add --train_type lora (without it every "
                              "parameter trains and no adapter exists)");
  const bool validation = !o.val_datasets.empty() || o.split_dataset_ratio > 0;
  const char* data_option = !o.val_datasets.empty() ? "val_dataset" : "split_dataset_ratio";
  if (o.eval_strategy == EvalStrategy::no) {
    if (given(src, "eval_steps") && t.eval_steps > 0)
      return GLM_USER_ERROR(src.where("eval_strategy"), " no contradicts ", src.where("eval_steps"), " ",
                            t.eval_steps);
    if (validation)
      return GLM_USER_ERROR(src.where("eval_strategy"), " no: ", src.where(data_option),
                            " would never be evaluated; drop one of them");
    t.eval_steps = 0;
    return Status::ok();
  }
  if (!validation) {
    if (given(src, "eval_steps") && t.eval_steps > 0)
      return GLM_USER_ERROR(src.where("eval_steps"), " needs validation data: add --val_dataset FILE or "
                            "--split_dataset_ratio R (e.g. 0.01)");
    if (given(src, "eval_strategy"))
      return GLM_USER_ERROR(src.where("eval_strategy"), " steps needs validation data: add --val_dataset FILE or "
                            "--split_dataset_ratio R (e.g. 0.01)");
    return Status::ok();
  }
  if (given(src, "eval_steps") && t.eval_steps == 0)
    return GLM_USER_ERROR(src.where("eval_steps"), " 0: ", src.where(data_option),
                          " would never be evaluated; give --eval_steps N, or --eval_strategy no without it");
  if (!given(src, "eval_steps")) t.eval_steps = t.save_steps;  // ms-swift's default
  return Status::ok();
}

// Every path option names what it expects (base/input_path.h): a FIFO, a device or a directory given
// for a file (or the reverse) is refused here, before any reader opens it and blocks or never ends.
// Missing paths are left to the readers, which say they cannot open them.
Status validate_input_paths(const CliOptions& o, const Sources& src) {
  const TrainConfig& t = o.train;
  auto expect = [&](const char* name, const std::string& path, InputKind kind) -> Status {
    if (path.empty()) return Status::ok();
    Status s = check_input_path(path, kind);
    return s.is_ok() ? s : GLM_USER_ERROR(src.where(name), ": ", s.message());
  };
  for (const auto& path : t.datasets) GLM_RETURN_IF_ERROR(expect("dataset", path, InputKind::file_or_directory));
  for (const auto& path : o.val_datasets)
    GLM_RETURN_IF_ERROR(expect("val_dataset", path, InputKind::file_or_directory));
  if (o.tokenizer != "auto" && o.tokenizer != "bytes")
    GLM_RETURN_IF_ERROR(expect("tokenizer", o.tokenizer, InputKind::file_or_directory));
  GLM_RETURN_IF_ERROR(expect("model_id_or_path", o.model_id_or_path, InputKind::directory));
  GLM_RETURN_IF_ERROR(expect("comm_profile", t.comm_profile, InputKind::file));
  if (t.resume_from_checkpoint != "latest")
    GLM_RETURN_IF_ERROR(expect("resume_from_checkpoint", t.resume_from_checkpoint, InputKind::directory));
  GLM_RETURN_IF_ERROR(expect("ckpt_dir", o.ckpt_dir, InputKind::directory));
  GLM_RETURN_IF_ERROR(expect("adapters", o.adapters, InputKind::directory));
  GLM_RETURN_IF_ERROR(expect("compare_with", o.compare_with, InputKind::directory));
  return expect("tokenizer_dir", o.tokenizer_dir, InputKind::directory);
}

// One optimizer step's micro-batches are built on the host before the step, 16 bytes a token
// (tokens, targets, positions, document starts): batch sizes whose product passes this host's
// memory are refused before anything is allocated.
Status validate_step_size(const CliOptions& o, const Sources& src) {
  const TrainConfig& t = o.train;
  const double micro_batches = static_cast<double>(t.gradient_accumulation_steps);
  const double tokens =
      micro_batches * static_cast<double>(t.per_device_train_batch_size) * static_cast<double>(t.max_length);
  const double bytes = tokens * 4 * sizeof(int32_t) + micro_batches * sizeof(HostMicroBatch);
  const double host = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGE_SIZE));
  if (host <= 0 || bytes <= host) return Status::ok();
  const double gib = 1024.0 * 1024.0 * 1024.0;
  return GLM_USER_ERROR(src.where("gradient_accumulation_steps"), " ", t.gradient_accumulation_steps, " x ",
                        src.where("per_device_train_batch_size"), " ", t.per_device_train_batch_size, " x ",
                        src.where("max_length"), " ", t.max_length, " = ", tokens,
                        " tokens in one optimizer step: their micro-batches need ", bytes / gib,
                        " GiB of host memory (16 bytes a token), more than this host's ", host / gib, " GiB");
}

// glm_hpc infer's own options belong to it alone; their values are checked here, before any model is read.
Status validate_infer(const CliOptions& o, const Sources& src) {
  constexpr const char* kInferOnly[] = {
      "adapters", "result_path",        "compare_with", "max_new_tokens", "max_batch_size", "temperature", "top_p",
      "top_k",    "repetition_penalty", "num_beams",    "length_penalty", "early_stopping", "stream"};
  if (o.command != "infer") {
    for (const char* name : kInferOnly)
      if (given(src, name) && (o.command != "eval" || std::string_view(name) != "adapters"))
        return GLM_USER_ERROR(src.where(name), " is an option of 'glm_hpc infer'");
    return Status::ok();
  }
  if (given(src, "output_dir"))
    return GLM_USER_ERROR(src.where("output_dir"), ": 'glm_hpc infer' writes its results to --result_path FILE; "
                          "drop --output_dir");
  GLM_RETURN_IF_ERROR(check(!o.model_id_or_path.empty() || !o.ckpt_dir.empty() || !o.adapters.empty(), src,
                            "model_id_or_path",
                            "(or --ckpt_dir DIR, or --adapters DIR) is required by 'glm_hpc infer': the model to run"));
  GLM_RETURN_IF_ERROR(check(o.result_path.empty() || !o.val_datasets.empty(), src, "result_path",
                            "needs --val_dataset FILE (the prompts whose results it holds)"));
  GLM_RETURN_IF_ERROR(check(o.compare_with.empty() || !o.val_datasets.empty(), src, "compare_with",
                            "needs --val_dataset FILE (the prompts both models answer)"));
  GLM_RETURN_IF_ERROR(check(o.max_new_tokens >= 1, src, "max_new_tokens", "must be >= 1"));
  GLM_RETURN_IF_ERROR(check(o.max_batch_size >= 1, src, "max_batch_size", "must be >= 1"));
  GLM_RETURN_IF_ERROR(check(!o.temperature || *o.temperature >= 0, src, "temperature", "must be >= 0 (0: greedy)"));
  GLM_RETURN_IF_ERROR(check(!o.top_p || (*o.top_p > 0 && *o.top_p <= 1), src, "top_p", "must be in (0, 1]"));
  GLM_RETURN_IF_ERROR(check(!o.top_k || *o.top_k >= 0, src, "top_k", "must be >= 0 (0: no limit)"));
  GLM_RETURN_IF_ERROR(check(!o.repetition_penalty || *o.repetition_penalty > 0, src, "repetition_penalty",
                            "must be > 0 (1: none)"));
  GLM_RETURN_IF_ERROR(check(!o.num_beams || *o.num_beams >= 1, src, "num_beams", "must be >= 1 (1: no beam search)"));
  return Status::ok();
}

Status validate(CliOptions& o, const Sources& src, const po::variables_map& vm) {
  TrainConfig& t = o.train;
  GLM_RETURN_IF_ERROR(validate_infer(o, src));
  GLM_RETURN_IF_ERROR(check(t.per_device_train_batch_size >= 1, src, "per_device_train_batch_size", "must be >= 1"));
  GLM_RETURN_IF_ERROR(check(t.gradient_accumulation_steps >= 1, src, "gradient_accumulation_steps", "must be >= 1"));
  GLM_RETURN_IF_ERROR(check(t.max_steps == -1 || t.max_steps > 0, src, "max_steps", "must be -1 or positive"));
  GLM_RETURN_IF_ERROR(check(t.num_train_epochs > 0, src, "num_train_epochs", "must be positive"));
  GLM_RETURN_IF_ERROR(check(t.max_length >= 2, src, "max_length", "must be >= 2"));
  GLM_RETURN_IF_ERROR(check(t.learning_rate >= 0 && std::isfinite(t.learning_rate), src, "learning_rate",
                            "must be a finite value >= 0"));
  GLM_RETURN_IF_ERROR(check(t.warmup_ratio >= 0 && t.warmup_ratio < 1, src, "warmup_ratio", "must be in [0, 1)"));
  GLM_RETURN_IF_ERROR(check(t.warmup_steps >= 0, src, "warmup_steps", "must be >= 0"));
  GLM_RETURN_IF_ERROR(check(t.weight_decay >= 0, src, "weight_decay", "must be >= 0"));
  GLM_RETURN_IF_ERROR(check(t.adam_beta1 >= 0 && t.adam_beta1 < 1, src, "adam_beta1", "must be in [0, 1)"));
  GLM_RETURN_IF_ERROR(check(t.adam_beta2 >= 0 && t.adam_beta2 < 1, src, "adam_beta2", "must be in [0, 1)"));
  GLM_RETURN_IF_ERROR(check(t.adam_epsilon > 0, src, "adam_epsilon", "must be positive"));
  GLM_RETURN_IF_ERROR(check(t.logging_steps >= 0, src, "logging_steps", "must be >= 0"));
  GLM_RETURN_IF_ERROR(check(std::isfinite(t.bad_steps.loss_zscore) && t.bad_steps.loss_zscore >= 0, src,
                            "skip_loss_zscore", "must be >= 0 (0: off)"));
  GLM_RETURN_IF_ERROR(check(std::isfinite(t.bad_steps.grad_norm_zscore) && t.bad_steps.grad_norm_zscore >= 0, src,
                            "skip_grad_norm_zscore", "must be >= 0 (0: off)"));
  GLM_RETURN_IF_ERROR(check(t.bad_steps.max_consecutive >= 0, src, "max_skipped_steps", "must be >= 0 (0: no limit)"));
  GLM_RETURN_IF_ERROR(check(t.save_steps >= 1, src, "save_steps", "must be >= 1"));
  GLM_RETURN_IF_ERROR(check(!t.resume_only_model || !t.resume_from_checkpoint.empty(), src, "resume_only_model",
                            "needs --resume_from_checkpoint (the checkpoint whose weights to load)"));
  GLM_RETURN_IF_ERROR(check(t.zero_stage >= 0 && t.zero_stage <= 3, src, "zero_stage", "must be 0, 1, 2 or 3"));
  {
    const bool explicit_size =
        src.command_line.count("context_parallel_size") || src.config_lines.count("context_parallel_size");
    GLM_RETURN_IF_ERROR(check(o.sequence_parallel_size >= 0, src, "sequence_parallel_size", "must be >= 1"));
    GLM_RETURN_IF_ERROR(check(o.sequence_parallel_size == 0 || !explicit_size ||
                                  o.sequence_parallel_size == t.context_parallel_size,
                              src, "sequence_parallel_size",
                              concat("contradicts --context_parallel_size ", t.context_parallel_size)));
    if (o.sequence_parallel_size > 0) t.context_parallel_size = o.sequence_parallel_size;
    GLM_RETURN_IF_ERROR(check(t.context_parallel_size >= 1, src, "context_parallel_size", "must be >= 1"));
  }
  {
    auto targets = parse_lora_targets(o.target_modules);
    if (!targets.is_ok()) return GLM_USER_ERROR(src.where("target_modules"), ": ", targets.status().message());
    t.lora.targets = targets.take();
    GLM_RETURN_IF_ERROR(check(t.lora.rank >= 1, src, "lora_rank", "must be >= 1"));
    GLM_RETURN_IF_ERROR(check(t.lora.alpha > 0 && std::isfinite(t.lora.alpha), src, "lora_alpha", "must be positive"));
    GLM_RETURN_IF_ERROR(check(t.lora.dropout >= 0 && t.lora.dropout < 1, src, "lora_dropout", "must be in [0, 1)"));
    t.base_model = o.model_id_or_path;  // LoRA checkpoints record their base
  }
  GLM_RETURN_IF_ERROR(check(o.collective_timeout > 0, src, "collective_timeout", "must be positive"));
  GLM_RETURN_IF_ERROR(validate_performance(o, src));
  {
    const bool explicit_policy = src.command_line.count("recompute") || src.config_lines.count("recompute");
    GLM_RETURN_IF_ERROR(check(!o.gradient_checkpointing || !explicit_policy || t.recompute == Recompute::full, src,
                              "gradient_checkpointing",
                              concat("true contradicts --recompute ", enum_name(t.recompute))));
    if (o.gradient_checkpointing) t.recompute = Recompute::full;
  }
  {
    const ZeroOptions& z = t.zero_options;
    GLM_RETURN_IF_ERROR(check(t.comm_profile.empty() || z.reduce_bucket_size == ZeroOptions::kAutoBucketSize, src,
                              "comm_profile", "is only read by --reduce_bucket_size auto"));
  }
  GLM_RETURN_IF_ERROR(check(!t.datasets.empty(), src, "dataset", "needs at least one file"));
  GLM_RETURN_IF_ERROR(validate_input_paths(o, src));
  if (o.command == "train") GLM_RETURN_IF_ERROR(validate_step_size(o, src));
  GLM_RETURN_IF_ERROR(check(o.per_device_eval_batch_size >= 1, src, "per_device_eval_batch_size", "must be >= 1"));
  GLM_RETURN_IF_ERROR(check(o.plan_world_size >= 1, src, "world_size", "must be >= 1"));
  GLM_RETURN_IF_ERROR(check(o.plan_gpus_per_node >= 1, src, "gpus_per_node", "must be >= 1"));
  GLM_RETURN_IF_ERROR(check(o.command != "plan" || o.plan_world_size % t.context_parallel_size == 0, src,
                            "context_parallel_size", concat("must divide --world_size ", o.plan_world_size)));
  GLM_RETURN_IF_ERROR(check(o.print_example >= -1, src, "print_example", "must be a sample index, or -1 for none"));
  GLM_RETURN_IF_ERROR(
      check(o.split_dataset_ratio >= 0 && o.split_dataset_ratio < 1, src, "split_dataset_ratio", "must be in [0, 1)"));
  GLM_RETURN_IF_ERROR(check(t.eval_steps >= 0, src, "eval_steps", "must be >= 0"));
  GLM_RETURN_IF_ERROR(validate_familiar_names(o, src));
  GLM_RETURN_IF_ERROR(validate_combinations(o, src));
  GLM_RETURN_IF_ERROR(check(o.val_datasets.empty() || o.split_dataset_ratio == 0, src, "split_dataset_ratio",
                            "and --val_dataset exclude each other"));
  GLM_RETURN_IF_ERROR(check(o.gpu_memory_gib > 0, src, "gpu_memory_gib", "must be positive"));
  GLM_RETURN_IF_ERROR(check(o.command != "eval" || !o.model_id_or_path.empty() || !o.ckpt_dir.empty() ||
                                !o.adapters.empty(),
                            src, "model_id_or_path",
                            "(or --ckpt_dir DIR, or --adapters DIR) is required by 'glm_hpc eval': the model to score"));
  GLM_RETURN_IF_ERROR(check(o.command == "export" || !o.merge_lora, src, "merge_lora",
                            "is an option of 'glm_hpc export' (of a LoRA checkpoint)"));
  GLM_RETURN_IF_ERROR(check(o.plot_smoothing >= 0 && o.plot_smoothing < 1, src, "plot_smoothing", "must be in [0, 1)"));
  if (o.command == "plot" && o.plot_runs.empty())
    return GLM_USER_ERROR("glm_hpc plot RUN_DIR [RUN_DIR...]: give the output directory of one or more training runs");
  if (o.command == "export") {
    GLM_RETURN_IF_ERROR(check(!o.ckpt_dir.empty(), src, "ckpt_dir", "is required by 'glm_hpc export'"));
    GLM_RETURN_IF_ERROR(check(!o.save_dir.empty(), src, "save_dir", "is required by 'glm_hpc export'"));
    auto shard = parse_byte_size(o.max_shard_size);
    if (!shard.is_ok()) return GLM_USER_ERROR(src.where("max_shard_size"), " ", shard.status().message());
  }
  if (!o.model_id_or_path.empty()) {
    // The checkpoint's config.json defines the model: a shape given here as well is a contradiction.
    for (const char* name : kModelShapeOptions)
      if (src.command_line.count(name) || src.config_lines.count(name))
        return GLM_USER_ERROR(src.where(name), " conflicts with --model_id_or_path: the model's config.json ",
                              "defines the architecture");
    return Status::ok();
  }

  // RoPE base: rope_theta, or 10000 x rope_ratio; both given must agree.
  const bool has_theta = vm.count("rope_theta") > 0, has_ratio = vm.count("rope_ratio") > 0;
  const double ratio_theta = has_ratio ? 10000.0 * vm["rope_ratio"].as<double>() : 0.0;
  if (has_theta && has_ratio && std::fabs(vm["rope_theta"].as<double>() - ratio_theta) > 1e-6 * ratio_theta)
    return GLM_USER_ERROR(src.where("rope_theta"), " = ", vm["rope_theta"].as<double>(), " contradicts ",
                          src.where("rope_ratio"), " (10000 x rope_ratio = ", ratio_theta, ")");
  t.model.rope_theta = has_theta ? vm["rope_theta"].as<double>() : (has_ratio ? ratio_theta : 5e6);

  Status model_status = t.model.finalize_and_validate();
  if (!model_status.is_ok()) {
    // Messages start with the field name; point at where that field was set.
    const std::string& msg = model_status.message();
    const std::string field = msg.substr(0, msg.find_first_of(" ("));
    return GLM_USER_ERROR(src.where(field), ": invalid model shape: ", msg);
  }
  GLM_RETURN_IF_ERROR(
      check(t.max_length <= t.model.max_position_embeddings, src, "max_length",
            concat("(", t.max_length, ") exceeds max_position_embeddings (", t.model.max_position_embeddings, ")")));
  return Status::ok();
}

}  // namespace

std::string help_text() {
  CliOptions o;
  OptionTable table(o);
  std::ostringstream s;
  s << "usage: mpirun -np N glm_hpc [train] [--config FILE] [--option value ...]\n"
    << "       mpirun -np N glm_hpc eval --model_id_or_path DIR --dataset FILE [--option value ...]\n"
    << "       glm_hpc plan --config FILE --world_size N --zero_stage S [--option value ...]\n"
    << "       glm_hpc prepare --dataset FILE... [--max_length N --packing true ...] [--print_example N]\n"
    << "                       [--output_dir DIR]\n"
    << "       glm_hpc export --ckpt_dir DIR --save_dir OUT [--export_format hf|chatglm] [--max_shard_size 5GB]\n"
    << "                      [--tokenizer_dir DIR] [--overwrite true] [--merge_lora true]\n"
    << "       [mpirun -np N] glm_hpc infer (--model_id_or_path DIR [--adapters DIR] | --ckpt_dir DIR)\n"
    << "                      [--val_dataset FILE... [--result_path FILE]] [--temperature T --top_p P ...]\n"
    << "       glm_hpc plot RUN_DIR [RUN_DIR...] [--save_dir DIR] [--plot_smoothing 0.9] [--plot_format png|svg]\n\n"
    << "Trains a GLM-4-family model data-parallel over MPI ranks. With no options it trains the\n"
    << "embedded tiny GLM-4 on data/sample/conversations.jsonl, tokenized with the project's\n"
    << "data/sample/tokenizer.model (tools/train_tokenizer.cpp). 'eval' prints eval_loss and eval_ppl\n"
    << "(mean loss over all target tokens of the dataset) for a Hugging Face model directory. 'plan'\n"
    << "predicts the per-GPU memory of a CUDA run and says whether it fits. 'prepare' runs the data\n"
    << "pipeline only: the length report (and packing report) training prints at start, and with\n"
    << "--print_example N sample N with its trained tokens between [[ and ]]; with --output_dir DIR it\n"
    << "writes the tokenized samples as token shards that --dataset DIR then trains on, memory-mapped.\n"
    << "'export' reassembles a checkpoint's fp32 master weights (saved at any world size and ZeRO stage)\n"
    << "into a Hugging Face model directory: config.json, generation_config.json, bf16 safetensors shards\n"
    << "(+ model.safetensors.index.json) and the tokenizer files; transformers loads the default layout\n"
    << "with GlmForCausalLM.from_pretrained, and glm_hpc with --model_id_or_path. Of a LoRA checkpoint it\n"
    << "writes the adapters as PEFT saves them (peft.PeftModel.from_pretrained on the base loads them), or\n"
    << "with --merge_lora true the base with the adapters merged in, as a full checkpoint's export.\n"
    << "'infer' generates replies: from a Hugging Face model (with LoRA adapters applied unmerged) or a\n"
    << "checkpoint; with --val_dataset the prompts of the files (their last assistant turn, if any, the\n"
    << "reference) are split over the ranks and one jsonl of results is written, else a chat on the\n"
    << "terminal. Sampling defaults come from the model's generation_config.json. 'plot' draws the curves\n"
    << "of training runs' logging.jsonl (loss raw and smoothed, eval loss, learning rate, grad norm,\n"
    << "tokens/s, MFU, memory), several runs overlaid, as training does into OUTPUT_DIR/images at its end.\n\n"
    << table.all();
  return s.str();
}

// Two option texts that mean the same value: equal, the same boolean (true, 1, yes, on), or equal
// numbers (1.0 and 1, 5e8 and 500000000).
bool same_value(const std::string& a, const std::string& b) {
  if (a == b) return true;
  auto truth = [](std::string t) -> int {
    for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (t == "true" || t == "yes" || t == "on") return 1;
    if (t == "false" || t == "no" || t == "off") return 0;
    return -1;
  };
  if (truth(a) >= 0 && truth(b) >= 0) return truth(a) == truth(b);
  try {
    size_t used_a = 0, used_b = 0;
    const double x = std::stod(a, &used_a), y = std::stod(b, &used_b);
    return used_a == a.size() && used_b == b.size() && x == y;
  } catch (const std::exception&) {
    return false;
  }
}

// --deepspeed: the options its keys set, below the command line and the config file (an option
// given there must agree), and the account of every key for rank 0 to print.
Status store_deepspeed(const po::options_description& all, po::variables_map& vm, const OptionTexts& texts,
                       Sources& src, CliOptions& o) {
  if (!vm.count("deepspeed") || vm["deepspeed"].defaulted() || vm["deepspeed"].as<std::string>().empty())
    return Status::ok();
  src.deepspeed = vm["deepspeed"].as<std::string>();
  GLM_ASSIGN_OR_RETURN(const DeepSpeedConfig ds, read_deepspeed_config(src.deepspeed));
  o.deepspeed_account = concat("glm_hpc: --deepspeed ", src.deepspeed, ":\n", ds.account());
  if (ds.refused())
    return GLM_USER_ERROR("--deepspeed ", src.deepspeed, " has keys glm_hpc cannot honour (marked REFUSED):\n",
                          ds.account(), "remove or change them");
  std::map<std::string, const DeepSpeedKey*> chosen;  // option -> the key that sets it
  std::string lines;
  for (const DeepSpeedKey& k : ds.keys) {
    if (k.outcome != DeepSpeedKey::Outcome::applied) continue;
    if (auto it = chosen.find(k.option); it != chosen.end()) {
      if (!same_value(it->second->text, k.text))
        return GLM_USER_ERROR("--deepspeed ", src.deepspeed, ": ", it->second->key, " ", it->second->value, " and ",
                              k.key, " ", k.value, " both set --", k.option, " and disagree");
      continue;
    }
    chosen[k.option] = &k;
    if (given(src, k.option.c_str())) {
      const auto given = texts.find(k.option);
      const std::string text = given != texts.end() && !given->second.empty() ? given->second.back() : "";
      if (!same_value(text, k.text))
        return GLM_USER_ERROR("--deepspeed ", src.deepspeed, ": ", k.key, " ", k.value, " sets --", k.option, " ",
                              k.text, ", which contradicts ", src.where(k.option), " ", text,
                              " (drop one, or make them agree)");
      continue;
    }
    lines += concat(k.option, " = ", k.text, "\n");
    src.deepspeed_keys[k.option] = k.key;
  }
  // --warmup_steps (when positive) wins over --warmup_ratio: a key that sets one contradicts the
  // other given explicitly.
  for (const auto& [set, other] : {std::pair{"warmup_steps", "warmup_ratio"}, std::pair{"warmup_ratio", "warmup_steps"}})
    if (const auto it = chosen.find(set); it != chosen.end() && given(src, other))
      return GLM_USER_ERROR("--deepspeed ", src.deepspeed, ": ", it->second->key, " ", it->second->value, " sets --",
                            set, " ", it->second->text, ", which contradicts ", src.where(other),
                            " (drop one: warmup is given once)");
  std::istringstream in(lines);
  po::store(po::parse_config_file(in, all, false), vm);
  return Status::ok();
}

Result<CliOptions> parse_options(int argc, const char* const* argv) {
  CliOptions o;
  OptionTable table(o);
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && !args.front().empty() && args.front().front() != '-') {
    o.command = args.front();
    args.erase(args.begin());
    if (o.command != "train" && o.command != "eval" && o.command != "plan" && o.command != "prepare" &&
        o.command != "export" && o.command != "infer" && o.command != "plot")
      return GLM_USER_ERROR("unknown command '", o.command,
                            "' (available: train, eval, plan, prepare, export, infer, plot)");
  }
  // glm_hpc plot takes its run directories as arguments; no other command takes any.
  po::options_description command_line;
  command_line.add(table.all());
  po::positional_options_description positional;
  if (o.command == "plot") {
    command_line.add_options()("plot_run", po::value<std::vector<std::string>>(&o.plot_runs)->multitoken(), "");
    positional.add("plot_run", -1);
  }
  po::variables_map vm;
  Sources src;
  OptionTexts texts;
  try {
    // No prefix guessing: a typo such as --learning_rat must fail, not pick --learning_rate.
    const int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
    po::parsed_options cmd =
        po::command_line_parser(args).options(command_line).positional(positional).style(style).run();
    for (const auto& opt : cmd.options) {
      src.command_line[opt.string_key] = true;
      texts[opt.string_key] = opt.value;
    }
    po::store(cmd, vm);
    if (vm.count("help")) {
      o.help = true;
      return o;
    }
    if (vm.count("config")) {
      src.config_file = vm["config"].as<std::string>();
      GLM_ASSIGN_OR_RETURN(auto entries, scan_ini_file(src.config_file));
      std::map<std::string, int> seen;
      for (const auto& e : entries) {
        if (seen.count(e.key) && e.key != "dataset")
          return GLM_USER_ERROR(src.config_file, ":", e.line, ": '", e.key, "' is already set on line ", seen[e.key]);
        seen[e.key] = e.line;
        src.config_lines[e.key] = e.line;
      }
      std::ifstream in(src.config_file);
      po::parsed_options file = po::parse_config_file(in, table.all(), true);
      for (const auto& opt : file.options) {
        texts.emplace(opt.string_key, opt.value);
        if (opt.unregistered) {
          auto it = src.config_lines.find(opt.string_key);
          return GLM_USER_ERROR(src.config_file, ":", it == src.config_lines.end() ? 0 : it->second,
                                ": unknown option '", opt.string_key, "'", did_you_mean(table.all(), opt.string_key),
                                " (see glm_hpc --help)");
        }
        if (opt.string_key == "config" || opt.string_key == "help")
          return GLM_USER_ERROR(src.config_file, ":", src.config_lines[opt.string_key], ": '", opt.string_key,
                                "' is only allowed on the command line");
      }
      po::store(file, vm);
    }
    GLM_RETURN_IF_ERROR(store_deepspeed(table.all(), vm, texts, src, o));
    po::notify(vm);
  } catch (const po::unknown_option& e) {
    const std::string name = strip_dashes(e.get_option_name());
    return GLM_USER_ERROR("unknown option '--", name, "'", did_you_mean(table.all(), name), " (see glm_hpc --help)");
  } catch (const po::error_with_option_name& e) {
    const std::string name = strip_dashes(e.get_option_name());
    if (!src.command_line.count(name) && src.config_lines.count(name))
      return GLM_USER_ERROR(src.config_file, ":", src.config_lines[name], ": ", e.what());
    return GLM_USER_ERROR(e.what());
  } catch (const po::error& e) {
    return GLM_USER_ERROR(e.what());
  }
  GLM_RETURN_IF_ERROR(table.resolve(src));
  GLM_RETURN_IF_ERROR(check_numbers(vm, texts, src));
  GLM_RETURN_IF_ERROR(validate(o, src, vm));

  nlohmann::json values = table.values();
  values["rope_theta"] = o.train.model.rope_theta;
  values["head_dim"] = o.train.model.head_dim;
  values["config"] = o.config_file;
  o.effective = nlohmann::json::object();
  for (auto& [name, value] : values.items()) {
    const char* source = src.command_line.count(name)     ? "command_line"
                         : src.config_lines.count(name)   ? "config"
                         : src.deepspeed_keys.count(name) ? "deepspeed"
                                                          : "default";
    o.effective[name] = {{"value", value}, {"source", source}};
  }
  return o;
}

Status write_args_json(const CliOptions& options) {
  namespace fs = std::filesystem;
  const std::string dir = options.train.output_dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return GLM_USER_ERROR("cannot create --output_dir '", dir, "': ", ec.message());
  const nlohmann::json j = {{"command", options.command}, {"options", options.effective}};
  return write_file_durably(dir + "/args.json", json_text(j, 2) + "\n");
}

}  // namespace glm
