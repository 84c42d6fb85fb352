// The paired ladder experiments (ZeRO-Infinity §8.6, Figures 6d and 6e):
// per ladder model, the throughput measurement (ladder.h) of the one
// ZeRO-3 mode without a feature, then with it. Each result names its
// feature: infinity/prefetch (overlap-centric prefetch) and
// infinity/activation_offload (activation checkpoints in host memory).
#ifndef MEMWALL_REPRO_PAIRED_H_
#define MEMWALL_REPRO_PAIRED_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "models/gpt_config.pb.h"
#include "repro/experiment.pb.h"
#include "repro/harness.h"
#include "repro/ladder.h"
#include "zero/trainer.h"

namespace memwall::repro {

// A feature compared off against on.
struct PairedFeature {
  absl::string_view suffix;  // appended to the mode's name in the "on" rows ("+prefetch")
  // Sets the feature `on` or off in the model and the trainer's options
  // (the mode's, from OffloadTrainerOptions).
  void (*set)(bool on, models::GptConfig& config, zero::TrainerOptions& options);
  absl::string_view without_then_with;  // the provenance's words for the pair
};

// Per ladder model the row without the feature, then the row with it
// (its mode named with the suffix).
absl::StatusOr<std::vector<OffloadRow>> MeasurePaired(const Experiment& e, const PairedFeature& feature);

// Per model: tokens/s and device peak with the feature over without
// ("model,hidden,params,tokens_per_second_off,tokens_per_second_on,
// throughput_ratio,device_peak_off,device_peak_on,device_peak_ratio").
std::string PairedSummaryCsv(const std::vector<OffloadRow>& rows);

// MeasurePaired, then results/<name>/{data.csv (ThroughputCsv rows),
// summary.csv, figure.png, provenance.json}.
absl::Status DrivePaired(const Experiment& e, const RunContext& run, const PairedFeature& feature);

}  // namespace memwall::repro

#endif  // MEMWALL_REPRO_PAIRED_H_
