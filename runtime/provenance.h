// Where a measurement came from: the source tree, and provenance.json, the
// record every repro target and benchmark result carries beside its data
// (the commit, whether the tree had uncommitted changes, the UTC date, the
// command and the machine).
#ifndef MEMWALL_RUNTIME_PROVENANCE_H_
#define MEMWALL_RUNTIME_PROVENANCE_H_

#include <map>
#include <string>

#include "absl/status/status.h"

namespace memwall {

// The source tree: BUILD_WORKSPACE_DIRECTORY under `bazel run`, else the
// current directory.
std::string WorkspaceDir();

// "a b" -> 'a b', for one argument of a shell command line.
std::string ShellQuote(const std::string& arg);

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

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_PROVENANCE_H_
