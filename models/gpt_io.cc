#include "models/gpt_io.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "google/protobuf/struct.pb.h"
#include "google/protobuf/text_format.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/layers.h"
#include "runtime/files.h"
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

// `name` in `file`, spelled as memwall writes it or with the "transformer."
// prefix of GPT2LMHeadModel; nullptr when neither is there.
const SafetensorsEntry* FindEither(const SafetensorsFile& file, const std::string& name) {
  const SafetensorsEntry* e = file.Find(name);
  return e != nullptr ? e : file.Find(kPrefix + name);
}

// The metadata key under which an export records its model.
constexpr char kConfigKey[] = "memwall_gpt_config";

// The index of the first NaN or infinity among n values of a floating
// dtype, read from the bits (an exponent of all ones), or -1.
int64_t FirstNonFinite(const void* data, DType dtype, int64_t n) {
  const auto scan = [&](auto word, uint32_t exponent) -> int64_t {
    using Word = decltype(word);
    // A safetensors payload need not be aligned to its dtype: copy each word.
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (int64_t i = 0; i < n; ++i) {
      Word w;
      std::memcpy(&w, bytes + i * sizeof(Word), sizeof(Word));
      if ((uint32_t(w) & exponent) == exponent) return i;
    }
    return -1;
  };
  switch (dtype) {
    case DType::kF32: return scan(uint32_t{}, 0x7f800000u);
    case DType::kF16: return scan(uint16_t{}, 0x7c00u);
    case DType::kBF16: return scan(uint16_t{}, 0x7f80u);
    default: return -1;
  }
}

std::string Shape(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); }

}  // namespace

namespace {

// Where a parameter's values sit in its logical (untiled) parameter.
struct Placement {
  std::string name;             // the logical parameter
  std::vector<int64_t> shape;   // its shape
  int64_t begin = 0, width = 0; // columns [begin, begin + width) of its last dimension
};

Placement PlacementOf(const Parameter& p) {
  Placement at{p.name, p.shape, 0, p.shape.back()};
  if (p.slice.has_value()) {
    at.name = p.slice->name;
    at.shape.back() = p.slice->width;
    at.begin = p.slice->begin;
  }
  return at;
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

namespace {
// Row r of a parameter placed `at` (width w) is columns [begin, begin + w)
// of row r of its logical parameter (width W).
void PlaceTile(const Placement& at, int64_t numel, const float* src, float* logical) {
  const int64_t w = at.width, W = at.shape.back(), rows = numel / w;
  for (int64_t r = 0; r < rows; ++r) std::copy_n(src + r * w, w, logical + r * W + at.begin);
}
}  // namespace

absl::StatusOr<std::vector<LogicalParameter>> JoinTiles(Gpt& model, const std::vector<float>& values) {
  const std::vector<Parameter*> params = model.Parameters();
  int64_t total = 0;
  for (const Parameter* p : params) total += p->numel();
  if (static_cast<int64_t>(values.size()) != total) {
    return absl::InvalidArgumentError(absl::StrCat("JoinTiles: ", values.size(), " values given; the model has ",
                                                   total, " parameters"));
  }
  std::vector<LogicalParameter> out;  // in order of first appearance: the untiled order
  absl::flat_hash_map<std::string, size_t> index;
  size_t offset = 0;
  for (const Parameter* p : params) {
    const Placement at = PlacementOf(*p);
    auto [it, added] = index.try_emplace(at.name, out.size());
    if (added) out.push_back({at.name, at.shape, std::vector<float>(Numel(at.shape))});
    PlaceTile(at, p->numel(), values.data() + offset, out[it->second].values.data());
    offset += p->numel();
  }
  return out;
}

std::map<std::string, std::string> ExportMetadata(const GptConfig& config) {
  // The model's meaning, not its memory layout (tiling, checkpointing) or
  // name: a tiled model's export is the untiled model's file, byte for byte.
  GptConfig meaning;
  meaning.set_layers(config.layers());
  meaning.set_hidden(config.hidden());
  meaning.set_heads(config.heads());
  meaning.set_vocab(config.vocab());
  meaning.set_positions(config.positions());
  std::string text;
  google::protobuf::TextFormat::Printer printer;
  printer.SetSingleLineMode(true);
  printer.PrintToString(meaning, &text);
  return {{"format", "pt"}, {kConfigKey, text}};
}

std::string HfConfigJson(const GptConfig& c) {
  return absl::StrCat("{\n",
                      "  \"architectures\": [\"GPT2LMHeadModel\"],\n",
                      "  \"model_type\": \"gpt2\",\n",
                      "  \"n_layer\": ", c.layers(), ",\n",
                      "  \"n_embd\": ", c.hidden(), ",\n",
                      "  \"n_head\": ", c.heads(), ",\n",
                      "  \"n_inner\": null,\n",
                      "  \"vocab_size\": ", c.vocab(), ",\n",
                      "  \"n_positions\": ", c.positions(), ",\n",
                      "  \"n_ctx\": ", c.positions(), ",\n",
                      "  \"activation_function\": \"gelu_new\",\n",
                      "  \"layer_norm_epsilon\": ", kLayerNormEps, ",\n",
                      "  \"tie_word_embeddings\": true,\n",
                      "  \"torch_dtype\": \"float32\"\n",
                      "}\n");
}

namespace {
std::string ConfigJsonBeside(const std::string& weights_path) {
  return (std::filesystem::path(weights_path).parent_path() / "config.json").string();
}
}  // namespace

absl::Status WriteHfConfig(const GptConfig& config, const std::string& weights_path) {
  return WriteFileAtomically(ConfigJsonBeside(weights_path), HfConfigJson(config));
}

absl::StatusOr<int64_t> RecordedHeads(const SafetensorsFile& file) {
  std::optional<int64_t> from_metadata, from_json;
  if (auto it = file.metadata().find(kConfigKey); it != file.metadata().end()) {
    GptConfig saved;
    if (google::protobuf::TextFormat::ParseFromString(it->second, &saved) && saved.heads() > 0) {
      from_metadata = saved.heads();
    }
  }
  const std::string json_path = ConfigJsonBeside(file.path());
  std::error_code ec;
  if (std::filesystem::exists(json_path, ec)) {
    MEMWALL_ASSIGN_OR_RETURN(const std::string json, ReadRegularFile(json_path, "Hugging Face config"));
    google::protobuf::Struct root;
    if (const absl::Status st = ParseJsonObject(json, root); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(json_path, " is not a JSON object: ", st.message()));
    }
    if (auto n = root.fields().find("n_head"); n != root.fields().end()) {
      const double v = n->second.has_number_value() ? n->second.number_value() : 0;
      if (!(v >= 1 && v <= double(std::numeric_limits<int32_t>::max()) && v == std::floor(v))) {
        return absl::InvalidArgumentError(absl::StrCat(
            json_path, ": n_head must be a whole number >= 1 (the attention heads), not ", JsonValueText(n->second)));
      }
      from_json = static_cast<int64_t>(v);
    }
  }
  if (from_metadata && from_json && *from_metadata != *from_json) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), " records ", *from_metadata, " heads but ", json_path,
                                                   " says n_head = ", *from_json));
  }
  if (from_metadata) return *from_metadata;
  if (from_json) return *from_json;
  return absl::NotFoundError(absl::StrCat(file.path(), " records no head count (no ", kConfigKey,
                                          " metadata, no n_head in a config.json beside it)"));
}

absl::Status ExportGpt(Gpt& model, Device& device, const std::string& path) {
  std::vector<float> values;
  Stream& s = device.compute_stream();
  for (const Parameter* p : model.Parameters()) {
    if (p->value.data() == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("ExportGpt: ", p->name, " has no storage bound"));
    }
    const size_t offset = values.size();
    values.resize(offset + p->numel());
    if (p->value.dtype() == DType::kF32) {
      MEMWALL_RETURN_IF_ERROR(s.Copy(values.data() + offset, p->value.data(), p->value.bytes()));
      MEMWALL_RETURN_IF_ERROR(s.Synchronize());  // `values` may grow
    } else {
      std::vector<uint16_t> half(p->numel());
      MEMWALL_RETURN_IF_ERROR(s.Copy(half.data(), p->value.data(), p->value.bytes()));
      MEMWALL_RETURN_IF_ERROR(s.Synchronize());
      MEMWALL_RETURN_IF_ERROR(Convert(half.data(), p->value.dtype(), values.data() + offset, DType::kF32, half.size()));
    }
  }
  return ExportGpt(model, values, path);
}

absl::Status ExportGpt(Gpt& model, const std::vector<float>& values, const std::string& path) {
  int64_t total = 0;
  for (const Parameter* p : model.Parameters()) total += p->numel();
  if (static_cast<int64_t>(values.size()) != total) {
    return absl::InvalidArgumentError(absl::StrCat("ExportGpt: ", values.size(), " values given; the model has ",
                                                   total, " parameters"));
  }
  return ExportGpt(
      model,
      [&](int64_t offset, int64_t n, float* out) {
        std::copy_n(values.data() + offset, n, out);
        return absl::OkStatus();
      },
      path);
}

absl::Status ExportGpt(Gpt& model, const FlatValueReader& read, const std::string& path) {
  // The logical (untiled) tensors in order of first appearance, each with
  // its parameters and their flat offsets.
  struct Logical {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<std::pair<const Parameter*, int64_t>> parts;
  };
  std::vector<Logical> logical;
  absl::flat_hash_map<std::string, size_t> index;
  int64_t offset = 0;
  for (const Parameter* p : model.Parameters()) {
    const Placement at = PlacementOf(*p);
    auto [it, added] = index.try_emplace(at.name, logical.size());
    if (added) logical.push_back({at.name, at.shape, {}});
    logical[it->second].parts.emplace_back(p, offset);
    offset += p->numel();
  }
  std::vector<SafetensorsTensor> tensors;
  for (const Logical& t : logical) tensors.push_back({t.name, DType::kF32, t.shape, nullptr});
  MEMWALL_ASSIGN_OR_RETURN(auto writer, SafetensorsWriter::Create(path, tensors, ExportMetadata(model.config())));
  // One logical tensor in memory at a time (and, when it is tiled, one
  // tile); a refusal leaves no file (the writer commits only at Finish).
  std::vector<float> one, part;
  for (const Logical& t : logical) {
    one.resize(Numel(t.shape));
    if (t.parts.size() == 1 && t.parts[0].first->numel() == static_cast<int64_t>(one.size())) {
      // Untiled: the parameter is the logical tensor.
      MEMWALL_RETURN_IF_ERROR(read(t.parts[0].second, one.size(), one.data()));
    } else {
      std::fill(one.begin(), one.end(), 0.0f);
      for (const auto& [p, at] : t.parts) {
        part.resize(p->numel());
        MEMWALL_RETURN_IF_ERROR(read(at, p->numel(), part.data()));
        PlaceTile(PlacementOf(*p), p->numel(), part.data(), one.data());
      }
    }
    if (const int64_t bad = FirstNonFinite(one.data(), DType::kF32, int64_t(one.size())); bad >= 0) {
      return absl::InvalidArgumentError(absl::StrCat("ExportGpt: ", path, " not written: tensor ", t.name, " holds ",
                                                     one[bad], " at element ", bad, " (the weights diverged)"));
    }
    MEMWALL_RETURN_IF_ERROR(writer->Append(one.data(), one.size() * sizeof(float)));
  }
  MEMWALL_RETURN_IF_ERROR(writer->Finish());
  return WriteHfConfig(model.config(), path);
}

namespace {

// The LM head is wte (one tensor, gpt.h). A file may carry it again as
// "lm_head.weight", as transformers writes a tied model; that copy must be
// wte's values, or loading would drop a head that was trained apart from
// the embedding.
template <typename Bad>
absl::Status CheckTiedHead(const SafetensorsFile& file, const Bad& bad) {
  const SafetensorsEntry* head = FindEither(file, "lm_head.weight");
  if (head == nullptr) return absl::OkStatus();
  const SafetensorsEntry* wte = FindEither(file, "wte.weight");
  if (wte == nullptr) return absl::OkStatus();  // reported as missing
  if (head->shape != wte->shape || !IsFloating(head->dtype)) {
    return bad(absl::StrCat("tensor '", head->name, "' (", DTypeName(head->dtype), " ", Shape(head->shape),
                            ") is not a copy of '", wte->name, "' (", Shape(wte->shape),
                            "); this GPT ties its LM head to the token embedding"));
  }
  if (!IsFloating(wte->dtype)) return absl::OkStatus();  // reported with wte
  std::vector<float> a(wte->numel()), b(head->numel());
  MEMWALL_RETURN_IF_ERROR(Convert(file.data(*wte), wte->dtype, a.data(), DType::kF32, a.size()));
  MEMWALL_RETURN_IF_ERROR(Convert(file.data(*head), head->dtype, b.data(), DType::kF32, b.size()));
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      return bad(absl::StrCat("tensor '", head->name, "' differs from '", wte->name, "' at element ", i, " (",
                              b[i], " against ", a[i], "); this GPT ties its LM head to the token embedding, ",
                              "so an untied head cannot be loaded"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ImportGpt(const SafetensorsFile& file, Gpt& model, Device& device) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("GPT weights ", file.path(), ": ", what));
  };
  const std::vector<Parameter*> params = model.Parameters();
  std::vector<const SafetensorsEntry*> source(params.size(), nullptr);
  std::vector<Placement> placement(params.size());
  std::set<std::string> wanted;
  for (size_t i = 0; i < params.size(); ++i) {
    placement[i] = PlacementOf(*params[i]);
    wanted.insert(placement[i].name);
  }
  for (const SafetensorsEntry& e : file.entries()) {
    const std::string name = Unprefixed(e.name);
    if (name != e.name && file.Find(name) != nullptr) {
      return bad(absl::StrCat("tensors '", e.name, "' and '", name, "' are both present; which one is meant?"));
    }
    if (Ignored(name)) continue;
    if (!wanted.count(name)) {
      return bad(absl::StrCat("tensor '", e.name, "' is not a parameter of this ",
                              model.config().layers(), "-layer GPT"));
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const Placement& at = placement[i];
    const SafetensorsEntry* e = FindEither(file, at.name);
    if (e == nullptr) return bad(absl::StrCat("tensor '", at.name, "' is missing"));
    if (e->shape != at.shape) {
      return bad(absl::StrCat("tensor '", e->name, "' has shape ", Shape(e->shape), "; the model needs ",
                              Shape(at.shape)));
    }
    if (!IsFloating(e->dtype)) {
      return bad(absl::StrCat("tensor '", e->name, "' is ", DTypeName(e->dtype),
                              "; weights must be F32, F16 or BF16"));
    }
    if (params[i]->value.data() == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("ImportGpt: ", params[i]->name, " has no storage bound"));
    }
    if (i == 0 || source[i - 1] != e) {
      if (const int64_t at = FirstNonFinite(file.data(*e), e->dtype, e->numel()); at >= 0) {
        return bad(absl::StrCat("tensor '", e->name, "' holds a NaN or infinity at element ", at,
                                " (weights of a run that diverged)"));
      }
    }
    source[i] = e;
  }
  // The same shapes can hold another model: heads are not in the tensors.
  if (auto it = file.metadata().find(kConfigKey); it != file.metadata().end()) {
    GptConfig saved;
    if (!google::protobuf::TextFormat::ParseFromString(it->second, &saved)) {
      return bad(absl::StrCat("its ", kConfigKey, " metadata is not a GptConfig text proto"));
    }
    if (saved.heads() != model.config().heads()) {
      return bad(absl::StrCat("it was exported from a model with heads = ", saved.heads(), "; this model (GptConfig '",
                              model.config().name(), "') has heads = ", model.config().heads()));
    }
  }
  MEMWALL_RETURN_IF_ERROR(CheckTiedHead(file, bad));
  // A file tensor in fp32 lives from its first tile to its last.
  absl::flat_hash_map<const SafetensorsEntry*, size_t> last_use;
  for (size_t i = 0; i < params.size(); ++i) last_use[source[i]] = i;
  absl::flat_hash_map<const SafetensorsEntry*, std::vector<float>> converted;
  Stream& s = device.compute_stream();
  std::vector<float> host;  // one parameter's part
  std::vector<uint16_t> half;
  for (size_t i = 0; i < params.size(); ++i) {
    const SafetensorsEntry& e = *source[i];
    const Placement& at = placement[i];
    const Tensor& value = params[i]->value;
    auto [it, added] = converted.try_emplace(&e);
    std::vector<float>& whole = it->second;
    if (added) {
      whole.resize(e.numel());
      MEMWALL_RETURN_IF_ERROR(Convert(file.data(e), e.dtype, whole.data(), DType::kF32, e.numel()));
    }
    const int64_t w = at.width, W = at.shape.back(), rows = params[i]->numel() / w;
    host.resize(params[i]->numel());
    for (int64_t r = 0; r < rows; ++r) std::copy_n(whole.data() + r * W + at.begin, w, host.data() + r * w);
    const void* src = host.data();
    if (value.dtype() != DType::kF32) {
      half.resize(host.size());
      MEMWALL_RETURN_IF_ERROR(Convert(host.data(), DType::kF32, half.data(), value.dtype(), host.size()));
      src = half.data();
    }
    MEMWALL_RETURN_IF_ERROR(s.Copy(value.data(), src, value.bytes()));
    MEMWALL_RETURN_IF_ERROR(s.Synchronize());  // `host` is reused
    if (last_use[&e] == i) converted.erase(&e);
  }
  return absl::OkStatus();
}

absl::StatusOr<GptConfig> InferGptConfig(const SafetensorsFile& file, int64_t heads) {
  const SafetensorsEntry* wte = FindEither(file, "wte.weight");
  const SafetensorsEntry* wpe = FindEither(file, "wpe.weight");
  if (wte == nullptr || wpe == nullptr || wte->shape.size() != 2 || wpe->shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GPT weights ", file.path(), ": need 2-D 'wte.weight' and 'wpe.weight' to infer the shape"));
  }
  int64_t layers = 0;
  while (FindEither(file, absl::StrCat("h.", layers, ".ln_1.weight")) != nullptr) ++layers;
  GptConfig c;
  c.set_name(file.path());
  c.set_layers(layers);
  c.set_hidden(wte->shape[1]);
  c.set_vocab(wte->shape[0]);
  c.set_positions(wpe->shape[0]);
  absl::StatusOr<int64_t> recorded = RecordedHeads(file);
  if (!recorded.ok() && recorded.status().code() != absl::StatusCode::kNotFound) return recorded.status();
  if (heads == 0) {
    if (!recorded.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(recorded.status().message(), "; give the head count (--heads)"));
    }
    heads = *recorded;
  } else if (recorded.ok() && *recorded != heads) {
    return absl::InvalidArgumentError(absl::StrCat("heads = ", heads, " contradicts the ", *recorded,
                                                   " heads recorded with ", file.path(),
                                                   " (drop --heads to use the recorded count)"));
  }
  c.set_heads(heads);
  c.set_source("inferred from " + file.path());
  MEMWALL_RETURN_IF_ERROR(ValidateConfig(c));
  return c;
}

}  // namespace memwall::models
