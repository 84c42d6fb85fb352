// Fuzz target: DeepSpeed JSON configs (`//:train --deepspeed_config`,
// engine/deepspeed_config.h), the one config a user brings from another
// system. Promises checked on every input:
//   - a refusal is InvalidArgument naming the file;
//   - the translation is a function of the text: twice the same config and
//     the same lines;
//   - an accepted translation is a valid TrainingConfig (TrainingOptions
//     takes it), every line reads "<key> ... -> <what it became>", and
//     its train_batch_size check on 1, 2 and 3 ranks either refuses with
//     InvalidArgument or leaves micro_batch x accumulation x ranks equal to
//     train_batch_size (when the config gives one).
#include "engine/deepspeed_config.h"
#include "tools/fuzz.h"
#include "zero/config.h"

namespace memwall::engine {
namespace {

constexpr char kOrigin[] = "fuzz-input.json";

void Check(const uint8_t* data, size_t size) {
  const std::string json = fuzz::AsString(data, size);
  auto translation = TranslateDeepSpeedConfig(json, kOrigin);
  if (!translation.ok()) {
    fuzz::CheckRefusal(translation.status(), absl::StatusCode::kInvalidArgument, kOrigin);
    return;
  }
  auto again = TranslateDeepSpeedConfig(json, kOrigin);
  FUZZ_CHECK(again.ok(), "accepted once, refused the second time: ", again.status().ToString());
  FUZZ_CHECK(again->training.SerializeAsString() == translation->training.SerializeAsString(),
             "the same text translated to two configs");
  FUZZ_CHECK(again->lines == translation->lines, "the same text translated with other lines");
  auto options = zero::TrainingOptions::Create(translation->training);
  FUZZ_CHECK(options.ok(), "an accepted translation is not a valid TrainingConfig: ", options.status().ToString());
  for (const std::string& line : translation->lines) {
    FUZZ_CHECK(absl::StrContains(line, " -> "), "a line that does not say what the key became: ", line);
  }
  for (int ranks : {1, 2, 3}) {
    DeepSpeedTranslation t = *translation;
    const absl::Status st = CheckTrainBatchSize(t, ranks);
    if (!st.ok()) {
      FUZZ_CHECK(st.code() == absl::StatusCode::kInvalidArgument, "train_batch_size check: ", st.ToString());
      continue;
    }
    if (t.train_batch_size == 0) continue;
    const int64_t micro = t.training.has_micro_batch() ? t.training.micro_batch() : 1;
    FUZZ_CHECK(t.training.has_accumulation(), "an accepted train_batch_size left the accumulation unset");
    FUZZ_CHECK(__int128{micro} * t.training.accumulation() * ranks == t.train_batch_size, "micro ", micro,
               " x accumulation ",
               t.training.accumulation(), " x ", ranks, " ranks != train_batch_size ", t.train_batch_size);
  }
}

}  // namespace
}  // namespace memwall::engine

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  memwall::engine::Check(data, size);
  return 0;
}
