// //repro:estimate: how much device memory, pinned host memory and NVMe one
// rank needs, before launching (engine/estimate.h).
//
//   ./bazelw run //repro:estimate -- (--params=N | --model=FILE.textproto [--model_name=NAME])
//       --ranks=N [--config=TRAINING.textproto] [--set='zero { stage: 2 } micro_batch: 4']
//       [--checkpointing=true|false] [--device_bytes=N] [--host_bytes=N] [--disk_bytes=N]
//       [--format=text|json]
//
// The run's settings are the trainer's own TrainingConfig
// (zero/training_config.proto: seq, micro_batch, precision, zero with its
// stage and offload_optimizer, ...): --config is a file of it, --set fields
// of it written inline and merged over the file; every unset field takes the
// trainer's default. A relative --model or --config is taken from the
// directory `bazel run` was started in. --model takes a GptConfig text
// proto, or a GptConfigList (for example models/configs/papers.textproto)
// with --model_name picking an entry.
// Exits 0 with the estimate (one JSON object with --format=json), 1 when
// the run does not fit --device_bytes, --host_bytes (pinned) or
// --disk_bytes (NVMe offload's swap files), each budget per rank and the
// verdict said for each, 2 on bad input.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "engine/engine.h"
#include "engine/estimate.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/text_format.h"
#include "models/gpt.h"
#include "runtime/files.h"
#include "runtime/launch.h"
#include "runtime/status.h"

ABSL_FLAG(int64_t, params, 0, "parameter count (model states only); or give --model");
ABSL_FLAG(std::string, model, "", "GptConfig or GptConfigList text proto");
ABSL_FLAG(std::string, model_name, "", "entry of a GptConfigList given to --model");
ABSL_FLAG(int64_t, ranks, 1, "data-parallel ranks");
ABSL_FLAG(std::string, config, "", "TrainingConfig text proto file (zero/training_config.proto)");
ABSL_FLAG(std::string, set, "", "TrainingConfig fields in text-proto form, over --config, e.g. 'zero { stage: 3 }'");
ABSL_FLAG(std::string, checkpointing, "", "true or false (default: the model's setting)");
ABSL_FLAG(int64_t, device_bytes, 0, "device memory per rank to check against (0: none)");
ABSL_FLAG(int64_t, host_bytes, 0, "pinned host memory per rank to check against (0: none)");
ABSL_FLAG(int64_t, disk_bytes, 0, "NVMe bytes per rank (the swap files) to check against (0: none)");
ABSL_FLAG(std::string, format, "text", "text or json");

namespace memwall::zero {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& flag, const std::string& path) {
  return ReadRegularFile(path, absl::StrCat("--", flag));
}

absl::StatusOr<models::GptConfig> LoadModel(const std::string& path, const std::string& name) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string text, ReadFile("model", path));
  models::GptConfig one;
  if (name.empty() && google::protobuf::TextFormat::ParseFromString(text, &one)) {
    MEMWALL_RETURN_IF_ERROR(models::ValidateConfig(one));
    return one;
  }
  MEMWALL_ASSIGN_OR_RETURN(models::GptConfigList list, models::LoadConfigs(path));
  if (name.empty()) {
    if (list.configs_size() == 1) return list.configs(0);
    return absl::InvalidArgumentError(absl::StrCat(path, " lists ", list.configs_size(),
                                                   " models; pick one with --model_name"));
  }
  return models::FindConfig(list, name);
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

absl::StatusOr<engine::Estimate> Run() {
  engine::EstimateInput in;
  const std::string model = absl::GetFlag(FLAGS_model);
  if (model.empty() == (absl::GetFlag(FLAGS_params) <= 0)) {
    return absl::InvalidArgumentError("give exactly one of --params=N (> 0) and --model=FILE");
  }
  if (!model.empty()) {
    MEMWALL_ASSIGN_OR_RETURN(models::GptConfig config,
                             LoadModel(UserPath(model, std::getenv), absl::GetFlag(FLAGS_model_name)));
    in.model = config;
  }
  in.params = absl::GetFlag(FLAGS_params);
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
  return engine::EstimateMemory(in);
}

}  // namespace
}  // namespace memwall::zero

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto estimate = memwall::zero::Run();
  if (!estimate.ok()) {
    std::fprintf(stderr, "estimate: %s\n", std::string(estimate.status().message()).c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_format) == "json") {
    std::printf("%s\n", estimate->ToJson().c_str());
  } else {
    std::printf("%s", estimate->ToText().c_str());
  }
  return estimate->fits ? 0 : 1;
}
