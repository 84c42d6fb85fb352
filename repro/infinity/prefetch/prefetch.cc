#include "repro/infinity/prefetch/prefetch.h"

#include "absl/strings/str_cat.h"
#include "repro/ladder.h"
#include "repro/paired.h"
#include "runtime/status.h"

namespace memwall::repro {
namespace {

absl::Status ValidatePrefetch(const Experiment& e) {
  MEMWALL_RETURN_IF_ERROR(ValidateLadder(e, {}));
  MEMWALL_RETURN_IF_ERROR(ValidateOneStage3Mode(e));
  const zero::ZeroConfig& z = e.training().zero();
  if (z.has_prefetch_bucket_bytes() && z.prefetch_bucket_bytes() <= 0) {
    return BadField("training.zero.prefetch_bucket_bytes", z.prefetch_bucket_bytes(),
                    "must be > 0 (unset: the default): INFINITY_PREFETCH compares it with no prefetch");
  }
  return absl::OkStatus();
}

void SetPrefetch(bool on, models::GptConfig& /*config*/, zero::TrainerOptions& options) {
  if (on) return;
  // Prefetch off is every hop: no gathers ahead and, with the parameters
  // on NVMe, no read-ahead either.
  options.training.mutable_zero()->set_prefetch_bucket_bytes(0);
  if (options.training.zero().offload_param().device() == zero::OffloadParamConfig::NVME) {
    options.training.mutable_zero()->mutable_offload_param()->set_read_ahead_buffers(0);
  }
}

absl::Status DrivePrefetch(const Experiment& e, const RunContext& run) {
  return DrivePaired(e, run,
                     {"+prefetch", SetPrefetch,
                      "with zero.prefetch_bucket_bytes = 0 (no prefetch) and then with the experiment's"});
}

}  // namespace

const ExperimentKind kInfinityPrefetchKind = {
    Experiment::INFINITY_PREFETCH, "repro/infinity/prefetch/figure.py", kOffload, /*cuda=*/false,
    /*offload_in_training=*/false, FillInfCpuMode, ValidatePrefetch, DrivePrefetch};

}  // namespace memwall::repro
