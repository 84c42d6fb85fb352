#include "repro/drivers.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "repro/harness.h"
#include "repro/memory_table.h"
#include "repro/offload.h"
#include "repro/partition.h"
#include "repro/zero_memory.h"
#include "runtime/files.h"
#include "runtime/memory.h"
#include "runtime/provenance.h"
#include "runtime/status.h"

namespace memwall::repro {
namespace {

// results/<name>/, created.
absl::StatusOr<std::string> ResultsDir(const Experiment& e, const RunContext& run) {
  const std::string dir = absl::StrCat(run.results_root, "/", e.name());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  std::printf("%s: %s\n", e.name().c_str(), e.description().c_str());
  return dir;
}

Provenance ProvenanceOf(const Experiment& e, const RunContext& run) {
  Provenance p;
  p.experiment = e.name();
  p.description = e.description();
  p.paper = e.paper();
  p.command = run.command;
  p.files = {{"figure.png", absl::StrCat("drawn by ", run.figure_script, " from data.csv")},
             {"experiment", std::filesystem::path(run.experiment_path).lexically_relative(WorkspaceDir()).string()}};
  return p;
}

// Every world size of the sweep, in order: world size 1 in this process,
// the others as `mpirun -np N` of this binary with --worker, rank 0 writing
// its rows to a file in `dir` that is read back. Their CSV rows.
absl::StatusOr<std::string> SweepWorldSizes(const Experiment& e, const RunContext& run, const std::string& dir,
                                            const MeasureRowsFn& measure_rows) {
  std::string csv;
  for (size_t i = 0; i < static_cast<size_t>(e.world_sizes_size()); ++i) {
    const int world = e.world_sizes(i);
    std::printf("[%zu/%d] %d rank%s%s\n", i + 1, e.world_sizes_size(), world, world == 1 ? "" : "s",
                e.stages().empty() ? "" : absl::StrCat(", stages ", absl::StrJoin(e.stages(), ", ")).c_str());
    std::fflush(stdout);
    if (world == 1) {
      MEMWALL_ASSIGN_OR_RETURN(const std::string rows, measure_rows(e, 1));
      csv += rows;
      continue;
    }
    const std::string rows_file = absl::StrCat(dir, "/.rows_np", world, ".csv");
    MEMWALL_ASSIGN_OR_RETURN(const std::string self, SelfPath());
    MEMWALL_RETURN_IF_ERROR(LaunchRanks(
        world, {self, run.experiment_path, "--worker",
                absl::StrCat("--world_size=", world), absl::StrCat("--rows_out=", rows_file)}));
    std::ifstream in(rows_file);
    if (!in) return absl::InternalError(absl::StrCat("the ", world, "-rank run wrote no rows to ", rows_file));
    std::stringstream text;
    text << in.rdbuf();
    csv += text.str();
    std::error_code ec;
    std::filesystem::remove(rows_file, ec);
  }
  return csv;
}

// One rank, in this process: the ladder walked per mode (`infinity`: ZeRO-
// Infinity's modes and summary).
absl::Status DriveMaxModel(const Experiment& e, const RunContext& run, bool infinity) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string dir, ResultsDir(e, run));
  Provenance p = ProvenanceOf(e, run);
  const std::string budget = FormatBytes(size_t(e.offload().device_memory_bytes()));
  MEMWALL_ASSIGN_OR_RETURN(const std::vector<OffloadRow> rows, MeasureMaxModel(e));
  std::string csv = absl::StrCat(kMaxModelCsvHeader, "\n");
  for (const OffloadRow& r : rows) absl::StrAppend(&csv, MaxModelCsv(r), "\n");
  const std::string summary = infinity ? InfinityMaxModelSummaryCsv(rows) : MaxModelSummaryCsv(rows);
  MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/data.csv", csv));
  MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/summary.csv", summary));
  const std::string budgets =
      e.offload().host_pinned_memory_bytes() > 0
          ? absl::StrCat(budget, " device budget and a ", FormatBytes(size_t(e.offload().host_pinned_memory_bytes())),
                         " pinned host budget")
          : absl::StrCat(budget, " budget");
  std::printf("largest model per mode (%s):\n%s", budgets.c_str(), summary.c_str());
  p.measured_or_modeled = absl::StrCat(
      "data.csv: measured, every row an attempt on a fresh CpuDevice with a ", budgets, " (one rank, no MPI",
      infinity ? "; stage3+nvme's swap files on the machine's disk" : "",
      "): fits = every training step completed; peaks from the device's and the pinned host allocator's "
      "accounts. summary.csv: source=measured rows derived from data.csv; source=paper rows are ",
      infinity ? "ZeRO-Infinity §8.1, Figure 6a (one DGX-2: ZeRO-3 20B, ZeRO-Inf-CPU 70B, ZeRO-Inf-NVMe 1T; here "
                 "stage3+offload+params and stage3+nvme+nvme-params)"
               : "ZeRO-Offload §6.2.1 (one 32 GB V100: PyTorch 1.4B, ZeRO-Offload 13B)");
  p.files["data.csv"] = "one row per (mode, ladder model) attempted; a mode stops at its first model that does not fit";
  p.files["summary.csv"] = absl::StrCat("per mode the largest model that trained and its size over ",
                                        infinity ? "stage3+offload" : "stage 0", "'s");
  // The provenance before the figure: a GPU machine may have no matplotlib,
  // and the measurement must survive that (the figure can be drawn later).
  MEMWALL_RETURN_IF_ERROR(WriteProvenance(dir + "/provenance.json", p));
  MEMWALL_RETURN_IF_ERROR(RunFigureScript(run.figure_script,
                                          {dir + "/data.csv", dir + "/figure.png"}));
  std::printf("wrote %s/\n", dir.c_str());
  return absl::OkStatus();
}

// INFINITY_PREFETCH and INFINITY_ACTIVATION_OFFLOAD: one rank, each model
// without and with the feature.
absl::Status DrivePaired(const Experiment& e, const RunContext& run, bool prefetch) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string dir, ResultsDir(e, run));
  MEMWALL_ASSIGN_OR_RETURN(const std::vector<OffloadRow> rows, MeasurePaired(e));
  std::string csv = absl::StrCat(kThroughputCsvHeader, "\n");
  for (const OffloadRow& r : rows) absl::StrAppend(&csv, ThroughputCsv(r), "\n");
  const std::string summary = PairedSummaryCsv(rows);
  MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/data.csv", csv));
  MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/summary.csv", summary));
  std::printf("with the feature over without, per model:\n%s", summary.c_str());
  MEMWALL_RETURN_IF_ERROR(RunFigureScript(run.figure_script, {dir + "/data.csv", dir + "/figure.png"}));
  Provenance p = ProvenanceOf(e, run);
  p.measured_or_modeled = absl::StrCat(
      "measured on a CpuDevice (cpu:0), one rank, ", ModeName(e.offload().modes(0)), ": per model ",
      e.offload().warmup_steps(), " untimed then ", e.steps(), " timed steps ",
      prefetch ? "with zero.prefetch_bucket_bytes = 0 (no prefetch) and then with the experiment's"
               : "with the activation checkpoints on the device and then offloaded to pinned host memory",
      "; tokens/s over the timed steps, device and pinned host peaks from the allocators' accounts, the device-idle "
      "fraction from the timeline. Absolute rates on the CpuDevice are not a GPU's: compare the ratios. The paper's "
      "figure (ZeRO-Infinity §8.1) has no rows here: its gain comes from PCIe and NVMe links a CpuDevice does not have");
  p.files["data.csv"] = "one row per (model, without / with the feature), OFFLOAD_THROUGHPUT's columns";
  p.files["summary.csv"] = "per model: throughput and device peak with the feature over without";
  MEMWALL_RETURN_IF_ERROR(WriteProvenance(dir + "/provenance.json", p));
  std::printf("wrote %s/{data.csv, summary.csv, figure.png, provenance.json}\n", dir.c_str());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> MeasureZeroMemoryRows(const Experiment& e, int world) {
  std::string csv;
  MEMWALL_ASSIGN_OR_RETURN(const std::vector<MemoryRow> rows, MeasureZeroMemory(e, world));
  for (const MemoryRow& r : rows) absl::StrAppend(&csv, ToCsv(r), "\n");
  return csv;
}

absl::StatusOr<std::string> MeasurePartitionRows(const Experiment& e, int world) {
  std::string csv;
  MEMWALL_ASSIGN_OR_RETURN(const std::vector<PartitionRow> rows, MeasurePartitioning(e, world));
  for (const PartitionRow& r : rows) absl::StrAppend(&csv, PartitionCsv(r), "\n");
  return csv;
}

absl::Status DriveOffloadMaxModel(const Experiment& e, const RunContext& run) {
  return DriveMaxModel(e, run, /*infinity=*/false);
}

absl::Status DriveInfinityMaxModel(const Experiment& e, const RunContext& run) {
  return DriveMaxModel(e, run, /*infinity=*/true);
}

absl::Status DrivePrefetch(const Experiment& e, const RunContext& run) {
  return DrivePaired(e, run, /*prefetch=*/true);
}

absl::Status DriveActivationOffload(const Experiment& e, const RunContext& run) {
  return DrivePaired(e, run, /*prefetch=*/false);
}

absl::Status DriveZeroMemory(const Experiment& e, const RunContext& run) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string dir, ResultsDir(e, run));
  MEMWALL_ASSIGN_OR_RETURN(const std::string rows, SweepWorldSizes(e, run, dir, MeasureZeroMemoryRows));
  std::string csv = absl::StrCat(kMemoryCsvHeader, "\n", rows);
  MEMWALL_ASSIGN_OR_RETURN(std::vector<MemoryRow> modeled, ModelZeroMemory(e));
  for (const MemoryRow& r : modeled) absl::StrAppend(&csv, ToCsv(r), "\n");
  MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/data.csv", csv));

  MEMWALL_RETURN_IF_ERROR(RunFigureScript(run.figure_script,
                                          {dir + "/data.csv", dir + "/figure.png"}));
  Provenance p = ProvenanceOf(e, run);
  p.measured_or_modeled =
      "part=sweep: source=measured rows are measured on the CpuDevice (peak bytes per tag after the "
      "training steps, rank 0); source=estimator and source=paper rows are modeled (engine/estimate.h; "
      "ZeRO §5.1's formula). part=modeled: modeled only (estimator, formula, and the figure's printed "
      "values as source=paper_figure)";
  p.files["data.csv"] = "one row per (part, stage, ranks, source); bytes per rank";
  MEMWALL_RETURN_IF_ERROR(WriteProvenance(dir + "/provenance.json", p));
  std::printf("wrote %s/{data.csv, figure.png, provenance.json}\n", dir.c_str());
  return absl::OkStatus();
}



// One rank, in this process.
absl::Status DriveThroughput(const Experiment& e, const RunContext& run) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string dir, ResultsDir(e, run));
  Provenance p = ProvenanceOf(e, run);
  const std::string budget = FormatBytes(size_t(e.offload().device_memory_bytes()));
  const std::string traces = e.offload().write_traces() ? dir + "/traces" : "";
  if (!traces.empty()) std::filesystem::remove_all(traces);
  MEMWALL_ASSIGN_OR_RETURN(const std::vector<OffloadRow> rows, MeasureThroughput(e, traces));
  std::string csv = absl::StrCat(kThroughputCsvHeader, "\n");
  for (const OffloadRow& r : rows) absl::StrAppend(&csv, ThroughputCsv(r), "\n");
  MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/data.csv", csv));
  p.measured_or_modeled = absl::StrCat(
      "measured on ", e.device() == "cuda" ? "a GPU (cuda:0)" : "a CpuDevice", " with a ", budget,
      " budget, one rank: means over the timed steps after ",
      e.offload().warmup_steps(), " warm-up steps; tflops = model FLOPs (3 x forward: 6 x params + attention, "
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

absl::Status DrivePartition(const Experiment& e, const RunContext& run) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string dir, ResultsDir(e, run));
  MEMWALL_ASSIGN_OR_RETURN(const std::string rows, SweepWorldSizes(e, run, dir, MeasurePartitionRows));
  MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/data.csv", absl::StrCat(kPartitionCsvHeader, "\n", rows)));
  MEMWALL_RETURN_IF_ERROR(RunFigureScript(run.figure_script, {dir + "/data.csv", dir + "/figure.png"}));
  Provenance p = ProvenanceOf(e, run);
  p.measured_or_modeled = absl::StrCat(
      "measured: each world size's ranks are processes on this machine (mpirun above one), each with its own "
      "CpuDevice; ZeRO-3 with offload_param and offload_optimizer on the CPU; one warm-up step, then ",
      e.steps(), " timed steps averaged; rank 0's timeline: gathered bytes and the time of its \"param fetch\" "
      "and \"param gather\" zones on the collective stream. The paper's Figure 6c (DGX-2 V100s, PCIe and "
      "NVMe) has no rows here: its gain is each GPU's own host link serving every gather, which a CpuDevice "
      "in one memory does not have");
  p.files["data.csv"] = "one row per (world size, partitioning)";
  MEMWALL_RETURN_IF_ERROR(WriteProvenance(dir + "/provenance.json", p));
  std::printf("wrote %s/{data.csv, figure.png, provenance.json}\n", dir.c_str());
  return absl::OkStatus();
}

absl::Status DriveTiling(const Experiment& e, const RunContext& run) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string dir, ResultsDir(e, run));
  MEMWALL_ASSIGN_OR_RETURN(const std::vector<TilingRow> rows, MeasureTiling(e));
  std::string csv = absl::StrCat(kTilingCsvHeader, "\n");
  for (const TilingRow& r : rows) absl::StrAppend(&csv, TilingCsv(r), "\n");
  const std::string summary = TilingSummaryCsv(rows);
  MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/data.csv", csv));
  MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/summary.csv", summary));
  std::printf("largest hidden size per tiling factor:\n%s", summary.c_str());
  MEMWALL_RETURN_IF_ERROR(RunFigureScript(run.figure_script, {dir + "/data.csv", dir + "/figure.png"}));
  Provenance p = ProvenanceOf(e, run);
  p.measured_or_modeled = absl::StrCat(
      "data.csv source=measured: every row an attempt on a fresh CpuDevice (cpu:0) with a ",
      FormatBytes(size_t(e.offload().device_memory_bytes())), " device budget, one rank, ",
      ModeName(e.offload().modes(0)), ", the model's projections tiled by the row's factor; fits = every training "
      "step completed; peaks from the allocators' accounts. source=estimator: engine/estimate.h's totals and "
      "verdict under the same budgets, nothing run. summary.csv: the largest hidden size per (factor, source) "
      "below its first refusal, and the paper's one-V100 points (ZeRO-Infinity §8.1, Figure 6b: 8K untiled, 64K "
      "at factor 16)");
  p.files["data.csv"] = "per tiling factor: the estimator's verdict on every ladder model it divides, then the measured walk";
  p.files["summary.csv"] = "per (tiling factor, source) the largest hidden size and its ratio to the untiled one";
  MEMWALL_RETURN_IF_ERROR(WriteProvenance(dir + "/provenance.json", p));
  std::printf("wrote %s/{data.csv, summary.csv, figure.png, provenance.json}\n", dir.c_str());
  return absl::OkStatus();
}


// INFINITY_MEMORY: modeled only, in this process.
absl::Status DriveMemoryTable(const Experiment& e, const RunContext& run) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string dir, ResultsDir(e, run));
  MEMWALL_ASSIGN_OR_RETURN(const std::vector<MemoryTableRow> rows,
                           ModelMemoryTable(e, WorkspaceDir() + "/models/configs/papers.textproto"));
  std::string csv = absl::StrCat(kMemoryTableCsvHeader, "\n");
  for (const MemoryTableRow& r : rows) {
    absl::StrAppend(&csv, MemoryTableCsv(r), "\n");
    std::printf("%-16s %-26s %-14s model states %s, device/rank %s, host/rank %s, NVMe/rank %s\n", r.model.c_str(),
                r.placement.c_str(), r.source.c_str(), FormatBytes(size_t(r.model_states_total)).c_str(),
                r.device_per_rank < 0 ? "-" : FormatBytes(size_t(r.device_per_rank)).c_str(),
                r.host_per_rank < 0 ? "-" : FormatBytes(size_t(r.host_per_rank)).c_str(),
                r.nvme_per_rank < 0 ? "-" : FormatBytes(size_t(r.nvme_per_rank)).c_str());
  }
  MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/data.csv", csv));
  MEMWALL_RETURN_IF_ERROR(RunFigureScript(run.figure_script, {dir + "/data.csv", dir + "/figure.png"}));
  Provenance p = ProvenanceOf(e, run);
  p.measured_or_modeled = absl::StrCat(
      "modeled, nothing run: source=estimator rows are engine/estimate.h over ", e.memory_table().ranks(),
      " ranks at micro_batch ", e.training().micro_batch(), " x seq ", e.training().seq(),
      " (the plans the engine allocates from); source=paper formula rows are ZeRO-Infinity §3's formulas "
      "(the paper's numbers) on the same shapes. The figure's printed values are not in this repository, so "
      "no row copies them");
  p.files["data.csv"] = "per model: the formula row, then one estimator row per placement; bytes";
  MEMWALL_RETURN_IF_ERROR(WriteProvenance(dir + "/provenance.json", p));
  std::printf("wrote %s/{data.csv, figure.png, provenance.json}\n", dir.c_str());
  return absl::OkStatus();
}

// ZERO_MAX_MODEL: modeled only, in this process.
absl::Status DriveMaxModelTable(const Experiment& e, const RunContext& run) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string dir, ResultsDir(e, run));
  MEMWALL_ASSIGN_OR_RETURN(const std::vector<MaxModelTableRow> rows, ZeroMaxModelTable(e));
  std::string csv = absl::StrCat(kMaxModelTableCsvHeader, "\n");
  for (const MaxModelTableRow& r : rows) {
    absl::StrAppend(&csv, MaxModelTableCsv(r), "\n");
    std::printf("MP %-3lld %5lld GPUs  stage %d  %-24s %8.1fB parameters (%.4f bytes each per device)\n",
                (long long)r.model_parallel, (long long)r.gpus, r.stage, r.source.c_str(), r.max_params / 1e9,
                r.bytes_per_param);
  }
  MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/data.csv", csv));
  MEMWALL_RETURN_IF_ERROR(RunFigureScript(run.figure_script, {dir + "/data.csv", dir + "/figure.png"}));
  Provenance p = ProvenanceOf(e, run);
  p.measured_or_modeled = absl::StrCat(
      "modeled, nothing run: source=estimator rows are the largest model whose per-device model states (source="
      "estimator with buckets: whole plan, buckets included) from engine/estimate.h fit ",
      e.max_model_table().device_bytes(), " bytes, the model split over MP ranks and partitioned over ",
      e.max_model_table().data_parallel(), " data-parallel ranks, found by bisection; source=paper formula rows are "
      "ZeRO §5.1's 16, 4+12/N_d, 2+14/N_d and 16/N_d bytes per parameter, which give "
      "ZeRO Table 2's theoretical columns");
  p.files["data.csv"] = "per MP degree and stage: the formula row, then the estimator's without and with buckets";
  MEMWALL_RETURN_IF_ERROR(WriteProvenance(dir + "/provenance.json", p));
  std::printf("wrote %s/{data.csv, figure.png, provenance.json}\n", dir.c_str());
  return absl::OkStatus();
}

}  // namespace memwall::repro
