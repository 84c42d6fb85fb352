// //models:evaluate: the mean next-token cross-entropy of a GPT-2 safetensors
// file on a text, with the byte-level tokenizer (token id = byte value).
//
//   ./bazelw run //models:evaluate -- --weights=FILE.safetensors --text=FILE
//       [--heads=N] [--seq=N] [--device=auto|cpu|cuda]      (one command line)
//
// The head count comes from the file (memwall's metadata, or the
// config.json beside it); --heads is for files that record none, and one
// that contradicts the record is refused.
//
// The text is cut into consecutive windows of seq + 1 tokens that overlap by
// one, so every token after the first is predicted exactly once; the last
// window may be shorter. Prints `loss=<value>` as its last line.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "models/data.h"
#include "models/flat_storage.h"
#include "models/gpt.h"
#include "models/gpt_io.h"
#include "runtime/best_device.h"
#include "runtime/launch.h"
#include "runtime/status.h"

ABSL_FLAG(std::string, weights, "", "GPT-2 weights (.safetensors, Hugging Face names)");
ABSL_FLAG(int64_t, heads, 0, "attention heads (default: recorded with the weights; needed only for a file without them)");
ABSL_FLAG(std::string, text, "", "text file to evaluate on (bytes are tokens)");
ABSL_FLAG(int64_t, seq, 0, "tokens per window (default: the positions in the file)");
ABSL_FLAG(std::string, device, "auto", "auto, cpu or cuda");

namespace memwall::models {
namespace {

absl::StatusOr<double> Evaluate() {
  if (absl::GetFlag(FLAGS_weights).empty() || absl::GetFlag(FLAGS_text).empty()) {
    return absl::InvalidArgumentError("--weights and --text are required");
  }
  for (const auto& [name, value] : {std::pair{"heads", absl::GetFlag(FLAGS_heads)}, {"seq", absl::GetFlag(FLAGS_seq)}}) {
    if (value < 0) return absl::InvalidArgumentError(absl::StrCat("--", name, "=", value, " must be > 0"));
  }
  const std::string weights = UserPath(absl::GetFlag(FLAGS_weights), std::getenv);
  const std::string text = UserPath(absl::GetFlag(FLAGS_text), std::getenv);
  MEMWALL_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Read(weights));
  MEMWALL_ASSIGN_OR_RETURN(GptConfig config, InferGptConfig(file, absl::GetFlag(FLAGS_heads)));
  const int64_t seq = absl::GetFlag(FLAGS_seq) > 0 ? absl::GetFlag(FLAGS_seq) : config.positions();
  if (seq > config.positions()) {
    return absl::InvalidArgumentError(absl::StrCat("--seq=", seq, " exceeds the ",
                                                   config.positions(), " positions in ", weights));
  }
  MEMWALL_ASSIGN_OR_RETURN(std::unique_ptr<TokenSource> source, ByteTextSource(text));
  if (source->size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(text, " has fewer than 2 bytes"));
  }
  if (config.vocab() < 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        weights, " has a vocabulary of ", config.vocab(), "; byte-level text needs 256"));
  }
  MEMWALL_ASSIGN_OR_RETURN(auto device, CreateDeviceByName(absl::GetFlag(FLAGS_device)));
  MEMWALL_ASSIGN_OR_RETURN(auto model, Gpt::Create(config));
  MEMWALL_ASSIGN_OR_RETURN(FlatStorage storage, BindFlatStorage(*model, *device, false));
  MEMWALL_RETURN_IF_ERROR(ImportGpt(file, *model, *device));
  std::fprintf(stderr, "evaluate: %lld layers, hidden %lld, %lld heads, vocabulary %lld, %lld positions; "
               "%lld parameters on %s; %lld tokens in windows of %lld\n",
               (long long)config.layers(), (long long)config.hidden(), (long long)config.heads(),
               (long long)config.vocab(), (long long)config.positions(),
               (long long)CountParameters(config), device->name().c_str(),
               (long long)source->size(), (long long)seq);
  LossSum total;
  std::vector<int32_t> ids, targets;
  const int64_t predicted = source->size() - 1;
  // A terminal gets one progress line rewritten in place; a log gets a
  // line at every tenth of the text.
  const bool tty = isatty(STDERR_FILENO);
  const int64_t windows = (predicted + seq - 1) / seq;
  const int64_t every = std::max<int64_t>(1, windows / 10);
  for (int64_t start = 0, window = 1; start < predicted; start += seq, ++window) {
    const int64_t t = std::min(seq, predicted - start);
    ids.resize(t);
    targets.resize(t);
    for (int64_t j = 0; j < t; ++j) {
      ids[j] = source->token(start + j);
      targets[j] = source->token(start + j + 1);
    }
    MEMWALL_ASSIGN_OR_RETURN(LossSum part, model->ForwardBackward(*device, ids.data(), targets.data(),
                                                                  1, t, 1.0f, false));
    total.sum += part.sum;
    total.tokens += part.tokens;
    if (tty || window % every == 0 || window == windows) {
      std::fprintf(stderr, "%sevaluate: %lld / %lld tokens, running loss %.4f%s", tty ? "\r" : "",
                   (long long)total.tokens, (long long)predicted, total.mean(), tty ? "" : "\n");
    }
  }
  if (tty) std::fprintf(stderr, "\n");
  return total.mean();
}

}  // namespace
}  // namespace memwall::models

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "the mean next-token loss of GPT-2 weights on a text.\n"
      "  evaluate --weights=FILE.safetensors --text=FILE [--heads=N] [--seq=N] [--device=auto|cpu|cuda]");
  absl::ParseCommandLine(argc, argv);
  const absl::StatusOr<double> loss = memwall::models::Evaluate();
  if (!loss.ok()) {
    std::fprintf(stderr, "evaluate: %s\n", std::string(loss.status().message()).c_str());
    return 1;
  }
  std::printf("loss=%.6f\n", *loss);
  return 0;
}
