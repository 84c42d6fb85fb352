// //repro:estimate: how much device memory, pinned host memory and NVMe one
// rank needs, before launching (engine/estimate.h).
//
//   ./bazelw run //repro:estimate -- (--params=N | --model=NAME|FILE.textproto [--model_name=NAME])
//       --ranks=N [--config=TRAINING.textproto] [--set='zero { stage: 2 } micro_batch: 4']
//       [--checkpointing=true|false] [--device_bytes=N] [--host_bytes=N] [--disk_bytes=N]
//       [--format=text|json]
//
// The run's settings are the trainer's own TrainingConfig
// (zero/training_config.proto: seq, micro_batch, precision, zero with its
// stage and offload_optimizer, ...): --config is a file of it, --set fields
// of it written inline and merged over the file; every unset field takes the
// trainer's default, and the output's first line says what was assumed. A
// relative --model or --config is taken from the directory `bazel run` was
// started in. --model takes a model name from models/configs/
// (offload_10b, gpt_1.3b, ...), a GptConfig text proto, or a GptConfigList
// with --model_name picking an entry (models::ResolveModel). --params takes
// 10e9 as well as 10000000000.
// Exits 0 with the estimate (one JSON object with --format=json), 1 when
// the run does not fit --device_bytes, --host_bytes (pinned) or
// --disk_bytes (NVMe offload's swap files), each budget per rank and the
// verdict said for each, followed by the placements that would fit; 2 on
// bad input. Without a budget there is no verdict ("fits": null).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "engine/engine.h"
#include "engine/estimate.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/text_format.h"
#include "models/gpt.h"
#include "runtime/files.h"
#include "runtime/launch.h"
#include "runtime/memory.h"
#include "runtime/status.h"

ABSL_FLAG(std::string, params, "", "parameter count, e.g. 10e9 (model states only); or give --model");
ABSL_FLAG(std::string, model, "", "a model name from models/configs/ (offload_10b, ...) or a GptConfig(List) file");
ABSL_FLAG(std::string, model_name, "", "entry of a GptConfigList given to --model");
ABSL_FLAG(int64_t, ranks, 1, "data-parallel ranks");
ABSL_FLAG(std::string, config, "", "TrainingConfig text proto file (zero/training_config.proto)");
ABSL_FLAG(std::string, set, "", "TrainingConfig fields in text-proto form, over --config, e.g. 'zero { stage: 3 }'");
ABSL_FLAG(std::string, checkpointing, "", "true or false (default: the model's setting)");
ABSL_FLAG(int64_t, device_bytes, 0, "device memory per rank to check against (0: none)");
ABSL_FLAG(int64_t, host_bytes, 0, "pinned host memory per rank to check against (0: none)");
ABSL_FLAG(int64_t, disk_bytes, 0, "NVMe bytes per rank (the swap files) to check against (0: none)");
ABSL_FLAG(std::string, format, "text", "text or json");
ABSL_FLAG(bool, buffers, false, "text: also list every buffer of the plan (name, memory, tag, bytes)");

namespace memwall::zero {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& flag, const std::string& path) {
  return ReadRegularFile(path, absl::StrCat("--", flag));
}

// --config, then --set over it; checked by the estimator, as the trainer
// checks it.
absl::StatusOr<TrainingConfig> LoadTraining() {
  TrainingConfig config;
  if (const std::string path = absl::GetFlag(FLAGS_config); !path.empty()) {
    const std::string resolved = UserPath(path, std::getenv);
    MEMWALL_ASSIGN_OR_RETURN(const std::string text, ReadFile("config", resolved));
    MEMWALL_RETURN_IF_ERROR(ParseTextProto(text, resolved, &config));
  }
  if (const std::string set = absl::GetFlag(FLAGS_set); !set.empty()) {
    TrainingConfig fields;
    MEMWALL_RETURN_IF_ERROR(ParseTextProto(set, "--set", &fields));
    config.MergeFrom(fields);
  }
  return config;
}

// The estimate, and for a run that does not fit, the placements that would.
struct Result {
  engine::Estimate estimate;
  std::vector<engine::Suggestion> fit;
};

// "would fit:" and a line per suggestion (or what to try when none fits).
std::string SuggestionsText(const std::vector<engine::Suggestion>& fit) {
  std::string text = fit.empty() ? "no placement memwall has fits these budgets: fewer parameters per rank "
                                   "(more ranks), a smaller micro-batch or sequence\n"
                                 : "would fit:\n";
  for (const engine::Suggestion& s : fit) {
    absl::StrAppend(&text, "  --set='", s.set, "'  device ", FormatBytes(s.estimate.total_device_bytes),
                    ", pinned host ", FormatBytes(s.estimate.host_bytes),
                    s.estimate.nvme_bytes > 0 ? absl::StrCat(", NVMe ", FormatBytes(s.estimate.nvme_bytes)) : "", "\n");
  }
  return text;
}

absl::StatusOr<Result> Run() {
  engine::EstimateInput in;
  const std::string model = absl::GetFlag(FLAGS_model), params = absl::GetFlag(FLAGS_params);
  if (model.empty() == params.empty()) {
    return absl::InvalidArgumentError("give exactly one of --params=N and --model=NAME|FILE");
  }
  if (!model.empty()) {
    MEMWALL_ASSIGN_OR_RETURN(models::GptConfig config, models::ResolveModel(model, absl::GetFlag(FLAGS_model_name)));
    in.model = config;
  } else {
    double count = 0;
    if (!absl::SimpleAtod(params, &count) || !(count >= 1) || count != std::floor(count) || count >= 9.2e18) {
      return absl::InvalidArgumentError(absl::StrCat("--params=", params, " is not a whole number of parameters "
                                                     "(10000000000 or 10e9)"));
    }
    in.params = static_cast<int64_t>(count);
  }
  in.ranks = absl::GetFlag(FLAGS_ranks);
  MEMWALL_ASSIGN_OR_RETURN(in.training, LoadTraining());
  const std::string ckpt = absl::GetFlag(FLAGS_checkpointing);
  if (ckpt == "true" || ckpt == "false") {
    in.checkpointing = ckpt == "true";
  } else if (!ckpt.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--checkpointing=", ckpt, " is not true or false"));
  }
  in.device_bytes = absl::GetFlag(FLAGS_device_bytes);
  in.host_bytes = absl::GetFlag(FLAGS_host_bytes);
  in.disk_bytes = absl::GetFlag(FLAGS_disk_bytes);
  const std::string format = absl::GetFlag(FLAGS_format);
  if (format != "text" && format != "json") {
    return absl::InvalidArgumentError(absl::StrCat("--format=", format, " is not text or json"));
  }
  Result result;
  MEMWALL_ASSIGN_OR_RETURN(result.estimate, engine::EstimateMemory(in));
  if (!result.estimate.fits) result.fit = engine::SuggestPlacements(in);
  return result;
}

}  // namespace
}  // namespace memwall::zero

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "how much device memory, pinned host memory and NVMe one rank needs, before launching.\n"
      "  estimate (--params=N | --model=NAME|FILE [--model_name=NAME]) [--ranks=N] [--config=FILE] [--set='...']\n"
      "           [--checkpointing=true|false] [--device_bytes=N] [--host_bytes=N] [--disk_bytes=N] [--format=text|json]\n"
      "           [--buffers]");
  absl::ParseCommandLine(argc, argv);
  auto result = memwall::zero::Run();
  if (!result.ok()) {
    std::fprintf(stderr, "estimate: %s\n", std::string(result.status().message()).c_str());
    return 2;
  }
  const memwall::engine::Estimate& estimate = result->estimate;
  if (absl::GetFlag(FLAGS_format) == "json") {
    std::printf("%s\n", estimate.ToJson().c_str());
  } else {
    std::printf("%s%s", estimate.ToText().c_str(),
                estimate.fits ? "" : memwall::zero::SuggestionsText(result->fit).c_str());
    if (absl::GetFlag(FLAGS_buffers)) {
      std::printf("every buffer, per rank (bytes):\n%s", estimate.plan.ToText().c_str());
    }
  }
  return estimate.fits ? 0 : 1;
}
