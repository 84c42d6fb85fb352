// //repro:run: runs one experiment (repro/experiments/*.textproto) and
// writes results/<name>/{data.csv, figure.png, provenance.json}.
//
//   ./bazelw run //repro:run -- repro/experiments/zero_memory.textproto
//   ./bazelw run //repro:zero_memory          (the same, named)
//
// Flags: --results_dir=DIR (default: <workspace>/results). World sizes > 1
// are launched as `mpirun -np N` of this binary with --worker, each
// rank 0 writing its rows to a file the driver merges; world size 1 runs in
// this process, without MPI. Exits 0 on success, 1 when a run fails, 2 on a
// bad experiment file.
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
#include "repro/zero_memory.h"
#include "runtime/files.h"
#include "runtime/launch.h"
#include "runtime/status.h"

ABSL_FLAG(std::string, results_dir, "", "where results/<experiment>/ goes (default: <workspace>/results)");
ABSL_FLAG(bool, worker, false, "internal: one world size of the sweep, under mpirun");
ABSL_FLAG(int32_t, world_size, 1, "internal: the world size a --worker was launched for");
ABSL_FLAG(std::string, rows_out, "", "internal: where a --worker's rank 0 writes its CSV rows");

namespace memwall::repro {
namespace {

absl::Status WriteRows(const std::string& path, const std::vector<MemoryRow>& rows) {
  std::string csv;
  for (const MemoryRow& r : rows) absl::StrAppend(&csv, ToCsv(r), "\n");
  return WriteFileAtomically(path, csv);
}

absl::Status Worker(const Experiment& e) {
  const int world = absl::GetFlag(FLAGS_world_size);
  MEMWALL_ASSIGN_OR_RETURN(std::vector<MemoryRow> rows, MeasureZeroMemory(e, world));
  if (!rows.empty()) MEMWALL_RETURN_IF_ERROR(WriteRows(absl::GetFlag(FLAGS_rows_out), rows));
  return absl::OkStatus();
}

absl::Status Drive(const Experiment& e, const std::string& experiment_path, const std::string& command) {
  const std::string results =
      absl::GetFlag(FLAGS_results_dir).empty() ? WorkspaceDir() + "/results" : UserPath(absl::GetFlag(FLAGS_results_dir), std::getenv);
  const std::string dir = absl::StrCat(results, "/", e.name());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  std::printf("%s: %s\n", e.name().c_str(), e.description().c_str());

  std::string csv = absl::StrCat(kMemoryCsvHeader, "\n");
  for (size_t i = 0; i < static_cast<size_t>(e.world_sizes_size()); ++i) {
    const int world = e.world_sizes(i);
    std::printf("[%zu/%d] %d rank%s, stages %s\n", i + 1, e.world_sizes_size(), world, world == 1 ? "" : "s",
                absl::StrJoin(e.stages(), ", ").c_str());
    std::fflush(stdout);
    std::vector<MemoryRow> rows;
    if (world == 1) {
      MEMWALL_ASSIGN_OR_RETURN(rows, MeasureZeroMemory(e, 1));
    } else {
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
      std::filesystem::remove(rows_file, ec);
    }
    for (const MemoryRow& r : rows) absl::StrAppend(&csv, ToCsv(r), "\n");
  }
  MEMWALL_ASSIGN_OR_RETURN(std::vector<MemoryRow> modeled, ModelZeroMemory(e));
  for (const MemoryRow& r : modeled) absl::StrAppend(&csv, ToCsv(r), "\n");
  MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/data.csv", csv));

  MEMWALL_RETURN_IF_ERROR(RunFigureScript(absl::StrCat("repro/figures/", e.name(), ".py"),
                                          {dir + "/data.csv", dir + "/figure.png"}));
  Provenance p;
  p.experiment = e.name();
  p.description = e.description();
  p.paper = e.paper();
  p.command = command;
  p.measured_or_modeled =
      "part=sweep: source=measured rows are measured on the CpuDevice (peak bytes per tag after the "
      "training steps, rank 0); source=estimator and source=paper rows are modeled (zero/estimator.h; "
      "ZeRO §5.1's formula). part=modeled: modeled only (estimator, formula, and the figure's printed "
      "values as source=paper_figure)";
  p.files = {{"data.csv", "one row per (part, stage, ranks, source); bytes per rank"},
             {"figure.png", absl::StrCat("drawn by repro/figures/", e.name(), ".py from data.csv")},
             {"experiment", std::filesystem::path(experiment_path).lexically_relative(WorkspaceDir()).string()}};
  MEMWALL_RETURN_IF_ERROR(WriteProvenance(dir + "/provenance.json", p));
  std::printf("wrote %s/{data.csv, figure.png, provenance.json}\n", dir.c_str());
  return absl::OkStatus();
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
  const std::string path = memwall::UserPath(positional[1], std::getenv);
  auto experiment = LoadExperiment(std::filesystem::exists(path) ? path : positional[1]);
  if (!experiment.ok()) {
    std::fprintf(stderr, "run: %s\n", std::string(experiment.status().message()).c_str());
    return 2;
  }
  if (experiment->kind() != Experiment::ZERO_MEMORY) {
    std::fprintf(stderr, "run: experiment kind %s has no runner yet\n",
                 Experiment::Kind_Name(experiment->kind()).c_str());
    return 2;
  }
  std::vector<std::string> args(argv, argv + argc);
  const absl::Status st = absl::GetFlag(FLAGS_worker)
                              ? Worker(*experiment)
                              : Drive(*experiment, std::filesystem::absolute(std::filesystem::exists(path) ? path : positional[1]).string(),
                                      absl::StrCat("./bazelw run //repro:", std::filesystem::path(args[0]).filename().string(),
                                                   " -- ", absl::StrJoin(args.begin() + 1, args.end(), " ")));
  if (!st.ok()) {
    std::fprintf(stderr, "run: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
