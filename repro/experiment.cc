#include "repro/experiment.h"

#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/gpt.h"
#include "runtime/cpu_device.h"
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
  const std::string kind = Experiment::Kind_Name(e.kind());
  if (absl::Status st = models::ValidateConfig(e.model()); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("Experiment model: ", st.message()));
  }
  if (e.training().seq() > e.model().positions()) {
    return Bad("training.seq", e.training().seq(),
               absl::StrCat("must be in [1, model.positions = ", e.model().positions(), "]"));
  }
  if (e.has_offload()) return Bad("offload", "{...}", absl::StrCat("must be unset for ", kind));
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
  if (!e.stages().empty()) return Bad("stages", "[...]", "must be unset for INFINITY_PARTITION (it runs stage 3)");
  if (!e.modeled().empty()) return Bad("modeled", "{...}", "must be unset for INFINITY_PARTITION");
  const zero::ZeroConfig& z = e.training().zero();
  if (z.has_offload_param() || z.partitioning() != zero::ZeroConfig::CONTIGUOUS) {
    return Bad("training.zero.offload_param/partitioning", "{...}", "must be unset: the sweep sets them");
  }
  return absl::OkStatus();
}

absl::Status ValidateMemoryTable(const Experiment& e) {
  if (e.has_model() || e.has_offload() || !e.world_sizes().empty() || !e.stages().empty() || !e.modeled().empty()) {
    return Bad("model/offload/world_sizes/stages/modeled", "{...}",
               "must be unset for INFINITY_MEMORY (memory_table names the models, ranks and placements)");
  }
  const MemoryTable& t = e.memory_table();
  if (t.models().empty()) return Bad("memory_table.models", "[]", "must name at least one model of models/configs/papers.textproto");
  if (t.ranks() < 1) return Bad("memory_table.ranks", t.ranks(), "must be >= 1");
  for (int mode : t.placements()) {
    if (mode < OffloadSweep::STAGE3) {
      return Bad("memory_table.placements", OffloadSweep::Mode_Name(OffloadSweep::Mode(mode)), "must be a ZeRO-3 mode");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateMaxModelTable(const Experiment& e) {
  if (e.has_model() || e.has_offload() || !e.world_sizes().empty() || !e.stages().empty() || !e.modeled().empty()) {
    return Bad("model/offload/world_sizes/stages/modeled", "{...}",
               "must be unset for ZERO_MAX_MODEL (max_model_table names the device, DP and MP degrees)");
  }
  const MaxModelTable& t = e.max_model_table();
  if (t.device_bytes() <= 0) return Bad("max_model_table.device_bytes", t.device_bytes(), "must be > 0");
  if (t.data_parallel() < 1) return Bad("max_model_table.data_parallel", t.data_parallel(), "must be >= 1");
  if (t.model_parallel().empty()) return Bad("max_model_table.model_parallel", "[]", "must name at least one degree");
  for (int64_t mp : t.model_parallel()) {
    if (mp < 1) return Bad("max_model_table.model_parallel", mp, "must be >= 1");
  }
  return absl::OkStatus();
}

absl::Status ValidateOffload(const Experiment& e) {
  const std::string kind = Experiment::Kind_Name(e.kind());
  if (e.has_model()) return Bad("model", "{...}", absl::StrCat("must be unset for ", kind, " (it runs offload.ladder)"));
  if (!e.world_sizes().empty() || !e.stages().empty()) {
    return Bad("world_sizes/stages", "[...]", absl::StrCat("must be unset for ", kind, " (one rank; offload.modes set the stage)"));
  }
  if (!e.modeled().empty()) return Bad("modeled", "{...}", absl::StrCat("must be unset for ", kind));
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
  if (seen.count(OffloadSweep::OFFLOAD_DPU)) {
    if (e.kind() == Experiment::OFFLOAD_MAX_MODEL && e.steps() < o.dpu_after_steps() + 2) {
      return Bad("steps", e.steps(),
                 absl::StrCat("must be >= offload.dpu_after_steps + 2 = ", o.dpu_after_steps() + 2,
                              " so that OFFLOAD_DPU runs a delayed update"));
    }
    if (e.kind() == Experiment::OFFLOAD_THROUGHPUT && o.warmup_steps() < o.dpu_after_steps() + 1) {
      return Bad("offload.warmup_steps", o.warmup_steps(),
                 absl::StrCat("must be >= offload.dpu_after_steps + 1 = ", o.dpu_after_steps() + 1,
                              " so that every timed OFFLOAD_DPU step has a delayed update under it"));
    }
  }
  if (o.write_traces() && e.kind() != Experiment::OFFLOAD_THROUGHPUT) {
    return Bad("offload.write_traces", "true", "is for OFFLOAD_THROUGHPUT");
  }
  if (o.host_pinned_memory_bytes() < 0) {
    return Bad("offload.host_pinned_memory_bytes", o.host_pinned_memory_bytes(), "must be >= 0 (0: unlimited)");
  }
  if (o.tile_elements() < 0) return Bad("offload.tile_elements", o.tile_elements(), "must be >= 0 (0: 4 Mi)");
  const bool paired = e.kind() == Experiment::INFINITY_PREFETCH || e.kind() == Experiment::INFINITY_ACTIVATION_OFFLOAD;
  if (e.kind() == Experiment::INFINITY_TILING || paired) {
    if (o.modes_size() != 1) return Bad("offload.modes", o.modes_size(), absl::StrCat("must name exactly one mode for ", kind));
    if (o.modes(0) < OffloadSweep::STAGE3) {
      return Bad("offload.modes", OffloadSweep::Mode_Name(o.modes(0)),
                 "must be a ZeRO-3 mode (tiles, prefetch and offloaded activations are ZeRO-Infinity's)");
    }
  }
  if (e.kind() == Experiment::INFINITY_PREFETCH && e.training().zero().has_prefetch_bucket_bytes() &&
      e.training().zero().prefetch_bucket_bytes() <= 0) {
    return Bad("training.zero.prefetch_bucket_bytes", e.training().zero().prefetch_bucket_bytes(),
               "must be > 0 (unset: the default): INFINITY_PREFETCH compares it with no prefetch");
  }
  if (e.kind() == Experiment::INFINITY_ACTIVATION_OFFLOAD) {
    for (int i = 0; i < o.ladder_size(); ++i) {
      if (!o.ladder(i).activation_checkpointing() || o.ladder(i).offload_activations()) {
        return Bad(absl::StrCat("offload.ladder[", i, "]"), absl::StrCat("\"", o.ladder(i).name(), "\""),
                   "needs activation_checkpointing and offload_activations unset (the sweep sets it)");
      }
    }
  }
  if (e.kind() == Experiment::INFINITY_TILING) {
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
  } else if (!o.tiling_factors().empty()) {
    return Bad("offload.tiling_factors", "[...]", "is for INFINITY_TILING");
  }
  if (o.swap_buffer_bytes() < 0) {
    return Bad("offload.swap_buffer_bytes", o.swap_buffer_bytes(), "must be >= 0 (0: three swap buffers)");
  }
  if (!seen.count(OffloadSweep::STAGE3_NVME) && !seen.count(OffloadSweep::STAGE3_NVME_CPU_PARAMS) &&
      !seen.count(OffloadSweep::STAGE3_NVME_NVME_PARAMS) && (!o.nvme_path().empty() || o.swap_buffer_bytes() != 0)) {
    return Bad(o.nvme_path().empty() ? "offload.swap_buffer_bytes" : "offload.nvme_path",
               o.nvme_path().empty() ? absl::StrCat(o.swap_buffer_bytes()) : absl::StrCat("\"", o.nvme_path(), "\""),
               "needs an NVMe mode (STAGE3_NVME, STAGE3_NVME_CPU_PARAMS, STAGE3_NVME_NVME_PARAMS)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateExperiment(const Experiment& e) {
  if (e.name().empty() || e.name().find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos) {
    return Bad("name", absl::StrCat("\"", e.name(), "\""), "must be non-empty lower case, digits and '_' (it names results/<name>/)");
  }
  if (e.kind() == Experiment::KIND_UNSPECIFIED) {
    return Bad("kind", "KIND_UNSPECIFIED",
               "must name what to run (ZERO_MEMORY, OFFLOAD_MAX_MODEL, OFFLOAD_THROUGHPUT, INFINITY_MAX_MODEL, "
               "INFINITY_PARTITION, INFINITY_TILING, INFINITY_PREFETCH, INFINITY_ACTIVATION_OFFLOAD, INFINITY_MEMORY, "
               "ZERO_MAX_MODEL)");
  }
  if (e.device() != "cpu" && !(e.device() == "cuda" && e.kind() == Experiment::OFFLOAD_THROUGHPUT)) {
    return Bad("device", absl::StrCat("\"", e.device(), "\""),
               "must be cpu, or cuda for OFFLOAD_THROUGHPUT (the one kind measured on a GPU so far)");
  }
  if (e.steps() <= 0) return Bad("steps", e.steps(), "must be > 0 (unset: 2)");
  const zero::ZeroConfig& z = e.training().zero();
  if (z.stage() != 0) {
    return Bad("training.zero.stage", z.stage(), "must be unset: the sweep's `stages` (or offload.modes) set it");
  }
  if (e.kind() != Experiment::ZERO_MEMORY && z.has_offload_optimizer()) {
    return Bad("training.zero.offload_optimizer", "{...}", "must be unset: offload.modes set it");
  }
  // The trainer's own checks, each naming its field under `training.`.
  if (absl::Status st = zero::ValidateTrainingConfig(e.training(), "Experiment training."); !st.ok()) return st;
  if (e.kind() != Experiment::INFINITY_MEMORY && e.has_memory_table()) {
    return Bad("memory_table", "{...}", "is for INFINITY_MEMORY");
  }
  if (e.kind() != Experiment::ZERO_MAX_MODEL && e.has_max_model_table()) {
    return Bad("max_model_table", "{...}", "is for ZERO_MAX_MODEL");
  }
  if (e.kind() == Experiment::ZERO_MEMORY) return ValidateZeroMemory(e);
  if (e.kind() == Experiment::ZERO_MAX_MODEL) return ValidateMaxModelTable(e);
  if (e.kind() == Experiment::INFINITY_PARTITION) return ValidatePartition(e);
  if (e.kind() == Experiment::INFINITY_MEMORY) return ValidateMemoryTable(e);
  return ValidateOffload(e);
}

absl::StatusOr<Experiment> ParseExperiment(const std::string& text, const std::string& origin) {
  Experiment e;
  if (absl::Status st = ParseTextProto(text, origin, &e); !st.ok()) return st;
  if (e.steps() == 0) e.set_steps(2);
  if (e.device().empty()) e.set_device("cpu");
  if (e.kind() == Experiment::INFINITY_MEMORY && e.memory_table().placements().empty()) {
    for (auto mode : {OffloadSweep::STAGE3, OffloadSweep::STAGE3_OFFLOAD_CPU_PARAMS, OffloadSweep::STAGE3_NVME_NVME_PARAMS}) {
      e.mutable_memory_table()->add_placements(mode);
    }
  }
  if (e.kind() != Experiment::ZERO_MEMORY && e.kind() != Experiment::KIND_UNSPECIFIED &&
      e.kind() != Experiment::INFINITY_PARTITION && e.kind() != Experiment::INFINITY_MEMORY &&
      e.kind() != Experiment::ZERO_MAX_MODEL) {
    OffloadSweep& o = *e.mutable_offload();
    if (o.modes().empty() && (e.kind() == Experiment::INFINITY_TILING || e.kind() == Experiment::INFINITY_PREFETCH ||
                              e.kind() == Experiment::INFINITY_ACTIVATION_OFFLOAD)) {
      o.add_modes(OffloadSweep::STAGE3_OFFLOAD_CPU_PARAMS);
    }
    if (o.modes().empty() && e.kind() == Experiment::INFINITY_MAX_MODEL) {
      for (auto mode : {OffloadSweep::STAGE3, OffloadSweep::STAGE3_OFFLOAD, OffloadSweep::STAGE3_NVME}) o.add_modes(mode);
    }
    if (o.modes().empty()) {
      for (auto mode : {OffloadSweep::STAGE0, OffloadSweep::STAGE2, OffloadSweep::OFFLOAD, OffloadSweep::OFFLOAD_DPU}) {
        o.add_modes(mode);
      }
    }
    if (o.device_memory_bytes() == 0) o.set_device_memory_bytes(int64_t{1} << 30);
    if (o.dpu_after_steps() == 0) o.set_dpu_after_steps(1);
    if (o.warmup_steps() == 0) o.set_warmup_steps(o.dpu_after_steps() + 1);
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

zero::TrainerOptions TrainerOptionsFor(const Experiment& e, int stage, int world_size) {
  zero::TrainerOptions o;
  o.training = e.training();
  o.training.mutable_zero()->set_stage(stage);
  return o;
}

absl::StatusOr<SweepRank> JoinSweep(int world_size) {
  SweepRank rank;
  MEMWALL_ASSIGN_OR_RETURN(rank.device, CreateCpuDevice());
  if (world_size == 1) {
    rank.comm = CreateSingleProcessCommunicator();
  } else {
    MEMWALL_ASSIGN_OR_RETURN(rank.comm, CreateCommunicator(*rank.device));
  }
  MEMWALL_RETURN_IF_ERROR(zero::CheckWorldSize(world_size, rank.comm->world_size()));
  return rank;
}

}  // namespace memwall::repro
