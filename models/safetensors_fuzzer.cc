// Fuzz target: the safetensors reader (models/safetensors.h), the first
// code to touch a weights file a user hands memwall, and what it feeds
// (InferGptConfig, the import's shape inference).
// Promises checked on every input:
//   - a refusal is InvalidArgument naming the file;
//   - an accepted file's tensors lie inside its data, each exactly
//     numel * itemsize bytes, and writing them out again (the writer
//     memwall exports with) reads back as the same tensors and metadata;
//   - a GptConfig inferred from it passes the config validation, so its
//     parameter count is a positive int64 (the validation bounds it);
//   - importing it into that model (when small) either refuses with
//     InvalidArgument naming the file, or loads every parameter with the
//     file's values, and only when an lm_head.weight, if any, is wte's.
#include <cstring>
#include <vector>

#include "models/flat_storage.h"
#include "models/gpt.h"
#include "models/gpt_io.h"
#include "models/safetensors.h"
#include "runtime/cpu_device.h"
#include "tools/fuzz.h"

namespace memwall::models {
namespace {

constexpr char kOrigin[] = "fuzz-input.safetensors";

// The file's tensor `name` (or "transformer." + name) as fp32, or empty.
std::vector<float> Values(const SafetensorsFile& file, const std::string& name) {
  const SafetensorsEntry* e = file.Find(name);
  if (e == nullptr) e = file.Find("transformer." + name);
  if (e == nullptr || !IsFloating(e->dtype)) return {};
  std::vector<float> out(e->numel());
  if (!Convert(file.data(*e), e->dtype, out.data(), DType::kF32, out.size()).ok()) return {};
  return out;
}

void CheckImport(const SafetensorsFile& file, const GptConfig& config) {
  static Device* device = CreateCpuDevice()->release();
  auto model = Gpt::Create(config);
  if (!model.ok()) return;
  auto storage = BindFlatStorage(**model, *device, false);
  FUZZ_CHECK(storage.ok(), storage.status().ToString());
  const absl::Status st = ImportGpt(file, **model, *device);
  if (!st.ok()) {
    fuzz::CheckRefusal(st, absl::StatusCode::kInvalidArgument, kOrigin);
    return;
  }
  for (const Parameter* p : (*model)->Parameters()) {
    const std::vector<float> want = Values(file, p->name);
    FUZZ_CHECK(int64_t(want.size()) == p->numel(), p->name, " loaded from no tensor of its size");
    FUZZ_CHECK(std::memcmp(p->value.data(), want.data(), want.size() * sizeof(float)) == 0, p->name,
               " differs from the file");
  }
  if (file.Find("lm_head.weight") != nullptr || file.Find("transformer.lm_head.weight") != nullptr) {
    const std::vector<float> head = Values(file, "lm_head.weight"), wte = Values(file, "wte.weight");
    FUZZ_CHECK(head.size() == wte.size() && std::memcmp(head.data(), wte.data(), wte.size() * sizeof(float)) == 0,
               "an lm_head.weight that is not wte was accepted");
  }
}

void Check(const uint8_t* data, size_t size) {
  auto file = SafetensorsFile::Parse(fuzz::AsString(data, size), kOrigin);
  if (!file.ok()) {
    fuzz::CheckRefusal(file.status(), absl::StatusCode::kInvalidArgument, kOrigin);
    return;
  }
  std::vector<SafetensorsTensor> tensors;
  for (const SafetensorsEntry& e : file->entries()) {
    FUZZ_CHECK(e.begin <= e.end && e.numel() >= 0, e.name);
    FUZZ_CHECK(e.end - e.begin == uint64_t(e.numel()) * SizeOf(e.dtype), e.name);
    FUZZ_CHECK(file->Find(e.name) == &e, "Find(", e.name, ") is not the entry");
    tensors.push_back({e.name, e.dtype, e.shape, file->data(e)});
  }
  // What the reader takes, every writer can write back.
  auto bytes = SerializeSafetensors(tensors, file->metadata());
  FUZZ_CHECK(bytes.ok(), "an accepted file cannot be written back: ", bytes.status().ToString());
  auto again = SafetensorsFile::Parse(*bytes, kOrigin);
  FUZZ_CHECK(again.ok(), "a re-serialized file is refused: ", again.status().ToString());
  FUZZ_CHECK(again->metadata() == file->metadata(), "metadata changed");
  FUZZ_CHECK(again->entries().size() == file->entries().size(), "tensor count changed");
  for (const SafetensorsEntry& e : file->entries()) {
    const SafetensorsEntry* f = again->Find(e.name);
    FUZZ_CHECK(f != nullptr && f->dtype == e.dtype && f->shape == e.shape, e.name, " changed");
    FUZZ_CHECK(std::memcmp(again->data(*f), file->data(e), e.end - e.begin) == 0, e.name, "'s bytes changed");
  }
  for (int64_t heads : {1, 2, 12}) {
    auto config = InferGptConfig(*file, heads);
    if (!config.ok()) continue;
    FUZZ_CHECK(ValidateConfig(*config).ok(), "an inferred config is invalid: ",
               ValidateConfig(*config).ToString());
    FUZZ_CHECK(CountParameters(*config) > 0, "no parameters");
    if (heads == 1 && CountParameters(*config) <= (int64_t{1} << 16)) CheckImport(*file, *config);
  }
}

}  // namespace
}  // namespace memwall::models

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  memwall::models::Check(data, size);
  return 0;
}
