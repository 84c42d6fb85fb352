// The OFFLOAD_THROUGHPUT experiment (ZeRO-Offload §6.2.2, Figure 8): the
// ladder's throughput measurement (ladder.h) of stage 0, ZeRO-2, ZeRO-2 +
// offload and + DPU on every ladder model, one rank; every timed DPU step
// has a delayed update running under it (the kind checks warmup_steps >=
// dpu_after_steps + 1). On a GPU (`device: "cuda"`) the same kind measures
// ZeRO-Offload Figure 9's one-GPU points (repro/offload/dpu/gpu.textproto).
#ifndef MEMWALL_REPRO_OFFLOAD_THROUGHPUT_THROUGHPUT_H_
#define MEMWALL_REPRO_OFFLOAD_THROUGHPUT_THROUGHPUT_H_

#include "repro/kind.h"

namespace memwall::repro {

// OFFLOAD_THROUGHPUT's row of the registry; results/<name>/ with a Chrome
// trace per step under traces/ when offload.write_traces.
extern const ExperimentKind kOffloadThroughputKind;

}  // namespace memwall::repro

#endif  // MEMWALL_REPRO_OFFLOAD_THROUGHPUT_THROUGHPUT_H_
