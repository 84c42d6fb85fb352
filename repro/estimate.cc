// //repro:estimate: how much device and pinned host memory one rank needs,
// before launching (zero/estimator.h).
//
//   ./bazelw run //repro:estimate -- (--params=N | --model=FILE.textproto [--model_name=NAME])
//       --ranks=N --stage=S [--micro_batch=B --seq=L --checkpointing=true|false]
//       [--precision=bf16|fp16|fp32] [--offload=none|cpu [--delayed_update_after_steps=K]]
//       [--device_bytes=N] [--format=text|json]
//
// A relative --model is taken from the directory `bazel run` was started in.
// --model takes a GptConfig text proto, or a GptConfigList (for example
// models/configs/papers.textproto) with --model_name picking an entry.
// Exits 0 with the estimate (one JSON object with --format=json), 1 when
// the run does not fit --device_bytes, 2 on bad input.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/text_format.h"
#include "models/gpt.h"
#include "offload/host_optimizer.h"
#include "runtime/launch.h"
#include "runtime/status.h"
#include "zero/estimator.h"

ABSL_FLAG(int64_t, params, 0, "parameter count (model states only); or give --model");
ABSL_FLAG(std::string, model, "", "GptConfig or GptConfigList text proto");
ABSL_FLAG(std::string, model_name, "", "entry of a GptConfigList given to --model");
ABSL_FLAG(int64_t, ranks, 1, "data-parallel ranks");
ABSL_FLAG(int32_t, stage, 0, "ZeRO stage: 0, 1, 2 or 3");
ABSL_FLAG(int64_t, micro_batch, 1, "sequences per micro-batch per rank");
ABSL_FLAG(int64_t, seq, 1024, "tokens per sequence");
ABSL_FLAG(std::string, checkpointing, "", "true or false (default: the model's setting)");
ABSL_FLAG(std::string, precision, "bf16", "bf16, fp16 or fp32");
ABSL_FLAG(std::string, offload, "none", "offload_optimizer device: none or cpu (ZeRO-Offload, stages 1 and 2)");
ABSL_FLAG(int64_t, delayed_update_after_steps, 0, "with --offload=cpu: the delayed parameter update's warm-up (0: no DPU)");
ABSL_FLAG(int64_t, device_bytes, 0, "device memory per rank to check against (0: none)");
ABSL_FLAG(std::string, format, "text", "text or json");

namespace memwall::zero {
namespace {

absl::StatusOr<models::GptConfig> LoadModel(const std::string& path, const std::string& name) {
  std::ifstream file(path);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot open --model=", path));
  std::stringstream text;
  text << file.rdbuf();
  models::GptConfig one;
  if (name.empty() && google::protobuf::TextFormat::ParseFromString(text.str(), &one)) {
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

absl::StatusOr<Estimate> Run() {
  EstimateInput in;
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
  in.zero.set_stage(absl::GetFlag(FLAGS_stage));
  const std::string offload = absl::GetFlag(FLAGS_offload);
  if (offload == "cpu") {
    in.zero.mutable_offload_optimizer()->set_device(OffloadOptimizerConfig::CPU);
    in.zero.mutable_offload_optimizer()->set_delayed_update_after_steps(absl::GetFlag(FLAGS_delayed_update_after_steps));
    in.optimizer = offload::HostOptimizerProvider();
  } else if (offload != "none") {
    return absl::InvalidArgumentError(absl::StrCat("--offload=", offload, " is not none or cpu"));
  } else if (absl::GetFlag(FLAGS_delayed_update_after_steps) != 0) {
    return absl::InvalidArgumentError("--delayed_update_after_steps needs --offload=cpu");
  }
  in.micro_batch = absl::GetFlag(FLAGS_micro_batch);
  in.seq = absl::GetFlag(FLAGS_seq);
  const std::string ckpt = absl::GetFlag(FLAGS_checkpointing);
  if (ckpt == "true" || ckpt == "false") {
    in.checkpointing = ckpt == "true";
  } else if (!ckpt.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--checkpointing=", ckpt, " is not true or false"));
  }
  MEMWALL_ASSIGN_OR_RETURN(in.precision, ParsePrecision(absl::GetFlag(FLAGS_precision)));
  in.device_bytes = absl::GetFlag(FLAGS_device_bytes);
  const std::string format = absl::GetFlag(FLAGS_format);
  if (format != "text" && format != "json") {
    return absl::InvalidArgumentError(absl::StrCat("--format=", format, " is not text or json"));
  }
  return EstimateMemory(in);
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
