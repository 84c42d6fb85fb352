// //repro:run: runs one experiment (repro/experiments/*.textproto) and
// writes results/<name>/{data.csv, figure.png, provenance.json}.
//
//   ./bazelw run //repro:run -- repro/experiments/zero_memory.textproto
//   ./bazelw run //repro:zero_memory          (the same, named)
//   ./bazelw run //repro:offload_max_model    (ZeRO-Offload Figure 7)
//   ./bazelw run //repro:offload_throughput   (ZeRO-Offload Figure 8)
//   ./bazelw run //repro:infinity_max_model   (ZeRO-Infinity Figure 6a)
//   ./bazelw run //repro:infinity_partition   (ZeRO-Infinity Figure 6c)
//
// Flags: --results_dir=DIR (default: <workspace>/results). World sizes > 1
// are launched as `mpirun -np N` of this binary with --worker, each
// rank 0 writing its rows to a file the driver merges; world size 1 runs in
// this process, without MPI. Exits 0 on success, 1 when a run fails, 2 on a
// bad experiment file.
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "repro/experiment.h"
#include "repro/harness.h"
#include "repro/memory_table.h"
#include "repro/offload.h"
#include "repro/partition.h"
#include "repro/zero_memory.h"
#include "runtime/files.h"
#include "runtime/launch.h"
#include "runtime/memory.h"
#include "runtime/status.h"

ABSL_FLAG(std::string, results_dir, "", "where results/<experiment>/ goes (default: <workspace>/results)");
ABSL_FLAG(bool, worker, false, "internal: one world size of the sweep, under mpirun");
ABSL_FLAG(int32_t, world_size, 1, "internal: the world size a --worker was launched for");
ABSL_FLAG(std::string, rows_out, "", "internal: where a --worker's rank 0 writes its CSV rows");

namespace memwall::repro {
namespace {

// One world size of a multi-rank sweep (ZERO_MEMORY, INFINITY_PARTITION)
// on this process's communicator: rank 0's CSV rows, other ranks' none.
absl::StatusOr<std::string> MeasureRows(const Experiment& e, int world) {
  std::string csv;
  if (e.kind() == Experiment::INFINITY_PARTITION) {
    MEMWALL_ASSIGN_OR_RETURN(const std::vector<PartitionRow> rows, MeasurePartitioning(e, world));
    for (const PartitionRow& r : rows) absl::StrAppend(&csv, PartitionCsv(r), "\n");
  } else {
    MEMWALL_ASSIGN_OR_RETURN(const std::vector<MemoryRow> rows, MeasureZeroMemory(e, world));
    for (const MemoryRow& r : rows) absl::StrAppend(&csv, ToCsv(r), "\n");
  }
  return csv;
}

absl::Status Worker(const Experiment& e) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string csv, MeasureRows(e, absl::GetFlag(FLAGS_world_size)));
  if (!csv.empty()) MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(absl::GetFlag(FLAGS_rows_out), csv));
  return absl::OkStatus();
}

// results/<name>/, created.
absl::StatusOr<std::string> ResultsDir(const Experiment& e) {
  const std::string results =
      absl::GetFlag(FLAGS_results_dir).empty() ? WorkspaceDir() + "/results" : UserPath(absl::GetFlag(FLAGS_results_dir), std::getenv);
  const std::string dir = absl::StrCat(results, "/", e.name());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  std::printf("%s: %s\n", e.name().c_str(), e.description().c_str());
  return dir;
}

// The figure script: repro/figures/<kind in lower case>.py, e.g.
// offload_max_model.py for OFFLOAD_MAX_MODEL (a CI-sized experiment shares
// its kind's script).
std::string FigureScript(const Experiment& e) {
  std::string kind = Experiment::Kind_Name(e.kind());
  for (char& ch : kind) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return absl::StrCat("repro/figures/", kind, ".py");
}

Provenance ProvenanceOf(const Experiment& e, const std::string& experiment_path, const std::string& command) {
  Provenance p;
  p.experiment = e.name();
  p.description = e.description();
  p.paper = e.paper();
  p.command = command;
  p.files = {{"figure.png", absl::StrCat("drawn by ", FigureScript(e), " from data.csv")},
             {"experiment", std::filesystem::path(experiment_path).lexically_relative(WorkspaceDir()).string()}};
  return p;
}

// Every world size of the sweep, in order: world size 1 in this process,
// the others as `mpirun -np N` of this binary with --worker, rank 0 writing
// its rows to a file in `dir` that is read back. Their CSV rows.
absl::StatusOr<std::string> SweepWorldSizes(const Experiment& e, const std::string& experiment_path,
                                            const std::string& dir) {
  std::string csv;
  for (size_t i = 0; i < static_cast<size_t>(e.world_sizes_size()); ++i) {
    const int world = e.world_sizes(i);
    std::printf("[%zu/%d] %d rank%s%s\n", i + 1, e.world_sizes_size(), world, world == 1 ? "" : "s",
                e.stages().empty() ? "" : absl::StrCat(", stages ", absl::StrJoin(e.stages(), ", ")).c_str());
    std::fflush(stdout);
    if (world == 1) {
      MEMWALL_ASSIGN_OR_RETURN(const std::string rows, MeasureRows(e, 1));
      csv += rows;
      continue;
    }
    const std::string rows_file = absl::StrCat(dir, "/.rows_np", world, ".csv");
    MEMWALL_ASSIGN_OR_RETURN(const std::string self, SelfPath());
    MEMWALL_RETURN_IF_ERROR(LaunchRanks(
        world, {self, std::filesystem::absolute(experiment_path).string(), "--worker",
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

absl::Status DriveZeroMemory(const Experiment& e, const std::string& experiment_path, const std::string& command) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string dir, ResultsDir(e));
  MEMWALL_ASSIGN_OR_RETURN(const std::string rows, SweepWorldSizes(e, experiment_path, dir));
  std::string csv = absl::StrCat(kMemoryCsvHeader, "\n", rows);
  MEMWALL_ASSIGN_OR_RETURN(std::vector<MemoryRow> modeled, ModelZeroMemory(e));
  for (const MemoryRow& r : modeled) absl::StrAppend(&csv, ToCsv(r), "\n");
  MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/data.csv", csv));

  MEMWALL_RETURN_IF_ERROR(RunFigureScript(FigureScript(e),
                                          {dir + "/data.csv", dir + "/figure.png"}));
  Provenance p = ProvenanceOf(e, experiment_path, command);
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

// OFFLOAD_MAX_MODEL, OFFLOAD_THROUGHPUT and INFINITY_MAX_MODEL: one rank,
// in this process.
absl::Status DriveOffload(const Experiment& e, const std::string& experiment_path, const std::string& command) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string dir, ResultsDir(e));
  Provenance p = ProvenanceOf(e, experiment_path, command);
  const std::string budget = FormatBytes(size_t(e.offload().device_memory_bytes()));
  if (e.kind() == Experiment::OFFLOAD_MAX_MODEL || e.kind() == Experiment::INFINITY_MAX_MODEL) {
    const bool infinity = e.kind() == Experiment::INFINITY_MAX_MODEL;
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
  } else {
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
  }
  // The provenance before the figure: a GPU machine may have no matplotlib,
  // and the measurement must survive that (the figure can be drawn later).
  MEMWALL_RETURN_IF_ERROR(WriteProvenance(dir + "/provenance.json", p));
  MEMWALL_RETURN_IF_ERROR(RunFigureScript(FigureScript(e),
                                          {dir + "/data.csv", dir + "/figure.png"}));
  std::printf("wrote %s/\n", dir.c_str());
  return absl::OkStatus();
}

absl::Status DrivePartition(const Experiment& e, const std::string& experiment_path, const std::string& command) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string dir, ResultsDir(e));
  MEMWALL_ASSIGN_OR_RETURN(const std::string rows, SweepWorldSizes(e, experiment_path, dir));
  MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/data.csv", absl::StrCat(kPartitionCsvHeader, "\n", rows)));
  MEMWALL_RETURN_IF_ERROR(RunFigureScript(FigureScript(e), {dir + "/data.csv", dir + "/figure.png"}));
  Provenance p = ProvenanceOf(e, experiment_path, command);
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

absl::Status DriveTiling(const Experiment& e, const std::string& experiment_path, const std::string& command) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string dir, ResultsDir(e));
  MEMWALL_ASSIGN_OR_RETURN(const std::vector<TilingRow> rows, MeasureTiling(e));
  std::string csv = absl::StrCat(kTilingCsvHeader, "\n");
  for (const TilingRow& r : rows) absl::StrAppend(&csv, TilingCsv(r), "\n");
  const std::string summary = TilingSummaryCsv(rows);
  MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/data.csv", csv));
  MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/summary.csv", summary));
  std::printf("largest hidden size per tiling factor:\n%s", summary.c_str());
  MEMWALL_RETURN_IF_ERROR(RunFigureScript(FigureScript(e), {dir + "/data.csv", dir + "/figure.png"}));
  Provenance p = ProvenanceOf(e, experiment_path, command);
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

// INFINITY_PREFETCH and INFINITY_ACTIVATION_OFFLOAD: one rank, each model
// without and with the feature.
absl::Status DrivePaired(const Experiment& e, const std::string& experiment_path, const std::string& command) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string dir, ResultsDir(e));
  MEMWALL_ASSIGN_OR_RETURN(const std::vector<OffloadRow> rows, MeasurePaired(e));
  std::string csv = absl::StrCat(kThroughputCsvHeader, "\n");
  for (const OffloadRow& r : rows) absl::StrAppend(&csv, ThroughputCsv(r), "\n");
  const std::string summary = PairedSummaryCsv(rows);
  MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/data.csv", csv));
  MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/summary.csv", summary));
  std::printf("with the feature over without, per model:\n%s", summary.c_str());
  MEMWALL_RETURN_IF_ERROR(RunFigureScript(FigureScript(e), {dir + "/data.csv", dir + "/figure.png"}));
  const bool prefetch = e.kind() == Experiment::INFINITY_PREFETCH;
  Provenance p = ProvenanceOf(e, experiment_path, command);
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

// INFINITY_MEMORY: modeled only, in this process.
absl::Status DriveMemoryTable(const Experiment& e, const std::string& experiment_path, const std::string& command) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string dir, ResultsDir(e));
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
  MEMWALL_RETURN_IF_ERROR(RunFigureScript(FigureScript(e), {dir + "/data.csv", dir + "/figure.png"}));
  Provenance p = ProvenanceOf(e, experiment_path, command);
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
absl::Status DriveMaxModelTable(const Experiment& e, const std::string& experiment_path, const std::string& command) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string dir, ResultsDir(e));
  MEMWALL_ASSIGN_OR_RETURN(const std::vector<MaxModelTableRow> rows, ZeroMaxModelTable(e));
  std::string csv = absl::StrCat(kMaxModelTableCsvHeader, "\n");
  for (const MaxModelTableRow& r : rows) {
    absl::StrAppend(&csv, MaxModelTableCsv(r), "\n");
    std::printf("MP %-3lld %5lld GPUs  stage %d  %-24s %8.1fB parameters (%.4f bytes each per device)\n",
                (long long)r.model_parallel, (long long)r.gpus, r.stage, r.source.c_str(), r.max_params / 1e9,
                r.bytes_per_param);
  }
  MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/data.csv", csv));
  MEMWALL_RETURN_IF_ERROR(RunFigureScript(FigureScript(e), {dir + "/data.csv", dir + "/figure.png"}));
  Provenance p = ProvenanceOf(e, experiment_path, command);
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

absl::Status Drive(const Experiment& e, const std::string& experiment_path, const std::string& command) {
  if (e.kind() == Experiment::INFINITY_MEMORY) return DriveMemoryTable(e, experiment_path, command);
  if (e.kind() == Experiment::ZERO_MAX_MODEL) return DriveMaxModelTable(e, experiment_path, command);
  if (e.kind() == Experiment::INFINITY_TILING) return DriveTiling(e, experiment_path, command);
  if (e.kind() == Experiment::INFINITY_PREFETCH || e.kind() == Experiment::INFINITY_ACTIVATION_OFFLOAD) {
    return DrivePaired(e, experiment_path, command);
  }
  if (e.kind() == Experiment::ZERO_MEMORY) return DriveZeroMemory(e, experiment_path, command);
  if (e.kind() == Experiment::INFINITY_PARTITION) return DrivePartition(e, experiment_path, command);
  return DriveOffload(e, experiment_path, command);
}

}  // namespace
}  // namespace memwall::repro

int main(int argc, char** argv) {
  using namespace memwall::repro;
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() != 2) {
    std::fprintf(stderr, "usage: run EXPERIMENT.textproto [--results_dir=DIR]\n");
    return 2;
  }
  std::error_code ec;  // a path that cannot be examined: LoadExperiment says why
  const std::string user_path = memwall::UserPath(positional[1], std::getenv);
  const std::string path = std::filesystem::exists(user_path, ec) ? user_path : positional[1];
  auto experiment = LoadExperiment(path);
  if (!experiment.ok()) {
    std::fprintf(stderr, "run: %s\n", std::string(experiment.status().message()).c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_worker) && experiment->kind() != Experiment::ZERO_MEMORY &&
      experiment->kind() != Experiment::INFINITY_PARTITION) {
    std::fprintf(stderr, "run: --worker is for the multi-rank sweeps (ZERO_MEMORY, INFINITY_PARTITION); %s runs one rank\n",
                 Experiment::Kind_Name(experiment->kind()).c_str());
    return 2;
  }
  // The command that regenerates this, as a user types it: a named target
  // (//repro:zero_memory) has its experiment file built in, //repro:run is
  // given it; tools/gpu_bundle.sh's repro_run on a GPU machine (its env.sh
  // sets MEMWALL_COMMIT), the command line itself.
  std::vector<std::string> args(argv, argv + argc);
  const std::string target = std::filesystem::path(args[0]).filename().string();
  const auto given = args.begin() + std::min<size_t>(args.size(), target == "run" ? 1 : 2);
  std::string command = absl::StrCat("./bazelw run //repro:", target);
  if (given < args.end()) absl::StrAppend(&command, " -- ", absl::StrJoin(given, args.end(), " "));
  if (std::getenv("MEMWALL_COMMIT") != nullptr) command = absl::StrJoin(args, " ");
  const absl::Status st = absl::GetFlag(FLAGS_worker)
                              ? Worker(*experiment)
                              : Drive(*experiment, std::filesystem::absolute(path).string(),
                                      command);
  if (!st.ok()) {
    std::fprintf(stderr, "run: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
