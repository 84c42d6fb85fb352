// StatusError -> the Python exception its code means (the table is in
// python/bindings.h and python/README.md).
#include <pybind11/pybind11.h>

#include <cerrno>
#include <string>

#include "python/bindings.h"
#include "runtime/status.h"

namespace py = pybind11;

namespace memwall::python {
namespace {

// OSError(errno, message): Python picks the subclass (ENOENT is
// FileNotFoundError, EACCES PermissionError, EEXIST FileExistsError).
void RaiseOSError(int err, const std::string& message) {
  const py::object e = py::reinterpret_borrow<py::object>(PyExc_OSError)(err, message);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(e.ptr())), e.ptr());
}

void Raise(const absl::Status& s) {
  const std::string message(s.message());
  if (const int err = ErrnoOf(s); err != 0) return RaiseOSError(err, message);
  switch (s.code()) {
    case absl::StatusCode::kNotFound: return RaiseOSError(ENOENT, message);
    case absl::StatusCode::kPermissionDenied: return RaiseOSError(EACCES, message);
    case absl::StatusCode::kAlreadyExists: return RaiseOSError(EEXIST, message);
    case absl::StatusCode::kDataLoss: return RaiseOSError(EIO, message);
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition: return PyErr_SetString(PyExc_ValueError, message.c_str());
    case absl::StatusCode::kResourceExhausted: return PyErr_SetString(PyExc_MemoryError, message.c_str());
    default: return PyErr_SetString(PyExc_RuntimeError, message.c_str());
  }
}

}  // namespace

void RegisterStatusErrors() {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      Raise(e.status());
    }
  });
}

}  // namespace memwall::python
