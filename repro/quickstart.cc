// //repro:quickstart: train a small byte-level GPT on data/quickstart.txt on
// the best device present (CUDA if a GPU is visible, else the CpuDevice),
// with a progress line, then report the first and last loss and where the
// log and the weights went.
//
//   ./bazelw run //repro:quickstart [-- --steps=N --device=cpu --out=DIR]
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "engine/engine.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "models/data.h"
#include "models/gpt.h"
#include "runtime/best_device.h"
#include "runtime/communicator.h"
#include "runtime/launch.h"
#include "runtime/status.h"
#include "zero/trainer.h"

ABSL_FLAG(int64_t, steps, 300, "optimizer steps");
ABSL_FLAG(std::string, device, "auto", "auto (CUDA if a GPU is visible), cpu or cuda");
ABSL_FLAG(std::string, precision, "bf16", "fp32, bf16 or fp16");
ABSL_FLAG(std::string, text, "", "training text (bytes are tokens; default: the project's data/quickstart.txt)");
ABSL_FLAG(std::string, config, "", "model config file (default: the project's models/configs/gpt.textproto)");
ABSL_FLAG(std::string, model, "quickstart", "config name in --config");
ABSL_FLAG(std::string, out, "", "output directory (default: <workspace>/out/quickstart)");

namespace memwall::repro {
namespace {

// The project's own files, relative to the runfiles tree `bazel run` starts
// us in (and to the repository root, where mpirun runs bazel-bin/...).
constexpr char kDefaultText[] = "data/quickstart.txt";
constexpr char kDefaultConfig[] = "models/configs/gpt.textproto";

// A path flag: what the user typed, from the directory they typed it in;
// the project's file when they typed nothing.
std::string PathFlag(const std::string& value, const char* project_file) {
  return value.empty() ? project_file : UserPath(value, std::getenv);
}

std::string OutputDir() {
  if (!absl::GetFlag(FLAGS_out).empty()) return UserPath(absl::GetFlag(FLAGS_out), std::getenv);
  // `bazel run` starts us in the runfiles tree; write next to the sources.
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  return absl::StrCat(workspace != nullptr ? workspace : ".", "/out/quickstart");
}

// The text's path as a user would type it after `bazel run` returns.
std::string TextPathForUser() {
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  const std::string text = absl::GetFlag(FLAGS_text);
  if (text.empty() && workspace != nullptr) return absl::StrCat(workspace, "/", kDefaultText);
  return std::filesystem::absolute(PathFlag(text, kDefaultText)).string();
}

absl::Status Main() {
  MEMWALL_ASSIGN_OR_RETURN(models::GptConfigList configs, models::LoadConfigs(PathFlag(absl::GetFlag(FLAGS_config), kDefaultConfig)));
  MEMWALL_ASSIGN_OR_RETURN(models::GptConfig config, models::FindConfig(configs, absl::GetFlag(FLAGS_model)));
  MEMWALL_ASSIGN_OR_RETURN(std::unique_ptr<models::TokenSource> text,
                           models::ByteTextSource(PathFlag(absl::GetFlag(FLAGS_text), kDefaultText)));
  MEMWALL_ASSIGN_OR_RETURN(auto device, CreateDeviceByName(absl::GetFlag(FLAGS_device)));
  MEMWALL_ASSIGN_OR_RETURN(auto comm, CreateCommunicator(*device));
  MEMWALL_ASSIGN_OR_RETURN(auto model, models::Gpt::Create(config));
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  if (steps <= 0) return absl::InvalidArgumentError("--steps must be > 0");
  zero::TrainerOptions options;
  zero::TrainingConfig& training = options.training;
  training.set_seq(config.positions());
  training.set_micro_batch(8);
  MEMWALL_ASSIGN_OR_RETURN(const zero::Precision precision, zero::ParsePrecision(absl::GetFlag(FLAGS_precision)));
  training.set_precision(precision);
  training.mutable_adam()->set_lr(2e-3f);
  training.mutable_adam()->set_weight_decay(0.01f);
  training.mutable_schedule()->set_warmup_steps(20);
  training.mutable_schedule()->set_decay_steps(steps);
  MEMWALL_ASSIGN_OR_RETURN(auto trainer, engine::CreateTrainer(*model, *device, *comm, options));

  const std::string dir = OutputDir();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  const std::string log_path = dir + "/train.log", weights_path = dir + "/model.safetensors";
  std::ofstream log(log_path, std::ios::trunc);
  if (!log) return absl::PermissionDeniedError(absl::StrCat("cannot write ", log_path));
  const bool rank0 = comm->rank() == 0;
  if (rank0) {
    std::printf("quickstart: %s (%lld layers, hidden %lld, %lld parameters) on %s, %s, %lld ranks; "
                "%lld steps of %lld x %lld tokens from %s\n",
                config.name().c_str(), (long long)config.layers(), (long long)config.hidden(),
                (long long)models::CountParameters(config), device->name().c_str(),
                std::string(zero::PrecisionName(precision)).c_str(),
                (long long)comm->world_size(), (long long)steps,
                (long long)(training.micro_batch() * comm->world_size()), (long long)training.seq(),
                text->description().c_str());
  }
  const bool tty = isatty(STDERR_FILENO);
  const int64_t every = std::max<int64_t>(1, steps / 20);
  double first = 0, last = 0;
  for (int64_t i = 0; i < steps; ++i) {
    MEMWALL_ASSIGN_OR_RETURN(zero::StepStats st, trainer->Step(*text));
    if (i == 0) first = st.loss;
    last = st.loss;
    const std::string line = trainer->LogLine(st);
    log << line << "\n";
    if (rank0 && tty) {  // one progress line, rewritten in place
      std::fprintf(stderr, "\r[%3d%%] %s   ", int(100 * (i + 1) / steps), line.c_str());
      if (i + 1 == steps) std::fprintf(stderr, "\n");
    } else if (rank0 && ((i + 1) % every == 0 || i == 0)) {
      std::fprintf(stderr, "[%3d%%] %s\n", int(100 * (i + 1) / steps), line.c_str());
    }
  }
  log.close();
  if (!log) return absl::DataLossError(absl::StrCat("error writing ", log_path));
  // The fp32 master weights, not the 16-bit compute copy (rank 0 writes).
  MEMWALL_RETURN_IF_ERROR(trainer->Export(weights_path));
  if (rank0) {
    std::printf("first loss %.4f, last loss %.4f (uniform over bytes: %.4f)\n", first, last,
                std::log(256.0));
    std::printf("log:     %s\nweights: %s\n", log_path.c_str(), weights_path.c_str());
    std::printf("evaluate: ./bazelw run //models:evaluate -- --weights=%s --heads=%lld --text=%s\n",
                weights_path.c_str(), (long long)config.heads(),
                TextPathForUser().c_str());
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace memwall::repro

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::Status st = memwall::repro::Main(); !st.ok()) {
    std::fprintf(stderr, "quickstart: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
