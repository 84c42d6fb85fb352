// The INFINITY_MAX_MODEL experiment (ZeRO-Infinity §8.5, Figure 6a): the
// ladder's max-model walk (ladder.h) for ZeRO-3, + CPU offload of the
// optimizer states, + NVMe offload of them (infinity/nvme_optimizer.h),
// each offload also with the 16-bit parameters on the host, and NVMe
// offload with them on NVMe too, without and with the gradient shard
// there (infinity/nvme_gradient_shard.h), under the device's and the pinned host's
// budgets (offload.host_pinned_memory_bytes); a pinned budget exceeded, or
// a full disk, is "does not fit" too.
#ifndef MEMWALL_REPRO_INFINITY_MAX_MODEL_MAX_MODEL_H_
#define MEMWALL_REPRO_INFINITY_MAX_MODEL_MAX_MODEL_H_

#include <string>
#include <vector>

#include "repro/kind.h"
#include "repro/ladder.h"

namespace memwall::repro {

// Per mode the largest model that fit and its Ψ over "stage3+offload"'s
// largest and over "stage3+offload+params"'s ("...,ratio_to_cpu_offload,
// ratio_to_cpu_offload_with_params,tflops,device_idle_fraction,source"),
// followed by the paper's
// one-DGX-2 points (ZeRO-3 20B, ZeRO-Inf-CPU 70B, ZeRO-Inf-NVMe 1T, their
// ratios over ZeRO-Inf-CPU in the second column).
std::string InfinityMaxModelSummaryCsv(const std::vector<OffloadRow>& rows);

// INFINITY_MAX_MODEL's row of the registry; results/infinity_max_model/.
extern const ExperimentKind kInfinityMaxModelKind;

}  // namespace memwall::repro

#endif  // MEMWALL_REPRO_INFINITY_MAX_MODEL_MAX_MODEL_H_
