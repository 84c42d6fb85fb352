// The OFFLOAD_MAX_MODEL experiment (ZeRO-Offload §6.2.1, Figure 7): the
// ladder's max-model walk (ladder.h) for stage 0, ZeRO-2, ZeRO-2 + offload
// and + DPU, one rank on a budgeted device; per mode the largest model
// whose steps all complete, and its size over stage 0's.
//
// DPU: delayed_update_after_steps = offload.dpu_after_steps; the walk runs
// at least one delayed step (the kind checks steps >= after + 2).
#ifndef MEMWALL_REPRO_OFFLOAD_MAX_MODEL_MAX_MODEL_H_
#define MEMWALL_REPRO_OFFLOAD_MAX_MODEL_MAX_MODEL_H_

#include <string>
#include <vector>

#include "repro/kind.h"
#include "repro/ladder.h"

namespace memwall::repro {

// Per mode the largest model that fit, its Ψ over stage 0's and its last
// step's rate ("mode,largest_model,largest_params,ratio_to_stage0,tflops,
// device_idle_fraction,source"), followed by the paper's one-GPU points
// (PyTorch 1.4B, ZeRO-Offload 13B: 9.3x).
std::string MaxModelSummaryCsv(const std::vector<OffloadRow>& rows);

// OFFLOAD_MAX_MODEL's row of the registry; results/offload_max_model/.
extern const ExperimentKind kOffloadMaxModelKind;

}  // namespace memwall::repro

#endif  // MEMWALL_REPRO_OFFLOAD_MAX_MODEL_MAX_MODEL_H_
