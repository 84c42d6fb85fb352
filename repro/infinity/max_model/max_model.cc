#include "repro/infinity/max_model/max_model.h"

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace memwall::repro {

std::string InfinityMaxModelSummaryCsv(const std::vector<OffloadRow>& rows) {
  // ZeRO-Infinity §8.5, Figure 6a: one DGX-2 (16 V100 32 GB, 1.5 TB host
  // memory, 28 TB NVMe). ZeRO-Inf-CPU moves the parameters and the
  // optimizer states to the CPU (stage3+offload+params here); ZeRO-Inf-NVMe
  // moves every model state to NVMe, the gradients too (stage3+nvme-all).
  // The paper's ratios are over ZeRO-Inf-CPU.
  return absl::StrCat(LargestPerMode(rows, {{"stage3+offload", "ratio_to_cpu_offload"},
                                            {"stage3+offload+params", "ratio_to_cpu_offload_with_params"}}),
                      "stage3,ZeRO-3 (paper),20000000000,,0.286,,,paper\n",
                      "stage3+offload+params,ZeRO-Inf-CPU (paper),70000000000,,1.000,,,paper\n",
                      "stage3+nvme-all,ZeRO-Inf-NVMe (paper),1000000000000,,14.286,,,paper\n");
}

namespace {

void FillInfinityModes(Experiment& e) {
  FillLadder(e, {OffloadSweep::STAGE3, OffloadSweep::STAGE3_OFFLOAD, OffloadSweep::STAGE3_NVME});
}

absl::Status ValidateInfinityMaxModel(const Experiment& e) {
  return ValidateLadder(e, {.traces = true, .max_model_walk = true});
}

absl::Status DriveInfinityMaxModel(const Experiment& e, const RunContext& run) {
  return DriveMaxModelWalk(e, run,
                           {InfinityMaxModelSummaryCsv, "; stage3+nvme's swap files on the machine's disk",
                            "ZeRO-Infinity §8.5, Figure 6a (one DGX-2: ZeRO-3 20B, ZeRO-Inf-CPU 70B, ZeRO-Inf-NVMe "
                            "1T; here stage3+offload+params and stage3+nvme-all)",
                            "stage3+offload"});
}

}  // namespace

const ExperimentKind kInfinityMaxModelKind = {
    Experiment::INFINITY_MAX_MODEL, "repro/infinity/max_model/figure.py", kOffload, /*cuda=*/false,
    /*offload_in_training=*/false, FillInfinityModes, ValidateInfinityMaxModel, DriveInfinityMaxModel};

}  // namespace memwall::repro
