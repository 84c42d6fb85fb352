// What a fuzz target (a file defining LLVMFuzzerTestOneInput, built by
// memwall_fuzz_test in tools/memwall.bzl) may use to state its invariants.
//
// A target feeds one input to a parser and checks what the parser promises
// of any input, not only that it does not crash: a refusal is a Status
// naming the input, and what is accepted is self-consistent (re-encoding
// and parsing again gives the same thing). FUZZ_CHECK aborts with the
// broken promise on stderr, which libFuzzer and the corpus replay
// (tools/fuzz_replay.cc) both report as a finding, with the input.
#ifndef MEMWALL_TOOLS_FUZZ_H_
#define MEMWALL_TOOLS_FUZZ_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

#define FUZZ_CHECK(condition, ...)                                                        \
  do {                                                                                     \
    if (!(condition)) {                                                                    \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: %s\n", __FILE__, __LINE__,      \
                   #condition, ::absl::StrCat("", __VA_ARGS__).c_str());                  \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)

namespace memwall::fuzz {

inline std::string AsString(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// Every target's promise about a refusal: its code, and a message that
// names the input (`origin`: the file name the target gave the parser).
inline void CheckRefusal(const absl::Status& status, absl::StatusCode code, absl::string_view origin) {
  FUZZ_CHECK(status.code() == code, status.ToString());
  FUZZ_CHECK(absl::StrContains(status.message(), origin), status.ToString());
}

}  // namespace memwall::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#endif  // MEMWALL_TOOLS_FUZZ_H_
