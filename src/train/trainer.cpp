// The data-parallel training loop: data, schedule, evaluation, logging, checkpoints and preemption
// around TrainingEngine's steps.
#include "train/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <thread>

#include "base/numa.h"
#include "base/progress.h"
#include "data/sharded_loader.h"
#include "train/checkpoint.h"
#include "train/engine.h"
#include "train/lr_schedule.h"
#include "train/metrics_logger.h"
#include "train/model_flops.h"
#include "train/preemption.h"
#include "train/run_health.h"
#include "zero/bucket_autotune.h"

namespace glm {

Result<int64_t> total_training_steps(const TrainConfig& c, int64_t epoch_size, int world_size) {
  const double global = static_cast<double>(c.per_device_train_batch_size) * world_size *
                        static_cast<double>(c.gradient_accumulation_steps);
  const double steps = c.max_steps > 0
                           ? static_cast<double>(c.max_steps)
                           : std::max(1.0, std::ceil(c.num_train_epochs * static_cast<double>(epoch_size) / global));
  // The loader numbers the samples of every step in one int64 stream (step x global batch + ...).
  constexpr double kStreamPositions = 9.2e18;  // below 2^63
  if (!(steps * global < kStreamPositions)) {
    if (c.max_steps > 0)
      return GLM_USER_ERROR("--max_steps ", c.max_steps, " x a global batch of ", global,
                            " is more samples than the loader can number (2^63)");
    return GLM_USER_ERROR("--num_train_epochs ", c.num_train_epochs, " over ", epoch_size,
                          " samples per epoch is more samples than the loader can number (2^63)");
  }
  return static_cast<int64_t>(steps);
}

Result<EvalResult> evaluate_dataset(TrainingEngine& engine, const Dataset& data, int64_t per_device,
                                    Communicator& comm) {
  // Under context parallelism the ranks of a group evaluate the same samples, each its share.
  const int cp = engine.context_parallel_size();
  const int rank = comm.rank() / cp;
  const int64_t n = data.size(), per_round = per_device * (comm.size() / cp);
  EvalResult total;
  Progress progress("evaluating", n, Progress::Unit::items, "samples");
  for (int64_t first = 0; first < n; first += per_round) {
    GLM_ASSIGN_OR_RETURN(const int stop, agree_on_preemption(comm));
    if (stop != 0) return stopped_status(concat("during evaluation, after ", first, " of ", n, " samples"), stop);
    HostMicroBatch batch;
    for (int64_t b = 0; b < per_device; ++b) {
      const int64_t index = first + rank * per_device + b;
      if (index < n) append_document(batch, data.sample(index));
    }
    GLM_ASSIGN_OR_RETURN(EvalResult r, engine.evaluate(batch));  // collective: every rank calls it
    total.loss_sum += r.loss_sum;
    total.targets += r.targets;
    total.correct += r.correct;
    progress.update(std::min(first + per_round, n));
  }
  progress.finish();
  // The sums are global: every rank sees the same and fails alike.
  if (!std::isfinite(total.loss_sum))
    return GLM_ERROR(ErrorKind::internal, "the evaluation loss over ", total.targets, " target tokens is ",
                     total.loss_sum, ": the model's logits are not finite (its weights overflow in the forward)");
  return total;
}

Result<ZeroOptions> resolve_zero_options(const TrainConfig& config, Communicator& comm, Communicator& data,
                                         Backend& backend) {
  ZeroOptions z = config.zero_options;
  z.offload_params = config.offload_param == OffloadDevice::cpu;
  z.offload_pin_memory = config.offload_pin_memory;
  // One micro-batch a step: the reduced gradients go straight to the host optimizer's memory.
  z.offload_grads = offloads_gradients(config.offload_gradients, config.offload_optimizer == OffloadDevice::cpu,
                                      config.gradient_accumulation_steps, config.zero_stage,
                                      config.train_type == TrainType::lora);
  if (z.reduce_bucket_size != ZeroOptions::kAutoBucketSize) return z;
  const DType reduce = effective_reduce_dtype(z, backend.compute_dtype(), comm.size());
  std::vector<BandwidthPoint> curve;
  std::string source;
  if (!config.comm_profile.empty()) {
    GLM_ASSIGN_OR_RETURN(curve, read_bandwidth_curve(config.comm_profile, config.zero_stage, reduce));
    source = "from " + config.comm_profile;
  } else if (comm.size() > 1) {
    // Measured with the run's own communicator: 1 MiB to 1 GiB on GPUs, 64 KiB to 16 MiB over MPI.
    const bool device = data.device_buffers();
    const int64_t lo = device ? int64_t{1} << 20 : int64_t{64} << 10,
                  hi = device ? int64_t{1} << 30 : int64_t{16} << 20;
    GLM_ASSIGN_OR_RETURN(curve, measure_bandwidth_curve(data, comm, backend, config.zero_stage, reduce, lo, hi));
    source = concat("measured now on ", comm.size(), " ranks (", data.name(), ")");
  }
  std::string explanation;
  if (curve.empty()) {
    z.reduce_bucket_size = z.unmeasured_reduce_bucket_size();
    explanation = concat("--reduce_bucket_size auto: one rank communicates no gradients; keeping DeepSpeed's default ",
                         z.reduce_bucket_size, " elements");
  } else {
    const BucketChoice choice = choose_reduce_bucket_size(curve, config.zero_stage, reduce, source);
    z.reduce_bucket_size = choice.elements;
    explanation = choice.explanation;
  }
  if (comm.rank() == 0 && config.log_to_console) {
    std::printf("glm_hpc: %s\n", explanation.c_str());
    std::fflush(stdout);
  }
  return z;
}

namespace {

// Where the offloaded state sits on a machine of several NUMA nodes: ", NUMA node N, the GPU's".
std::string numa_text(const Backend& backend) {
  const int node = backend.host_numa_node();
  if (node < 0 || numa_node_count() < 2) return "";
  return concat(", NUMA node ", node, ", the GPU's");
}

// This process's resident host memory (Linux /proc/self/statm); -1 where unreadable.
int64_t resident_host_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  long long size = 0, resident = 0;
  const int read = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  const long page = ::sysconf(_SC_PAGESIZE);
  return read == 2 && page > 0 ? static_cast<int64_t>(resident) * page : -1;
}

// "0-3,5": the ranks, consecutive ones as ranges.
std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    out += concat(out.empty() ? "" : ",", ranks[i], j > i ? concat("-", ranks[j]) : std::string());
    i = j + 1;
  }
  return out;
}

// Every rank's model-state and activation bytes, printed by rank 0 once for the ranks that agree
// and once more for each group that differs (ZeRO's shards differ by rank only through padding).
// Under LoRA each kind also says how much of it is the adapters' (all of the gradients and
// optimizer state: the base is frozen). Collective over comm.
Status print_memory(TrainingEngine& engine, Communicator& comm, const TrainConfig& config) {
  const ZeroMemory mem = engine.memory();
  const LoraMemory adapters = engine.lora_memory();
  constexpr int kFields = 14;
  const int64_t mine[kFields] = {mem.parameter_bytes + adapters.parameter_bytes,
                                 adapters.parameter_bytes,
                                 mem.gradient_bytes + adapters.gradient_bytes,
                                 adapters.gradient_bytes,
                                 engine.optimizer_bytes(),
                                 adapters.optimizer_bytes,
                                 mem.buffer_bytes + adapters.buffer_bytes,
                                 adapters.buffer_bytes,
                                 engine.activation_bytes(),
                                 adapters.activation_bytes,
                                 engine.host_optimizer_bytes(),
                                 mem.host_parameter_bytes,
                                 mem.host_gradient_bytes,
                                 engine.host_activation_bytes()};
  std::vector<int64_t> all(static_cast<size_t>(kFields * comm.size()));
  GLM_RETURN_IF_ERROR(comm.all_gather(mine, all.data(), kFields, CommType::i64));
  if (comm.rank() != 0) return Status::ok();
  const bool lora = engine.lora_layout() != nullptr;
  auto format_mib = [](int64_t bytes) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
    return std::string(text);
  };
  auto mib = [&](int64_t bytes, int64_t lora_bytes) {
    const double m = 1024.0 * 1024.0;
    char text[64];
    if (lora)
      std::snprintf(text, sizeof(text), "%.1f MiB (of which LoRA %.1f MiB)", static_cast<double>(bytes) / m,
                    static_cast<double>(lora_bytes) / m);
    else
      std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / m);
    return std::string(text);
  };
  std::vector<bool> said(static_cast<size_t>(comm.size()), false);
  for (int first = 0; first < comm.size(); ++first) {
    if (said[static_cast<size_t>(first)]) continue;
    const int64_t* v = all.data() + first * kFields;
    std::vector<int> group;
    for (int r = first; r < comm.size(); ++r)
      if (std::equal(v, v + kFields, all.data() + r * kFields)) {
        group.push_back(r);
        said[static_cast<size_t>(r)] = true;
      }
    const char* pinned = config.offload_pin_memory && !engine.backend().host_accessible() ? "pinned " : "";
    std::string parameters = mib(v[0], v[1]);
    if (config.offload_param == OffloadDevice::cpu)
      parameters = concat(mib(v[0], 0), " on the device (",
                          config.zero_options.offload_param_ratio < 1 ? "persistent and resident shards" : "persistent",
                          "), ", mib(v[11], 0), " in ", pinned, "host memory");
    std::string gradients = mib(v[2], v[3]);
    if (v[12] > 0) gradients = concat(mib(v[12], 0), " in ", pinned, "host memory (copied there in backward)");
    std::string optimizer = mib(v[4], v[5]);
    if (config.offload_optimizer == OffloadDevice::cpu)
      optimizer = concat(mib(v[10], 0), " in ", pinned, "host memory (", config.offload_threads,
                         config.offload_threads == 1 ? " thread" : " threads", numa_text(engine.backend()), ")");
    std::string activations = mib(v[8], v[9]);
    if (v[13] > 0)
      activations = concat(activations, " on the device, layer inputs ", format_mib(v[13]), " in ",
                           engine.backend().host_accessible() ? "" : "pinned ", "host memory");
    std::printf(
        "glm_hpc: memory per rank (ZeRO-%d), rank%s %s of %d: parameters %s, gradients %s, optimizer %s, "
        "communication buffers %s, activations (recompute %s) %s\n",
        config.zero_stage, group.size() > 1 ? "s" : "", rank_list(group).c_str(), comm.size(), parameters.c_str(),
        gradients.c_str(), optimizer.c_str(), mib(v[6], v[7]).c_str(), enum_name(config.recompute).data(),
        activations.c_str());
  }
  std::fflush(stdout);
  return Status::ok();
}

}  // namespace

Result<TrainSummary> train(const TrainConfig& config, const Dataset& dataset, Communicator& comm, Backend& backend,
                           const WeightLoader& load_weights, const Dataset* validation, Communicator* data_comm) {
  using clock = std::chrono::steady_clock;
  const auto start_time = clock::now();
  const int world = comm.size(), rank = comm.rank();
  // Context parallelism: groups of cp consecutive ranks read the same rows (each keeps its share),
  // so the data is spread over world / cp data-parallel ranks.
  const int cp = config.context_parallel_size;
  if (cp < 1 || world % cp != 0)
    return GLM_USER_ERROR("--context_parallel_size ", cp, " must divide the world size ", world);
  const int data_world = world / cp, data_rank = rank / cp;
  // With packing the loader's unit is a packed row, so an epoch (and the step count) counts rows.
  std::optional<PackingPlan> packing;
  if (config.packing) {
    GLM_ASSIGN_OR_RETURN(packing, pack_dataset(dataset, config.max_length));
  }
  const int64_t epoch_units = packing ? packing->rows() : dataset.size();
  GLM_ASSIGN_OR_RETURN(const int64_t total_steps, total_training_steps(config, epoch_units, data_world));
  const int64_t eval_tokens =
      validation != nullptr ? config.per_device_eval_batch_size * validation->report.max_tokens : 0;
  const int64_t max_tokens = std::max(config.per_device_train_batch_size * config.max_length, eval_tokens);

  AdamWOptions adam{config.adam_beta1, config.adam_beta2, config.adam_epsilon, config.weight_decay};
  adam.split_master = config.split_master_weights;
  GLM_ASSIGN_OR_RETURN(const ZeroOptions zero_options,
                       resolve_zero_options(config, comm, data_comm != nullptr ? *data_comm : comm, backend));
  const bool lora = config.train_type == TrainType::lora;
  EngineConfig engine_config;
  engine_config.model = config.model;
  engine_config.max_tokens = max_tokens;
  engine_config.adam = adam;
  engine_config.max_grad_norm = config.max_grad_norm;
  engine_config.zero_stage = config.zero_stage;
  engine_config.recompute = config.recompute;
  engine_config.offload_activations = config.offload_activations;
  engine_config.zero = zero_options;
  if (lora) engine_config.lora = config.lora;
  engine_config.optimizer_in_backward = config.optimizer_in_backward;
  engine_config.defer_embedding_rows = config.defer_embedding_rows;
  engine_config.context_parallel_size = cp;
  engine_config.offload = OffloadConfig{config.offload_optimizer == OffloadDevice::cpu, config.offload_pin_memory,
                                        std::max(config.offload_threads, 1)};
  engine_config.offload.delayed_update = config.offload_delayed_update;
  engine_config.offload.delayed_update_after = config.offload_delayed_update_after;
  BadStepGuard guard(config.bad_steps);
  engine_config.norm_before_update = guard.spikes();
  engine_config.gradient_fault = config.gradient_fault;
  GLM_ASSIGN_OR_RETURN(auto engine, TrainingEngine::create(engine_config, backend, comm, data_comm));
  if (load_weights) {
    GLM_RETURN_IF_ERROR(load_weights(*engine));
  } else {
    GLM_RETURN_IF_ERROR(engine->initialize_parameters(config.seed));
  }
  if (lora) GLM_RETURN_IF_ERROR(engine->initialize_lora(config.seed));
  LrSchedule schedule{config.lr_scheduler_type, config.learning_rate,
                      resolve_warmup_steps(config.warmup_steps, config.warmup_ratio, total_steps), total_steps};

  const bool lead = rank == 0 && config.log_to_console;
  GLM_ASSIGN_OR_RETURN(MetricsLogger logger, MetricsLogger::open(rank == 0 ? config.output_dir : "", lead, config.report_tensorboard));
  ShardedLoader loader(dataset, config.seed, data_rank, data_world, config.per_device_train_batch_size,
                       config.gradient_accumulation_steps, packing ? &*packing : nullptr);
  const auto& rep = dataset.report;
  logger.print(concat("glm_hpc: ", backend.description(), " backend, world size ", world, ", model ",
                      engine->layout().parameter_count(), " parameters (", config.model.num_hidden_layers,
                      " layers, hidden ", config.model.hidden_size, ")"));
  if (const LoraLayout* l = engine->lora_layout())
    logger.print(concat("glm_hpc: LoRA rank ", l->rank(), ", alpha ", l->config().alpha, ", dropout ",
                        l->config().dropout, " on ", lora_targets_text(l->config().targets), ": ", l->parameter_count(),
                        " trainable parameters; the base is frozen"));
  if (engine->layout().persistent_unit() >= 0)
    logger.print(concat("glm_hpc: ZeRO-3 keeps ", engine->layout().persistent_tensors(), " tensors of at most ",
                        config.zero_options.param_persistence_threshold, " elements (",
                        engine->layout().persistent_parameter_count(),
                        " parameters) whole on every rank (--param_persistence_threshold)"));
  if (!dataset.prepared.empty()) logger.print("glm_hpc: samples memory-mapped from " + dataset.prepared);
  logger.print("glm_hpc: " + rep.describe());
  if (packing) logger.print("glm_hpc: " + packing->summary());
  if (config.log_to_console) GLM_RETURN_IF_ERROR(print_memory(*engine, comm, config));
  if (rep.skipped_bad > 0)
    logger.print(concat("glm_hpc: --on_bad_sample skip dropped ", rep.skipped_bad,
                        " bad sample(s); the first:", rep.skipped_reasons));
  logger.print(concat("glm_hpc: global batch ", loader.global_batch_size(), packing ? " packed rows" : " samples",
                      " = ", config.per_device_train_batch_size, " per device x ", data_world,
                      cp > 1 ? concat(" data-parallel group", data_world == 1 ? "" : "s", " of ", cp, " ranks sharing each row")
                             : std::string(" ranks"),
                      " x ",
                      config.gradient_accumulation_steps, " accumulation; ", total_steps, " steps, warmup ",
                      schedule.warmup_steps));

  TrainSummary summary;
  auto interval_start = clock::now();
  int64_t interval_tokens = 0;
  double interval_flops = 0;  // this rank's rows' model FLOPs since the last log line
  const PeakFlops peak = backend.bf16_peak();
  if (peak.flops > 0) logger.print("glm_hpc: MFU is model FLOPs over " + peak.source + " per GPU");
  RunHealth health(backend, config.log_gpu_health);
  if (!backend.pci_bus_id().empty()) logger.print("glm_hpc: " + health.source());
  std::vector<HostMicroBatch> micro(static_cast<size_t>(config.gradient_accumulation_steps));
  int64_t start_step = 0;
  std::optional<EvalRecord> best;  // the lowest eval loss so far, carried through resumes
  std::string last_saved;          // the newest checkpoint of this run (or the one it resumed from)
  if (!config.resume_from_checkpoint.empty()) {
    GLM_ASSIGN_OR_RETURN(const std::string dir, resolve_checkpoint(config.resume_from_checkpoint, config.output_dir));
    const ResumeExpectation expect{config.tokenizer, config.tokenizer_hash, config.resume_only_model, config.base_model,
                                   config.seed};
    GLM_ASSIGN_OR_RETURN(const CheckpointState saved, load_checkpoint(*engine, comm, dir, expect));
    if (config.resume_only_model) {
      logger.print(concat("glm_hpc: loaded the weights of ", dir, " (step ", saved.step,
                          "); --resume_only_model: optimizer, schedule and data start at step 0"));
    } else {
      start_step = saved.step;
      best = saved.best;
      last_saved = dir;
      if (start_step >= total_steps)
        return GLM_USER_ERROR("checkpoint '", dir, "' is at step ", start_step, ", not before this run's last step ",
                              total_steps);
      // The loader is a function of the step: the same global batch resumes at the same sample.
      const int64_t now = loader.consumed_samples(start_step);
      logger.print(concat("glm_hpc: resumed from ", dir, " at step ", start_step,
                          now == saved.consumed_samples
                              ? std::string()
                              : concat(" (the global batch changed: the checkpoint consumed ", saved.consumed_samples,
                                       " samples, this run continues at ", now, ")")));
    }
  }
  GLM_RETURN_IF_ERROR(logger.begin(start_step));
  // A checkpoint after `done` steps, with the eval loss of that step (if evaluated) and the best so far.
  // model_only: --save_only_model's weights alone; a preemption's save is whole, for the resume.
  auto checkpoint = [&](int64_t done, std::optional<double> eval_loss, bool model_only) -> Result<std::string> {
    if (best && best->step == done) best->checkpoint = concat("checkpoint-", done);
    const CheckpointState state{done,
                                loader.consumed_samples(done),
                                config.seed,
                                config.tokenizer,
                                config.tokenizer_hash,
                                eval_loss,
                                best,
                                config.base_model,
                                model_only};
    GLM_ASSIGN_OR_RETURN(const SaveReport saved,
                         save_checkpoint(*engine, comm, config.output_dir, state, config.save_total_limit));
    GLM_RETURN_IF_ERROR(logger.log_save(done, saved.dir, saved.bytes, saved.seconds));
    return saved.dir;
  };
  StepFilter filter;
  if (guard.active()) filter = [&guard](double loss, double grad_norm) { return guard.check(loss, grad_norm); };
  for (int64_t step = start_step; step < total_steps; ++step) {
    const auto step_start = clock::now();
    for (int64_t m = 0; m < config.gradient_accumulation_steps; ++m)
      micro[static_cast<size_t>(m)] = loader.micro_batch(step, m);
    const double lr = schedule.at(step);
    if (rank == config.slow_rank) std::this_thread::sleep_for(std::chrono::duration<double>(config.slow_rank_seconds));
    GLM_ASSIGN_OR_RETURN(StepResult r, engine->step(micro, lr, filter));
    health.add_step(std::chrono::duration<double>(clock::now() - step_start).count(), r.exposed_comm_seconds);
    // --profile tables cover the steady steps: the first one loads kernels and plans GEMMs.
    if (step == start_step) engine->backend().reset_profile();
    summary.losses.push_back(r.loss);
    summary.grad_norms.push_back(r.grad_norm);
    summary.steps = step + 1;
    interval_tokens += r.tokens;
    interval_flops += step_model_flops(config.model, micro, lora);
    guard.record(r.loss, r.grad_norm, !r.skipped.empty());
    if (!r.skipped.empty()) {
      summary.skipped_steps.push_back(step + 1);
      GLM_RETURN_IF_ERROR(logger.log_skip(step + 1, total_steps, r.skipped, loader.consumed_samples(step),
                                          loader.consumed_samples(step + 1), guard.consecutive_skips()));
      if (guard.over_limit())
        return GLM_USER_ERROR(guard.consecutive_skips(), " steps in a row skipped (the last, step ", step + 1,
                              ": ", r.skipped, "); stopped with the last checkpoint as it was (",
                              last_saved.empty() ? std::string("none saved") : last_saved,
                              "); lower --learning_rate, check the data, or raise --max_skipped_steps");
    }

    const bool last = step + 1 == total_steps;
    if (config.logging_steps > 0 && ((step + 1) % config.logging_steps == 0 || last)) {
      const auto now = clock::now();
      const double interval = std::chrono::duration<double>(now - interval_start).count();
      const double elapsed = std::chrono::duration<double>(now - start_time).count();
      StepMetrics m;
      m.step = step + 1;
      m.max_steps = total_steps;
      m.loss = r.loss;
      m.lr = lr;
      m.grad_norm = r.grad_norm;
      m.tokens = r.tokens;
      m.step_seconds = r.step_seconds;
      m.exposed_comm_seconds = r.exposed_comm_seconds;
      m.device_memory_bytes = backend.device_memory_used();
      m.tokens_per_second = interval > 0 ? static_cast<double>(interval_tokens) / interval : 0.0;
      m.host_memory_bytes = resident_host_bytes();
      // Every rank logs at the same steps: the FLOPs of all ranks' rows (a context-parallel group's
      // ranks hold the same rows) over the interval and the GPUs, summed in the ranks' report.
      GLM_ASSIGN_OR_RETURN(m.ranks, health.gather(comm, interval_flops));
      m.model_tflops = interval > 0 ? m.ranks.flops / cp / (interval * world) / 1e12 : 0.0;
      if (peak.flops > 0) m.mfu = m.model_tflops * 1e12 / peak.flops;
      interval_flops = 0;
      m.elapsed_seconds = elapsed;
      m.eta_seconds = elapsed / static_cast<double>(step + 1) * static_cast<double>(total_steps - step - 1);
      GLM_RETURN_IF_ERROR(logger.log(m));
      if (!m.ranks.straggler.empty()) logger.print("glm_hpc: warning: " + m.ranks.straggler);
      interval_start = now;
      interval_tokens = 0;
    }
    std::optional<double> eval_now;
    if (validation != nullptr && config.eval_steps > 0 && ((step + 1) % config.eval_steps == 0 || last)) {
      auto evaluated = evaluate_dataset(*engine, *validation, config.per_device_eval_batch_size, comm);
      if (evaluated.is_ok()) {
        const EvalResult& e = evaluated.value();
        summary.eval_losses.emplace_back(step + 1, e.mean_loss());
        summary.eval_correct.emplace_back(step + 1, e.correct);
        GLM_RETURN_IF_ERROR(logger.log_eval(step + 1, total_steps, e.mean_loss(), e.token_accuracy(), e.targets));
        eval_now = e.mean_loss();
        if (!best || e.mean_loss() < best->loss) best = EvalRecord{step + 1, e.mean_loss(), ""};
      } else if (evaluated.status().kind() == ErrorKind::stopped) {
        // Every rank stopped the evaluation alike; the step's checkpoint and the stop follow below
        // (after the last step the run is complete but for this evaluation).
        logger.print(concat("glm_hpc: step ", step + 1, ": ", evaluated.status().message()));
      } else {
        return evaluated.status();
      }
    }
    // Preemption (src/train/preemption.h): every rank asks after every step, so all stop together.
    if (!last) {
      GLM_ASSIGN_OR_RETURN(summary.preempted_by, agree_on_preemption(comm));
    }
    const bool stopping = summary.preempted_by != 0;
    const bool save_now = !config.output_dir.empty() && config.save_strategy == SaveStrategy::steps &&
                          ((step + 1) % config.save_steps == 0 || last || stopping);
    std::string saved = "no checkpoint saved (--save_strategy no, or no --output_dir)";
    if (save_now) {
      GLM_ASSIGN_OR_RETURN(const std::string dir, checkpoint(step + 1, eval_now, config.save_only_model && !stopping));
      saved = "saved " + dir;
      last_saved = dir;
    }
    if (stopping) {
      logger.print(concat("glm_hpc: preempted: ", signal_name(summary.preempted_by),
                          " received; every rank stopped after step ", step + 1, " of ", total_steps, ", ", saved,
                          "; exit code ", kPreemptedExitCode, " (continue with --resume_from_checkpoint latest)"));
      break;
    }
  }
  GLM_ASSIGN_OR_RETURN(summary.parameter_checksum, engine->parameter_checksum());
  return summary;
}

}  // namespace glm
