#include "repro/experiment.h"

#include <initializer_list>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/gpt.h"
#include "repro/sweep.h"
#include "runtime/files.h"
#include "runtime/status.h"
#include "zero/config.h"

namespace memwall::repro {
namespace {

template <typename T>
absl::Status Bad(absl::string_view field, const T& value, absl::string_view need) {
  return absl::InvalidArgumentError(absl::StrCat("Experiment ", field, " = ", value, " ", need));
}

// A multi-rank sweep's model and world sizes (ZERO_MEMORY, INFINITY_PARTITION).
absl::Status ValidateSweep(const Experiment& e) {
  if (absl::Status st = models::ValidateConfig(e.model()); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("Experiment model: ", st.message()));
  }
  if (e.training().seq() > e.model().positions()) {
    return Bad("training.seq", e.training().seq(),
               absl::StrCat("must be in [1, model.positions = ", e.model().positions(), "]"));
  }
  if (e.world_sizes().empty()) return Bad("world_sizes", "[]", "must list at least one world size");
  for (int w : e.world_sizes()) {
    if (w < 1 || w > 64) return Bad("world_sizes", w, "must be in [1, 64] (ranks on this machine)");
  }
  return absl::OkStatus();
}

absl::Status ValidateZeroMemory(const Experiment& e) {
  if (absl::Status st = ValidateSweep(e); !st.ok()) return st;
  if (e.stages().empty()) return Bad("stages", "[]", "must list at least one ZeRO stage");
  for (int s : e.stages()) {
    if (s < 0 || s > 3) return Bad("stages", s, "must be 0, 1, 2 or 3");
  }
  for (const ModeledPoint& m : e.modeled()) {
    if (m.params() <= 0) return Bad("modeled.params", m.params(), "must be > 0");
    if (m.ranks() < 1) return Bad("modeled.ranks", m.ranks(), "must be >= 1");
    if (m.paper_bytes_size() != 0 && m.paper_bytes_size() != 4) {
      return Bad("modeled.paper_bytes", m.paper_bytes_size(), "values given; must be none or 4 (stages 0-3)");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidatePartition(const Experiment& e) {
  if (absl::Status st = ValidateSweep(e); !st.ok()) return st;
  const zero::ZeroConfig& z = e.training().zero();
  if (z.has_offload_param() || z.partitioning() != zero::ZeroConfig::CONTIGUOUS) {
    return Bad("training.zero.offload_param/partitioning", "{...}", "must be unset: the sweep sets them");
  }
  return absl::OkStatus();
}

absl::Status ValidateMemoryTable(const Experiment& e) {
  const MemoryTable& t = e.memory_table();
  if (t.models().empty()) return Bad("memory_table.models", "[]", "must name at least one model of models/configs/papers.textproto");
  if (t.ranks() < 1) return Bad("memory_table.ranks", t.ranks(), "must be >= 1");
  for (int mode : t.placements()) {
    if (ModeOverlay(OffloadSweep::Mode(mode)).stage() != 3) {
      return Bad("memory_table.placements", OffloadSweep::Mode_Name(OffloadSweep::Mode(mode)), "must be a ZeRO-3 mode");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateMaxModelTable(const Experiment& e) {
  const MaxModelTable& t = e.max_model_table();
  if (t.device_bytes() <= 0) return Bad("max_model_table.device_bytes", t.device_bytes(), "must be > 0");
  if (t.data_parallel() < 1) return Bad("max_model_table.data_parallel", t.data_parallel(), "must be >= 1");
  if (t.model_parallel().empty()) return Bad("max_model_table.model_parallel", "[]", "must name at least one degree");
  for (int64_t mp : t.model_parallel()) {
    if (mp < 1) return Bad("max_model_table.model_parallel", mp, "must be >= 1");
  }
  return absl::OkStatus();
}

// The sub-fields of `offload` only some ladder kinds read.
struct LadderFields {
  bool traces = false;  // write_traces
  bool tiling = false;  // tiling_factors
};

// What every kind that walks offload.ladder over offload.modes checks.
absl::Status ValidateLadder(const Experiment& e, LadderFields reads) {
  const std::string kind = Experiment::Kind_Name(e.kind());
  const OffloadSweep& o = e.offload();
  if (o.ladder().empty()) return Bad("offload.ladder", "[]", "must list at least one model");
  int64_t previous = 0;
  for (int i = 0; i < o.ladder_size(); ++i) {
    const models::GptConfig& m = o.ladder(i);
    const std::string field = absl::StrCat("offload.ladder[", i, "] (\"", m.name(), "\")");
    if (absl::Status st = models::ValidateConfig(m); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("Experiment ", field, ": ", st.message()));
    }
    if (e.training().seq() > m.positions()) {
      return Bad("training.seq", e.training().seq(),
                 absl::StrCat("must be <= ", field, ".positions = ", m.positions()));
    }
    const int64_t params = models::CountParameters(m);
    if (params <= previous) {
      return Bad(field, absl::StrCat(params, " parameters"),
                 absl::StrCat("must be larger than the model before it (", previous, "): the ladder grows"));
    }
    previous = params;
  }
  std::set<int> seen;
  for (int mode : o.modes()) {
    if (mode == OffloadSweep::MODE_UNSPECIFIED) return Bad("offload.modes", "MODE_UNSPECIFIED", "is not a mode");
    if (!seen.insert(mode).second) {
      return Bad("offload.modes", OffloadSweep::Mode_Name(OffloadSweep::Mode(mode)), "is listed twice");
    }
  }
  if (o.device_memory_bytes() < (int64_t{1} << 20)) {
    return Bad("offload.device_memory_bytes", o.device_memory_bytes(), "must be >= 1 MiB (unset: 1 GiB)");
  }
  if (o.dpu_after_steps() < 1) return Bad("offload.dpu_after_steps", o.dpu_after_steps(), "must be >= 1 (unset: 1)");
  if (o.warmup_steps() < 0) return Bad("offload.warmup_steps", o.warmup_steps(), "must be >= 0");
  if (o.write_traces() && !reads.traces) return Bad("offload.write_traces", "true", "is for OFFLOAD_THROUGHPUT");
  if (!o.tiling_factors().empty() && !reads.tiling) return Bad("offload.tiling_factors", "[...]", "is for INFINITY_TILING");
  if (o.host_pinned_memory_bytes() < 0) {
    return Bad("offload.host_pinned_memory_bytes", o.host_pinned_memory_bytes(), "must be >= 0 (0: unlimited)");
  }
  if (o.tile_elements() < 0) return Bad("offload.tile_elements", o.tile_elements(), "must be >= 0 (0: 4 Mi)");
  if (o.swap_buffer_bytes() < 0) {
    return Bad("offload.swap_buffer_bytes", o.swap_buffer_bytes(), "must be >= 0 (0: three swap buffers)");
  }
  bool nvme = false;  // a mode with a swap file
  for (int mode : o.modes()) {
    const zero::ZeroConfig& overlay = ModeOverlay(OffloadSweep::Mode(mode));
    nvme |= overlay.offload_optimizer().device() == zero::OffloadOptimizerConfig::NVME ||
            overlay.offload_param().device() == zero::OffloadParamConfig::NVME;
  }
  if (!nvme && (!o.nvme_path().empty() || o.swap_buffer_bytes() != 0)) {
    return Bad(o.nvme_path().empty() ? "offload.swap_buffer_bytes" : "offload.nvme_path",
               o.nvme_path().empty() ? absl::StrCat(o.swap_buffer_bytes()) : absl::StrCat("\"", o.nvme_path(), "\""),
               "needs an NVMe mode (STAGE3_NVME, STAGE3_NVME_CPU_PARAMS, STAGE3_NVME_NVME_PARAMS)");
  }
  return absl::OkStatus();
}

bool RunsDpu(const OffloadSweep& o) {
  for (int mode : o.modes()) {
    if (ModeOverlay(OffloadSweep::Mode(mode)).offload_optimizer().delayed_update_after_steps() > 0) return true;
  }
  return false;
}

// Tiling, prefetch and offloaded activations compare within one ZeRO-3 mode.
absl::Status ValidateOneStage3Mode(const Experiment& e) {
  const OffloadSweep& o = e.offload();
  if (o.modes_size() != 1) {
    return Bad("offload.modes", o.modes_size(),
               absl::StrCat("must name exactly one mode for ", Experiment::Kind_Name(e.kind())));
  }
  if (ModeOverlay(o.modes(0)).stage() != 3) {
    return Bad("offload.modes", OffloadSweep::Mode_Name(o.modes(0)),
               "must be a ZeRO-3 mode (tiles, prefetch and offloaded activations are ZeRO-Infinity's)");
  }
  return absl::OkStatus();
}

absl::Status ValidateOffloadMaxModel(const Experiment& e) {
  MEMWALL_RETURN_IF_ERROR(ValidateLadder(e, {}));
  const OffloadSweep& o = e.offload();
  if (RunsDpu(o) && e.steps() < o.dpu_after_steps() + 2) {
    return Bad("steps", e.steps(),
               absl::StrCat("must be >= offload.dpu_after_steps + 2 = ", o.dpu_after_steps() + 2,
                            " so that OFFLOAD_DPU runs a delayed update"));
  }
  return absl::OkStatus();
}

absl::Status ValidateThroughput(const Experiment& e) {
  MEMWALL_RETURN_IF_ERROR(ValidateLadder(e, {.traces = true}));
  const OffloadSweep& o = e.offload();
  if (RunsDpu(o) && o.warmup_steps() < o.dpu_after_steps() + 1) {
    return Bad("offload.warmup_steps", o.warmup_steps(),
               absl::StrCat("must be >= offload.dpu_after_steps + 1 = ", o.dpu_after_steps() + 1,
                            " so that every timed OFFLOAD_DPU step has a delayed update under it"));
  }
  return absl::OkStatus();
}

absl::Status ValidateInfinityMaxModel(const Experiment& e) { return ValidateLadder(e, {}); }

absl::Status ValidateTiling(const Experiment& e) {
  MEMWALL_RETURN_IF_ERROR(ValidateLadder(e, {.tiling = true}));
  MEMWALL_RETURN_IF_ERROR(ValidateOneStage3Mode(e));
  const OffloadSweep& o = e.offload();
  if (o.tiling_factors().empty()) return Bad("offload.tiling_factors", "[]", "must list at least one factor (1: untiled)");
  for (int64_t factor : o.tiling_factors()) {
    if (factor < 1) return Bad("offload.tiling_factors", factor, "must be >= 1");
  }
  for (int i = 0; i < o.ladder_size(); ++i) {
    if (o.ladder(i).tiling() > 1) {
      return Bad(absl::StrCat("offload.ladder[", i, "].tiling"), o.ladder(i).tiling(),
                 "must be unset: offload.tiling_factors set it");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidatePrefetch(const Experiment& e) {
  MEMWALL_RETURN_IF_ERROR(ValidateLadder(e, {}));
  MEMWALL_RETURN_IF_ERROR(ValidateOneStage3Mode(e));
  const zero::ZeroConfig& z = e.training().zero();
  if (z.has_prefetch_bucket_bytes() && z.prefetch_bucket_bytes() <= 0) {
    return Bad("training.zero.prefetch_bucket_bytes", z.prefetch_bucket_bytes(),
               "must be > 0 (unset: the default): INFINITY_PREFETCH compares it with no prefetch");
  }
  return absl::OkStatus();
}

absl::Status ValidateActivationOffload(const Experiment& e) {
  MEMWALL_RETURN_IF_ERROR(ValidateLadder(e, {}));
  MEMWALL_RETURN_IF_ERROR(ValidateOneStage3Mode(e));
  const OffloadSweep& o = e.offload();
  for (int i = 0; i < o.ladder_size(); ++i) {
    if (!o.ladder(i).activation_checkpointing() || o.ladder(i).offload_activations()) {
      return Bad(absl::StrCat("offload.ladder[", i, "]"), absl::StrCat("\"", o.ladder(i).name(), "\""),
                 "needs activation_checkpointing and offload_activations unset (the sweep sets it)");
    }
  }
  return absl::OkStatus();
}

// The ladder kinds' defaults: `modes` when none are given, a 1 GiB device,
// the delayed update after one step and one warm-up step past it.
void FillLadder(Experiment& e, std::initializer_list<OffloadSweep::Mode> modes) {
  OffloadSweep& o = *e.mutable_offload();
  if (o.modes().empty()) {
    for (OffloadSweep::Mode mode : modes) o.add_modes(mode);
  }
  if (o.device_memory_bytes() == 0) o.set_device_memory_bytes(int64_t{1} << 30);
  if (o.dpu_after_steps() == 0) o.set_dpu_after_steps(1);
  if (o.warmup_steps() == 0) o.set_warmup_steps(o.dpu_after_steps() + 1);
}
void FillOffloadModes(Experiment& e) {
  FillLadder(e, {OffloadSweep::STAGE0, OffloadSweep::STAGE2, OffloadSweep::OFFLOAD, OffloadSweep::OFFLOAD_DPU});
}
void FillInfinityModes(Experiment& e) {
  FillLadder(e, {OffloadSweep::STAGE3, OffloadSweep::STAGE3_OFFLOAD, OffloadSweep::STAGE3_NVME});
}
void FillInfCpuMode(Experiment& e) { FillLadder(e, {OffloadSweep::STAGE3_OFFLOAD_CPU_PARAMS}); }
void FillPlacements(Experiment& e) {
  if (!e.memory_table().placements().empty()) return;
  for (auto mode : {OffloadSweep::STAGE3, OffloadSweep::STAGE3_OFFLOAD_CPU_PARAMS, OffloadSweep::STAGE3_NVME_NVME_PARAMS}) {
    e.mutable_memory_table()->add_placements(mode);
  }
}

// [Note: the kind registry]
// Every experiment kind, one row each: what it reads, its defaults, its
// checks, its driver and its figure. Nothing else branches on a kind.
const ExperimentKind kKinds[] = {
    {Experiment::ZERO_MEMORY, "repro/figures/zero_memory.py", kModel | kWorldSizes | kStages | kModeled, false,
     /*offload_in_training=*/true, nullptr, ValidateZeroMemory, DriveZeroMemory, MeasureZeroMemoryRows},
    {Experiment::OFFLOAD_MAX_MODEL, "repro/figures/offload_max_model.py", kOffload, false, false, FillOffloadModes,
     ValidateOffloadMaxModel, DriveOffloadMaxModel},
    {Experiment::OFFLOAD_THROUGHPUT, "repro/figures/offload_throughput.py", kOffload, /*cuda=*/true, false, FillOffloadModes,
     ValidateThroughput, DriveThroughput},
    {Experiment::INFINITY_MAX_MODEL, "repro/figures/infinity_max_model.py", kOffload, false, false, FillInfinityModes,
     ValidateInfinityMaxModel, DriveInfinityMaxModel},
    {Experiment::INFINITY_PARTITION, "repro/figures/infinity_partition.py", kModel | kWorldSizes, false, false, nullptr,
     ValidatePartition, DrivePartition, MeasurePartitionRows},
    {Experiment::INFINITY_TILING, "repro/figures/infinity_tiling.py", kOffload, false, false, FillInfCpuMode, ValidateTiling,
     DriveTiling},
    {Experiment::INFINITY_PREFETCH, "repro/figures/infinity_prefetch.py", kOffload, false, false, FillInfCpuMode,
     ValidatePrefetch, DrivePrefetch},
    {Experiment::INFINITY_ACTIVATION_OFFLOAD, "repro/figures/infinity_activation_offload.py", kOffload, false, false,
     FillInfCpuMode, ValidateActivationOffload, DriveActivationOffload},
    {Experiment::INFINITY_MEMORY, "repro/figures/infinity_memory.py", kMemoryTable, false, false, FillPlacements,
     ValidateMemoryTable, DriveMemoryTable},
    {Experiment::ZERO_MAX_MODEL, "repro/figures/zero_max_model.py", kMaxModelTable, false, false, nullptr,
     ValidateMaxModelTable, DriveMaxModelTable},
};

// Each part: its name in messages, how a set one prints, whether it is set.
struct PartField {
  ExperimentPart part;
  absl::string_view name;
  absl::string_view shown;
  bool (*set)(const Experiment& e);
};
const PartField kParts[] = {
    {kModel, "model", "{...}", [](const Experiment& e) { return e.has_model(); }},
    {kWorldSizes, "world_sizes", "[...]", [](const Experiment& e) { return !e.world_sizes().empty(); }},
    {kStages, "stages", "[...]", [](const Experiment& e) { return !e.stages().empty(); }},
    {kModeled, "modeled", "{...}", [](const Experiment& e) { return !e.modeled().empty(); }},
    {kOffload, "offload", "{...}", [](const Experiment& e) { return e.has_offload(); }},
    {kMemoryTable, "memory_table", "{...}", [](const Experiment& e) { return e.has_memory_table(); }},
    {kMaxModelTable, "max_model_table", "{...}", [](const Experiment& e) { return e.has_max_model_table(); }},
};

}  // namespace

const ExperimentKind* FindKind(Experiment::Kind kind) {
  for (const ExperimentKind& k : kKinds) {
    if (k.kind == kind) return &k;
  }
  return nullptr;
}

std::vector<std::string> KindNames() {
  std::vector<std::string> names;
  for (const ExperimentKind& k : kKinds) names.push_back(Experiment::Kind_Name(k.kind));
  return names;
}

absl::Status ValidateExperiment(const Experiment& e) {
  if (e.name().empty() || e.name().find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos) {
    return Bad("name", absl::StrCat("\"", e.name(), "\""), "must be non-empty lower case, digits and '_' (it names results/<name>/)");
  }
  const ExperimentKind* kind = FindKind(e.kind());
  if (kind == nullptr) {
    return Bad("kind", Experiment::Kind_Name(e.kind()),
               absl::StrCat("must name what to run (", absl::StrJoin(KindNames(), ", "), ")"));
  }
  const std::string name = Experiment::Kind_Name(e.kind());
  if (e.device() != "cpu" && !(e.device() == "cuda" && kind->cuda)) {
    std::vector<std::string> cuda;
    for (const ExperimentKind& k : kKinds) {
      if (k.cuda) cuda.push_back(Experiment::Kind_Name(k.kind));
    }
    return Bad("device", absl::StrCat("\"", e.device(), "\""),
               absl::StrCat("must be cpu, or cuda for ", absl::StrJoin(cuda, ", "), " (measured on a GPU so far)"));
  }
  if (e.steps() <= 0) return Bad("steps", e.steps(), "must be > 0 (unset: 2)");
  for (const PartField& part : kParts) {
    if (!(kind->parts & part.part) && part.set(e)) {
      std::vector<std::string> readers;
      for (const ExperimentKind& k : kKinds) {
        if (k.parts & part.part) readers.push_back(Experiment::Kind_Name(k.kind));
      }
      return Bad(part.name, part.shown,
                 absl::StrCat("must be unset for ", name, " (read by ", absl::StrJoin(readers, ", "), ")"));
    }
  }
  const zero::ZeroConfig& z = e.training().zero();
  if (z.stage() != 0) {
    return Bad("training.zero.stage", z.stage(), "must be unset: the sweep's `stages` (or offload.modes) set it");
  }
  if (!kind->offload_in_training && z.has_offload_optimizer()) {
    return Bad("training.zero.offload_optimizer", "{...}", "must be unset: offload.modes set it");
  }
  // The trainer's own checks, each naming its field under `training.`.
  if (absl::Status st = zero::ValidateTrainingConfig(e.training(), "Experiment training."); !st.ok()) return st;
  return kind->validate(e);
}

absl::StatusOr<Experiment> ParseExperiment(const std::string& text, const std::string& origin) {
  Experiment e;
  if (absl::Status st = ParseTextProto(text, origin, &e); !st.ok()) return st;
  if (e.steps() == 0) e.set_steps(2);
  if (e.device().empty()) e.set_device("cpu");
  if (const ExperimentKind* kind = FindKind(e.kind()); kind != nullptr && kind->fill_defaults != nullptr) {
    kind->fill_defaults(e);
  }
  if (absl::Status st = ValidateExperiment(e); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": ", st.message()));
  }
  *e.mutable_training() = zero::WithDefaults(e.training());
  return e;
}

absl::StatusOr<Experiment> LoadExperiment(const std::string& path) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string text, ReadRegularFile(path, "experiment"));
  return ParseExperiment(text, path);
}

}  // namespace memwall::repro
