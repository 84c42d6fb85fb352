// The ladder experiments' shared measurement (ZeRO-Offload §6.2,
// ZeRO-Infinity §8.5, §8.6): one rank on one device, the models of
// `offload.ladder` (growing in size) under the ZeroConfig overlays of
// `offload.modes` ([Note: offload modes], sweep.h).
//
//   a max-model walk    for each mode, walk the ladder from the smallest
//                       model (offload.start_at_estimate: from the largest
//                       the memory estimator fits) and train each for `steps` steps in a fresh
//                       device of `offload.device_memory_bytes` (and a
//                       pinned host budget, offload.host_pinned_memory_bytes);
//                       the largest model whose steps all complete is the
//                       mode's result. A model that does not fit ends the
//                       walk; only a ResourceExhausted status (a budget
//                       exceeded, a full disk) counts as "does not fit",
//                       anything else fails the experiment.
//   throughput          for each (model, mode) that fits,
//                       `offload.warmup_steps` untimed then `steps` timed
//                       steps: tokens/s, TFLOPS (the trainer's model FLOPs,
//                       models/gpt.h), the device's GEMM rate for the
//                       model's largest matmul measured in the same run,
//                       before and after the model's runs, the faster (the
//                       bound the TFLOPS are a fraction of), and the
//                       fraction of each step the compute stream sat idle,
//                       from the timeline (runtime/timeline.h).
//
// The results that use them: offload/max_model, offload/throughput,
// infinity/max_model, infinity/tiling, and through paired.h
// infinity/prefetch and infinity/activation_offload.
#ifndef MEMWALL_REPRO_LADDER_H_
#define MEMWALL_REPRO_LADDER_H_

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/estimate.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "repro/experiment.pb.h"
#include "repro/harness.h"
#include "repro/kind.h"
#include "repro/sweep.h"
#include "runtime/device.h"
#include "zero/trainer.h"

namespace memwall::repro {

// The estimator's input for a run of `config` with `options` over `ranks`
// ranks: the offloaded optimizer's and NVMe parameter store's plans picked
// from options' offload settings (rank 0's).
engine::EstimateInput EstimateInputFor(const zero::TrainerOptions& options, const models::GptConfig& config,
                                     int64_t ranks);
// The same for one rank, checked against the sweep's device and pinned host
// budgets (offload.device_memory_bytes, offload.host_pinned_memory_bytes)
// and, where the mode has swap files, the free bytes of their file system.
engine::EstimateInput BudgetedEstimateInput(const Experiment& e, const zero::TrainerOptions& options,
                                            const models::GptConfig& config);

// One (model, mode) attempt.
struct OffloadRow {
  std::string model;
  int64_t params = 0;
  int64_t layers = 0, hidden = 0;
  int64_t micro_batch = 0;
  std::string mode;
  bool fits = false;
  std::string reason;       // why not (the status's message), when !fits
  int64_t steps = 0;        // steps run, warm-up and timed
  int64_t timed_steps = 0;  // the last `timed_steps` of them
  int64_t device_peak_bytes = -1;
  int64_t host_pinned_peak_bytes = -1;
  double attempt_seconds = 0;  // wall time of the whole attempt: device, model, trainer, every step
  // Over the timed steps, when the attempt trained and timed any.
  double step_seconds = 0;  // mean step time
  double tokens_per_second = 0;
  double tflops = 0;
  double device_idle_fraction = -1;
  std::string breakdown;    // zone name -> seconds, the last timed step
  double gemm_tflops = 0;   // throughput only: the device's rate on the model's largest matmul
  std::string device;       // where it was measured ("cpu:0"); empty for a modeled row
};

// `seconds` is the attempt's wall time; step_seconds, tflops,
// device_idle_fraction and breakdown (its zones, as StepStats gives them)
// are its last step's, empty where it did not train.
inline constexpr char kMaxModelCsvHeader[] =
    "model,params,layers,hidden,mode,fits,steps,device_peak_bytes,host_pinned_peak_bytes,seconds,step_seconds,tflops,"
    "device_idle_fraction,breakdown,reason,device";
std::string MaxModelCsv(const OffloadRow& row);

inline constexpr char kThroughputCsvHeader[] =
    "model,params,layers,hidden,micro_batch,mode,fits,timed_steps,step_seconds,tokens_per_second,tflops,gemm_tflops,"
    "fraction_of_gemm,device_idle_fraction,device_peak_bytes,host_pinned_peak_bytes,breakdown,reason,device";
std::string ThroughputCsv(const OffloadRow& row);

// Called with every row measured so far after each attempt (null: not
// called): a run cut short keeps what it measured (PartialCsv).
using RowsSoFar = std::function<absl::Status(const std::vector<OffloadRow>&)>;

// A RowsSoFar that writes `header` and each row as `csv` gives it to
// <dir>/data.partial.csv, atomically, after every attempt: what a run killed
// by a time limit (a GPU machine's) leaves behind. CompleteCsv writes the
// finished run's data.csv and removes the partial file; a run that starts
// removes the last one's.
RowsSoFar PartialCsv(const std::string& dir, absl::string_view header, std::string (*csv)(const OffloadRow&));
absl::Status CompleteCsv(const std::string& dir, absl::string_view header, std::string (*csv)(const OffloadRow&),
                         const std::vector<OffloadRow>& rows);

// The max-model walk: every (mode, ladder model) attempted, in order: per
// mode the models that fit and the first that does not (or none when all
// fit). With offload.start_at_estimate a mode's rows start at the first
// model it ran, the estimator's largest or the first that trained below it.
// Every attempt runs `steps` steps and times the last. `trace_root`, when not
// empty: each attempt that trains keeps its steps' traces in
// trace_root/<model>_<mode>/step_<k>.json.
// `rows_so_far` sees every attempt in the order it ran.
absl::StatusOr<std::vector<OffloadRow>> MeasureMaxModel(const Experiment& e, const std::string& trace_root,
                                                        const RowsSoFar& rows_so_far = nullptr);

// One mode's max-model walk over ladder models [0, n), from `start`:
// attempt(i) up from `start` to the first refusal and, where `start` itself
// was refused, down until a model trains, keeping only the lowest refusal.
// The rows in ladder order. Where fitting is monotone in the ladder (a
// model fits when a larger one does), these are the last rows of the walk
// from 0, and the same largest model.
absl::StatusOr<std::vector<OffloadRow>> WalkLadder(int start, int n,
                                                   const std::function<absl::StatusOr<OffloadRow>(int)>& attempt);

// Per mode the largest model that fit, its Ψ over each base mode's largest
// (empty where the base has none) and its timed steps' TFLOPS and device idle
// fraction, a "measured" row each, under the header
// "mode,largest_model,largest_params,<ratio columns>,tflops,device_idle_fraction,source".
struct RatioColumn {
  std::string base_mode, name;
};
std::string LargestPerMode(const std::vector<OffloadRow>& rows, const std::vector<RatioColumn>& ratios);

// How a max-model result reports its walk: data.csv (MaxModelCsv rows),
// summary.csv (its own), the provenance's words.
struct MaxModelReport {
  std::string (*summary_csv)(const std::vector<OffloadRow>& rows);
  absl::string_view disk;         // appended to "one rank, no MPI" (where swap files went), or empty
  absl::string_view paper_rows;   // what summary.csv's source=paper rows are
  absl::string_view ratio_base;   // the mode summary.csv's ratios are over
};
// The walk, then results/<name>/{data.csv, summary.csv, provenance.json,
// figure.png}.
absl::Status DriveMaxModelWalk(const Experiment& e, const RunContext& run, const MaxModelReport& report);

// What every ladder kind checks: the ladder (valid models, training.seq
// within each one's positions, growing in size), the modes (given, none
// twice), the budgets, and the sweep's settings only where a mode reads
// them (nvme_path and swap_buffer_bytes need an NVMe mode). `reads`: the
// sub-fields only some kinds read.
struct LadderFields {
  bool traces = false;         // write_traces
  bool tiling = false;         // tiling_factors
  bool micro_batches = false;  // micro_batches, halve_micro_batch_to_fit
  bool max_model_walk = false; // start_at_estimate
};
absl::Status ValidateLadder(const Experiment& e, LadderFields reads = {});
// Whether a mode of the sweep delays the parameter update (ZeRO-Offload's DPU).
bool RunsDpu(const OffloadSweep& o);
// Tiling, prefetch and offloaded activations compare within one ZeRO-3 mode.
absl::Status ValidateOneStage3Mode(const Experiment& e);

// The ladder kinds' defaults: `modes` when none are given, a 1 GiB device,
// the delayed update after one step and one warm-up step past it.
void FillLadder(Experiment& e, std::initializer_list<OffloadSweep::Mode> modes);
// ZeRO-Offload's four modes (Figures 7, 8): stage 0, ZeRO-2, + offload, + DPU.
void FillOffloadModes(Experiment& e);
// ZeRO-Inf-CPU alone (Figure 6b, d, e): the optimizer and the parameters on the host.
void FillInfCpuMode(Experiment& e);

// One attempt: a fresh device of the experiment's budgets (so its peaks
// are this attempt's alone), the model, the trainer with `options` (null:
// the mode's, OffloadTrainerOptions), `warmup + timed` steps, each step's
// trace under `trace_dir` when not empty. A ResourceExhausted anywhere is a
// row with fits = false (its traces removed); any other error fails.
absl::StatusOr<OffloadRow> Attempt(const Experiment& e, const models::GptConfig& config, OffloadSweep::Mode mode,
                                   int64_t warmup, int64_t timed, const std::string& trace_dir,
                                   const zero::TrainerOptions* options = nullptr);

// The micro-batch ladder model `i` trains at: offload.micro_batches[i],
// else training.micro_batch.
int64_t MicroBatchOf(const Experiment& e, int i);

// The throughput measurement of every (ladder model, mode), each at its
// model's micro-batch (MicroBatchOf), halved until it fits when
// offload.halve_micro_batch_to_fit. `trace_root`,
// when not empty: each (model, mode)'s steps (warm-up and timed) write
// trace_root/<model>_<mode>/step_<k>.json. `rows_so_far` sees the rows after
// each attempt, and again once a model's GEMM rate after its runs is in
// (until then its rows carry the rate measured before them).
absl::StatusOr<std::vector<OffloadRow>> MeasureThroughput(const Experiment& e, const std::string& trace_root,
                                                          const RowsSoFar& rows_so_far = nullptr);

// Floating-point operations per second of ops::Matmul on `device`'s compute
// stream for C(m, n) = A(m, k) B(k, n) in `dtype`: the fastest of at least
// `repeats` timed calls (and 0.2 s) after one untimed.
absl::StatusOr<double> MeasureGemmFlops(Device& device, DType dtype, int64_t m, int64_t k, int64_t n,
                                        int repeats);

}  // namespace memwall::repro

#endif  // MEMWALL_REPRO_LADDER_H_
