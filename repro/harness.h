// What every repro target shares: where results go, the figure script, and
// launching ranks with mpirun; the provenance record is runtime/provenance.h.
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
#include "runtime/provenance.h"

namespace memwall::repro {

// One CSV field, quoted when it holds a comma, quote or newline.
std::string CsvField(const std::string& value);

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
