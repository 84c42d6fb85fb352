// Fuzz target: experiment files (repro/<paper>/<result>/*.textproto, what
// `./bazelw run //repro:run -- FILE` reads; repro/experiment.h).
// Promises checked on every input:
//   - a refusal is InvalidArgument naming the file;
//   - an accepted experiment, its defaults filled, prints and parses back
//     to itself (filling defaults is idempotent and never makes an
//     experiment invalid).
#include "google/protobuf/text_format.h"
#include "repro/experiment.h"
#include "tools/fuzz.h"

namespace memwall::repro {
namespace {

constexpr char kOrigin[] = "fuzz-input.textproto";

void Check(const uint8_t* data, size_t size) {
  auto e = ParseExperiment(fuzz::AsString(data, size), kOrigin);
  if (!e.ok()) {
    fuzz::CheckRefusal(e.status(), absl::StatusCode::kInvalidArgument, kOrigin);
    return;
  }
  std::string text;
  FUZZ_CHECK(google::protobuf::TextFormat::PrintToString(*e, &text), "cannot print");
  auto again = ParseExperiment(text, kOrigin);
  FUZZ_CHECK(again.ok(), "a filled experiment is refused: ", again.status().ToString());
  FUZZ_CHECK(again->SerializeAsString() == e->SerializeAsString(), "filling defaults twice changed it");
}

}  // namespace
}  // namespace memwall::repro

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  memwall::repro::Check(data, size);
  return 0;
}
