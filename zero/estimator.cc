#include "zero/estimator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/gpt.h"
#include "runtime/bounds.h"
#include "runtime/status.h"
#include "zero/partition.h"
#include "zero/config.h"
#include "zero/parameter_gather.h"
#include "zero/stage_plan.h"

namespace memwall::zero {
namespace {


absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("memory estimate: ", what));
}

}  // namespace

absl::StatusOr<Estimate> EstimateMemory(const EstimateInput& in) {
  if (in.ranks < 1) return Bad(absl::StrCat("ranks = ", in.ranks, " must be >= 1"));
  if (in.ranks > kMaxRanks) return Bad(absl::StrCat("ranks = ", in.ranks, " must be <= ", LimitString(kMaxRanks)));
  MEMWALL_ASSIGN_OR_RETURN(const TrainingOptions training, TrainingOptions::Create(in.training));
  if (in.device_bytes < 0) return Bad(absl::StrCat("device_bytes = ", in.device_bytes, " must be >= 0"));
  if (in.host_bytes < 0) return Bad(absl::StrCat("host_bytes = ", in.host_bytes, " must be >= 0"));
  if (in.disk_bytes < 0) return Bad(absl::StrCat("disk_bytes = ", in.disk_bytes, " must be >= 0"));
  if (in.model.has_value()) {
    if (absl::Status st = models::ValidateConfig(*in.model); !st.ok()) return st;
    if (training->seq() > in.model->positions()) {
      return Bad(absl::StrCat("TrainingConfig seq = ", training->seq(), " exceeds the model's ", in.model->positions(),
                              " positions"));
    }
    if (absl::Status st = models::CheckRunShape(*in.model, training->micro_batch(), training->seq()); !st.ok()) {
      return Bad(st.message());
    }
  } else if (in.params <= 0) {
    return Bad(absl::StrCat("params = ", in.params, " must be > 0 (or give a model)"));
  } else if (in.params >= kMaxParameters) {
    return Bad(absl::StrCat("params = ", in.params, " must be < ", LimitString(kMaxParameters),
                            " (16 bytes a parameter must fit int64)"));
  }
  const bool offload = training->zero().offload_optimizer().device() != OffloadOptimizerConfig::NONE;
  if (offload != static_cast<bool>(in.optimizer)) {
    return absl::FailedPreconditionError(
        offload ? absl::StrCat("memory estimate: zero.offload_optimizer.device = ",
                               OffloadOptimizerConfig::Device_Name(training->zero().offload_optimizer().device()),
                               " needs the offloaded optimizer's plan (offload::HostOptimizerProvider() or "
                               "infinity::NvmeOptimizerProvider(rank) as EstimateInput.optimizer)")
                : "memory estimate: an optimizer provider is given but zero.offload_optimizer.device is NONE");
  }
  const bool nvme_params = training->zero().offload_param().device() == OffloadParamConfig::NVME;
  if (nvme_params != static_cast<bool>(in.parameters)) {
    return absl::FailedPreconditionError(
        nvme_params ? "memory estimate: zero.offload_param.device = NVME needs the NVMe parameter store's plan "
                      "(infinity::NvmeParameterStoreProvider(rank) as EstimateInput.parameters)"
                    : "memory estimate: a parameter store provider is given but zero.offload_param.device is not NVME");
  }
  // The shape the engine would compute from the model's layout.
  PlanShape shape;
  shape.zero = training->zero();
  shape.numel = in.model.has_value() ? models::CountParameters(*in.model) : in.params;
  shape.ranks = static_cast<int>(in.ranks);
  shape.owners = Owners(shape.zero, shape.ranks);
  shape.shard = (shape.numel + shape.owners - 1) / shape.owners;
  shape.dtype = ParamDType(training->precision());
  if (in.model.has_value()) {
    MEMWALL_ASSIGN_OR_RETURN(std::unique_ptr<models::Gpt> gpt, models::Gpt::Create(*in.model));
    const bool bandwidth = shape.zero.partitioning() == ZeroConfig::BANDWIDTH_CENTRIC;
    const int bandwidth_owners = bandwidth ? shape.owners : 0;
    shape.largest_module = LargestModuleParameters(*gpt, bandwidth_owners);
    if (shape.zero.stage() == 3) {
      shape.persistent = PersistentElements(*gpt, shape.zero.param_persistence_threshold(), bandwidth_owners);
    }
    if (bandwidth) shape.shard = FlatLayout(*gpt, shape.owners, 0, true).shard();
  } else if (shape.zero.partitioning() == ZeroConfig::BANDWIDTH_CENTRIC) {
    return Bad("partitioning = BANDWIDTH_CENTRIC: the shard depends on every parameter's size: give a model");
  }
  const StageParts parts = ChooseStageParts(shape.zero, shape.dtype, offload);
  const ShardOptimizerRequest request = OptimizerRequest(shape, training.adam(), nullptr);
  RankPlanInput activations;
  if (in.model.has_value()) {
    activations.model = &*in.model;
    activations.micro_batch = training->micro_batch();
    activations.seq = training->seq();
    activations.checkpointing = in.checkpointing.value_or(in.model->activation_checkpointing());
  }

  Estimate e;
  e.params = shape.numel;
  e.plan = RankPlan(shape, parts, OptimizerPlan(request, parts, in.optimizer), in.parameters, activations);
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
  return e;
}

std::string Estimate::ToText() const {
  std::string out = absl::StrFormat("parameters: %d\nper rank, device memory:\n", params);
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
                      ", \"fits\": ", fits ? "true" : "false",
                      ", \"fits_device\": ", fits_device ? "true" : "false",
                      ", \"fits_host\": ", fits_host ? "true" : "false",
                      ", \"fits_disk\": ", fits_disk ? "true" : "false",
                      ", \"device_bytes_per_rank_by_tag\": {", tags, "}",
                      ", \"host_bytes_per_rank_by_tag\": {", host_tags, "}}");
}

}  // namespace memwall::zero
