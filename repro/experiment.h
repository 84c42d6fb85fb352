// Experiments (experiment.proto): the registry of experiment kinds, and
// loading, defaults and checks through it. Every bad value is an
// InvalidArgument that names the file and the field, returned before
// anything is allocated or launched.
#ifndef MEMWALL_REPRO_EXPERIMENT_H_
#define MEMWALL_REPRO_EXPERIMENT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "repro/experiment.pb.h"
#include "repro/kind.h"

namespace memwall::repro {

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
