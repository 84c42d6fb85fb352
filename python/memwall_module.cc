// The extension memwall._memwall (the package memwall/ re-exports it): thin
// pybind11 glue over plain cc_libraries. memwall.dtype (runtime/dtype.h),
// memwall.cpu_adam (cpu_adam/cpu_adam.h) and build_info() here; estimate,
// Trainer, model_config and latest_checkpoint in training.cc;
// load/save_safetensors in safetensors.cc; write_provenance and
// workspace_dir in provenance.cc; configs from dicts in arguments.cc; a
// failed Status's Python exception in errors.cc.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

#include "cpu_adam/cpu_adam.h"
#include "python/bindings.h"
#include "runtime/cuda_device.h"
#include "runtime/dtype.h"

namespace py = pybind11;

namespace memwall {
namespace {

// float32 array (any shape, C-contiguous) -> uint16 bit patterns of `dtype`.
py::array_t<uint16_t> FromFloat32(
    const py::array_t<float, py::array::c_style | py::array::forcecast>& x, DType dtype) {
  py::array_t<uint16_t> out(x.request().shape);
  python::ThrowIfError(Convert(x.data(), DType::kF32, out.mutable_data(), dtype, x.size()));
  return out;
}

// uint16 bit patterns of `dtype` -> float32 array.
py::array_t<float> ToFloat32(
    const py::array_t<uint16_t, py::array::c_style | py::array::forcecast>& x, DType dtype) {
  py::array_t<float> out(x.request().shape);
  python::ThrowIfError(Convert(x.data(), dtype, out.mutable_data(), DType::kF32, x.size()));
  return out;
}

using python::ThrowIfError;

// A C-contiguous buffer's data and element count, or a ValueError naming
// `what` (e.g. "params[2]").
struct Flat {
  void* data;
  int64_t n;
  DType dtype;
};
// `held` keeps the buffer view (and so the memory) until the caller is done.
Flat Request(const py::buffer& b, const std::string& what, bool writable,
             std::vector<py::buffer_info>& held) {
  py::buffer_info info;
  try {
    info = b.request(writable);
  } catch (const std::exception& e) {
    throw py::value_error(what + ": " + (writable ? "needs a writable buffer: " : "") + e.what());
  }
  DType dtype;
  if (info.format == py::format_descriptor<float>::format()) {
    dtype = DType::kF32;
  } else if (info.format == "e") {
    dtype = DType::kF16;
  } else if (info.format == py::format_descriptor<uint16_t>::format()) {
    dtype = DType::kBF16;  // bf16 bit patterns, as memwall.dtype.float32_to_bf16 makes them
  } else {
    throw py::value_error(what + ": element format '" + info.format +
                          "' is not float32, float16 or uint16 (bf16 bits)");
  }
  py::ssize_t expect = info.itemsize;
  for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
    if (info.shape[d] > 1 && info.strides[d] != expect) {
      throw py::value_error(what + ": must be C-contiguous");
    }
    expect *= info.shape[d];
  }
  const Flat flat{info.ptr, static_cast<int64_t>(info.size), dtype};
  held.push_back(std::move(info));
  return flat;
}

// Adam or AdamW over a list of float32 parameter buffers, stepped in place.
// The moments are float32 numpy arrays the optimizer owns.
class PyAdam {
 public:
  PyAdam(py::list params, float lr, std::pair<float, float> betas, float eps, float weight_decay,
         bool adamw, int threads) {
    cpu_adam::CpuAdam::Options o;
    o.adam.lr = lr;
    o.adam.beta1 = betas.first;
    o.adam.beta2 = betas.second;
    o.adam.eps = eps;
    o.adam.weight_decay = weight_decay;
    o.adam.adamw = adamw;
    o.threads = threads;
    auto adam = cpu_adam::CpuAdam::Create(o);
    ThrowIfError(adam.status());
    adam_ = std::move(*adam);
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string what = "params[" + std::to_string(i) + "]";
      std::vector<py::buffer_info> held;
      const Flat f = Request(params[i].cast<py::buffer>(), what, true, held);
      if (f.dtype != DType::kF32) throw py::value_error(what + ": parameters must be float32");
      params_.push_back(params[i]);
      exp_avg_.append(py::array_t<float>(f.n));
      exp_avg_sq_.append(py::array_t<float>(f.n));
      for (py::list l : {exp_avg_, exp_avg_sq_}) {
        auto a = l[i].cast<py::array_t<float>>();
        std::fill(a.mutable_data(), a.mutable_data() + f.n, 0.0f);
      }
    }
  }

  void Step(py::list grads, float grad_scale) {
    if (grads.size() != params_.size()) {
      throw py::value_error("step: " + std::to_string(grads.size()) + " gradients for " +
                            std::to_string(params_.size()) + " parameters");
    }
    // Check everything before the first update, so an error changes nothing.
    std::vector<cpu_adam::AdamBuffers> buffers;
    std::vector<py::buffer_info> held;  // released after the GIL is back
    for (size_t i = 0; i < params_.size(); ++i) {
      const Flat p = Request(params_[i].cast<py::buffer>(), "params[" + std::to_string(i) + "]",
                             true, held);
      const Flat g = Request(grads[i].cast<py::buffer>(), "grads[" + std::to_string(i) + "]",
                             false, held);
      if (g.n != p.n) {
        throw py::value_error("grads[" + std::to_string(i) + "] has " + std::to_string(g.n) +
                              " elements; params[" + std::to_string(i) + "] has " +
                              std::to_string(p.n));
      }
      cpu_adam::AdamBuffers b;
      b.params = static_cast<float*>(p.data);
      b.exp_avg = exp_avg_[i].cast<py::array_t<float>>().mutable_data();
      b.exp_avg_sq = exp_avg_sq_[i].cast<py::array_t<float>>().mutable_data();
      b.grads = g.data;
      b.grad_dtype = g.dtype;
      b.n = p.n;
      buffers.push_back(b);
    }
    ++step_;
    py::gil_scoped_release release;
    for (const cpu_adam::AdamBuffers& b : buffers) ThrowIfError(adam_->Step(b, step_, grad_scale));
  }

  float lr() const { return adam_->config().lr; }
  void set_lr(float lr) { ThrowIfError(adam_->SetLearningRate(lr)); }
  int64_t steps() const { return step_; }
  py::list exp_avg() const { return exp_avg_; }
  py::list exp_avg_sq() const { return exp_avg_sq_; }
  std::string path() const { return std::string(cpu_adam::PathName(adam_->path())); }
  int threads() const { return adam_->threads(); }

 private:
  std::unique_ptr<cpu_adam::CpuAdam> adam_;
  std::vector<py::object> params_;
  py::list exp_avg_, exp_avg_sq_;
  int64_t step_ = 0;
};

// One C++ type per Python class (pybind11 registers each type once).
struct PyAdamL2 : PyAdam {
  using PyAdam::PyAdam;
};
struct PyAdamW : PyAdam {
  using PyAdam::PyAdam;
};

}  // namespace
}  // namespace memwall

PYBIND11_MODULE(_memwall, m) {
  using memwall::DType;
  m.doc() = "memwall: ZeRO, ZeRO-Offload and ZeRO-Infinity in C++";
  memwall::python::RegisterStatusErrors();
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
  py::module_ adam = m.def_submodule(
      "cpu_adam",
      "SIMD, multi-threaded Adam/AdamW on host memory (cpu_adam/cpu_adam.h). Parameters are "
      "float32 buffers (numpy arrays or anything with the buffer protocol, C-contiguous), "
      "updated in place; gradients are float32, float16, or uint16 bf16 bit patterns.");
  auto bind = [&](auto* tag, const char* name, bool adamw, float default_decay, const char* doc) {
    using T = std::remove_pointer_t<decltype(tag)>;
    py::class_<T>(adam, name, doc)
        .def(py::init([adamw](py::object params, float lr, std::pair<float, float> betas,
                              float eps, float weight_decay, int threads) {
               py::list list;
               if (py::isinstance<py::list>(params) || py::isinstance<py::tuple>(params)) {
                 list = py::list(params);
               } else {
                 list.append(params);
               }
               return std::make_unique<T>(list, lr, betas, eps, weight_decay, adamw, threads);
             }),
             py::arg("params"), py::arg("lr") = 1e-3f,
             py::arg("betas") = std::make_pair(0.9f, 0.999f), py::arg("eps") = 1e-8f,
             py::arg("weight_decay") = default_decay, py::arg("threads") = 0)
        .def(
            "step",
            [](T& self, py::object grads, float grad_scale) {
              py::list list;
              if (py::isinstance<py::list>(grads) || py::isinstance<py::tuple>(grads)) {
                list = py::list(grads);
              } else {
                list.append(grads);
              }
              self.Step(list, grad_scale);
            },
            py::arg("grads"), py::arg("grad_scale") = 1.0f,
            "One step; every gradient is multiplied by grad_scale first.")
        .def_property("lr", &memwall::PyAdam::lr, &memwall::PyAdam::set_lr)
        .def_property_readonly("steps", &memwall::PyAdam::steps)
        .def_property_readonly("exp_avg", &memwall::PyAdam::exp_avg)
        .def_property_readonly("exp_avg_sq", &memwall::PyAdam::exp_avg_sq)
        .def_property_readonly("path", &memwall::PyAdam::path)
        .def_property_readonly("threads", &memwall::PyAdam::threads);
  };
  bind(static_cast<memwall::PyAdamL2*>(nullptr), "Adam", false, 0.0f, "torch.optim.Adam: weight decay added to the gradient (L2).");
  bind(static_cast<memwall::PyAdamW*>(nullptr), "AdamW", true, 0.01f, "torch.optim.AdamW: decoupled weight decay.");

  m.def("build_info", [] {
    py::dict info;
    info["convert_path"] = std::string(memwall::ConvertPathName(memwall::BestConvertPath()));
    info["cuda"] = memwall::BuiltWithCuda();
    return info;
  });
  memwall::python::BindTraining(m);
  memwall::python::BindSafetensors(m);
  memwall::python::BindProvenance(m);
}
