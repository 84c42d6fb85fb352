#include "repro/experiment.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/gpt.h"
#include "repro/infinity/activation_offload/activation_offload.h"
#include "repro/infinity/max_model/max_model.h"
#include "repro/infinity/memory/memory.h"
#include "repro/infinity/partition/partition.h"
#include "repro/infinity/prefetch/prefetch.h"
#include "repro/infinity/tiling/tiling.h"
#include "repro/offload/max_model/max_model.h"
#include "repro/offload/throughput/throughput.h"
#include "repro/zero/max_model/max_model.h"
#include "repro/zero/memory/zero_memory.h"
#include "runtime/files.h"
#include "runtime/status.h"
#include "zero/config.h"

namespace memwall::repro {
namespace {

// [Note: the kind registry]
// Every experiment kind, one row each, defined by its result's folder
// (repro/<paper>/<result>/): what it reads, its defaults, its checks, its
// driver and its figure. Nothing else branches on a kind.
const ExperimentKind* const kKinds[] = {
    &kZeroMemoryKind,
    &kOffloadMaxModelKind,
    &kOffloadThroughputKind,
    &kInfinityMaxModelKind,
    &kInfinityPartitionKind,
    &kInfinityTilingKind,
    &kInfinityPrefetchKind,
    &kInfinityActivationOffloadKind,
    &kInfinityMemoryKind,
    &kZeroMaxModelKind,
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
  for (const ExperimentKind* k : kKinds) {
    if (k->kind == kind) return k;
  }
  return nullptr;
}

std::vector<std::string> KindNames() {
  std::vector<std::string> names;
  for (const ExperimentKind* k : kKinds) names.push_back(Experiment::Kind_Name(k->kind));
  return names;
}

absl::Status ValidateExperiment(const Experiment& e) {
  if (e.name().empty() || e.name().find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos) {
    return BadField("name", absl::StrCat("\"", e.name(), "\""), "must be non-empty lower case, digits and '_' (it names results/<name>/)");
  }
  const ExperimentKind* kind = FindKind(e.kind());
  if (kind == nullptr) {
    return BadField("kind", Experiment::Kind_Name(e.kind()),
                    absl::StrCat("must name what to run (", absl::StrJoin(KindNames(), ", "), ")"));
  }
  const std::string name = Experiment::Kind_Name(e.kind());
  if (e.device() != "cpu" && !(e.device() == "cuda" && kind->cuda)) {
    std::vector<std::string> cuda;
    for (const ExperimentKind* k : kKinds) {
      if (k->cuda) cuda.push_back(Experiment::Kind_Name(k->kind));
    }
    return BadField("device", absl::StrCat("\"", e.device(), "\""),
                    absl::StrCat("must be cpu, or cuda for ", absl::StrJoin(cuda, ", "), " (measured on a GPU so far)"));
  }
  if (e.steps() <= 0) return BadField("steps", e.steps(), "must be > 0 (unset: 2)");
  for (const PartField& part : kParts) {
    if (!(kind->parts & part.part) && part.set(e)) {
      std::vector<std::string> readers;
      for (const ExperimentKind* k : kKinds) {
        if (k->parts & part.part) readers.push_back(Experiment::Kind_Name(k->kind));
      }
      return BadField(part.name, part.shown,
                      absl::StrCat("must be unset for ", name, " (read by ", absl::StrJoin(readers, ", "), ")"));
    }
  }
  const zero::ZeroConfig& z = e.training().zero();
  if (z.stage() != 0) {
    return BadField("training.zero.stage", z.stage(), "must be unset: the sweep's `stages` (or offload.modes) set it");
  }
  if (!kind->offload_in_training && z.has_offload_optimizer()) {
    return BadField("training.zero.offload_optimizer", "{...}", "must be unset: offload.modes set it");
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
