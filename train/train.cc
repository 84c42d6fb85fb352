// //:train: train a GPT with any ZeRO stage and placement, save and resume
// sharded checkpoints, export Hugging Face files. With no flags it is the
// quickstart: the 0.8M-parameter `quickstart` GPT on data/quickstart.txt.
//
//   ./bazelw run //:train -- [--model=NAME|FILE] [--data=FILE] [--data_format=auto|text|uint16]
//       [--config=TRAINING.textproto] [--set='zero { stage: 2 }'] [--deepspeed_config=ds_config.json]
//       [--steps=N] [--out=DIR] [--save_every=N] [--keep_checkpoints=N] [--save_dir=DIR] [--resume[=latest|PATH]]
//       [--export=DIR] [--device=auto|cpu|cuda] [--share_gpus] [--comm_backend=auto|mpi|nccl|tcp] [--trace_dir=DIR]
//
// Under mpirun, srun or a torchrun-style launcher every process runs this
// same command; each is one data-parallel rank (runtime/launch.h), on the
// GPU of its local rank. One step reads like the algorithm: the trainer's
// Step (zero/trainer.h), a progress line, a checkpoint every --save_every
// steps; the end exports the fp32 master weights.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "engine/deepspeed_config.h"
#include "engine/engine.h"
#include "engine/estimate.h"
#include "models/data.h"
#include "models/gpt.h"
#include "runtime/best_device.h"
#include "runtime/communicator.h"
#include "runtime/files.h"
#include "runtime/host_cpus.h"
#include "runtime/launch.h"
#include "runtime/memory.h"
#include "runtime/status.h"
#include "runtime/timeline.h"
#include "zero/checkpoint.h"
#include "zero/config.h"
#include "zero/trainer.h"

ABSL_FLAG(std::string, model, "quickstart",
          "a model name from models/configs/ (quickstart, gpt_125m, gpt_1.3b, offload_10b, ...) or a GptConfig file");
ABSL_FLAG(std::string, model_name, "", "the entry to use when --model is a file listing several");
ABSL_FLAG(std::string, data, "",
          "training data: a text file, its bytes the tokens, or a token file of uint16 ids (default: the project's "
          "data/quickstart.txt)");
ABSL_FLAG(std::string, data_format, "auto",
          "how --data's bytes are tokens: text, uint16 (little-endian ids, no header: nanoGPT's train.bin), or auto "
          "(uint16 for a name ending in .bin, else text)");
ABSL_FLAG(std::string, config, "", "TrainingConfig text proto (zero/training_config.proto); default: the quickstart's");
ABSL_FLAG(std::string, set, "", "TrainingConfig fields over the config, e.g. 'zero { stage: 2 } micro_batch: 4'");
ABSL_FLAG(std::string, deepspeed_config, "", "a DeepSpeed JSON config instead of --config (docs/deepspeed.md)");
ABSL_FLAG(std::string, checkpointing, "", "activation checkpointing: true or false (default: the model's)");
ABSL_FLAG(int64_t, steps, 300, "train until this many optimizer steps are done (a resumed run counts its past steps)");
ABSL_FLAG(std::string, out, "", "output directory: train.log, the export (default: <workspace>/out/train)");
ABSL_FLAG(int64_t, save_every, 0, "save a sharded checkpoint every N steps and at the end (0: never)");
ABSL_FLAG(int64_t, keep_checkpoints, 0,
          "after each save, delete all but the newest N complete checkpoints under --save_dir (0: keep all)");
ABSL_FLAG(std::string, save_dir, "", "checkpoint directory (default: <out>/checkpoints)");
ABSL_FLAG(std::string, resume, "",
          "'latest': the newest complete checkpoint under --save_dir (none: start fresh); or a step directory");
ABSL_FLAG(std::string, export, "", "directory for model.safetensors and config.json (default: <out>; 'none': skip)");
ABSL_FLAG(std::string, device, "auto", "auto (CUDA if a GPU is visible), cpu or cuda");
ABSL_FLAG(bool, share_gpus, false,
          "let several local ranks share a GPU (else more local ranks than GPUs is refused); they communicate "
          "through pinned host memory, as NCCL needs a GPU per rank");
ABSL_FLAG(std::string, comm_backend, "auto",
          "auto (NCCL on GPUs, MPI or TCP on the CPU device), mpi, nccl or tcp; mpi and tcp stage a GPU's memory "
          "through pinned host buffers");
ABSL_FLAG(std::string, trace_dir, "", "write each step's Chrome trace here (one file per step and rank)");
ABSL_FLAG(int64_t, print_every, 0, "a progress line every N steps (default: 20 lines a run, or steps_per_print)");

namespace memwall::train {
namespace {

constexpr char kProjectText[] = "data/quickstart.txt";

// The quickstart's training settings: what runs with no --config.
constexpr char kQuickstartTraining[] = R"pb(
  micro_batch: 8
  precision: BF16
  adam { lr: 2e-3 weight_decay: 0.01 }
  schedule { warmup_steps: 20 }
)pb";

// A path flag as the user meant it (runtime/launch.h's UserPath).
std::string UserFlag(const std::string& value) { return UserPath(value, std::getenv); }

std::string OutDir() {
  if (!absl::GetFlag(FLAGS_out).empty()) return UserFlag(absl::GetFlag(FLAGS_out));
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");  // `bazel run`: beside the sources
  return absl::StrCat(workspace != nullptr ? workspace : ".", "/out/train");
}

// What the run trains with, and where each setting came from.
struct Settings {
  zero::TrainingConfig training;
  std::vector<std::string> translation;  // a DeepSpeed config's, line by line
  int64_t print_every = 0;
  // The model's side of a DeepSpeed activation_checkpointing block.
  std::optional<bool> checkpointing, offload_activations;
};

absl::StatusOr<Settings> LoadSettings(const models::GptConfig& model, int world_size, int64_t steps) {
  Settings s;
  const std::string config = absl::GetFlag(FLAGS_config), ds = absl::GetFlag(FLAGS_deepspeed_config);
  if (!config.empty() && !ds.empty()) {
    return absl::InvalidArgumentError("give --config or --deepspeed_config, not both");
  }
  if (!ds.empty()) {
    const std::string path = UserFlag(ds);
    MEMWALL_ASSIGN_OR_RETURN(const std::string json, ReadRegularFile(path, "--deepspeed_config"));
    MEMWALL_ASSIGN_OR_RETURN(engine::DeepSpeedTranslation t, engine::TranslateDeepSpeedConfig(json, path));
    MEMWALL_RETURN_IF_ERROR(engine::CheckTrainBatchSize(t, world_size));
    if (t.activation_checkpointing && !absl::GetFlag(FLAGS_checkpointing).empty()) {
      return absl::InvalidArgumentError("--checkpointing and the DeepSpeed config's activation_checkpointing: give one");
    }
    s.training = t.training;
    s.translation = t.lines;
    s.checkpointing = t.activation_checkpointing;
    s.offload_activations = t.offload_activations;
    s.print_every = t.steps_per_print;
  } else if (!config.empty()) {
    const std::string path = UserFlag(config);
    MEMWALL_ASSIGN_OR_RETURN(const std::string text, ReadRegularFile(path, "--config"));
    MEMWALL_RETURN_IF_ERROR(ParseTextProto(text, path, &s.training));
  } else {
    MEMWALL_RETURN_IF_ERROR(ParseTextProto(kQuickstartTraining, "the quickstart's settings", &s.training));
    s.training.mutable_schedule()->set_decay_steps(steps);
  }
  if (const std::string set = absl::GetFlag(FLAGS_set); !set.empty()) {
    zero::TrainingConfig over;
    MEMWALL_RETURN_IF_ERROR(ParseTextProto(set, "--set", &over));
    s.training.MergeFrom(over);
  }
  if (!s.training.has_seq()) s.training.set_seq(model.positions());
  if (absl::GetFlag(FLAGS_print_every) > 0) s.print_every = absl::GetFlag(FLAGS_print_every);
  return s;
}

// "stage 2, optimizer on CPU (+DPU after 40 steps), parameters on device".
std::string Placements(const zero::TrainingOptions& t) {
  const zero::ZeroConfig& z = t->zero();
  std::string line = absl::StrCat("stage ", z.stage(), ", optimizer states on ",
                                  zero::OffloadOptimizerConfig::Device_Name(z.offload_optimizer().device()));
  if (z.offload_optimizer().device() != zero::OffloadOptimizerConfig::NONE &&
      z.offload_optimizer().delayed_update_after_steps() > 0) {
    absl::StrAppend(&line, " (delayed update after ", z.offload_optimizer().delayed_update_after_steps(), " steps)");
  }
  if (z.stage() == 3) {
    absl::StrAppend(&line, ", parameters on ", zero::OffloadParamConfig::Device_Name(z.offload_param().device()),
                    z.partitioning() == zero::ZeroConfig::BANDWIDTH_CENTRIC ? ", bandwidth-centric" : "");
    if (z.offload_param().device() == zero::OffloadParamConfig::NVME && z.offload_param().host_elements() > 0) {
      absl::StrAppend(&line, " (a shard's first ", z.offload_param().host_elements(), " elements in pinned host memory)");
    }
    if (z.max_reuse_distance() > 0) {
      absl::StrAppend(&line, ", a module kept within ", z.max_reuse_distance(), " elements of its next use");
    }
  }
  absl::StrReplaceAll({{"on NONE", "on the device"}}, &line);
  return line;
}

// "bf16", or "fp16 (loss scale 65536, x2 after 1000 clean steps, hysteresis 2)".
std::string PrecisionLine(const zero::TrainingOptions& t) {
  std::string line(zero::PrecisionName(t->precision()));
  if (t->precision() != zero::FP16) return line;
  const zero::LossScaling& l = t->loss_scaling();
  absl::StrAppend(&line, " (loss scale ", l.initial_scale(), ", x2 after ", l.growth_interval(),
                  " clean steps, hysteresis ", l.hysteresis(), l.consecutive_hysteresis() ? " consecutive" : "", ")");
  return line;
}

// What this rank held at its peak beside what the estimator
// (engine/estimate.h, //repro:estimate) says for the same run before it
// starts: "device peak 4.41 GiB of 4.41 GiB estimated; pinned host peak ...;
// process resident peak 4.66 GiB". The estimate counts memwall's buffers;
// the process also holds its code, libraries and the host's copies.
std::string MemoryLine(Device& device, const models::GptConfig& config, const zero::TrainingConfig& training,
                       int world_size) {
  engine::EstimateInput in;
  in.model = config;
  in.ranks = world_size;
  in.training = training;
  in.checkpointing = config.activation_checkpointing();
  const absl::StatusOr<engine::Estimate> estimate = engine::EstimateMemory(in);
  auto of = [&](int64_t engine::Estimate::*bytes) {
    return estimate.ok() ? absl::StrCat(" of ", FormatBytes((*estimate).*bytes), " estimated") : std::string();
  };
  const size_t pinned_peak = device.pinned_host().account().total_peak();
  std::string line = absl::StrCat("device peak ", FormatBytes(device.memory().account().total_peak()),
                                  of(&engine::Estimate::total_device_bytes));
  if (pinned_peak > 0 || (estimate.ok() && estimate->host_bytes > 0)) {
    absl::StrAppend(&line, "; pinned host peak ", FormatBytes(pinned_peak), of(&engine::Estimate::host_bytes));
  }
  if (const size_t resident = PeakResidentBytes(); resident > 0) {
    absl::StrAppend(&line, "; process resident peak ", FormatBytes(resident));
  }
  if (!estimate.ok()) absl::StrAppend(&line, " (no estimate: ", estimate.status().message(), ")");
  return line;
}

// SIGTERM, SIGINT and SIGUSR1 (Slurm's --signal, which mpirun forwards) ask
// the run to stop: every rank finishes the step under way, they save a
// checkpoint together and exit with 128 + the signal. The handler is reset
// by its first signal, so a second one ends the process at once.
volatile std::sig_atomic_t stop_signal = 0;

extern "C" void AskToStop(int signal) {
  stop_signal = signal;
  constexpr char kSaid[] = "\ntrain: stopping after this step, with a checkpoint (again to stop now)\n";
  (void)!::write(STDERR_FILENO, kSaid, sizeof kSaid - 1);
}

void StopOnSignals() {
  struct sigaction action = {};
  action.sa_handler = AskToStop;
  action.sa_flags = SA_RESETHAND | SA_RESTART;
  sigemptyset(&action.sa_mask);
  for (int signal : {SIGTERM, SIGINT, SIGUSR1}) ::sigaction(signal, &action, nullptr);
}

// A save that failed ends the run; the message says what it can resume.
absl::Status WhereToResume(const absl::Status& failed, int64_t step, const std::string& save_dir) {
  const absl::StatusOr<std::string> latest = zero::LatestCheckpoint(save_dir);
  return absl::Status(failed.code(),
                      absl::StrCat("saving step ", step, ": ", failed.message(), "; ",
                                   latest.ok() ? absl::StrCat("the latest complete checkpoint is ", *latest,
                                                              " (continue with --resume)")
                                               : absl::StrCat("no complete checkpoint under ", save_dir)));
}

// A warning when --save_dir's file system cannot hold the checkpoints this
// run keeps at once: each is ShardFileBytes(Ψ) (zero/checkpoint.h), and a
// save writes its own before --keep_checkpoints deletes older ones.
void WarnIfCheckpointsDoNotFit(const zero::Trainer& trainer, const std::string& save_dir, int64_t steps,
                               int64_t save_every, int64_t keep) {
  const int64_t from = trainer.steps_done();
  if (from >= steps) return;
  const int64_t saves = steps / save_every - from / save_every + (steps % save_every != 0 ? 1 : 0);
  if (saves <= 0) return;
  const bool delayed = trainer.training()->zero().offload_optimizer().delayed_update_after_steps() > 0;
  const int64_t each = static_cast<int64_t>(zero::ShardFileBytes(trainer.layout().numel(), delayed));
  const int64_t held = keep > 0 ? std::min(saves, keep + 1) : saves;
  const int64_t available = FileSystemAvailableBytes(save_dir);
  if (available < 0 || held * each <= available) return;
  std::fprintf(stderr,
               "train: warning: %s has %s available; this run saves %lld checkpoint%s of %s and holds up to %lld "
               "at once (%s): a save will fail unless space is freed or --keep_checkpoints is lowered\n",
               save_dir.c_str(), FormatBytes(available).c_str(), (long long)saves, saves == 1 ? "" : "s",
               FormatBytes(each).c_str(), (long long)held, FormatBytes(held * each).c_str());
}

// The process's exit code: 0 when the run ended, 128 + the signal when it
// was stopped by one.
absl::StatusOr<int> Main() {
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  if (steps <= 0) return absl::InvalidArgumentError(absl::StrCat("--steps=", steps, " must be > 0"));
  if (absl::GetFlag(FLAGS_save_every) < 0) return absl::InvalidArgumentError("--save_every must be >= 0");
  if (const int64_t every = absl::GetFlag(FLAGS_print_every); every < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--print_every=", every, " must be >= 0 (0: the default)"));
  }
  const int64_t keep = absl::GetFlag(FLAGS_keep_checkpoints);
  if (keep < 0) return absl::InvalidArgumentError(absl::StrCat("--keep_checkpoints=", keep, " must be >= 0"));
  if (keep > 0 && absl::GetFlag(FLAGS_save_every) == 0) {
    return absl::InvalidArgumentError("--keep_checkpoints needs --save_every: nothing is saved without it");
  }
  MEMWALL_ASSIGN_OR_RETURN(const LaunchInfo launch, DiscoverLaunch(std::getenv));
  MEMWALL_ASSIGN_OR_RETURN(models::GptConfig config,
                           models::ResolveModel(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_model_name)));
  MEMWALL_ASSIGN_OR_RETURN(Settings settings, LoadSettings(config, launch.world_size, steps));
  // The translation first, so that a refusal of what it set (with --set on
  // top) reads after the line that set it.
  if (launch.rank == 0) {
    for (const std::string& line : settings.translation) std::printf("deepspeed_config: %s\n", line.c_str());
    std::fflush(stdout);
  }
  if (settings.checkpointing) config.set_activation_checkpointing(*settings.checkpointing);
  if (settings.offload_activations) config.set_offload_activations(*settings.offload_activations);
  if (const std::string c = absl::GetFlag(FLAGS_checkpointing); c == "true" || c == "false") {
    config.set_activation_checkpointing(c == "true");
  } else if (!c.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--checkpointing='", c, "' is not true or false"));
  }
  const std::string data_path =
      absl::GetFlag(FLAGS_data).empty() ? ProjectFile(kProjectText) : UserFlag(absl::GetFlag(FLAGS_data));
  MEMWALL_ASSIGN_OR_RETURN(const models::DataFormat format, models::ParseDataFormat(absl::GetFlag(FLAGS_data_format)));
  MEMWALL_ASSIGN_OR_RETURN(std::unique_ptr<models::TokenSource> data, models::OpenTokenSource(data_path, format));
  MEMWALL_ASSIGN_OR_RETURN(auto device,
                           CreateDeviceForRank(absl::GetFlag(FLAGS_device), launch, absl::GetFlag(FLAGS_share_gpus)));
  MEMWALL_ASSIGN_OR_RETURN(const CommBackend backend, ParseCommBackend(absl::GetFlag(FLAGS_comm_backend)));
  MEMWALL_ASSIGN_OR_RETURN(
      auto comm, CreateCommunicator(*device, LaunchCommOptions(backend, absl::GetFlag(FLAGS_share_gpus), *device)));
  MEMWALL_ASSIGN_OR_RETURN(auto model, models::Gpt::Create(config));
  const bool rank0 = comm->rank() == 0;
  const int64_t save_every = absl::GetFlag(FLAGS_save_every);
  const std::string out = OutDir();
  const std::string save_dir = absl::GetFlag(FLAGS_save_dir).empty() ? out + "/checkpoints"
                                                                     : UserFlag(absl::GetFlag(FLAGS_save_dir));
  const std::string trace_dir = absl::GetFlag(FLAGS_trace_dir).empty()
                                    ? ""
                                    : absl::StrCat(UserFlag(absl::GetFlag(FLAGS_trace_dir)), "/rank_", comm->rank());
  const std::string export_flag = absl::GetFlag(FLAGS_export);
  const std::string export_dir = export_flag == "none" ? "" : export_flag.empty() ? out : UserFlag(export_flag);
  // Every directory the run writes, checked now rather than after hours of
  // training.
  for (const auto& [dir, what] : {std::pair{out, "--out"}, {trace_dir, "--trace_dir"}, {export_dir, "--export"},
                                  {save_every > 0 ? save_dir : std::string(), "--save_dir"}}) {
    if (!dir.empty()) MEMWALL_RETURN_IF_ERROR(CreateWritableDirectory(dir, what));
  }

  Timeline timeline;  // the device-idle fraction and breakdown of each step
  zero::TrainerOptions options;
  options.training = settings.training;
  options.timeline = &timeline;
  options.trace_dir = trace_dir;
  if (rank0) {
    // "mpirun (OpenMPI), mpi"; one process has no backend to name.
    const std::string launched = comm->backend() == CommBackend::kSingleProcess
                                     ? std::string(LauncherName(launch.launcher))
                                     : absl::StrCat(LauncherName(launch.launcher), ", ", comm->Describe());
    std::printf("train: %s (%lld layers, hidden %lld, %lld heads, %lld parameters%s) on %s, %d %s (%s)\n",
                config.name().c_str(), (long long)config.layers(), (long long)config.hidden(),
                (long long)config.heads(), (long long)models::CountParameters(config),
                config.activation_checkpointing() ? ", activation checkpointing" : "", device->name().c_str(),
                comm->world_size(), comm->world_size() == 1 ? "rank" : "ranks",
                launched.c_str());
    std::fflush(stdout);  // before the set-up, which takes minutes for the largest models
  }
  const auto setup_start = std::chrono::steady_clock::now();
  MEMWALL_ASSIGN_OR_RETURN(auto trainer, engine::CreateTrainer(*model, *device, *comm, options));
  const double setup_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - setup_start).count();
  const zero::TrainingOptions& t = trainer->training();

  if (rank0) {
    const size_t pinned = device->pinned_host().account().total_current();
    std::printf("train: set up in %.1f s: the model states allocated and initialized (%s of device memory%s)\n",
                setup_seconds, FormatBytes(device->memory().account().total_current()).c_str(),
                pinned > 0 ? absl::StrCat(", ", FormatBytes(pinned), " of pinned host memory").c_str() : "");
    std::printf("train: %s; %s; %lld steps of %lld sequences x %lld tokens (micro-batch %lld x accumulation %lld x "
                "%d ranks) from %s\n",
                Placements(t).c_str(), PrecisionLine(t).c_str(), (long long)steps,
                (long long)(t->micro_batch() * t->accumulation() * comm->world_size()), (long long)t->seq(),
                (long long)t->micro_batch(), (long long)t->accumulation(), comm->world_size(),
                data->description().c_str());
    const HostCpus& cpus = CurrentHostCpus();
    std::printf("train: host work (CPU Adam, gradient accumulation, the CpuDevice's ops): %s\n",
                cpus.Describe().c_str());
    std::fflush(stdout);  // before the progress lines on stderr
    if (cpus.narrowed()) {
      const int share = cpus.machine / cpus.local_ranks;
      std::fprintf(stderr,
                   "train: warning: rank 0 may run on %d of the %d CPUs that are its share of this machine (its "
                   "launcher or taskset bound it; mpirun binds each of 2 or fewer ranks to one core): its host work "
                   "gets %d thread%s. Under mpirun pass --bind-to none, or --map-by slot:PE=%d to bind each rank to "
                   "its share\n",
                   cpus.allowed, share, cpus.threads, cpus.threads == 1 ? "" : "s", share);
    }
  }

  // Resume: the newest complete checkpoint, or the one named. A run that
  // would save over checkpoints it did not resume from stops now, not at
  // its first save.
  if (absl::GetFlag(FLAGS_resume).empty() && save_every > 0) {
    if (absl::StatusOr<std::string> old = zero::LatestCheckpoint(save_dir); old.ok()) {
      return absl::AlreadyExistsError(absl::StrCat(save_dir, " holds checkpoints (the latest ", *old,
                                                   "): pass --resume to continue from it, or another --save_dir"));
    }
  }
  if (const std::string resume = absl::GetFlag(FLAGS_resume); !resume.empty()) {
    std::string step_dir;
    if (resume == "latest") {
      absl::StatusOr<std::string> latest = zero::LatestCheckpoint(save_dir);
      if (latest.ok()) {
        step_dir = *latest;
      } else if (latest.status().code() != absl::StatusCode::kNotFound) {
        return latest.status();
      } else if (rank0) {
        std::printf("train: no complete checkpoint under %s: starting at step 0\n", save_dir.c_str());
      }
    } else {
      step_dir = UserFlag(resume);
    }
    if (!step_dir.empty()) {
      MEMWALL_RETURN_IF_ERROR(trainer->Load(step_dir));
      if (rank0) {
        std::printf("train: resumed from %s at step %lld\n", step_dir.c_str(), (long long)trainer->steps_done());
        std::fflush(stdout);
      }
    }
    // Resumed from an older step, the run's saves would meet the newer
    // checkpoints (a complete one is never replaced): stop now, not there.
    if (save_every > 0) {
      if (absl::StatusOr<std::string> latest = zero::LatestCheckpoint(save_dir); latest.ok()) {
        const absl::StatusOr<zero::CheckpointMetadata> meta = zero::ReadCheckpointMetadata(*latest);
        if (meta.ok() && meta->step() > trainer->steps_done()) {
          return absl::AlreadyExistsError(absl::StrCat(
              save_dir, " holds ", *latest, ", newer than step ", trainer->steps_done(),
              " that this run resumed from: its saves would meet it; give another --save_dir, or delete the "
              "checkpoints after step ", trainer->steps_done()));
        }
      }
    }
  }

  if (rank0 && save_every > 0) WarnIfCheckpointsDoNotFit(*trainer, save_dir, steps, save_every, keep);

  std::ofstream log;
  const std::string log_path = out + "/train.log";
  if (rank0) {
    log.open(log_path, trainer->steps_done() > 0 ? std::ios::app : std::ios::trunc);
    if (!log) return absl::PermissionDeniedError(absl::StrCat("cannot write ", log_path));
  }
  StopOnSignals();
  const bool tty = rank0 && isatty(STDERR_FILENO);
  const int64_t every = settings.print_every > 0 ? settings.print_every : std::max<int64_t>(1, steps / 20);
  double first = NAN, last = NAN;
  while (trainer->steps_done() < steps) {
    MEMWALL_ASSIGN_OR_RETURN(const zero::StepStats st, trainer->Step(*data));
    timeline.Clear();
    if (std::isnan(first)) first = st.loss;
    last = st.loss;
    const std::string line = trainer->LogLine(st);
    if (rank0) {
      log << line << "\n" << std::flush;
      const int percent = int(100 * st.step / steps);
      if (tty) {  // one progress line, rewritten in place
        std::fprintf(stderr, "\r\033[K[%3d%%] %s", percent, line.c_str());
        if (st.step == steps) std::fprintf(stderr, "\n");
      } else if (st.step % every == 0 || st.step == 1 || st.step == steps) {
        std::fprintf(stderr, "[%3d%%] %s\n", percent, line.c_str());
      }
    }
    // A checkpoint of this step, logged; with --keep_checkpoints, the
    // older ones deleted after it (the run goes on when a deletion fails:
    // its checkpoints are whole).
    auto save = [&]() -> absl::Status {
      absl::StatusOr<std::string> saved = trainer->Save(save_dir);
      if (!saved.ok()) return WhereToResume(saved.status(), st.step, save_dir);
      if (!rank0) return absl::OkStatus();
      log << "saved " << *saved << "\n" << std::flush;
      if (keep == 0) return absl::OkStatus();
      const absl::StatusOr<std::vector<std::string>> deleted = zero::PruneCheckpoints(save_dir, keep);
      if (!deleted.ok()) {
        std::fprintf(stderr, "train: warning: %s\n", std::string(deleted.status().message()).c_str());
        log << "warning: " << deleted.status().message() << "\n" << std::flush;
      }
      for (const std::string& d : deleted.ok() ? *deleted : std::vector<std::string>{}) {
        log << "deleted " << d << "\n" << std::flush;
      }
      return absl::OkStatus();
    };
    const bool save_now = save_every > 0 && (st.step % save_every == 0 || st.step == steps);
    if (save_now) MEMWALL_RETURN_IF_ERROR(save());
    // A signal on any rank stops every rank after the same step.
    MEMWALL_ASSIGN_OR_RETURN(const int32_t signal, trainer->MaxOverRanks(stop_signal));
    if (signal != 0 && st.step < steps) {
      const std::string step_dir = zero::CheckpointPath(save_dir, st.step);
      if (!save_now) MEMWALL_RETURN_IF_ERROR(save());
      const std::string line = absl::StrCat("stopped by signal ", signal, " (", strsignal(signal), ") after step ",
                                            st.step, " of ", steps, "; saved ", step_dir,
                                            " (continue: the same command with --resume)");
      if (rank0) {
        log << line << "\n" << std::flush;
        std::fprintf(stderr, "train: %s\n", line.c_str());
      }
      return 128 + signal;
    }
  }

  std::string exported;
  if (!export_dir.empty()) {
    // Every step's update in the weights, a delayed one included.
    MEMWALL_RETURN_IF_ERROR(trainer->ApplyPendingUpdate());
    exported = export_dir + "/model.safetensors";
    MEMWALL_RETURN_IF_ERROR(trainer->Export(exported));
  }
  if (rank0) {
    const std::string memory = MemoryLine(*device, config, trainer->training().config(), comm->world_size());
    log << "memory: " << memory << "\n" << std::flush;
    if (!std::isnan(first)) {
      std::printf("first loss %.4f, last loss %.4f (uniform over the vocabulary: %.4f)\n", first, last,
                  std::log(double(config.vocab())));
    }
    std::printf("memory:      %s\n", memory.c_str());
    std::printf("log:         %s\n", log_path.c_str());
    if (save_every > 0) std::printf("checkpoints: %s (resume with --resume)\n", save_dir.c_str());
    if (!exported.empty()) {
      std::printf("weights:     %s (+ config.json)\n", exported.c_str());
      // The project's text as the user's checkout has it, not as the
      // binary's runfiles do (`bazel run` starts in those).
      const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
      const std::string text = absl::GetFlag(FLAGS_data).empty() && workspace != nullptr
                                   ? absl::StrCat(workspace, "/", kProjectText)
                                   : std::filesystem::absolute(data_path).string();
      std::printf("evaluate:    ./bazelw run //models:evaluate -- --weights=%s --text=%s\n", exported.c_str(),
                  text.c_str());
    }
  }
  return 0;
}

}  // namespace
}  // namespace memwall::train

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "train a GPT with ZeRO stages 0-3, ZeRO-Offload and ZeRO-Infinity placements; with no flags, the "
      "quickstart.\n"
      "  train [--model=NAME|FILE] [--data=FILE] [--config=FILE | --deepspeed_config=FILE.json] [--set='...']\n"
      "        [--steps=N] [--out=DIR] [--save_every=N] [--keep_checkpoints=N] [--save_dir=DIR] [--resume[=latest|PATH]]\n"
      "        [--export=DIR]\n"
      "  Under mpirun, srun or torchrun-style variables each process is one rank.");
  // A bare --resume means the latest checkpoint.
  std::vector<char*> args(argv, argv + argc);
  static char kResumeLatest[] = "--resume=latest";
  for (char*& arg : args) {
    if (std::strcmp(arg, "--resume") == 0 || std::strcmp(arg, "-resume") == 0) arg = kResumeLatest;
  }
  absl::ParseCommandLine(int(args.size()), args.data());
  const absl::StatusOr<int> code = memwall::train::Main();
  if (!code.ok()) {
    std::fprintf(stderr, "train: %s\n", std::string(code.status().message()).c_str());
    return 1;
  }
  return *code;
}
