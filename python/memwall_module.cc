// The `memwall` Python extension: thin pybind11 glue over plain cc_libraries.
// Grows a submodule per capability (cpu_adam next); for now the runtime's
// conversions and a description of what this build offers.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>

#include "runtime/cuda_device.h"
#include "runtime/dtype.h"

namespace py = pybind11;

namespace memwall {
namespace {

// float32 array (any shape, C-contiguous) -> uint16 bit patterns of `dtype`.
py::array_t<uint16_t> FromFloat32(
    const py::array_t<float, py::array::c_style | py::array::forcecast>& x, DType dtype) {
  py::array_t<uint16_t> out(x.request().shape);
  absl::Status s = Convert(x.data(), DType::kF32, out.mutable_data(), dtype, x.size());
  if (!s.ok()) throw std::runtime_error(std::string(s.message()));
  return out;
}

// uint16 bit patterns of `dtype` -> float32 array.
py::array_t<float> ToFloat32(
    const py::array_t<uint16_t, py::array::c_style | py::array::forcecast>& x, DType dtype) {
  py::array_t<float> out(x.request().shape);
  absl::Status s = Convert(x.data(), dtype, out.mutable_data(), DType::kF32, x.size());
  if (!s.ok()) throw std::runtime_error(std::string(s.message()));
  return out;
}

}  // namespace
}  // namespace memwall

PYBIND11_MODULE(memwall, m) {
  using memwall::DType;
  m.doc() = "memwall: ZeRO, ZeRO-Offload and ZeRO-Infinity in C++";
  py::module_ dtype = m.def_submodule("dtype", "fp32 <-> fp16/bf16 conversions (runtime/dtype.h)");
  dtype.def("float32_to_fp16", [](const py::array_t<float, py::array::c_style | py::array::forcecast>& x) {
    return memwall::FromFloat32(x, DType::kF16);
  }, "fp16 bit patterns (uint16), round to nearest even");
  dtype.def("float32_to_bf16", [](const py::array_t<float, py::array::c_style | py::array::forcecast>& x) {
    return memwall::FromFloat32(x, DType::kBF16);
  }, "bf16 bit patterns (uint16), round to nearest even");
  dtype.def("fp16_to_float32", [](const py::array_t<uint16_t, py::array::c_style | py::array::forcecast>& x) {
    return memwall::ToFloat32(x, DType::kF16);
  });
  dtype.def("bf16_to_float32", [](const py::array_t<uint16_t, py::array::c_style | py::array::forcecast>& x) {
    return memwall::ToFloat32(x, DType::kBF16);
  });
  m.def("build_info", [] {
    py::dict info;
    info["convert_path"] = std::string(memwall::ConvertPathName(memwall::BestConvertPath()));
    info["cuda"] = memwall::BuiltWithCuda();
    return info;
  });
}
