// Fuzz target: the model config file (a GptConfigList text proto, what
// --model_config and the repro experiments read; models/gpt.h).
// Promises checked on every input:
//   - a refusal is InvalidArgument naming the file;
//   - every accepted config prints and parses back to itself, and the
//     sizes the engine derives from it (Ψ, the activation plan of one
//     sequence) are positive int64s: validation bounds the dimensions, so
//     no product overflows (UBSan reports one if it does).
#include "google/protobuf/text_format.h"
#include "models/gpt.h"
#include "tools/fuzz.h"

namespace memwall::models {
namespace {

constexpr char kOrigin[] = "fuzz-input.textproto";

void Check(const uint8_t* data, size_t size) {
  auto list = ParseConfigs(fuzz::AsString(data, size), kOrigin);
  if (!list.ok()) {
    fuzz::CheckRefusal(list.status(), absl::StatusCode::kInvalidArgument, kOrigin);
    return;
  }
  std::string text;
  FUZZ_CHECK(google::protobuf::TextFormat::PrintToString(*list, &text), "cannot print");
  auto again = ParseConfigs(text, kOrigin);
  FUZZ_CHECK(again.ok(), "printed configs are refused: ", again.status().ToString());
  FUZZ_CHECK(again->SerializeAsString() == list->SerializeAsString(), "configs changed through text");
  for (const GptConfig& c : list->configs()) {
    FUZZ_CHECK(CountParameters(c) > 0, c.name());
    const int64_t seq = std::min<int64_t>(c.positions(), 64);
    for (bool checkpointing : {false, true}) {
      const MemoryPlan plan = ActivationPlan(c, 1, seq, DType::kBF16, checkpointing);
      for (const PlannedBuffer& b : plan.buffers()) FUZZ_CHECK(b.bytes >= 0, c.name(), ": ", b.name);
    }
  }
}

}  // namespace
}  // namespace memwall::models

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  memwall::models::Check(data, size);
  return 0;
}
