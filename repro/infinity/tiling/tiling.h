// The INFINITY_TILING experiment (ZeRO-Infinity §5.1.3; §8.5, Figure 6b):
// memory-centric tiling against the largest hidden size one device trains.
#ifndef MEMWALL_REPRO_INFINITY_TILING_TILING_H_
#define MEMWALL_REPRO_INFINITY_TILING_TILING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "repro/experiment.pb.h"
#include "repro/kind.h"
#include "repro/ladder.h"

namespace memwall::repro {

// Per tiling factor,
// the max-model walk (ladder.h) over the ladder's models whose hidden size the
// factor divides, in the one mode, each with GptConfig.tiling = factor
// (source "measured"); and per (factor, ladder model) the estimator's
// verdict under the same budgets (source "estimator"; device and pinned
// bytes are its totals).
struct TilingRow {
  int64_t tiling = 1;
  std::string source;  // "measured" or "estimator"
  OffloadRow attempt;
};
inline constexpr char kTilingCsvHeader[] =
    "tiling,model,params,hidden,mode,source,fits,device_peak_bytes,host_pinned_peak_bytes,seconds,reason,device";
std::string TilingCsv(const TilingRow& row);
absl::StatusOr<std::vector<TilingRow>> MeasureTiling(const Experiment& e);
// Per (factor, source) the largest hidden size that fit and its ratio to
// the untiled (factor 1) one of the same source: "tiling,source,
// largest_model,largest_hidden,ratio_to_untiled", then the paper's points
// (one V100: 8K untiled, 64K at factor 16).
std::string TilingSummaryCsv(const std::vector<TilingRow>& rows);

// INFINITY_TILING's row of the registry; results/infinity_tiling/.
extern const ExperimentKind kInfinityTilingKind;

}  // namespace memwall::repro

#endif  // MEMWALL_REPRO_INFINITY_TILING_TILING_H_
