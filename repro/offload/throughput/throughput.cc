#include "repro/offload/throughput/throughput.h"

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "repro/harness.h"
#include "repro/ladder.h"
#include "runtime/files.h"
#include "runtime/memory.h"
#include "runtime/provenance.h"
#include "runtime/status.h"

namespace memwall::repro {
namespace {

absl::Status ValidateThroughput(const Experiment& e) {
  MEMWALL_RETURN_IF_ERROR(ValidateLadder(e, {.traces = true, .micro_batches = true}));
  const OffloadSweep& o = e.offload();
  if (RunsDpu(o) && o.warmup_steps() < o.dpu_after_steps() + 1) {
    return BadField("offload.warmup_steps", o.warmup_steps(),
                    absl::StrCat("must be >= offload.dpu_after_steps + 1 = ", o.dpu_after_steps() + 1,
                            " so that every timed OFFLOAD_DPU step has a delayed update under it"));
  }
  return absl::OkStatus();
}

// One rank, in this process.
absl::Status DriveThroughput(const Experiment& e, const RunContext& run) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string dir, ResultsDir(e, run));
  Provenance p = ProvenanceOf(e, run);
  const std::string budget = FormatBytes(size_t(e.offload().device_memory_bytes()));
  const std::string traces = e.offload().write_traces() ? dir + "/traces" : "";
  if (!traces.empty()) std::filesystem::remove_all(traces);
  MEMWALL_ASSIGN_OR_RETURN(const std::vector<OffloadRow> rows,
                           MeasureThroughput(e, traces, PartialCsv(dir, kThroughputCsvHeader, ThroughputCsv)));
  MEMWALL_RETURN_IF_ERROR(CompleteCsv(dir, kThroughputCsvHeader, ThroughputCsv, rows));
  p.measured_or_modeled = absl::StrCat(
      "measured on ", e.device() == "cuda" ? "a GPU (cuda:0)" : "a CpuDevice", " with a ", budget,
      " budget, one rank, each model at the micro-batch in data.csv",
      e.offload().halve_micro_batch_to_fit() ? " (its listed one, halved until it fit)" : "",
      ": means over the timed steps after ", e.offload().warmup_steps(), " warm-up steps; tflops = model FLOPs (3 x forward: 6 x params + attention, "
      "per token) / step time; gemm_tflops = ops::Matmul on the same device for the model's (tokens, d) x "
      "(d, 4d) on a device of its own, the faster of before and after the model's runs (fastest of >= 9 "
      "calls each); device_idle_fraction = time the compute stream ran no zone, from the timeline. ",
      e.device() == "cuda" ? "The host side (CPU Adam, gradient accumulation) ran on the GPU machine's CPU; machine below"
                           : "Absolute rates on the CpuDevice are not a GPU's: compare ratios (mode to stage 0, TFLOPS to the GEMM rate)");
  p.files["data.csv"] = "one row per (ladder model, mode)";
  if (!traces.empty()) p.files["traces/"] = "<model>_<mode>/step_<k>.json: each step's zones, Chrome trace format (Perfetto)";
  // The provenance before the figure: a GPU machine may have no matplotlib,
  // and the measurement must survive that (the figure can be drawn later).
  MEMWALL_RETURN_IF_ERROR(WriteProvenance(dir + "/provenance.json", p));
  MEMWALL_RETURN_IF_ERROR(RunFigureScript(run.figure_script,
                                          {dir + "/data.csv", dir + "/figure.png"}));
  std::printf("wrote %s/\n", dir.c_str());
  return absl::OkStatus();
}

}  // namespace

const ExperimentKind kOffloadThroughputKind = {
    Experiment::OFFLOAD_THROUGHPUT, "repro/offload/throughput/figure.py", kOffload, /*cuda=*/true,
    /*offload_in_training=*/false, FillOffloadModes, ValidateThroughput, DriveThroughput};

}  // namespace memwall::repro
