// The pieces of the extension memwall._memwall, one Bind function per file;
// each adds its functions and classes to the module it is given.
#ifndef MEMWALL_PYTHON_BINDINGS_H_
#define MEMWALL_PYTHON_BINDINGS_H_

#include <pybind11/pybind11.h>

#include <exception>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/message.h"

namespace memwall::python {

// A failed Status on its way to Python. The translator RegisterStatusErrors
// installs raises it as the exception its code means (python/README.md):
//   errno attached (runtime/status.h's WithErrno)  OSError(errno, message),
//                                                  e.g. disk full: ENOSPC
//   NotFound / PermissionDenied / AlreadyExists    FileNotFoundError /
//                                                  PermissionError / FileExistsError
//   DataLoss (a damaged file)                      OSError(EIO, message)
//   InvalidArgument, OutOfRange, FailedPrecondition ValueError (bad input)
//   ResourceExhausted                              MemoryError (does not fit)
//   anything else (Unavailable: no GPU; Internal)  RuntimeError
class StatusError : public std::exception {
 public:
  explicit StatusError(absl::Status status) : status_(std::move(status)), message_(status_.message()) {}
  const char* what() const noexcept override { return message_.c_str(); }
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
  std::string message_;
};

inline void ThrowIfError(const absl::Status& s) {
  if (!s.ok()) throw StatusError(s);
}

template <typename T>
T Unwrap(absl::StatusOr<T> v) {
  ThrowIfError(v.status());
  return std::move(*v);
}

// Fills `out` from a Python argument: a text proto (str), a dict of its
// fields (a dict per message field, a list per repeated field, an enum value
// by name in any case, e.g. "cpu"), or None (nothing set). Then `fields`
// (keyword arguments, the same form as the dict) are merged over it, as
// --set merges over --config. A wrong name, type or value raises ValueError
// naming `origin` and the field's path (e.g. "config: zero.stage").
void MessageFromPython(pybind11::handle config, const pybind11::dict& fields, const std::string& origin,
                       google::protobuf::Message* out);

// A path argument: str or os.PathLike; anything else raises TypeError, and
// one holding a NUL byte ValueError.
std::string PathFromPython(pybind11::handle path, const std::string& what);

void RegisterStatusErrors();                 // errors.cc: StatusError -> the exception above
void BindTraining(pybind11::module_& m);     // training.cc: estimate, Trainer, model_config
void BindSafetensors(pybind11::module_& m);  // safetensors.cc: load_safetensors, save_safetensors
void BindProvenance(pybind11::module_& m);   // provenance.cc: write_provenance, workspace_dir

}  // namespace memwall::python

#endif  // MEMWALL_PYTHON_BINDINGS_H_
