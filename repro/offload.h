// The ZeRO-Offload experiments (ATC21 §6) on one device, one rank:
//
//   OFFLOAD_MAX_MODEL   Figure 7: for each mode (stage 0, stage 2, stage 2 +
//                       offload, + DPU), walk the ladder from the smallest
//                       model and train each for `steps` steps in a
//                       fresh device of `offload.device_memory_bytes`; the
//                       largest model whose steps all complete is the mode's
//                       result. A model that does not fit ends the walk
//                       (the ladder grows in size); only a ResourceExhausted
//                       status counts as "does not fit", anything else
//                       fails the experiment.
//   OFFLOAD_THROUGHPUT  Figure 8: for each (model, mode) that fits,
//                       `offload.warmup_steps` untimed then `steps`
//                       timed steps: tokens/s, TFLOPS (model FLOPs, ZeRO's
//                       6Ψ + attention per token), the device's GEMM rate
//                       for the model's largest matmul measured in the same
//                       run, before and after the model's runs, the faster
//                       (the bound the TFLOPS are a fraction of), and
//                       the fraction of each step the compute stream sat
//                       idle, from the timeline (runtime/timeline.h).
//
//   INFINITY_MAX_MODEL  ZeRO-Infinity Figure 6a: OFFLOAD_MAX_MODEL's walk
//                       for ZeRO-3, + CPU offload of the optimizer states,
//                       + NVMe offload of them (infinity/nvme_optimizer.h),
//                       under the device's and the pinned host's budgets
//                       (offload.host_pinned_memory_bytes); a pinned budget
//                       exceeded, or a full disk, is "does not fit" too.
//
// DPU: delayed_update_after_steps = offload.dpu_after_steps; max-model runs
// at least one delayed step (ParseExperiment checks steps >= after + 2), and
// every timed throughput step has a delayed update running under it.
#ifndef MEMWALL_REPRO_OFFLOAD_H_
#define MEMWALL_REPRO_OFFLOAD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/estimate.h"
#include "absl/status/statusor.h"
#include "repro/experiment.pb.h"
#include "repro/sweep.h"
#include "zero/trainer.h"

namespace memwall::repro {

// The estimator's input for a run of `config` with `options` over `ranks`
// ranks: the offloaded optimizer's and NVMe parameter store's plans picked
// from options' offload settings (rank 0's).
engine::EstimateInput EstimateInputFor(const zero::TrainerOptions& options, const models::GptConfig& config,
                                     int64_t ranks);

// One (model, mode) attempt.
struct OffloadRow {
  std::string model;
  int64_t params = 0;
  int64_t layers = 0, hidden = 0;
  std::string mode;
  bool fits = false;
  std::string reason;  // why not (the status's message), when !fits
  int64_t steps = 0;   // steps run (timed ones for throughput)
  int64_t device_peak_bytes = -1;
  int64_t host_pinned_peak_bytes = -1;
  double seconds = 0;  // wall time of the attempt (max model); mean timed step (throughput)
  // Throughput only.
  double tokens_per_second = 0;
  double tflops = 0;
  double gemm_tflops = 0;           // the device's rate on the model's largest matmul
  double device_idle_fraction = -1;
  std::string breakdown;            // zone name -> seconds, the last timed step
  std::string device;               // where it was measured ("cpu:0"); empty for a modeled row
};

inline constexpr char kMaxModelCsvHeader[] =
    "model,params,layers,hidden,mode,fits,steps,device_peak_bytes,host_pinned_peak_bytes,seconds,reason,device";
std::string MaxModelCsv(const OffloadRow& row);

inline constexpr char kThroughputCsvHeader[] =
    "model,params,layers,hidden,mode,fits,timed_steps,step_seconds,tokens_per_second,tflops,gemm_tflops,"
    "fraction_of_gemm,device_idle_fraction,device_peak_bytes,host_pinned_peak_bytes,breakdown,reason,device";
std::string ThroughputCsv(const OffloadRow& row);

// Every (mode, ladder model) attempted, in order: per mode the models that
// fit and the first that does not (or none when all fit).
absl::StatusOr<std::vector<OffloadRow>> MeasureMaxModel(const Experiment& e);

// The summary of MeasureMaxModel's rows: per mode the largest model that
// fit and its Ψ over stage 0's ("mode,largest_model,largest_params,
// ratio_to_stage0,source"), followed by the paper's one-GPU points (PyTorch
// 1.4B, ZeRO-Offload 13B: 9.3x).
std::string MaxModelSummaryCsv(const std::vector<OffloadRow>& rows);
// INFINITY_MAX_MODEL's: the same over "stage3+offload"'s largest and over
// "stage3+offload+params"'s ("...,ratio_to_cpu_offload,
// ratio_to_cpu_offload_with_params,source"), followed by the paper's
// one-DGX-2 points (ZeRO-3 20B, ZeRO-Inf-CPU 70B, ZeRO-Inf-NVMe 1T, their
// ratios over ZeRO-Inf-CPU in the second column).
std::string InfinityMaxModelSummaryCsv(const std::vector<OffloadRow>& rows);

// INFINITY_TILING (ZeRO-Infinity §5.1.3, Figure 6b): per tiling factor,
// OFFLOAD_MAX_MODEL's walk over the ladder's models whose hidden size the
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

// INFINITY_PREFETCH (Figure 6d) and INFINITY_ACTIVATION_OFFLOAD (Figure 6e):
// per ladder model, OFFLOAD_THROUGHPUT's measurement of the one mode
// without the feature, then with it (prefetch_bucket_bytes 0 against the
// experiment's; offload_activations off against on); each row's mode is
// the mode's name plus "+prefetch" / "+activation-offload" when on.
// Prefetch off is every hop: no gathers ahead and, with the parameters on
// NVMe, no read-ahead (offload_param.read_ahead_buffers 0).
absl::StatusOr<std::vector<OffloadRow>> MeasurePaired(const Experiment& e);
// Per model: tokens/s and device peak with the feature over without
// ("model,hidden,params,tokens_per_second_off,tokens_per_second_on,
// throughput_ratio,device_peak_off,device_peak_on,device_peak_ratio").
std::string PairedSummaryCsv(const std::vector<OffloadRow>& rows);

// `trace_root`, when not empty: each (model, mode)'s steps (warm-up and
// timed) write
// trace_root/<model>_<mode>/step_<k>.json.
absl::StatusOr<std::vector<OffloadRow>> MeasureThroughput(const Experiment& e, const std::string& trace_root);

// Floating-point operations per second of ops::Matmul on `device`'s compute
// stream for C(m, n) = A(m, k) B(k, n) in `dtype`: the fastest of at least
// `repeats` timed calls (and 0.2 s) after one untimed.
absl::StatusOr<double> MeasureGemmFlops(Device& device, DType dtype, int64_t m, int64_t k, int64_t n,
                                        int repeats);

}  // namespace memwall::repro

#endif  // MEMWALL_REPRO_OFFLOAD_H_
