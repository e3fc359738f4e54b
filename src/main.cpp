// glm_hpc entry point: MPI bootstrap, options, data, backend, and the training run.
#include <cstdio>
#include <filesystem>

#include "cli/options.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "model/backend.h"
#include "mpi/fatal.h"
#include "mpi/mpi_communicator.h"
#include "mpi/runtime.h"
#include "train/trainer.h"

#ifdef GLM_HAVE_CUDA
#include "kernels/cuda_device.h"
#endif

namespace {

// Bad input is detected on every rank; all ranks agree, one prints, all exit with the same code.
// Returns the exit code to use, or 0 to go on.
int settle(const glm::Status& local) {
  glm::AgreedStatus agreed = glm::agree_on_status(local, MPI_COMM_WORLD);
  if (agreed.status.is_ok()) return 0;
  if (agreed.report_here) {
    std::fprintf(stderr, "glm_hpc: error: %s\n", agreed.status.message().c_str());
    std::fflush(stderr);
  }
  return agreed.status.exit_code();
}

int gpu_count() {
#ifdef GLM_HAVE_CUDA
  return glm::cuda_device_count();
#else
  return 0;
#endif
}

glm::Status resolve_paths(glm::CliOptions& o) {
  // The embedded default dataset is found from any working directory.
  if (o.effective["dataset"]["source"] == "default") {
    for (auto& path : o.train.datasets) {
      if (!std::filesystem::exists(path)) {
        const std::string bundled = std::string(GLM_SOURCE_DIR) + "/" + path;
        if (std::filesystem::exists(bundled)) path = bundled;
      }
    }
  }
  return glm::Status::ok();
}

glm::Status choose_backend(const glm::CliOptions& o, std::string& backend) {
  // The CUDA backend arrives with its own issue; until then auto means cpu and cuda is refused.
  const int gpus = gpu_count();
  if (o.device == "cuda")
    return GLM_USER_ERROR("--device cuda: the CUDA training backend is not part of this build yet (", gpus,
                          " GPU(s) visible); use --device cpu");
  backend = "cpu";
  return glm::Status::ok();
}

}  // namespace

int main(int argc, char** argv) {
  glm::MpiRuntime mpi(&argc, &argv);
  const glm::ProcessInfo& proc = mpi.info();

  auto parsed = glm::parse_options(argc, argv);
  if (int code = settle(parsed.status())) return code;
  glm::CliOptions options = parsed.take();
  if (options.help) {
    if (proc.rank == 0) std::printf("%s", glm::help_text().c_str());
    return 0;
  }
  std::string backend_name;
  if (int code = settle(resolve_paths(options))) return code;
  if (int code = settle(choose_backend(options, backend_name))) return code;

  glm::ByteTokenizer tokenizer;
  glm::Status vocab_ok = options.train.model.vocab_size >= tokenizer.vocab_size()
                             ? glm::Status::ok()
                             : GLM_USER_ERROR("vocab_size (", options.train.model.vocab_size,
                                              ") is smaller than the tokenizer's ", tokenizer.vocab_size(), " ids");
  if (int code = settle(vocab_ok)) return code;

  auto dataset =
      glm::load_dataset(options.train.datasets, tokenizer, options.train.max_length, options.train.model.vocab_size);
  if (int code = settle(dataset.status())) return code;
  if (int code = settle(proc.rank == 0 ? glm::write_args_json(options) : glm::Status::ok())) return code;

  glm::MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::duration<double>(options.collective_timeout));
  auto backend = glm::make_cpu_backend(glm::DType::f32);
  auto result = glm::train(options.train, dataset.value(), comm, *backend);
  // A failure here may leave peers inside a collective: take the fatal path, which aborts them.
  if (!result.is_ok()) glm::fatal_status(result.status());
  if (proc.rank == 0) {
    const auto& s = result.value();
    std::printf("glm_hpc: done: %lld steps, first loss %.4f, final loss %.4f; args.json and logging.jsonl in %s\n",
                static_cast<long long>(s.steps), s.losses.front(), s.losses.back(), options.train.output_dir.c_str());
  }
  return 0;
}
