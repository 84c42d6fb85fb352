#include "engine/estimate.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/engine.h"
#include "google/protobuf/text_format.h"
#include "models/gpt.h"
#include "runtime/status.h"
#include "zero/config.h"
#include "zero/stage_plan.h"

namespace memwall::engine {
namespace {

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("memory estimate: ", what));
}

}  // namespace

absl::StatusOr<Estimate> EstimateMemory(const EstimateInput& in) {
  if (in.device_bytes < 0) return Bad(absl::StrCat("device_bytes = ", in.device_bytes, " must be >= 0"));
  if (in.host_bytes < 0) return Bad(absl::StrCat("host_bytes = ", in.host_bytes, " must be >= 0"));
  if (in.disk_bytes < 0) return Bad(absl::StrCat("disk_bytes = ", in.disk_bytes, " must be >= 0"));
  std::unique_ptr<models::Gpt> gpt;  // its modules and their sizes; no values are allocated
  if (in.model.has_value()) {
    absl::StatusOr<std::unique_ptr<models::Gpt>> made = models::Gpt::Create(*in.model);
    if (!made.ok()) return Bad(made.status().message());
    gpt = *std::move(made);
  }
  CompositionInput input;
  input.model = gpt.get();
  input.params = in.params;
  input.training = in.training;
  input.ranks = in.ranks;
  absl::StatusOr<zero::Composition> composition = Compose(input);
  if (!composition.ok()) {
    return absl::Status(composition.status().code(), absl::StrCat("memory estimate: ", composition.status().message()));
  }
  const zero::PlanShape& shape = composition->shape;
  zero::RankPlanInput activations;
  if (in.model.has_value()) {
    activations.model = &*in.model;
    activations.micro_batch = composition->training->micro_batch();
    activations.seq = composition->training->seq();
    activations.checkpointing = in.checkpointing.value_or(in.model->activation_checkpointing());
  }

  Estimate e;
  e.params = shape.numel;
  e.plan = zero::RankPlan(shape, composition->parts, activations);
  e.activations_counted = in.model.has_value();
  e.device = e.plan.ByTag(MemorySpace::kDevice);
  e.host = e.plan.ByTag(MemorySpace::kPinnedHost);
  e.total_device_bytes = e.plan.Total(MemorySpace::kDevice);
  e.host_bytes = e.plan.Total(MemorySpace::kPinnedHost);
  e.nvme = e.plan.ByTag(MemorySpace::kNvme);
  e.nvme_bytes = e.plan.Total(MemorySpace::kNvme);
  e.model_states_bytes = e.of(MemoryTag::kParams16) + e.of(MemoryTag::kGrads) +
                         e.of(MemoryTag::kMasterParams) + e.of(MemoryTag::kOptimizerStates);
  e.device_budget = in.device_bytes;
  e.host_budget = in.host_bytes;
  e.disk_budget = in.disk_bytes;
  e.fits_device = in.device_bytes == 0 || e.total_device_bytes <= in.device_bytes;
  e.fits_host = in.host_bytes == 0 || e.host_bytes <= in.host_bytes;
  e.fits_disk = in.disk_bytes == 0 || e.nvme_bytes <= in.disk_bytes;
  e.fits = e.fits_device && e.fits_host && e.fits_disk;
  e.assumed = composition->training.config();
  e.checkpointing = activations.checkpointing;
  return e;
}

std::vector<Suggestion> SuggestPlacements(const EstimateInput& in) {
  const zero::TrainingConfig& t = in.training;
  const int stage = t.zero().stage();
  const bool optimizer_off = t.zero().offload_optimizer().device() != zero::OffloadOptimizerConfig::NONE;
  std::vector<std::string> overlays;
  for (int s = stage + 1; s <= 3; ++s) overlays.push_back(absl::StrCat("zero { stage: ", s, " }"));
  if (!optimizer_off) {
    overlays.push_back(absl::StrCat("zero { stage: ", std::max(stage, 2), " offload_optimizer { device: CPU } }"));
  }
  if (t.zero().offload_param().device() == zero::OffloadParamConfig::NONE) {
    overlays.push_back("zero { stage: 3 offload_optimizer { device: CPU } offload_param { device: CPU } }");
  }
  if (t.zero().offload_optimizer().device() != zero::OffloadOptimizerConfig::NVME) {
    overlays.push_back("zero { stage: 3 offload_optimizer { device: NVME nvme_path: \"/local_nvme\" } "
                       "offload_param { device: CPU } }");
  }
  if (!t.zero().offload_optimizer().gradients_on_nvme() ||
      t.zero().offload_param().device() != zero::OffloadParamConfig::NVME) {
    overlays.push_back("zero { stage: 3 offload_optimizer { device: NVME nvme_path: \"/local_nvme\" "
                       "gradients_on_nvme: true } offload_param { device: NVME nvme_path: \"/local_nvme\" } }");
  }
  std::vector<Suggestion> out;
  auto consider = [&](const std::string& set, EstimateInput changed) {
    absl::StatusOr<Estimate> e = EstimateMemory(changed);
    if (e.ok() && e->fits) out.push_back({set, *std::move(e)});
  };
  for (const std::string& overlay : overlays) {
    zero::TrainingConfig over;
    if (!google::protobuf::TextFormat::ParseFromString(overlay, &over)) continue;
    EstimateInput changed = in;
    changed.training.MergeFrom(over);
    consider(overlay, changed);
  }
  const bool checkpointing = in.checkpointing.value_or(in.model.has_value() && in.model->activation_checkpointing());
  if (in.model.has_value() && !checkpointing) {
    EstimateInput changed = in;
    changed.checkpointing = true;
    consider("activation checkpointing (--checkpointing=true)", changed);
  }
  return out;
}

std::string Estimate::AssumedText() const {
  const zero::ZeroConfig& z = assumed.zero();
  std::string text = absl::StrCat("seq ", assumed.seq(), ", micro-batch ", assumed.micro_batch(), ", accumulation ",
                                  assumed.accumulation(), ", ", zero::PrecisionName(assumed.precision()));
  if (activations_counted) absl::StrAppend(&text, ", activation checkpointing ", checkpointing ? "on" : "off");
  absl::StrAppend(&text, ", stage ", z.stage());
  if (z.offload_optimizer().device() != zero::OffloadOptimizerConfig::NONE) {
    absl::StrAppend(&text, ", optimizer states on ", zero::OffloadOptimizerConfig::Device_Name(z.offload_optimizer().device()));
  }
  if (z.offload_param().device() != zero::OffloadParamConfig::NONE) {
    absl::StrAppend(&text, ", parameters on ", zero::OffloadParamConfig::Device_Name(z.offload_param().device()));
    if (z.offload_param().device() == zero::OffloadParamConfig::NVME && z.offload_param().host_elements() > 0) {
      absl::StrAppend(&text, " (a shard's first ", z.offload_param().host_elements(), " elements in pinned host memory)");
    }
  }
  return text;
}

std::string Estimate::ToText() const {
  std::string out = absl::StrFormat("assumed: %s (change with --set or --config)\nparameters: %d\nper rank, device memory:\n",
                                    AssumedText(), params);
  for (int t = 0; t < kNumMemoryTags; ++t) {
    if (device[t] == 0) continue;
    absl::StrAppendFormat(&out, "  %-18s %s\n", MemoryTagName(static_cast<MemoryTag>(t)),
                          FormatBytes(static_cast<size_t>(device[t])));
  }
  absl::StrAppendFormat(&out, "  %-18s %s\n", "model states", FormatBytes(model_states_bytes));
  absl::StrAppendFormat(&out, "  %-18s %s%s\n", "total", FormatBytes(total_device_bytes),
                        activations_counted ? "" : " (model states and buckets only: give --model "
                                                   "for activations)");
  absl::StrAppendFormat(&out, "per rank, pinned host memory (offload): %s\n", FormatBytes(host_bytes));
  for (int t = 0; t < kNumMemoryTags; ++t) {
    if (host[t] == 0) continue;
    absl::StrAppendFormat(&out, "  %-18s %s\n", MemoryTagName(static_cast<MemoryTag>(t)),
                          FormatBytes(static_cast<size_t>(host[t])));
  }
  if (nvme_bytes > 0) {
    absl::StrAppendFormat(&out, "per rank, NVMe swap files: %s\n", FormatBytes(nvme_bytes));
    for (int t = 0; t < kNumMemoryTags; ++t) {
      if (nvme[t] == 0) continue;
      absl::StrAppendFormat(&out, "  %-18s %s\n", MemoryTagName(static_cast<MemoryTag>(t)),
                            FormatBytes(static_cast<size_t>(nvme[t])));
    }
  }
  const auto verdict = [&](int64_t budget, bool ok, const char* what) {
    if (budget > 0) absl::StrAppendFormat(&out, "%s %s of %s\n", ok ? "fits in" : "DOES NOT FIT in", FormatBytes(budget), what);
  };
  verdict(device_budget, fits_device, "device memory");
  verdict(host_budget, fits_host, "pinned host memory");
  verdict(disk_budget, fits_disk, "disk (NVMe swap files)");
  if (!budgeted()) out += "no budget given (--device_bytes, --host_bytes, --disk_bytes): bytes only, no verdict\n";
  return out;
}

std::string Estimate::ToJson() const {
  std::string tags, host_tags;
  for (int t = 0; t < kNumMemoryTags; ++t) {
    absl::StrAppend(&tags, t == 0 ? "" : ", ", "\"", MemoryTagName(static_cast<MemoryTag>(t)),
                    "\": ", device[t]);
    absl::StrAppend(&host_tags, t == 0 ? "" : ", ", "\"", MemoryTagName(static_cast<MemoryTag>(t)),
                    "\": ", host[t]);
  }
  return absl::StrCat("{\"params\": ", params, ", \"model_states_bytes_per_rank\": ",
                      model_states_bytes, ", \"total_device_bytes_per_rank\": ", total_device_bytes,
                      ", \"host_bytes_per_rank\": ", host_bytes,
                      ", \"nvme_bytes_per_rank\": ", nvme_bytes,
                      ", \"activations_counted\": ", activations_counted ? "true" : "false",
                      ", \"device_budget_bytes\": ", device_budget,
                      ", \"host_budget_bytes\": ", host_budget,
                      ", \"disk_budget_bytes\": ", disk_budget,
                      ", \"assumed\": {\"seq\": ", assumed.seq(), ", \"micro_batch\": ", assumed.micro_batch(),
                      ", \"accumulation\": ", assumed.accumulation(), ", \"precision\": \"",
                      zero::PrecisionName(assumed.precision()), "\", \"checkpointing\": ",
                      checkpointing ? "true" : "false", ", \"stage\": ", assumed.zero().stage(), "}",
                      ", \"fits\": ", !budgeted() ? "null" : fits ? "true" : "false",
                      ", \"fits_device\": ", fits_device ? "true" : "false",
                      ", \"fits_host\": ", fits_host ? "true" : "false",
                      ", \"fits_disk\": ", fits_disk ? "true" : "false",
                      ", \"device_bytes_per_rank_by_tag\": {", tags, "}",
                      ", \"host_bytes_per_rank_by_tag\": {", host_tags, "}}");
}

}  // namespace memwall::engine
