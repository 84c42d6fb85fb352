#include "repro/harness.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "runtime/files.h"

namespace memwall::repro {
namespace {

int Shell(const std::string& command) {
  const int st = std::system(command.c_str());
  if (st == -1) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

}  // namespace

std::string CsvField(const std::string& value) {
  if (value.find_first_of(",\"\n") == std::string::npos) return value;
  std::string out = "\"";
  for (char c : value) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

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
