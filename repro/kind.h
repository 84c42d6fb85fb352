// What a result defines for the registry (experiment.h): its experiment
// kind's row. Each result's folder (repro/<paper>/<result>/) declares one
// `extern const ExperimentKind`, and experiment.cc lists them.
#ifndef MEMWALL_REPRO_KIND_H_
#define MEMWALL_REPRO_KIND_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "repro/experiment.pb.h"
#include "repro/harness.h"

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

// The InvalidArgument every check returns: "Experiment FIELD = VALUE NEED".
template <typename T>
absl::Status BadField(absl::string_view field, const T& value, absl::string_view need) {
  return absl::InvalidArgumentError(absl::StrCat("Experiment ", field, " = ", value, " ", need));
}

}  // namespace memwall::repro

#endif  // MEMWALL_REPRO_KIND_H_
