// What every repro target shares: where results go, the provenance record,
// the figure script, and launching ranks with mpirun.
//
// results/<experiment>/ holds
//   data.csv         one row per measured or modeled point (a `source`
//                    column says which: measured, estimator, paper)
//   figure.png       drawn from data.csv by repro/figures/<experiment>.py
//                    (matplotlib from Debian's python3-matplotlib)
//   provenance.json  commit, date, command, machine, measured or modeled
#ifndef MEMWALL_REPRO_HARNESS_H_
#define MEMWALL_REPRO_HARNESS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace memwall::repro {

// The source tree: BUILD_WORKSPACE_DIRECTORY under `bazel run`, else the
// current directory.
std::string WorkspaceDir();

// "a b" -> 'a b', for one argument of a shell command line.
std::string ShellQuote(const std::string& arg);
// One CSV field, quoted when it holds a comma, quote or newline.
std::string CsvField(const std::string& value);

struct Provenance {
  std::string experiment;
  std::string description;
  std::string paper;
  std::string command;               // as the user ran it
  std::string measured_or_modeled;   // what in data.csv is which
  std::map<std::string, std::string> files;  // name -> what it holds
};

// provenance.json: the fields above plus the commit (and whether the tree
// had uncommitted changes outside results/), the UTC date, and the machine: CPU model,
// cores, memory, and the GPU name and driver when nvidia-smi finds one.
absl::Status WriteProvenance(const std::string& path, const Provenance& p);

// Runs `python3 SCRIPT ARGS...` with a Python that has matplotlib
// (Debian's /usr/bin/python3 first). FailedPrecondition naming the package
// when there is none.
absl::Status RunFigureScript(const std::string& script, const std::vector<std::string>& args);

// Runs `argv` under `mpirun -np n` on this host (shared memory between
// ranks, loopback wire-up, oversubscription allowed) and waits; the ranks
// inherit this process's environment and output. An Internal error with
// the exit status when any rank fails.
absl::Status LaunchRanks(int n, const std::vector<std::string>& argv);

// This executable's path (for relaunching itself as the ranks).
absl::StatusOr<std::string> SelfPath();

}  // namespace memwall::repro

#endif  // MEMWALL_REPRO_HARNESS_H_
