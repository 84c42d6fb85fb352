// //repro:run: runs one experiment (a result folder's text proto,
// repro/<paper>/<result>/*.textproto) and writes
// results/<name>/{data.csv, figure.png, provenance.json}.
//
//   ./bazelw run //repro:run -- repro/zero/memory/experiment.textproto
//   ./bazelw run //repro:zero_memory          (the same, named)
//   ./bazelw run //repro:offload_max_model    (ZeRO-Offload Figure 7)
//   ./bazelw run //repro:offload_throughput   (ZeRO-Offload Figure 8)
//   ./bazelw run //repro:infinity_max_model   (ZeRO-Infinity Figure 6a)
//   ./bazelw run //repro:infinity_partition   (ZeRO-Infinity Figure 6c)
//
// The experiment is a file, or a name (zero_memory, offload_max_model_ci):
// the folder's file whose name field it is; an unknown one lists the names.
// Flags: --results_dir=DIR (default: <workspace>/out/results; the tracked
// results/ only with --results_dir=results). World sizes > 1
// are launched as `mpirun -np N` of this binary with --worker, each
// rank 0 writing its rows to a file the driver merges; world size 1 runs in
// this process, without MPI. Exits 0 on success, 1 when a run fails, 2 on a
// bad experiment file.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "repro/harness.h"
#include "repro/experiment.h"
#include "runtime/files.h"
#include "runtime/launch.h"
#include "runtime/provenance.h"
#include "runtime/status.h"

ABSL_FLAG(std::string, results_dir, "",
          "where <experiment>/ goes (default: <workspace>/out/results; --results_dir=results for the tracked ones)");
ABSL_FLAG(bool, worker, false, "internal: one world size of the sweep, under mpirun");
ABSL_FLAG(int32_t, world_size, 1, "internal: the world size a --worker was launched for");
ABSL_FLAG(std::string, rows_out, "", "internal: where a --worker's rank 0 writes its CSV rows");

namespace memwall::repro {
namespace {

// Every experiment file of the result folders, by the name its place gives
// it (repro/<paper>/<result>/<stem>.textproto: <paper>_<result>, with
// _<stem> unless the stem is "experiment"; experiment_test holds each
// file's name field to it).
std::vector<std::pair<std::string, std::string>> ExperimentFiles() {
  std::vector<std::pair<std::string, std::string>> out;
  std::error_code ec;
  const std::filesystem::path root = ProjectFile("repro");
  for (auto it = std::filesystem::recursive_directory_iterator(root, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    const std::filesystem::path rel = it->path().lexically_relative(root);
    if (it->path().extension() != ".textproto" || std::distance(rel.begin(), rel.end()) != 3) continue;
    auto part = rel.begin();
    std::string name = absl::StrCat(part->string(), "_", std::next(part)->string());
    if (const std::string stem = it->path().stem().string(); stem != "experiment") absl::StrAppend(&name, "_", stem);
    out.emplace_back(name, it->path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The experiment file `arg` names: a path, or an experiment's name.
absl::StatusOr<std::string> FindExperiment(const std::string& arg) {
  std::error_code ec;
  const std::string user_path = UserPath(arg, std::getenv);
  if (std::filesystem::exists(user_path, ec)) return user_path;
  if (std::filesystem::exists(arg, ec)) return arg;
  std::vector<std::string> names;
  for (const auto& [name, path] : ExperimentFiles()) {
    if (name == arg) return path;
    names.push_back(name);
  }
  return absl::NotFoundError(absl::StrCat("no experiment file or name '", arg, "'; the experiments are: ",
                                          absl::StrJoin(names, ", ")));
}

absl::Status Worker(const ExperimentKind& kind, const Experiment& e) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string csv, kind.measure_rows(e, absl::GetFlag(FLAGS_world_size)));
  if (!csv.empty()) MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(absl::GetFlag(FLAGS_rows_out), csv));
  return absl::OkStatus();
}

}  // namespace
}  // namespace memwall::repro

int main(int argc, char** argv) {
  using namespace memwall::repro;
  absl::SetProgramUsageMessage(
      "run one paper result's experiment: writes <results_dir>/<name>/{data.csv, figure.png, provenance.json}.\n"
      "  run EXPERIMENT.textproto|NAME [--results_dir=DIR]   (a named target, //repro:zero_memory, needs neither)");
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() != 2) {
    std::fprintf(stderr, "usage: run EXPERIMENT.textproto|NAME [--results_dir=DIR]\n");
    return 2;
  }
  const absl::StatusOr<std::string> found = FindExperiment(positional[1]);
  if (!found.ok()) {
    std::fprintf(stderr, "run: %s\n", std::string(found.status().message()).c_str());
    return 2;
  }
  const std::string path = *found;
  auto experiment = LoadExperiment(path);
  if (!experiment.ok()) {
    std::fprintf(stderr, "run: %s\n", std::string(experiment.status().message()).c_str());
    return 2;
  }
  const ExperimentKind& kind = *FindKind(experiment->kind());  // ParseExperiment checked it has a row
  if (absl::GetFlag(FLAGS_worker) && kind.measure_rows == nullptr) {
    std::fprintf(stderr, "run: --worker is for the multi-rank sweeps; %s runs one rank\n",
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
  RunContext run;
  run.experiment_path = std::filesystem::absolute(path).string();
  run.command = command;
  run.results_root = absl::GetFlag(FLAGS_results_dir).empty()
                         ? memwall::WorkspaceDir() + "/out/results"
                         : memwall::UserPath(absl::GetFlag(FLAGS_results_dir), std::getenv);
  run.figure_script = std::string(kind.figure_script);
  const absl::Status st = absl::GetFlag(FLAGS_worker) ? Worker(kind, *experiment) : kind.drive(*experiment, run);
  if (!st.ok()) {
    std::fprintf(stderr, "run: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
