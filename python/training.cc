// memwall.estimate, memwall.Trainer and memwall.model_config: the memory
// estimator and the ZeRO trainer over the trainer's own TrainingConfig text
// proto (zero/training_config.proto), as //repro:estimate and //:train use
// them.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

#include "engine/deepspeed_config.h"
#include "engine/engine.h"
#include "engine/estimate.h"
#include "models/data.h"
#include "models/gpt.h"
#include "models/gpt_io.h"
#include "absl/strings/ascii.h"
#include "python/bindings.h"
#include "runtime/agreement.h"
#include "runtime/best_device.h"
#include "runtime/communicator.h"
#include "google/protobuf/text_format.h"
#include "runtime/files.h"
#include "runtime/launch.h"
#include "runtime/timeline.h"
#include "runtime/status.h"
#include "zero/checkpoint.h"
#include "zero/config.h"
#include "zero/trainer.h"

namespace py = pybind11;

namespace memwall::python {
namespace {

zero::TrainingConfig TrainingFromPython(py::handle config, const py::dict& fields) {
  zero::TrainingConfig training;
  MessageFromPython(config, fields, "config", &training);
  return training;
}

models::GptConfig ModelFromPython(py::handle model) {
  models::GptConfig gpt;
  MessageFromPython(model, py::dict(), "model", &gpt);
  ThrowIfError(models::ValidateConfig(gpt));
  return gpt;
}

py::object FromJson(const std::string& json) { return py::module_::import("json").attr("loads")(json); }

// params: an int, or a float with an integral value (10e9).
int64_t ParamsFromPython(py::handle params) {
  if (PyFloat_Check(params.ptr())) {
    const double x = params.cast<double>();
    if (!(x >= 0 && x < 9.007199254740992e15 && x == double(int64_t(x)))) {
      throw py::value_error("params = " + std::string(py::repr(params)) + " must be a whole number below 2^53");
    }
    return int64_t(x);
  }
  return params.cast<int64_t>();
}

py::dict Estimate(py::handle config, py::handle model, py::handle params, int64_t ranks,
                  std::optional<bool> checkpointing, int64_t device_bytes, int64_t host_bytes, int64_t disk_bytes,
                  const py::kwargs& fields) {
  engine::EstimateInput in;
  in.params = ParamsFromPython(params);
  if (!model.is_none() == (in.params > 0)) throw py::value_error("give exactly one of model= and params= (> 0)");
  if (!model.is_none()) in.model = ModelFromPython(model);
  in.ranks = ranks;
  in.training = TrainingFromPython(config, fields);
  in.checkpointing = checkpointing;
  in.device_bytes = device_bytes;
  in.host_bytes = host_bytes;
  in.disk_bytes = disk_bytes;
  const engine::Estimate e = Unwrap(engine::EstimateMemory(in));
  return FromJson(e.ToJson());
}

// A DeepSpeed JSON config (a path, or a dict) as memwall's: the
// TrainingConfig text proto for Trainer and estimate, the translation's
// lines, and the model's side of activation_checkpointing.
py::dict DeepSpeedConfig(py::handle source, std::optional<int> ranks) {
  std::string json, origin;
  if (py::isinstance<py::dict>(source)) {
    json = py::module_::import("json").attr("dumps")(source).cast<std::string>();
    origin = "deepspeed_config (a dict)";
  } else {
    origin = PathFromPython(source, "deepspeed_config");
    json = Unwrap(ReadRegularFile(origin, "deepspeed_config"));
  }
  engine::DeepSpeedTranslation t = Unwrap(engine::TranslateDeepSpeedConfig(json, origin));
  const int world = ranks.value_or(CurrentLaunch().world_size);
  if (world < 1) throw py::value_error("ranks = " + std::to_string(world) + " must be >= 1");
  ThrowIfError(engine::CheckTrainBatchSize(t, world));
  std::string text;
  google::protobuf::TextFormat::Printer printer;
  printer.SetSingleLineMode(true);
  printer.PrintToString(t.training, &text);
  py::dict d;
  d["config"] = std::string(absl::StripTrailingAsciiWhitespace(text));
  d["lines"] = t.lines;
  d["activation_checkpointing"] = t.activation_checkpointing;
  d["offload_activations"] = t.offload_activations;
  d["train_batch_size"] = t.train_batch_size;
  d["steps_per_print"] = t.steps_per_print;
  return d;
}

std::string ModelConfig(py::handle path, const std::string& name) {
  const models::GptConfigList list = Unwrap(models::LoadConfigs(PathFromPython(path, "path")));
  return Unwrap(models::FindConfig(list, name)).DebugString();
}

// One call at a time: step, save, load and export release the GIL, and a
// trainer is not thread-safe, so a second thread's call raises instead of
// racing the first.
class Exclusive {
 public:
  explicit Exclusive(std::mutex& m) : lock_(m, std::try_to_lock) {
    if (!lock_.owns_lock()) {
      throw std::runtime_error(
          "memwall.Trainer is in use by another thread: step, save, load and export run one at a time");
    }
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

// The trainer and everything it runs on, destroyed in reverse order.
class PyTrainer {
 public:
  PyTrainer(py::handle model, py::handle config, py::handle data, const std::string& data_format,
            const std::string& device, bool share_gpus, const std::string& comm_backend,
            const py::kwargs& fields) {
    // Python arguments first (a wrong one raises before anything starts).
    const models::GptConfig gpt = ModelFromPython(model);
    zero::TrainerOptions options;
    options.training = TrainingFromPython(config, fields);
    const std::string data_path = PathFromPython(data, "data");
    const models::DataFormat format = Unwrap(models::ParseDataFormat(data_format));
    const CommBackend backend = Unwrap(ParseCommBackend(comm_backend));
    device_ = Unwrap(CreateDeviceForRank(device, CurrentLaunch(), share_gpus));
    comm_ = Unwrap(CreateCommunicator(*device_, LaunchCommOptions(backend, share_gpus, *device_)));
    // Each rank reads its own files (a path may be bad on one rank only);
    // the ranks agree on the outcome before any other collective, so one
    // rank's error is every rank's instead of a wait for the watchdog.
    const absl::Status local = [&]() -> absl::Status {
      MEMWALL_ASSIGN_OR_RETURN(data_, models::OpenTokenSource(data_path, format));
      MEMWALL_ASSIGN_OR_RETURN(model_, models::Gpt::Create(gpt));
      return absl::OkStatus();
    }();
    ThrowIfError(AgreeAcrossRanks(*comm_, *device_, local, "reading the trainer's arguments"));
    trainer_ = Unwrap(engine::CreateTrainer(*model_, *device_, *comm_, std::move(options)));
  }

  py::dict Step() {
    Exclusive one(busy_);
    zero::StepStats s;
    {
      py::gil_scoped_release release;
      s = Unwrap(trainer_->Step(*data_));
    }
    py::dict d;
    d["step"] = s.step;
    d["loss"] = s.loss;
    d["lr"] = s.lr;
    d["grad_norm"] = s.grad_norm;
    d["skipped"] = s.skipped;
    d["loss_scale"] = s.loss_scale;
    d["seconds"] = s.seconds;
    d["tokens"] = s.tokens;
    d["tokens_per_second"] = s.tokens_per_second;
    d["tflops"] = s.tflops;
    d["log"] = trainer_->LogLine(s);
    return d;
  }

  std::string Save(py::handle dir_arg) {
    const std::string dir = PathFromPython(dir_arg, "dir");
    Exclusive one(busy_);
    py::gil_scoped_release release;
    return Unwrap(trainer_->Save(dir));
  }

  void Load(py::handle step_dir_arg) {
    const std::string step_dir = PathFromPython(step_dir_arg, "step_dir");
    Exclusive one(busy_);
    py::gil_scoped_release release;
    ThrowIfError(trainer_->Load(step_dir));
  }

  void Export(py::handle path_arg) {
    const std::string path = PathFromPython(path_arg, "path");
    Exclusive one(busy_);
    py::gil_scoped_release release;
    ThrowIfError(trainer_->Export(path));  // every rank: rank 0 writes, every rank gets its Status
  }

  void ApplyPendingUpdate() {
    Exclusive one(busy_);
    py::gil_scoped_release release;
    ThrowIfError(trainer_->ApplyPendingUpdate());
  }

  int64_t steps() const { return trainer_->steps_done(); }
  int rank() const { return comm_->rank(); }
  int world_size() const { return comm_->world_size(); }
  std::string device() const { return device_->name(); }

 private:
  std::mutex busy_;
  std::unique_ptr<models::TokenSource> data_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<models::Gpt> model_;
  std::unique_ptr<zero::Trainer> trainer_;
};

}  // namespace

void BindTraining(py::module_& m) {
  // The trainer's reduce bucket where a config sets none (perf_model's Run).
  m.attr("DEFAULT_REDUCE_BUCKET_BYTES") = zero::kDefaultReduceBucketBytes;
  m.def("estimate", &Estimate, py::arg("config") = py::none(), py::kw_only(), py::arg("model") = py::none(),
        py::arg("params") = 0, py::arg("ranks") = 1, py::arg("checkpointing") = py::none(),
        py::arg("device_bytes") = 0, py::arg("host_bytes") = 0, py::arg("disk_bytes") = 0,
        R"(The memory one rank needs, before anything is launched (engine/estimate.h).

config: the run's TrainingConfig (zero/training_config.proto) as a text proto
  ('micro_batch: 4 zero { stage: 3 }') or a dict ({"micro_batch": 4,
  "zero": {"stage": 3}}); further keyword arguments are fields merged over it
  (micro_batch=4, zero={"stage": 3}). Unset fields take the trainer's defaults.
model: a GptConfig (models/gpt_config.proto) as a text proto or a dict
  (memwall.model_config reads one from a list), or params=N (10e9 too) for
  model states alone.
ranks: data-parallel ranks. checkpointing: override the model's setting.
device_bytes, host_bytes, disk_bytes: budgets per rank to check (0: none).

Returns the estimate as a dict: params, model_states_bytes_per_rank,
total_device_bytes_per_rank, host_bytes_per_rank, nvme_bytes_per_rank, bytes by
tag for each space, what was assumed, and fits (None without a budget). The
same numbers as `./bazelw run //repro:estimate -- --format=json`. Bad input
raises ValueError naming the field.)");
  m.def("count_parameters", [](py::handle model) { return models::CountParameters(ModelFromPython(model)); },
        py::arg("model"), "Ψ of a GptConfig (text proto or dict), as the engine counts it (models::CountParameters).");
  m.def(
      "model_shape",
      [](py::handle model) {
        const models::GptConfig c = ModelFromPython(model);
        py::dict d;
        d["layers"] = c.layers();
        d["hidden"] = c.hidden();
        d["heads"] = c.heads();
        d["vocab"] = c.vocab();
        d["positions"] = c.positions();
        d["activation_checkpointing"] = c.activation_checkpointing();
        return d;
      },
      py::arg("model"),
      "The sizes of a GptConfig, text proto or dict (checked): layers, hidden, heads, vocab, positions, "
      "activation_checkpointing.");
  m.def(
      "forward_flops_per_token",
      [](py::handle model, int64_t seq) { return models::ForwardFlopsPerToken(ModelFromPython(model), seq); },
      py::arg("model"), py::arg("seq"),
      "Forward FLOPs of one token at sequence length `seq` (models::ForwardFlopsPerToken, the count the trainer's "
      "TFLOPS use): 2 x the matmul parameters + causal attention. A training step is 3x, plus one forward per token "
      "with activation checkpointing.");
  // Every ZoneKind (runtime/timeline.h); a kind added there fails here
  // until it is bound.
  static_assert(kNumZoneKinds == 17, "bind the new ZoneKind");
  py::enum_<ZoneKind>(m, "Zone", "The kinds of timeline zones (runtime/timeline.h); zone_name gives each one's name.")
      .value("FORWARD_BACKWARD", ZoneKind::kForwardBackward)
      .value("ADAM", ZoneKind::kAdam)
      .value("ALL_GATHER", ZoneKind::kAllGather)
      .value("GRAD_D2H", ZoneKind::kGradD2H)
      .value("GRAD_ACCUMULATE", ZoneKind::kGradAccumulate)
      .value("GRAD_NORM", ZoneKind::kGradNorm)
      .value("GRAD_NORM_PASS", ZoneKind::kGradNormPass)
      .value("CPU_ADAM", ZoneKind::kCpuAdam)
      .value("CPU_ADAM_DELAYED", ZoneKind::kCpuAdamDelayed)
      .value("PARAM_H2D", ZoneKind::kParamH2D)
      .value("SWAP_WAIT", ZoneKind::kSwapWait)
      .value("SWAP_IN", ZoneKind::kSwapIn)
      .value("SWAP_OUT", ZoneKind::kSwapOut)
      .value("PARAM_FETCH", ZoneKind::kParamFetch)
      .value("PARAM_GATHER", ZoneKind::kParamGather)
      .value("PARAM_SWAP_IN", ZoneKind::kParamSwapIn)
      .value("PARAM_SWAP_OUT", ZoneKind::kParamSwapOut);
  m.def("zone_name", [](ZoneKind kind) { return std::string(ZoneName(kind)); }, py::arg("zone"),
        "The name a timeline zone has in step breakdowns and traces (runtime/timeline.h).");
  m.def("deepspeed_config", &DeepSpeedConfig, py::arg("source"), py::kw_only(), py::arg("ranks") = py::none(),
        R"(A DeepSpeed JSON config as memwall's (engine/deepspeed_config.h, docs/deepspeed.md).

source: the path of a ds_config.json, or the config as a dict.
ranks: the launch's data-parallel ranks, for train_batch_size (default: this
  process's launch, 1 without a launcher).

Returns a dict: config (the TrainingConfig as a text proto, for Trainer and
estimate), lines (what each DeepSpeed key became, one line a key, DeepSpeed's
defaults where memwall's differ), activation_checkpointing and
offload_activations (the model's side of the activation_checkpointing block;
None when it is absent: set them in the model), train_batch_size and
steps_per_print (0 when absent). A key memwall cannot honour raises
ValueError naming every such key with what to write instead.)");
  m.def("model_config", &ModelConfig, py::arg("path"), py::arg("name"),
        "The GptConfig text proto of entry `name` in a GptConfigList file (e.g. models/configs/gpt.textproto).");
  m.def(
      "latest_checkpoint",
      [](py::handle dir) -> std::optional<std::string> {
        absl::StatusOr<std::string> latest = zero::LatestCheckpoint(PathFromPython(dir, "dir"));
        if (!latest.ok() && latest.status().code() == absl::StatusCode::kNotFound) return std::nullopt;
        return Unwrap(std::move(latest));
      },
      py::arg("dir"),
      "The complete checkpoint with the highest step under `dir` (what Trainer.save wrote there), or None when "
      "`dir` does not exist or holds none; pass it to Trainer.load to resume.");
  m.def(
      "prune_checkpoints",
      [](py::handle dir, int64_t keep) {
        return Unwrap(zero::PruneCheckpoints(PathFromPython(dir, "dir"), keep));
      },
      py::arg("dir"), py::arg("keep"),
      "Deletes all but the newest `keep` (>= 1) complete checkpoints under `dir`, oldest first, and returns "
      "the deleted step directories; unfinished saves are left alone. Call it on one rank (rank 0) after a "
      "save.");
  py::class_<PyTrainer>(m, "Trainer", R"(The ZeRO trainer (zero/trainer.h) with every placement of the config.

Trainer(model, config=None, *, data, data_format="auto", device="cpu",
        share_gpus=False, comm_backend="auto", **fields)
  model: a GptConfig as a text proto or a dict (memwall.model_config reads
    one from a list).
  config: the TrainingConfig as a text proto or a dict: seq, micro_batch,
    accumulation, precision, adam, schedule, zero { stage,
    offload_optimizer, offload_param, ... }; keyword arguments are fields
    merged over it (micro_batch=8, zero={"stage": 2}).
  data: a text file whose bytes are the tokens (the model's vocabulary must
    cover 256; memwall.QUICKSTART_TEXT is one), or a token file of
    little-endian uint16 ids with no header (np.array(ids,
    np.uint16).tofile(path); nanoGPT's train.bin).
  data_format: "auto" (a name ending in .bin is a token file), "text" or
    "uint16".
  device: "cpu" (the CpuDevice), "cuda" or "auto". A rank's GPU is its
    local rank.
  share_gpus: let a node's ranks share its GPUs (local rank k takes GPU k
    mod the count); their collectives then stage through pinned host
    memory, since NCCL cannot serve ranks on one GPU. No effect on the CPU.
  comm_backend: "auto", "mpi", "nccl" or "tcp", as //:train's
    --comm_backend.
Under `mpirun -np N python3 ...` every rank builds its own Trainer and the
ranks train data-parallel, as the C++ tools do.)")
      .def(py::init<py::handle, py::handle, py::handle, const std::string&, const std::string&, bool,
                    const std::string&, const py::kwargs&>(),
           py::arg("model"), py::arg("config") = py::none(), py::kw_only(), py::arg("data"),
           py::arg("data_format") = "auto", py::arg("device") = "cpu", py::arg("share_gpus") = false,
           py::arg("comm_backend") = "auto")
      .def("step", &PyTrainer::Step,
           "One optimizer step over the next global batch. Returns a dict: step, loss, lr, grad_norm, skipped, "
           "loss_scale, seconds, tokens, tokens_per_second, tflops, log (the trainer's log line).")
      .def("save", &PyTrainer::Save, py::arg("dir"),
           "Writes a sharded checkpoint to dir/step_<steps> (every rank must call it); returns that path. "
           "Saving never changes the run: under the delayed parameter update the pending update is saved, "
           "not applied.")
      .def("load", &PyTrainer::Load, py::arg("step_dir"),
           "Restores weights, Adam states, loss scale and step (and a pending delayed update) from a checkpoint "
           "of any stage and world size.")
      .def("export", &PyTrainer::Export, py::arg("path"),
           "Writes the fp32 master weights as a GPT-2 safetensors file (rank 0 writes; every rank must call it). "
           "Under the delayed parameter update these are the weights the next step computes with: the last "
           "step's update is still pending (apply_pending_update() first to include it).")
      .def("apply_pending_update", &PyTrainer::ApplyPendingUpdate,
           "Applies the delayed parameter update's pending step now (nothing without one), e.g. before a "
           "final export. Later steps then differ from a run that did not call it. Every rank must call it.")
      .def_property_readonly("steps", &PyTrainer::steps)
      .def_property_readonly("rank", &PyTrainer::rank)
      .def_property_readonly("world_size", &PyTrainer::world_size)
      .def_property_readonly("device", &PyTrainer::device);
}

}  // namespace memwall::python
