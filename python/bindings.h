// The pieces of the `memwall` extension, one Bind function per file; each
// adds its functions and classes to the module it is given.
#ifndef MEMWALL_PYTHON_BINDINGS_H_
#define MEMWALL_PYTHON_BINDINGS_H_

#include <pybind11/pybind11.h>

#include <string>

#include "absl/status/status.h"

namespace memwall::python {

// A failed Status as Python's ValueError (bad input: the message names it).
inline void ThrowIfError(const absl::Status& s) {
  if (!s.ok()) throw pybind11::value_error(std::string(s.message()));
}

void BindTraining(pybind11::module_& m);     // training.cc: estimate, Trainer, model_config
void BindSafetensors(pybind11::module_& m);  // safetensors.cc: load_safetensors, save_safetensors
void BindProvenance(pybind11::module_& m);   // provenance.cc: write_provenance, workspace_dir

}  // namespace memwall::python

#endif  // MEMWALL_PYTHON_BINDINGS_H_
