#include "models/gpt_io.h"

#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/status.h"

namespace memwall::models {
namespace {

const std::string kPrefix = "transformer.";

std::string Unprefixed(const std::string& name) {
  return name.rfind(kPrefix, 0) == 0 ? name.substr(kPrefix.size()) : name;
}

bool Ignored(const std::string& name) {
  const auto ends = [&](const std::string& s) { return name.ends_with(s); };
  return name == "lm_head.weight" || ends(".attn.bias") || ends(".attn.masked_bias");
}

std::string Shape(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); }

}  // namespace

absl::Status ExportGpt(Gpt& model, Device& device, const std::string& path) {
  const std::vector<Parameter*> params = model.Parameters();
  std::vector<std::vector<float>> host(params.size());
  std::vector<SafetensorsTensor> tensors;
  Stream& s = device.compute_stream();
  for (size_t i = 0; i < params.size(); ++i) {
    const Parameter& p = *params[i];
    if (p.value.data() == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("ExportGpt: ", p.name, " has no storage bound"));
    }
    host[i].resize(p.numel());
    if (p.value.dtype() == DType::kF32) {
      MEMWALL_RETURN_IF_ERROR(s.Copy(host[i].data(), p.value.data(), p.value.bytes()));
    } else {
      std::vector<uint16_t> half(p.numel());
      MEMWALL_RETURN_IF_ERROR(s.Copy(half.data(), p.value.data(), p.value.bytes()));
      MEMWALL_RETURN_IF_ERROR(s.Synchronize());
      MEMWALL_RETURN_IF_ERROR(Convert(half.data(), p.value.dtype(), host[i].data(), DType::kF32, half.size()));
    }
    tensors.push_back({p.name, DType::kF32, p.shape, host[i].data()});
  }
  MEMWALL_RETURN_IF_ERROR(s.Synchronize());
  return WriteSafetensors(path, tensors, {{"format", "pt"}});
}

absl::Status ExportGpt(Gpt& model, const std::vector<float>& values, const std::string& path) {
  std::vector<SafetensorsTensor> tensors;
  size_t offset = 0;
  for (const Parameter* p : model.Parameters()) {
    if (offset + p->numel() > values.size()) break;
    tensors.push_back({p->name, DType::kF32, p->shape, values.data() + offset});
    offset += p->numel();
  }
  if (offset != values.size() || tensors.size() != model.Parameters().size()) {
    return absl::InvalidArgumentError(absl::StrCat("ExportGpt: ", values.size(),
                                                   " values given; the model has ",
                                                   CountParameters(model.config()), " parameters"));
  }
  return WriteSafetensors(path, tensors, {{"format", "pt"}});
}

absl::Status ImportGpt(const SafetensorsFile& file, Gpt& model, Device& device) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("GPT weights ", file.path(), ": ", what));
  };
  const std::vector<Parameter*> params = model.Parameters();
  std::vector<const SafetensorsEntry*> source(params.size(), nullptr);
  std::set<std::string> wanted;
  for (Parameter* p : params) wanted.insert(p->name);
  for (const SafetensorsEntry& e : file.entries()) {
    const std::string name = Unprefixed(e.name);
    if (Ignored(name)) continue;
    if (!wanted.count(name)) {
      return bad(absl::StrCat("tensor '", e.name, "' is not a parameter of this ",
                              model.config().layers(), "-layer GPT"));
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const Parameter& p = *params[i];
    const SafetensorsEntry* e = file.Find(p.name);
    if (e == nullptr) e = file.Find(absl::StrCat(kPrefix, p.name));
    if (e == nullptr) return bad(absl::StrCat("tensor '", p.name, "' is missing"));
    if (e->shape != p.shape) {
      return bad(absl::StrCat("tensor '", e->name, "' has shape ", Shape(e->shape), "; the model needs ",
                              Shape(p.shape)));
    }
    if (!IsFloating(e->dtype)) {
      return bad(absl::StrCat("tensor '", e->name, "' is ", DTypeName(e->dtype),
                              "; weights must be F32, F16 or BF16"));
    }
    if (p.value.data() == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("ImportGpt: ", p.name, " has no storage bound"));
    }
    source[i] = e;
  }
  Stream& s = device.compute_stream();
  std::vector<float> host;
  std::vector<uint16_t> half;
  for (size_t i = 0; i < params.size(); ++i) {
    const SafetensorsEntry& e = *source[i];
    const Tensor& value = params[i]->value;
    host.resize(e.numel());
    MEMWALL_RETURN_IF_ERROR(Convert(file.data(e), e.dtype, host.data(), DType::kF32, e.numel()));
    const void* src = host.data();
    if (value.dtype() != DType::kF32) {
      half.resize(host.size());
      MEMWALL_RETURN_IF_ERROR(Convert(host.data(), DType::kF32, half.data(), value.dtype(), host.size()));
      src = half.data();
    }
    MEMWALL_RETURN_IF_ERROR(s.Copy(value.data(), src, value.bytes()));
    MEMWALL_RETURN_IF_ERROR(s.Synchronize());  // `host` is reused
  }
  return absl::OkStatus();
}

absl::StatusOr<GptConfig> InferGptConfig(const SafetensorsFile& file, int64_t heads) {
  auto find = [&](const std::string& name) {
    const SafetensorsEntry* e = file.Find(name);
    return e != nullptr ? e : file.Find(absl::StrCat(kPrefix, name));
  };
  const SafetensorsEntry* wte = find("wte.weight");
  const SafetensorsEntry* wpe = find("wpe.weight");
  if (wte == nullptr || wpe == nullptr || wte->shape.size() != 2 || wpe->shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GPT weights ", file.path(), ": need 2-D 'wte.weight' and 'wpe.weight' to infer the shape"));
  }
  int64_t layers = 0;
  while (find(absl::StrCat("h.", layers, ".ln_1.weight")) != nullptr) ++layers;
  GptConfig c;
  c.set_name(file.path());
  c.set_layers(layers);
  c.set_hidden(wte->shape[1]);
  c.set_vocab(wte->shape[0]);
  c.set_positions(wpe->shape[0]);
  c.set_heads(heads);
  c.set_source("inferred from " + file.path());
  MEMWALL_RETURN_IF_ERROR(ValidateConfig(c));
  return c;
}

}  // namespace memwall::models
