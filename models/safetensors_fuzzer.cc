// Fuzz target: the safetensors reader (models/safetensors.h), the first
// code to touch a weights file a user hands memwall, and what it feeds
// (InferGptConfig, the import's shape inference).
// Promises checked on every input:
//   - a refusal is InvalidArgument naming the file;
//   - an accepted file's tensors lie inside its data, each exactly
//     numel * itemsize bytes, and writing them out again (the writer
//     memwall exports with) reads back as the same tensors and metadata;
//   - a GptConfig inferred from it passes the config validation, so its
//     parameter count is a positive int64 (the validation bounds it).
#include <cstring>

#include "models/gpt.h"
#include "models/gpt_io.h"
#include "models/safetensors.h"
#include "tools/fuzz.h"

namespace memwall::models {
namespace {

constexpr char kOrigin[] = "fuzz-input.safetensors";

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
  auto again = SafetensorsFile::Parse(SerializeSafetensors(tensors, file->metadata()), kOrigin);
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
  }
}

}  // namespace
}  // namespace memwall::models

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  memwall::models::Check(data, size);
  return 0;
}
