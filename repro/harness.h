// What every result's driver shares: where its results go, its provenance
// record (runtime/provenance.h), its figure script, and a multi-rank sweep
// launched with mpirun.
//
// results/<experiment>/ holds
//   data.csv         one row per measured or modeled point (a `source`
//                    column says which: measured, estimator, paper)
//   figure.png       drawn from data.csv by the result's figure.py
//                    (matplotlib from Debian's python3-matplotlib)
//   provenance.json  commit, date, command, machine, measured or modeled
#ifndef MEMWALL_REPRO_HARNESS_H_
#define MEMWALL_REPRO_HARNESS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "repro/experiment.pb.h"
#include "runtime/provenance.h"

namespace memwall::repro {

// Where a run comes from and goes.
struct RunContext {
  std::string experiment_path;  // absolute
  std::string command;          // as the user typed it (provenance)
  std::string results_root;     // the run writes results_root/<name>/
  std::string figure_script;    // the kind's figure.py, relative to the workspace
};

// results_root/<name>/, created; prints the experiment's one-line header.
absl::StatusOr<std::string> ResultsDir(const Experiment& e, const RunContext& run);

// The provenance record every result starts from: the experiment, its
// paper, the command, the experiment file and the figure script.
Provenance ProvenanceOf(const Experiment& e, const RunContext& run);

// One world size of a multi-rank sweep on this process's communicator:
// rank 0's CSV rows, the other ranks' none.
using MeasureRowsFn = absl::StatusOr<std::string> (*)(const Experiment& e, int world);

// Every world size of the sweep, in order: world size 1 in this process,
// the others as `mpirun -np N` of this binary with --worker, rank 0 writing
// its rows to a file in `dir` that is read back. Their CSV rows.
absl::StatusOr<std::string> SweepWorldSizes(const Experiment& e, const RunContext& run, const std::string& dir,
                                            MeasureRowsFn measure_rows);

// One CSV field, quoted when it holds a comma, quote or newline.
std::string CsvField(const std::string& value);
// An optional CSV cell: empty when `v` is negative (not measured, not given).
std::string CsvCell(int64_t v);
std::string CsvCell(double v, const char* format);

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
