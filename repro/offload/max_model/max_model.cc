#include "repro/offload/max_model/max_model.h"

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace memwall::repro {

std::string MaxModelSummaryCsv(const std::vector<OffloadRow>& rows) {
  // ZeRO-Offload §6.2.1, Figure 7: one 32 GB V100.
  return absl::StrCat(LargestPerMode(rows, {{"stage0", "ratio_to_stage0"}}),
                      "stage0,PyTorch DDP (paper),1400000000,1.000,,,paper\n",
                      "stage2+offload,ZeRO-Offload (paper),13000000000,9.286,,,paper\n");
}

namespace {

absl::Status ValidateOffloadMaxModel(const Experiment& e) {
  MEMWALL_RETURN_IF_ERROR(ValidateLadder(e, {.traces = true, .max_model_walk = true}));
  const OffloadSweep& o = e.offload();
  if (RunsDpu(o) && e.steps() < o.dpu_after_steps() + 2) {
    return BadField("steps", e.steps(),
                    absl::StrCat("must be >= offload.dpu_after_steps + 2 = ", o.dpu_after_steps() + 2,
                            " so that OFFLOAD_DPU runs a delayed update"));
  }
  return absl::OkStatus();
}

absl::Status DriveOffloadMaxModel(const Experiment& e, const RunContext& run) {
  return DriveMaxModelWalk(
      e, run,
      {MaxModelSummaryCsv, "", "ZeRO-Offload §6.2.1 (one 32 GB V100: PyTorch 1.4B, ZeRO-Offload 13B)", "stage 0"});
}

}  // namespace

const ExperimentKind kOffloadMaxModelKind = {
    Experiment::OFFLOAD_MAX_MODEL, "repro/offload/max_model/figure.py", kOffload, /*cuda=*/true,
    /*offload_in_training=*/false, FillOffloadModes, ValidateOffloadMaxModel, DriveOffloadMaxModel};

}  // namespace memwall::repro
