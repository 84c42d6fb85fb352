// Configs and paths from Python: a text proto, a dict of fields or keyword
// arguments become the message (by protobuf reflection, so every field of
// every config is reachable and a wrong one is named); str or os.PathLike
// become a path.
#include <pybind11/pybind11.h>

#include <cctype>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "python/bindings.h"
#include "runtime/files.h"
#include "runtime/status.h"

namespace py = pybind11;
namespace pb = google::protobuf;

namespace memwall::python {
namespace {

std::string TypeName(py::handle v) { return py::str(py::type::handle_of(v).attr("__name__")); }
std::string Repr(py::handle v) { return py::repr(v); }

// A dict, or any collections.abc.Mapping.
bool IsMapping(py::handle v) {
  static const py::object* mapping = new py::object(py::module_::import("collections.abc").attr("Mapping"));
  return py::isinstance(v, *mapping);
}

// Fills `msg` from the mapping `fields`; `path` is the message's place in
// the top-level one ("" at the top, "zero." below it).
class Filler {
 public:
  explicit Filler(std::string origin) : origin_(std::move(origin)) {}

  absl::Status Fill(py::handle fields, pb::Message* msg, const std::string& path) {
    if (!IsMapping(fields)) {
      return Bad(path.empty() ? "" : path.substr(0, path.size() - 1),
                 absl::StrCat("must be a dict of ", msg->GetDescriptor()->name(), "'s fields, not ", TypeName(fields)));
    }
    const pb::Descriptor* d = msg->GetDescriptor();
    for (const py::handle item : fields.attr("items")()) {
      const py::tuple kv = py::reinterpret_borrow<py::tuple>(item);
      if (!py::isinstance<py::str>(kv[0])) {
        return Bad(path, absl::StrCat("has a key ", Repr(kv[0]), " that is not a field name (str)"));
      }
      const std::string name = kv[0].cast<std::string>();
      const pb::FieldDescriptor* f = d->FindFieldByName(name);
      if (f == nullptr) {
        std::vector<std::string> names;
        for (int i = 0; i < d->field_count(); ++i) names.push_back(d->field(i)->name());
        return Bad(path + name, absl::StrCat("is not a field of ", d->name(), "; its fields are ",
                                             absl::StrJoin(names, ", ")));
      }
      const py::handle value = kv[1];
      if (value.is_none()) continue;  // None: left unset
      if (!f->is_repeated()) {
        MEMWALL_RETURN_IF_ERROR(Assign(value, msg, f, path + name));
        continue;
      }
      if (!py::isinstance<py::list>(value) && !py::isinstance<py::tuple>(value)) {
        return Bad(path + name, absl::StrCat("is repeated: give a list, not ", TypeName(value)));
      }
      int i = 0;
      for (const py::handle element : value) {
        MEMWALL_RETURN_IF_ERROR(Assign(element, msg, f, absl::StrCat(path, name, "[", i++, "]")));
      }
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Bad(const std::string& where, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(origin_, ": ", where, where.empty() ? "" : " ", what));
  }

  // An integer in [lo, hi]: Python ints and anything with __index__
  // (numpy's integers); not bool, not float.
  template <typename T>
  absl::Status Integer(py::handle v, const std::string& where, T* out) const {
    PyObject* index = PyBool_Check(v.ptr()) ? nullptr : PyNumber_Index(v.ptr());
    if (index == nullptr) {
      PyErr_Clear();
      return Bad(where, absl::StrCat("= ", Repr(v), " must be an integer, not ", TypeName(v)));
    }
    const py::int_ i = py::reinterpret_steal<py::int_>(index);
    const py::int_ lo(std::numeric_limits<T>::min()), hi(std::numeric_limits<T>::max());
    if (i < lo || i > hi) {
      return Bad(where, absl::StrCat("= ", Repr(i), " is outside [", Repr(lo), ", ", Repr(hi), "]"));
    }
    *out = i.cast<T>();
    return absl::OkStatus();
  }

  absl::Status Assign(py::handle v, pb::Message* msg, const pb::FieldDescriptor* f, const std::string& where) {
    const pb::Reflection* r = msg->GetReflection();
    const bool add = f->is_repeated();
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT32: {
        int32_t x = 0;
        MEMWALL_RETURN_IF_ERROR(Integer(v, where, &x));
        add ? r->AddInt32(msg, f, x) : r->SetInt32(msg, f, x);
        return absl::OkStatus();
      }
      case pb::FieldDescriptor::CPPTYPE_INT64: {
        int64_t x = 0;
        MEMWALL_RETURN_IF_ERROR(Integer(v, where, &x));
        add ? r->AddInt64(msg, f, x) : r->SetInt64(msg, f, x);
        return absl::OkStatus();
      }
      case pb::FieldDescriptor::CPPTYPE_UINT32: {
        uint32_t x = 0;
        MEMWALL_RETURN_IF_ERROR(Integer(v, where, &x));
        add ? r->AddUInt32(msg, f, x) : r->SetUInt32(msg, f, x);
        return absl::OkStatus();
      }
      case pb::FieldDescriptor::CPPTYPE_UINT64: {
        uint64_t x = 0;
        MEMWALL_RETURN_IF_ERROR(Integer(v, where, &x));
        add ? r->AddUInt64(msg, f, x) : r->SetUInt64(msg, f, x);
        return absl::OkStatus();
      }
      case pb::FieldDescriptor::CPPTYPE_FLOAT:
      case pb::FieldDescriptor::CPPTYPE_DOUBLE: {
        // int, float or numpy's scalars; a str is refused (float() would parse it).
        const bool number = !PyBool_Check(v.ptr()) && !PyUnicode_Check(v.ptr()) && !PyBytes_Check(v.ptr()) &&
                            (PyFloat_Check(v.ptr()) || PyIndex_Check(v.ptr()) ||
                             py::hasattr(v, "__float__"));
        const double x = number ? PyFloat_AsDouble(v.ptr()) : 0.0;
        if (!number || (x == -1.0 && PyErr_Occurred())) {
          PyErr_Clear();
          return Bad(where, absl::StrCat("= ", Repr(v), " must be a number, not ", TypeName(v)));
        }
        if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_FLOAT) {
          add ? r->AddFloat(msg, f, float(x)) : r->SetFloat(msg, f, float(x));
        } else {
          add ? r->AddDouble(msg, f, x) : r->SetDouble(msg, f, x);
        }
        return absl::OkStatus();
      }
      case pb::FieldDescriptor::CPPTYPE_BOOL: {
        if (!PyBool_Check(v.ptr())) {
          return Bad(where, absl::StrCat("= ", Repr(v), " must be True or False, not ", TypeName(v)));
        }
        add ? r->AddBool(msg, f, v.ptr() == Py_True) : r->SetBool(msg, f, v.ptr() == Py_True);
        return absl::OkStatus();
      }
      case pb::FieldDescriptor::CPPTYPE_STRING: {
        const std::string x = PathFromPython(v, origin_ + ": " + where);
        add ? r->AddString(msg, f, x) : r->SetString(msg, f, x);
        return absl::OkStatus();
      }
      case pb::FieldDescriptor::CPPTYPE_ENUM: {
        const pb::EnumDescriptor* e = f->enum_type();
        const pb::EnumValueDescriptor* value = nullptr;
        if (py::isinstance<py::str>(v)) {
          std::string name = v.cast<std::string>();
          value = e->FindValueByName(name);
          for (char& c : name) c = char(std::toupper(static_cast<unsigned char>(c)));
          if (value == nullptr) value = e->FindValueByName(name);  // "cpu" for CPU
        } else if (PyIndex_Check(v.ptr()) && !PyBool_Check(v.ptr())) {
          value = e->FindValueByNumber(v.cast<int>());
        }
        if (value == nullptr) {
          std::vector<std::string> names;
          for (int i = 0; i < e->value_count(); ++i) names.push_back(e->value(i)->name());
          return Bad(where, absl::StrCat("= ", Repr(v), " is not one of ", absl::StrJoin(names, ", ")));
        }
        add ? r->AddEnum(msg, f, value) : r->SetEnum(msg, f, value);
        return absl::OkStatus();
      }
      case pb::FieldDescriptor::CPPTYPE_MESSAGE: {
        pb::Message* sub = add ? r->AddMessage(msg, f) : r->MutableMessage(msg, f);
        return Fill(v, sub, where + ".");
      }
    }
    return Bad(where, "has a type this conversion does not know");
  }

  std::string origin_;
};

}  // namespace

void MessageFromPython(py::handle config, const py::dict& fields, const std::string& origin, pb::Message* out) {
  out->Clear();
  Filler filler(origin);
  if (py::isinstance<py::str>(config)) {
    ThrowIfError(ParseTextProto(config.cast<std::string>(), origin, out));
  } else if (!config.is_none()) {
    if (!IsMapping(config)) {
      throw py::type_error(absl::StrCat(origin, " must be a text proto (str), a dict of ", out->GetDescriptor()->name(),
                                        "'s fields, or None; not ", TypeName(config)));
    }
    ThrowIfError(filler.Fill(config, out, ""));
  }
  if (fields.empty()) return;
  std::unique_ptr<pb::Message> over(out->New());
  ThrowIfError(filler.Fill(fields, over.get(), ""));
  out->MergeFrom(*over);
}

std::string PathFromPython(py::handle path, const std::string& what) {
  PyObject* fs = PyOS_FSPath(path.ptr());
  if (fs == nullptr) {
    PyErr_Clear();
    throw py::type_error(absl::StrCat(what, " must be a str or os.PathLike, not ", TypeName(path)));
  }
  const py::object o = py::reinterpret_steal<py::object>(fs);
  std::string out = PyBytes_Check(o.ptr()) ? std::string(PyBytes_AS_STRING(o.ptr()), PyBytes_GET_SIZE(o.ptr()))
                                           : o.cast<std::string>();
  // The system calls would stop at the byte and name another file (Python's
  // own open() refuses it the same way).
  if (out.find('\0') != std::string::npos) throw py::value_error(what + ": embedded null byte");
  return out;
}

}  // namespace memwall::python
