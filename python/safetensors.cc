// memwall.load_safetensors / memwall.save_safetensors: models/safetensors.h
// (the validating reader and the atomic writer) with numpy arrays.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "models/safetensors.h"
#include "python/bindings.h"
#include "runtime/dtype.h"

namespace py = pybind11;

namespace memwall::python {
namespace {

// Every tensor as a numpy array of its shape: F32 float32, F16 float16, I32
// int32, BF16 widened to float32 (exactly; numpy has no bfloat16).
py::dict Load(py::handle path_arg) {
  const std::string path = PathFromPython(path_arg, "path");
  absl::StatusOr<models::SafetensorsFile> file;
  {
    py::gil_scoped_release release;
    file = models::SafetensorsFile::Read(path);
  }
  ThrowIfError(file.status());
  py::dict out;
  for (const models::SafetensorsEntry& e : file->entries()) {
    const std::vector<py::ssize_t> shape(e.shape.begin(), e.shape.end());
    const uint8_t* src = file->data(e);
    py::array a;
    switch (e.dtype) {
      case DType::kF32: a = py::array_t<float>(shape); break;
      case DType::kI32: a = py::array_t<int32_t>(shape); break;
      case DType::kF16: a = py::array(py::dtype("float16"), shape); break;
      case DType::kBF16: {
        py::array_t<float> wide(shape);
        ThrowIfError(Convert(src, DType::kBF16, wide.mutable_data(), DType::kF32, e.numel()));
        out[py::str(e.name)] = wide;
        continue;
      }
    }
    std::memcpy(a.mutable_data(), src, e.end - e.begin);
    out[py::str(e.name)] = a;
  }
  return out;
}

void Save(py::handle path_arg, const py::dict& tensors, const std::map<std::string, std::string>& metadata) {
  const std::string path = PathFromPython(path_arg, "path");
  std::vector<py::array> arrays;  // C-contiguous copies, alive until written
  std::vector<models::SafetensorsTensor> out;
  for (const auto& [key, value] : tensors) {
    const std::string name = py::str(key);
    py::array a = py::array::ensure(value, py::array::c_style);
    if (!a) throw py::value_error("tensor '" + name + "' is not an array");
    // safetensors is little-endian: a big-endian array is converted, not
    // written as raw bytes.
    if (a.dtype().byteorder() == '>') {
      a = py::array::ensure(a.attr("astype")(a.dtype().attr("newbyteorder")("<")), py::array::c_style);
    }
    models::SafetensorsTensor t;
    t.name = name;
    const char kind = a.dtype().kind();
    const auto size = a.dtype().itemsize();
    if (kind == 'f' && size == 4) {
      t.dtype = DType::kF32;
    } else if (kind == 'f' && size == 2) {
      t.dtype = DType::kF16;
    } else if (kind == 'i' && size == 4) {
      t.dtype = DType::kI32;
    } else {
      throw py::value_error("tensor '" + name + "' has dtype " + std::string(py::str(a.dtype())) +
                            "; safetensors here takes float32, float16 or int32");
    }
    for (py::ssize_t d = 0; d < a.ndim(); ++d) t.shape.push_back(a.shape(d));
    t.data = a.data();
    arrays.push_back(std::move(a));
    out.push_back(std::move(t));
  }
  py::gil_scoped_release release;
  ThrowIfError(models::WriteSafetensors(path, out, metadata));
}

}  // namespace

void BindSafetensors(py::module_& m) {
  m.def("load_safetensors", &Load, py::arg("path"),
        "Every tensor of a safetensors file (validated first: header, dtypes, shapes, offsets) as a dict of numpy "
        "arrays, in file order: F32 float32, F16 float16, I32 int32, BF16 widened exactly to float32.");
  m.def("save_safetensors", &Save, py::arg("path"), py::arg("tensors"),
        py::arg("metadata") = std::map<std::string, std::string>{{"format", "pt"}},
        "Writes a dict of numpy arrays (float32, float16 or int32) as a safetensors file, in dict order; the file "
        "appears whole or not at all. A memwall trainer's export and Hugging Face's GPT-2 files use the same names.");
}

}  // namespace memwall::python
