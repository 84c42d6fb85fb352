// Experiments (experiment.proto): the registry of experiment kinds, and
// loading, defaults and checks through it. Every bad value is an
// InvalidArgument that names the file and the field, returned before
// anything is allocated or launched.
#ifndef MEMWALL_REPRO_EXPERIMENT_H_
#define MEMWALL_REPRO_EXPERIMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "repro/drivers.h"
#include "repro/experiment.pb.h"

namespace memwall::repro {

// The parts of an Experiment a kind reads besides name, description,
// paper, device, steps and training; the others must be unset.
enum ExperimentPart : uint32_t {
  kModel = 1 << 0,
  kWorldSizes = 1 << 1,
  kStages = 1 << 2,
  kModeled = 1 << 3,
  kOffload = 1 << 4,
  kMemoryTable = 1 << 5,
  kMaxModelTable = 1 << 6,
};

// One experiment kind: everything that differs between kinds, in one row.
struct ExperimentKind {
  Experiment::Kind kind;
  absl::string_view figure_script;  // draws results/<name>/figure.png from data.csv
  uint32_t parts = 0;               // ExperimentParts it reads
  bool cuda = false;                // device: "cuda" too (else "cpu" only)
  // training.zero.offload_optimizer may be set (else the kind's offload.modes set it).
  bool offload_in_training = false;
  void (*fill_defaults)(Experiment& e) = nullptr;   // its own defaults, before the checks
  absl::Status (*validate)(const Experiment& e) = nullptr;  // its own checks, after the common ones
  absl::Status (*drive)(const Experiment& e, const RunContext& run) = nullptr;
  // Multi-rank sweeps: one world size's rows (//repro:run --worker); null
  // for kinds that run one rank in the runner's process.
  MeasureRowsFn measure_rows = nullptr;
};

// The kind's row; null for KIND_UNSPECIFIED and values no row has.
const ExperimentKind* FindKind(Experiment::Kind kind);
// Every kind's name, in the registry's order.
std::vector<std::string> KindNames();

// Parses a text proto (`text`, from `origin`), fills the defaults (steps 2,
// device cpu, the kind's, and the training config's from zero/config.h)
// and checks every field.
absl::StatusOr<Experiment> ParseExperiment(const std::string& text, const std::string& origin);
absl::StatusOr<Experiment> LoadExperiment(const std::string& path);

absl::Status ValidateExperiment(const Experiment& e);

}  // namespace memwall::repro

#endif  // MEMWALL_REPRO_EXPERIMENT_H_
