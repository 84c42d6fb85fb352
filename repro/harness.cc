#include "repro/harness.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/files.h"
#include "runtime/status.h"

namespace memwall::repro {
namespace {

int Shell(const std::string& command) {
  const int st = std::system(command.c_str());
  if (st == -1) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

}  // namespace

absl::StatusOr<std::string> ResultsDir(const Experiment& e, const RunContext& run) {
  const std::string dir = absl::StrCat(run.results_root, "/", e.name());
  MEMWALL_RETURN_IF_ERROR(CreateWritableDirectory(dir, "--results_dir: the experiment's results"));
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

absl::StatusOr<std::string> SweepWorldSizes(const Experiment& e, const RunContext& run, const std::string& dir,
                                            MeasureRowsFn measure_rows) {
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

std::string CsvField(const std::string& value) {
  if (value.find_first_of(",\"\n") == std::string::npos) return value;
  std::string out = "\"";
  for (char c : value) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string CsvCell(int64_t v) { return v < 0 ? "" : absl::StrCat(v); }
std::string CsvCell(double v, const char* format) { return v < 0 ? "" : absl::StrFormat(format, v); }

absl::Status RunFigureScript(const std::string& script, const std::vector<std::string>& args) {
  std::string python;
  for (const char* candidate : {"/usr/bin/python3", "python3"}) {
    if (Shell(absl::StrCat(candidate, " -c 'import matplotlib' >/dev/null 2>&1")) == 0) {
      python = candidate;
      break;
    }
  }
  if (python.empty()) {
    std::string later = absl::StrCat("python3 ", ShellQuote(script));
    for (const std::string& a : args) absl::StrAppend(&later, " ", ShellQuote(a));
    return absl::FailedPreconditionError(absl::StrCat(
        "no python3 with matplotlib: install Debian's python3-matplotlib (./bazelw does), or draw the figure "
        "where there is one: ", later));
  }
  std::string command = absl::StrCat(python, " ", ShellQuote(script));
  for (const std::string& a : args) absl::StrAppend(&command, " ", ShellQuote(a));
  const int code = Shell(command);
  if (code != 0) return absl::InternalError(absl::StrCat("figure script failed (exit ", code, "): ", command));
  return absl::OkStatus();
}

absl::Status LaunchRanks(int n, const std::vector<std::string>& argv) {
  // mpirun refuses root unless told; a private session directory keeps
  // concurrent launches (Bazel's PID namespaces) apart.
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir_template = absl::StrCat(base ? base : "/tmp", "/memwall_mpi.XXXXXX");
  if (::mkdtemp(dir_template.data()) == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir_template));
  }
  const std::string& session = dir_template;
  std::string command = absl::StrCat(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TMPDIR=", ShellQuote(session),
      " mpirun -np ", n,
      " --oversubscribe --bind-to none --mca btl self,vader --mca oob_tcp_if_include lo"
      " --mca btl_tcp_if_include lo --mca plm_rsh_agent false --mca orte_tmpdir_base ",
      ShellQuote(session), " --mca btl_vader_backing_directory ", ShellQuote(session),
      " --mca shmem_mmap_backing_file_base_dir ", ShellQuote(session));
  for (const std::string& a : argv) absl::StrAppend(&command, " ", ShellQuote(a));
  const int code = Shell(command);
  std::error_code ec;
  std::filesystem::remove_all(session, ec);
  if (code == 127) return absl::FailedPreconditionError("mpirun not found: install Debian's openmpi-bin (./bazelw does)");
  if (code != 0) return absl::InternalError(absl::StrCat("mpirun -np ", n, " failed (exit ", code, ")"));
  return absl::OkStatus();
}

absl::StatusOr<std::string> SelfPath() {
  std::error_code ec;
  const auto path = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot read /proc/self/exe: ", ec.message()));
  return path.string();
}

}  // namespace memwall::repro
