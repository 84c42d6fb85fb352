// memwall.write_provenance: runtime/provenance.h's provenance.json, so the
// Python repro targets write the same record as the C++ ones; workspace_dir
// and user_path resolve their paths as the C++ targets do.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdlib>
#include <map>
#include <string>

#include "python/bindings.h"
#include "runtime/launch.h"
#include "runtime/provenance.h"

namespace py = pybind11;

namespace memwall::python {

void BindProvenance(py::module_& m) {
  m.def(
      "write_provenance",
      [](const std::string& path, const std::string& experiment, const std::string& description,
         const std::string& paper, const std::string& command, const std::string& measured_or_modeled,
         const std::map<std::string, std::string>& files) {
        Provenance p{experiment, description, paper, command, measured_or_modeled, files};
        ThrowIfError(WriteProvenance(path, p));
      },
      py::arg("path"), py::kw_only(), py::arg("experiment"), py::arg("description"), py::arg("paper"),
      py::arg("command"), py::arg("measured_or_modeled"), py::arg("files"),
      "Writes a repro target's provenance.json (runtime/provenance.h): these fields plus the commit, whether the tree "
      "had uncommitted changes outside results/, the UTC date and the machine (CPU, cores, memory, GPU).");
  m.def("workspace_dir", &WorkspaceDir,
        "The source tree: BUILD_WORKSPACE_DIRECTORY under `bazel run`, else the current directory.");
  m.def(
      "user_path", [](const std::string& path) { return UserPath(path, std::getenv); }, py::arg("path"),
      "A path given on a command line, as the user means it: a relative one is taken from the directory `bazel run` "
      "was started in (BUILD_WORKING_DIRECTORY) when there is one, not from the runfiles tree; others unchanged.");
}

}  // namespace memwall::python
