// Fuzz target: the training config (a TrainingConfig text proto with its
// ZeroConfig, what --training_config and the experiments read;
// zero/config.h), and the memory estimate it drives.
// Promises checked on every input:
//   - a refusal is InvalidArgument naming the file;
//   - an accepted config, defaults filled, is accepted again as it is;
//   - the estimator, given it, a small GPT and 1, 3 or 4 ranks, either
//     refuses with a Status or plans only non-negative buffers whose tags
//     sum to its totals (no size overflows: UBSan reports one if it does).
#include "engine/engine.h"
#include "engine/estimate.h"
#include "models/gpt.h"
#include "tools/fuzz.h"
#include "zero/config.h"

namespace memwall::zero {
namespace {

constexpr char kOrigin[] = "fuzz-input.textproto";

models::GptConfig SmallModel() {
  models::GptConfig c;
  c.set_name("fuzz");
  c.set_layers(2);
  c.set_hidden(64);
  c.set_heads(4);
  c.set_vocab(256);
  c.set_positions(128);
  return c;
}

void Check(const uint8_t* data, size_t size) {
  auto options = TrainingOptions::Parse(fuzz::AsString(data, size), kOrigin);
  if (!options.ok()) {
    fuzz::CheckRefusal(options.status(), absl::StatusCode::kInvalidArgument, kOrigin);
    return;
  }
  auto again = TrainingOptions::Create(options->config());
  FUZZ_CHECK(again.ok(), "a filled config is refused: ", again.status().ToString());
  FUZZ_CHECK(again->config().SerializeAsString() == options->config().SerializeAsString(),
             "filling defaults twice changed the config");
  for (int64_t ranks : {1, 3, 4}) {
    engine::EstimateInput in;
    in.model = SmallModel();
    in.ranks = ranks;
    in.training = options->config();
    auto estimate = engine::EstimateMemory(in);
    if (!estimate.ok()) continue;  // e.g. seq beyond the model's positions
    int64_t device = 0;
    for (int64_t bytes : estimate->device) {
      FUZZ_CHECK(bytes >= 0, "a negative tag total");
      device += bytes;
    }
    for (const PlannedBuffer& b : estimate->plan.buffers()) FUZZ_CHECK(b.bytes >= 0, b.name, " is negative");
    FUZZ_CHECK(device == estimate->total_device_bytes, "tags sum to ", device, ", total says ",
               estimate->total_device_bytes);
  }
}

}  // namespace
}  // namespace memwall::zero

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  memwall::zero::Check(data, size);
  return 0;
}
