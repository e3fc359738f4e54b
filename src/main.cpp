// glm_hpc entry point: MPI bootstrap, options, model source, data, backend, and the command.
#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <thread>

#include "base/progress.h"
#include "base/stop_signal.h"
#include "cli/export.h"
#include "cli/infer.h"
#include "cli/model_source.h"
#include "cli/options.h"
#include "cli/prepare.h"
#include "cli/run_directory.h"
#include "data/dataset.h"
#include "data/dataset_cache.h"
#include "data/tokenizer.h"
#include "io/hf_import.h"
#include "io/run_plots.h"
#include "model/backend.h"
#include "mpi/fatal.h"
#include "mpi/mpi_communicator.h"
#include "mpi/nccl_communicator.h"
#include "mpi/runtime.h"
#include "train/engine.h"
#include "train/preemption.h"
#include "train/trainer.h"
#include "zero/memory_plan.h"

namespace {

// Bad input is detected on every rank; all ranks agree, one prints, all exit with the same code.
// Returns the exit code to use, or 0 to go on.
int settle(const glm::Status& local) {
  glm::AgreedStatus agreed = glm::agree_on_status(local, MPI_COMM_WORLD);
  if (agreed.status.is_ok()) return 0;
  if (agreed.report_here) {
    if (agreed.status.kind() == glm::ErrorKind::stopped)
      std::fprintf(stderr, "glm_hpc: %s; exit code %d\n", agreed.status.message().c_str(), glm::kStoppedExitCode);
    else
      std::fprintf(stderr, "glm_hpc: error: %s\n", agreed.status.message().c_str());
    std::fflush(stderr);
  }
  return agreed.status.exit_code();
}

// A stop while train reads its data comes before anything is trained or saved: the message says so.
glm::Status before_training(const glm::Status& s, const glm::CliOptions& o) {
  if (s.kind() != glm::ErrorKind::stopped || o.command != "train") return s;
  return glm::Status::error(glm::ErrorKind::stopped, s.message() + ", before training started; nothing was saved");
}

void resolve_paths(glm::CliOptions& o) {
  // The embedded default dataset is found from any working directory.
  if (o.effective["dataset"]["source"] != "default") return;
  for (auto& path : o.train.datasets) {
    if (!std::filesystem::exists(path)) {
      const std::string bundled = std::string(GLM_SOURCE_DIR) + "/" + path;
      if (std::filesystem::exists(bundled)) path = bundled;
    }
  }
}

// auto: cuda when this build has CUDA and a GPU is visible, else cpu. Each rank takes the GPU of
// its local rank (one rank per GPU).
glm::Result<std::unique_ptr<glm::Backend>> choose_backend(const glm::CliOptions& o, const glm::ProcessInfo& proc) {
  if (o.command == "prepare") return glm::make_cpu_backend(glm::DType::f32);  // data only: no device
  const int gpus = glm::cuda_device_count();
  const bool cuda = o.device == glm::Device::cuda || (o.device == glm::Device::auto_select && gpus > 0);
  if (!cuda) return glm::make_cpu_backend(glm::DType::f32);
  // One GPU per rank: the ranks of a host take its GPUs in local-rank order.
  GLM_RETURN_IF_ERROR(glm::check_one_rank_per_gpu(proc, gpus));
  return glm::make_cuda_backend(proc.local_rank, o.backend);
}

// The model's configuration becomes the run's; args.json says where it came from.
glm::Status record_model(glm::CliOptions& o, const glm::ModelConfig& c, const char* source) {
  o.train.model = c;
  const std::pair<const char*, nlohmann::json> values[] = {{"vocab_size", c.vocab_size},
                                                           {"hidden_size", c.hidden_size},
                                                           {"intermediate_size", c.intermediate_size},
                                                           {"num_hidden_layers", c.num_hidden_layers},
                                                           {"num_attention_heads", c.num_attention_heads},
                                                           {"num_key_value_heads", c.num_key_value_heads},
                                                           {"head_dim", c.head_dim},
                                                           {"max_position_embeddings", c.max_position_embeddings},
                                                           {"rope_theta", c.rope_theta},
                                                           {"partial_rotary_factor", c.partial_rotary_factor},
                                                           {"rms_norm_eps", c.rms_norm_eps},
                                                           {"pad_token_id", c.pad_token_id}};
  for (const auto& [name, value] : values) o.effective[name] = {{"value", value}, {"source", source}};
  if (o.command == "train" && o.train.max_length > c.max_position_embeddings)
    return GLM_USER_ERROR("--max_length ", o.train.max_length, " exceeds the model's max_position_embeddings ",
                          c.max_position_embeddings);
  return glm::Status::ok();
}

// plan: the model of --model_id_or_path's config.json, when given (no weights are read).
glm::Status resolve_model_config(glm::CliOptions& o) {
  if (o.model_id_or_path.empty()) return glm::Status::ok();
  GLM_ASSIGN_OR_RETURN(glm::HfModel hf, glm::read_hf_config(o.model_id_or_path));
  return record_model(o, hf.config, "model_id_or_path");
}

// train, eval and prepare: the model to start from (cli/model_source.h, the one place that opens
// models): --model_id_or_path, or for eval also a checkpoint or adapters; none for a model trained
// from random initialisation.
glm::Result<std::optional<glm::ModelSource>> open_model(glm::CliOptions& o) {
  const bool eval = o.command == "eval";
  if (o.model_id_or_path.empty() && (!eval || (o.ckpt_dir.empty() && o.adapters.empty())))
    return std::optional<glm::ModelSource>();
  GLM_ASSIGN_OR_RETURN(glm::ModelSource m, glm::ModelSource::open({o.model_id_or_path, eval ? o.ckpt_dir : "",
                                                                   eval ? o.adapters : ""}));
  GLM_RETURN_IF_ERROR(record_model(o, m.config(), o.model_id_or_path.empty() ? "ckpt_dir" : "model_id_or_path"));
  return std::optional<glm::ModelSource>(std::move(m));
}

// --tokenizer: bytes, a rank file or a directory holding one, or auto: the model's
// (ModelSource::tokenizer); without a model, the embedded tiny configuration's
// data/sample/tokenizer.model, found from any working directory. Null means none.
glm::Result<std::unique_ptr<glm::Tokenizer>> choose_tokenizer(glm::CliOptions& o, const glm::ModelSource* model) {
  namespace fs = std::filesystem;
  std::unique_ptr<glm::Tokenizer> tokenizer;
  std::string source = o.effective["tokenizer"]["source"];
  if (model != nullptr) {
    GLM_ASSIGN_OR_RETURN(tokenizer, model->tokenizer(o.tokenizer));
    if (o.tokenizer == "auto") source = o.model_id_or_path.empty() ? "ckpt_dir" : "model_id_or_path";
  } else {
    std::string path = o.tokenizer;
    if (path == "auto") {
      path = "data/sample/tokenizer.model";
      if (!fs::exists(path)) path = std::string(GLM_SOURCE_DIR) + "/" + path;
    }
    if (path == "bytes") {
      tokenizer = std::make_unique<glm::ByteTokenizer>();
    } else {
      auto loaded = glm::load_tokenizer(path);
      if (!loaded.is_ok()) return loaded.status().with_context(glm::concat("--tokenizer ", path));
      tokenizer = loaded.take();
    }
  }
  if (tokenizer != nullptr)
    o.effective["tokenizer"] = {
        {"value", tokenizer->source()}, {"source", source}, {"content_hash", tokenizer->content_hash()}};
  return tokenizer;
}

glm::WeightLoader weight_loader(const std::optional<glm::ModelSource>& model) {
  if (!model) return {};
  return [model = *model](glm::TrainingEngine& engine) -> glm::Status { return model.load(engine); };
}

// Mean loss over every target token of the dataset, samples spread over the ranks.
glm::Status run_eval(const glm::CliOptions& o, const glm::Dataset& data, const glm::ModelSource& model,
                     glm::Communicator& comm, glm::Communicator* data_comm, glm::Backend& backend) {
  const int64_t per_device = o.per_device_eval_batch_size;
  glm::EngineConfig config{.model = o.train.model,
                           .max_tokens = per_device * data.report.max_tokens,
                           .max_grad_norm = 0.0,
                           .forward_only = true};
  config.lora = model.lora();
  backend.set_out_of_memory_hint(
      "eval holds the whole model on each GPU with one micro-batch's activations: lower "
      "--per_device_eval_batch_size or --max_length, or use a GPU with more memory or --device cpu");
  GLM_ASSIGN_OR_RETURN(auto engine, glm::TrainingEngine::create(config, backend, comm, data_comm));
  GLM_RETURN_IF_ERROR(model.load(*engine));
  const int64_t n = data.size();
  GLM_ASSIGN_OR_RETURN(glm::EvalResult total, glm::evaluate_dataset(*engine, data, per_device, comm));
  if (comm.rank() == 0) {
    std::printf("glm_hpc: eval of %s on %lld samples, %lld target tokens\n", model.describe().c_str(),
                static_cast<long long>(n), static_cast<long long>(total.targets));
    std::printf("eval_loss: %.8f\neval_ppl: %.8f\neval_token_acc: %.8f\n", total.mean_loss(), total.perplexity(),
                total.token_accuracy());
    std::fflush(stdout);
  }
  return glm::Status::ok();
}

// glm_hpc infer: every rank prepares (model, prompts, engine) and agrees; then generates its share,
// agrees, and rank 0 gathers the results. With --compare_with the second model answers the same
// prompts after the first is gone from memory. Without prompt files, a chat on the terminal.
int run_infer(const glm::CliOptions& o, const glm::ProcessInfo& proc, glm::Backend& backend) {
  glm::InferResults results[2];
  std::string written;
  glm::CliOptions sides[2] = {o, o};
  if (!o.compare_with.empty()) {
    auto compared = glm::comparison_options(o);  // the same result path for both (its time is now)
    if (int code = settle(compared.status())) return code;
    sides[1] = compared.take();
    sides[0].result_path = sides[1].result_path;
  }
  for (int side = 0; side < (o.compare_with.empty() ? 1 : 2); ++side) {
    auto job = glm::InferJob::prepare(sides[side], proc, backend);
    if (int code = settle(job.status())) return code;
    glm::InferJob& infer = *job.value();
    if (proc.rank == 0) {
      std::printf("%s", infer.describe().c_str());
      std::fflush(stdout);
    }
    if (infer.interactive()) return settle(infer.chat(std::cin, std::cout));
    if (int code = settle(infer.generate_share())) return code;
    auto gathered = infer.gather(MPI_COMM_WORLD);
    if (int code = settle(gathered.status())) return code;
    results[side] = gathered.take();
    std::printf("%s", results[side].summary.c_str());
    std::fflush(stdout);
    if (side == 0 && !o.compare_with.empty()) continue;
    auto wrote = proc.rank != 0      ? glm::Result<std::string>(std::string())
                 : side == 0 ? infer.write(results[0].lines)
                             : infer.write_comparison(results[0], results[1]);
    if (int code = settle(wrote.status())) return code;
    written = wrote.value();
  }
  std::printf("%s", written.c_str());
  std::fflush(stdout);
  return 0;
}

// The charts of runs' logging.jsonl (io/run_plots.h) into images_dir: the report line, or why not.
glm::Result<std::string> draw_plots(const glm::CliOptions& o, const std::vector<std::string>& runs,
                                    const std::string& images_dir) {
  glm::PlotOptions plot;
  plot.runs = runs;
  plot.images_dir = images_dir;
  plot.smoothing = o.plot_smoothing;
  plot.use_gnuplot = o.plot_format != glm::PlotFormat::svg;
  GLM_ASSIGN_OR_RETURN(const glm::PlotReport report, glm::plot_runs(plot));
  return glm::describe_plots(report, images_dir) + "\n";
}

// glm_hpc plot RUN_DIR...: rank 0 draws (any others wait for it).
int run_plot(const glm::CliOptions& o, const glm::ProcessInfo& proc) {
  std::string images = o.save_dir;
  if (images.empty()) images = o.plot_runs.size() == 1 ? o.plot_runs.front() + "/images" : std::string("images");
  auto drawn = proc.rank == 0 ? draw_plots(o, o.plot_runs, images) : glm::Result<std::string>(std::string());
  if (int code = settle(drawn.status())) return code;
  std::printf("%s", drawn.value().c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace

// NCCL's proxy thread and glm_hpc's own threads need more than one CPU core per rank: a rank pinned
// to a single core (Open MPI binds to cores by default for up to 2 ranks) makes every collective
// wait for the scheduler.
// Said once by rank 0, counted over all ranks.
static void warn_if_bound_to_one_core(const glm::ProcessInfo& proc) {
  cpu_set_t set;
  CPU_ZERO(&set);
  int single = sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) == 1 ? 1 : 0;
  if (MPI_Allreduce(MPI_IN_PLACE, &single, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS) return;
  if (single > 0 && proc.rank == 0)
    std::fprintf(stderr,
                 "glm_hpc: warning: %d of %d ranks are bound to a single CPU core; NCCL's proxy thread shares it and "
                 "every collective slows down. Launch with `mpirun --bind-to none` or give each rank several cores "
                 "(e.g. `--map-by ppr:N:node:PE=8`; Slurm: --cpus-per-task).\n",
                 single, proc.world_size);
}

// --offload_threads 0: the cores this rank may run on; a rank free to run anywhere on the node shares
// them with the node's other ranks.
static int automatic_offload_threads(const glm::ProcessInfo& proc) {
  const int node = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  cpu_set_t set;
  CPU_ZERO(&set);
  int cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : node;
  if (cores >= node) cores /= std::max(proc.local_size, 1);
  return std::max(cores, 1);
}

// The command, once its directory is held; `ending` gets what run_status.json says beside the code.
// run_directory: rank 0's claim of the command's directory (null elsewhere, and for commands that
// write none).
static int run_command(glm::CliOptions& options, const glm::ProcessInfo& proc, glm::RunDirectory* run_directory,
                       nlohmann::json& ending) {
  if (options.command == "export") {
    // Files only, on one process (rank 0 under mpirun): no device, no data.
    auto report = proc.rank == 0 ? glm::run_export(options) : glm::Result<std::string>(std::string());
    if (int code = settle(report.status())) return code;
    if (proc.rank == 0) std::printf("%s", report.value().c_str());
    return 0;
  }
  // SIGTERM, SIGUSR1 and SIGINT are caught from here on (base/stop_signal.h): reading, tokenizing and
  // caching data, writing shards and evaluation stop at once, exit code 75; once train has its data,
  // one stops training after its first step with a checkpoint.
  if (int code = settle(glm::install_stop_handlers())) return code;
  if (proc.rank == 0 && !options.deepspeed_account.empty()) {
    std::printf("%s", options.deepspeed_account.c_str());
    std::fflush(stdout);
  }
  resolve_paths(options);
  auto backend = choose_backend(options, proc);
  if (int code = settle(backend.status())) return code;
  if (options.command == "infer") return run_infer(options, proc, *backend.value());
  auto opened = open_model(options);
  if (int code = settle(opened.status())) return code;
  const std::optional<glm::ModelSource>& model_source = opened.value();
  if (model_source && options.command != "prepare") {
    if (int code = settle(model_source->verify())) return code;
  }

  auto chosen_tokenizer = choose_tokenizer(options, model_source ? &*model_source : nullptr);
  if (int code = settle(chosen_tokenizer.status())) return code;
  const glm::Tokenizer* tokenizer = chosen_tokenizer.value().get();
  if (tokenizer != nullptr) {  // recorded in checkpoints; resuming with another tokenizer is refused
    options.train.tokenizer = tokenizer->source();
    options.train.tokenizer_hash = tokenizer->content_hash();
  }
  const glm::ModelConfig& model = options.train.model;
  glm::Status vocab_ok = tokenizer == nullptr || model.vocab_size >= tokenizer->vocab_size()
                             ? glm::Status::ok()
                             : GLM_USER_ERROR(model_source ? "the model's vocab_size (" : "vocab_size (",
                                              model.vocab_size, ") is smaller than the tokenizer's ",
                                              tokenizer->vocab_size(), " ids (", tokenizer->source(), "): ",
                                              model_source ? "give --tokenizer the tokenizer this model was trained with"
                                                         : "raise --vocab_size, or choose another --tokenizer");
  if (int code = settle(vocab_ok)) return code;
  if (proc.rank == 0) {
    if (tokenizer != nullptr)
      std::printf("glm_hpc: tokenizer %s; model vocab_size %lld\n", tokenizer->describe().c_str(),
                  static_cast<long long>(model.vocab_size));
    else
      std::printf(
          "glm_hpc: no tokenizer (%s has no tokenizer.model; give --tokenizer): only pre-tokenized "
          "samples can be read\n",
          model_source ? model_source->describe().c_str() : "the model");
    std::fflush(stdout);
  }
  // Evaluation scores every sample unless --max_length was given explicitly.
  const bool eval = options.command == "eval";
  const int64_t max_length =
      eval && options.effective["max_length"]["source"] == "default" ? 0 : options.train.max_length;
  glm::DatasetLoadOptions load;
  load.tokenizer = tokenizer;
  load.max_length = max_length;
  load.vocab_size = model.vocab_size;
  load.skip_bad = options.train.on_bad_sample == glm::OnBadSample::skip;
  load.conversation.system = options.train.system;
  load.conversation.loss_scale = options.train.loss_scale;
  load.truncation = options.train.truncation_strategy;
  // prepare tokenizes on purpose (and shows file:line of samples, which mapped shards lack).
  const std::string cache_dir =
      options.dataset_cache && options.command != "prepare" ? glm::default_dataset_cache_dir() : "";
  auto read_dataset = [&](const std::vector<std::string>& paths) -> glm::Result<glm::Dataset> {
    auto loaded = glm::load_dataset_cached(cache_dir, proc.rank == 0, paths, load);
    if (!loaded.is_ok()) return before_training(loaded.status(), options);
    glm::CachedDataset cached = loaded.take();
    if (proc.rank == 0 && !cached.note.empty()) {
      std::printf("%s\n", cached.note.c_str());
      std::fflush(stdout);
    }
    return std::move(cached.dataset);
  };
  auto dataset = read_dataset(options.train.datasets);
  if (int code = settle(dataset.status())) return code;
  if (options.command == "prepare") {
    auto report = glm::prepare_report(options, dataset.value(), tokenizer);
    if (int code = settle(report.status())) return code;
    if (proc.rank == 0) std::printf("%s", report.value().c_str());
    if (glm::prepare_writes_shards(options)) {
      auto wrote = proc.rank == 0 ? glm::write_prepared(options, dataset.value(), tokenizer)
                                  : glm::Result<std::string>(std::string());
      if (int code = settle(wrote.status())) return code;
      if (proc.rank == 0) std::printf("%s", wrote.value().c_str());
    }
    return 0;
  }
  // Validation: --val_dataset files, or a seeded share of --dataset (--split_dataset_ratio).
  std::optional<glm::Dataset> validation;
  if (!options.val_datasets.empty()) {
    auto v = read_dataset(options.val_datasets);
    if (int code = settle(v.status())) return code;
    validation = v.take();
  } else if (options.split_dataset_ratio > 0) {
    glm::Status split =
        glm::split_dataset(dataset.value(), options.split_dataset_ratio, options.train.seed, validation.emplace());
    if (int code = settle(split)) return code;
  }
  options.train.per_device_eval_batch_size = options.per_device_eval_batch_size;
  if (!eval) {
    // The inputs are read and checked: an earlier run this one replaces goes now, then its records start.
    auto begin_records = [&]() -> glm::Status {
      if (run_directory != nullptr) {
        GLM_ASSIGN_OR_RETURN(const std::string removed, run_directory->replace_earlier_run());
        std::printf("%s", removed.c_str());
        std::fflush(stdout);
      }
      return glm::write_args_json(options);
    };
    if (int code = settle(proc.rank == 0 ? begin_records() : glm::Status::ok())) return code;
  }

  const std::chrono::duration<double> timeout(options.collective_timeout);
  glm::MpiCommunicator comm(MPI_COMM_WORLD, timeout);
  // Several GPU ranks: NCCL moves parameters and gradients between the GPUs; MPI keeps the scalars.
  std::unique_ptr<glm::Communicator> nccl;
  if (proc.world_size > 1 && backend.value()->native_stream() != nullptr) {
    auto made = glm::make_nccl_communicator(MPI_COMM_WORLD, proc.local_rank, backend.value()->native_stream(), timeout);
    if (int code = settle(made.status())) return code;
    nccl = made.take();
    warn_if_bound_to_one_core(proc);
  }
  if (eval) {
    // A failure here may leave peers inside a collective: the fatal path aborts them all.
    glm::Status s = run_eval(options, dataset.value(), *model_source, comm, nccl.get(), *backend.value());
    if (s.kind() == glm::ErrorKind::stopped) return settle(s);  // every rank stopped at the same batch
    if (!s.is_ok()) glm::fatal_status(s);
    return 0;
  }
  if (options.train.offload_threads == 0) options.train.offload_threads = automatic_offload_threads(proc);
  auto result = glm::train(options.train, dataset.value(), comm, *backend.value(), weight_loader(model_source),
                           validation ? &*validation : nullptr, nccl.get());
  if (!result.is_ok()) {
    // Bad input found by every rank alike (a checkpoint that does not fit, for one) is said once,
    // with exit code 2; anything else may have left peers inside a collective: the fatal path.
    if (result.status().kind() == glm::ErrorKind::user_input || result.status().kind() == glm::ErrorKind::stopped)
      return settle(result.status());
    glm::fatal_status(result.status());
  }
  // Stopped by a signal after a checkpoint (the trainer printed which): every rank exits with 75.
  ending["steps"] = result.value().steps;
  if (result.value().preempted_by != 0) {
    ending["signal"] = glm::signal_name(result.value().preempted_by);
    ending["resume"] = "--resume_from_checkpoint latest";
    return glm::kPreemptedExitCode;
  }
  if (proc.rank == 0) {
    const auto& s = result.value();
    std::printf("glm_hpc: done: %lld steps, first loss %.4f, final loss %.4f; args.json and logging.jsonl in %s\n",
                static_cast<long long>(s.steps), s.losses.front(), s.losses.back(), options.train.output_dir.c_str());
    // The run's curves beside its log; a chart that cannot be drawn costs the run nothing.
    if (options.plot_format != glm::PlotFormat::none && !options.train.output_dir.empty() &&
        options.train.logging_steps > 0) {
      const std::string images = options.train.output_dir + "/images";
      auto drawn = draw_plots(options, {options.train.output_dir}, images);
      if (drawn.is_ok())
        std::printf("%s", drawn.value().c_str());
      else
        std::printf("glm_hpc: warning: no charts drawn in %s: %s\n", images.c_str(), drawn.status().message().c_str());
    }
    std::fflush(stdout);
  }
  return 0;
}

// Parses the options and runs the command, holding the directory it writes for its whole life.
static int run(int argc, char** argv, const glm::ProcessInfo& proc) {
  glm::enable_progress(proc.rank == 0);  // base/progress.h: one account of long work per job
  auto parsed = glm::parse_options(argc, argv);
  if (int code = settle(parsed.status())) return code;
  glm::CliOptions options = parsed.take();
  if (options.help) {
    if (proc.rank == 0) std::printf("%s", glm::help_text().c_str());
    return 0;
  }
  if (options.command == "plot") return run_plot(options, proc);
  if (options.command == "plan") {
    // Arithmetic only: no GPU, no data. The model comes from --config/options or config.json.
    if (int code = settle(resolve_model_config(options))) return code;
    if (proc.rank == 0) {
      glm::MemoryPlanInput in;
      in.model = options.train.model;
      in.world_size = static_cast<int>(options.plan_world_size);
      in.zero_stage = options.train.zero_stage;
      in.micro_batch_tokens = options.train.per_device_train_batch_size * options.train.max_length;
      in.recompute = options.train.recompute;
      in.offload_activations = options.train.offload_activations;
      in.zero_options = options.train.zero_options;
      if (options.train.train_type == glm::TrainType::lora) in.lora = options.train.lora;
      in.split_master = options.train.split_master_weights;
      in.defer_embedding = options.train.defer_embedding_rows > 0;
      in.lm_head_scratch_bytes = options.backend.lm_head_scratch_bytes;
      in.context_parallel_size = options.train.context_parallel_size;
      in.offload_optimizer = options.train.offload_optimizer == glm::OffloadDevice::cpu;
      in.offload_param = options.train.offload_param == glm::OffloadDevice::cpu;
      in.offload_delayed_update = options.train.offload_delayed_update;
      in.gradient_accumulation_steps = options.train.gradient_accumulation_steps;
      in.offload_gradients = options.train.offload_gradients;
      in.gpus_per_node = static_cast<int>(options.plan_gpus_per_node);
      std::printf("%s", glm::format_memory_plan(in, glm::plan_cuda_memory(in), options.gpu_memory_gib).c_str());
    }
    return 0;
  }
  // Before the directory is claimed and any data read: a context-parallel group must tile the ranks.
  if (options.command == "train" && proc.world_size % options.train.context_parallel_size != 0) {
    if (int code = settle(GLM_USER_ERROR("--context_parallel_size ", options.train.context_parallel_size,
                                         " must divide the world size ", proc.world_size)))
      return code;
  }
  // The directory this command writes is this run's alone until it exits: rank 0 holds its lock
  // (cli/run_directory.h) and every rank learns the outcome before anything is written.
  auto claimed = proc.rank == 0 ? glm::claim_run_directory(options)
                                : glm::Result<std::unique_ptr<glm::RunDirectory>>(std::unique_ptr<glm::RunDirectory>());
  if (int code = settle(claimed.status())) return code;
  const std::shared_ptr<glm::RunDirectory> run_directory = claimed.take();
  if (run_directory != nullptr) {
    if (!run_directory->report().empty()) {
      std::printf("%s", run_directory->report().c_str());
      std::fflush(stdout);
    }
    // The fatal path ends rank 0 without unwinding: the status says so and the lock goes with it.
    glm::register_abort_hook([weak = std::weak_ptr<glm::RunDirectory>(run_directory)] {
      if (const auto held = weak.lock()) {
        (void)held->record_status({{"status", "failed"}, {"exit_code", 1}, {"reason", "fatal error (see the log)"}});
        held->release();
      }
    });
  }
  nlohmann::json ending;
  int code = 0;
  try {
    code = run_command(options, proc, run_directory.get(), ending);
  } catch (...) {  // main() ends it through the fatal path; the directory says so and is released first
    if (run_directory != nullptr) {
      (void)run_directory->record_status({{"status", "failed"}, {"exit_code", 1}, {"reason", "uncaught exception"}});
      run_directory->release();
    }
    throw;
  }
  if (run_directory != nullptr) {
    ending["status"] = code == 0 ? "completed" : code == glm::kPreemptedExitCode ? "preempted" : "failed";
    ending["exit_code"] = code;
    const glm::Status recorded = run_directory->record_status(ending);
    if (!recorded.is_ok()) std::fprintf(stderr, "glm_hpc: error: %s\n", recorded.message().c_str());
    run_directory->release();
  }
  return code;
}

int main(int argc, char** argv) {
  // A file over the size limit (ulimit -f) is a write error naming the file, not a core dump.
  std::signal(SIGXFSZ, SIG_IGN);
  glm::MpiRuntime mpi(&argc, &argv);
  // An exception that escapes a command (std::bad_alloc above all) ends through the one fatal path
  // (rank, host, what; MPI_Abort, so no peer waits for this rank), after unwinding has removed the
  // temporary files of whatever it interrupted.
  try {
    return run(argc, argv, mpi.info());
  } catch (const std::bad_alloc&) {
    glm::fatal(__FILE__, __LINE__, "out of host memory (std::bad_alloc)");
  } catch (const std::exception& e) {
    glm::fatal(__FILE__, __LINE__, glm::concat("uncaught exception: ", e.what()));
  }
}
