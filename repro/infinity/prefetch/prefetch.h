// The INFINITY_PREFETCH experiment (ZeRO-Infinity §6.2; §8.6, Figure 6d): overlap-centric
// prefetch, off
// against on for each ladder model in one ZeRO-3 mode (paired.h).
#ifndef MEMWALL_REPRO_INFINITY_PREFETCH_PREFETCH_H_
#define MEMWALL_REPRO_INFINITY_PREFETCH_PREFETCH_H_

#include "repro/kind.h"

namespace memwall::repro {

// INFINITY_PREFETCH's row of the registry; results/infinity_prefetch/.
extern const ExperimentKind kInfinityPrefetchKind;

}  // namespace memwall::repro

#endif  // MEMWALL_REPRO_INFINITY_PREFETCH_PREFETCH_H_
