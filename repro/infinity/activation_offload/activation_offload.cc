#include "repro/infinity/activation_offload/activation_offload.h"

#include "absl/strings/str_cat.h"
#include "repro/ladder.h"
#include "repro/paired.h"
#include "runtime/status.h"

namespace memwall::repro {
namespace {

absl::Status ValidateActivationOffload(const Experiment& e) {
  MEMWALL_RETURN_IF_ERROR(ValidateLadder(e, {}));
  MEMWALL_RETURN_IF_ERROR(ValidateOneStage3Mode(e));
  const OffloadSweep& o = e.offload();
  for (int i = 0; i < o.ladder_size(); ++i) {
    if (!o.ladder(i).activation_checkpointing() || o.ladder(i).offload_activations()) {
      return BadField(absl::StrCat("offload.ladder[", i, "]"), absl::StrCat("\"", o.ladder(i).name(), "\""),
                      "needs activation_checkpointing and offload_activations unset (the sweep sets it)");
    }
  }
  return absl::OkStatus();
}

void SetActivationOffload(bool on, models::GptConfig& config, zero::TrainerOptions& /*options*/) {
  config.set_offload_activations(on);
}

absl::Status DriveActivationOffload(const Experiment& e, const RunContext& run) {
  return DrivePaired(e, run,
                     {"+activation-offload", SetActivationOffload,
                      "with the activation checkpoints on the device and then offloaded to pinned host memory"});
}

}  // namespace

const ExperimentKind kInfinityActivationOffloadKind = {
    Experiment::INFINITY_ACTIVATION_OFFLOAD, "repro/infinity/activation_offload/figure.py", kOffload, /*cuda=*/false,
    /*offload_in_training=*/false, FillInfCpuMode, ValidateActivationOffload, DriveActivationOffload};

}  // namespace memwall::repro
