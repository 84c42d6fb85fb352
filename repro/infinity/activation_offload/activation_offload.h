// The INFINITY_ACTIVATION_OFFLOAD experiment (ZeRO-Infinity §5.1.2; §8.6, Figure 6e):
// activation checkpoints offloaded to pinned host memory, off
// against on for each ladder model in one ZeRO-3 mode (paired.h).
#ifndef MEMWALL_REPRO_INFINITY_ACTIVATION_OFFLOAD_ACTIVATION_OFFLOAD_H_
#define MEMWALL_REPRO_INFINITY_ACTIVATION_OFFLOAD_ACTIVATION_OFFLOAD_H_

#include "repro/kind.h"

namespace memwall::repro {

// INFINITY_ACTIVATION_OFFLOAD's row of the registry; results/infinity_activation_offload/.
extern const ExperimentKind kInfinityActivationOffloadKind;

}  // namespace memwall::repro

#endif  // MEMWALL_REPRO_INFINITY_ACTIVATION_OFFLOAD_ACTIVATION_OFFLOAD_H_
