#include "repro/sweep.h"

#include <cstdlib>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/text_format.h"
#include "models/gpt.h"
#include "repro/kind.h"
#include "runtime/cpu_device.h"
#include "runtime/status.h"
#include "zero/config.h"

namespace memwall::repro {

zero::TrainerOptions TrainerOptionsFor(const Experiment& e, int stage, int world_size) {
  zero::TrainerOptions o;
  o.training = e.training();
  o.training.mutable_zero()->set_stage(stage);
  return o;
}

namespace {

struct ModeRow {
  OffloadSweep::Mode mode;
  const char* name;
  const char* overlay;  // a ZeroConfig text proto
};

// [Note: offload modes]'s table.
constexpr ModeRow kModes[] = {
    {OffloadSweep::STAGE0, "stage0", "stage: 0"},
    {OffloadSweep::STAGE2, "stage2", "stage: 2"},
    {OffloadSweep::OFFLOAD, "stage2+offload", "stage: 2 offload_optimizer { device: CPU }"},
    {OffloadSweep::OFFLOAD_DPU, "stage2+offload+dpu",
     "stage: 2 offload_optimizer { device: CPU delayed_update_after_steps: 1 }"},
    {OffloadSweep::STAGE3, "stage3", "stage: 3"},
    {OffloadSweep::STAGE3_OFFLOAD, "stage3+offload", "stage: 3 offload_optimizer { device: CPU }"},
    {OffloadSweep::STAGE3_NVME, "stage3+nvme", "stage: 3 offload_optimizer { device: NVME }"},
    {OffloadSweep::STAGE3_OFFLOAD_CPU_PARAMS, "stage3+offload+params",
     "stage: 3 offload_optimizer { device: CPU } offload_param { device: CPU }"},
    {OffloadSweep::STAGE3_NVME_CPU_PARAMS, "stage3+nvme+params",
     "stage: 3 offload_optimizer { device: NVME } offload_param { device: CPU }"},
    {OffloadSweep::STAGE3_NVME_NVME_PARAMS, "stage3+nvme+nvme-params",
     "stage: 3 offload_optimizer { device: NVME } offload_param { device: NVME }"},
    {OffloadSweep::STAGE3_NVME_ALL, "stage3+nvme-all",
     "stage: 3 offload_optimizer { device: NVME gradients_on_nvme: true } offload_param { device: NVME }"},
};

const ModeRow* FindMode(OffloadSweep::Mode mode) {
  for (const ModeRow& row : kModes) {
    if (row.mode == mode) return &row;
  }
  return nullptr;
}

}  // namespace

std::string ModeName(OffloadSweep::Mode mode) {
  const ModeRow* row = FindMode(mode);
  return row != nullptr ? row->name : "unspecified";
}

const zero::ZeroConfig& ModeOverlay(OffloadSweep::Mode mode) {
  static const auto* overlays = [] {
    auto* m = new std::map<OffloadSweep::Mode, zero::ZeroConfig>();
    for (const ModeRow& row : kModes) {
      // The table is ours and parses; a typo in it fails every test.
      if (!google::protobuf::TextFormat::ParseFromString(row.overlay, &(*m)[row.mode])) std::abort();
    }
    return m;
  }();
  static const zero::ZeroConfig kNone;
  const auto it = overlays->find(mode);
  return it != overlays->end() ? it->second : kNone;
}

zero::TrainerOptions OffloadTrainerOptions(const Experiment& e, OffloadSweep::Mode mode) {
  const zero::ZeroConfig& overlay = ModeOverlay(mode);
  zero::TrainerOptions o = TrainerOptionsFor(e, overlay.stage(), 1);
  zero::ZeroConfig& z = *o.training.mutable_zero();
  z.MergeFrom(overlay);
  const OffloadSweep& sweep = e.offload();
  const char* tmp = std::getenv("TMPDIR");
  const std::string swap_dir = !sweep.nvme_path().empty()         ? sweep.nvme_path()
                               : tmp != nullptr && *tmp != '\0' ? tmp
                                                                 : "/tmp";
  if (z.offload_optimizer().device() == zero::OffloadOptimizerConfig::NVME) {
    z.mutable_offload_optimizer()->set_nvme_path(swap_dir);
    if (sweep.swap_buffer_bytes() > 0) z.mutable_offload_optimizer()->set_pinned_budget_bytes(sweep.swap_buffer_bytes());
  }
  if (z.offload_param().device() == zero::OffloadParamConfig::NVME) z.mutable_offload_param()->set_nvme_path(swap_dir);
  if (z.offload_optimizer().device() != zero::OffloadOptimizerConfig::NONE && sweep.tile_elements() > 0) {
    z.mutable_offload_optimizer()->set_tile_elements(sweep.tile_elements());
  }
  if (z.offload_optimizer().delayed_update_after_steps() > 0) {
    z.mutable_offload_optimizer()->set_delayed_update_after_steps(sweep.dpu_after_steps());
    if (sweep.dpu_values_on_device()) z.mutable_offload_optimizer()->set_delayed_values_on_device(true);
  }
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

absl::Status ValidateSweep(const Experiment& e) {
  if (absl::Status st = models::ValidateConfig(e.model()); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("Experiment model: ", st.message()));
  }
  if (e.training().seq() > e.model().positions()) {
    return BadField("training.seq", e.training().seq(),
                    absl::StrCat("must be in [1, model.positions = ", e.model().positions(), "]"));
  }
  if (e.world_sizes().empty()) return BadField("world_sizes", "[]", "must list at least one world size");
  for (int w : e.world_sizes()) {
    if (w < 1 || w > 64) return BadField("world_sizes", w, "must be in [1, 64] (ranks on this machine)");
  }
  return absl::OkStatus();
}

}  // namespace memwall::repro
