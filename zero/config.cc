#include "zero/config.h"

#include <cmath>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "runtime/bounds.h"
#include "runtime/files.h"
#include "runtime/status.h"

namespace memwall::zero {
namespace {

// "<what><field> = <value> <need>", e.g. "ZeroConfig stage = 4 must be 0,
// 1, 2 or 3".
template <typename T>
absl::Status BadField(absl::string_view what, absl::string_view field, T value, absl::string_view need) {
  return absl::InvalidArgumentError(absl::StrCat(what, field, " = ", value, " ", need));
}

// The upper bound of a field that sizes memory, threads or loops
// (runtime/bounds.h): "<what><field> = <value> must be <= <limit> (<why>)".
absl::Status AtMost(absl::string_view what, absl::string_view field, int64_t value, int64_t limit,
                    absl::string_view why) {
  if (value <= limit) return absl::OkStatus();
  return BadField(what, field, value, absl::StrCat("must be <= ", LimitString(limit), " (", why, ")"));
}

ops::AdamOptions AdamFromConfig(const AdamConfig& c) {
  ops::AdamOptions o;
  if (c.has_lr()) o.lr = c.lr();
  if (c.has_beta1()) o.beta1 = c.beta1();
  if (c.has_beta2()) o.beta2 = c.beta2();
  if (c.has_eps()) o.eps = c.eps();
  if (c.has_weight_decay()) o.weight_decay = c.weight_decay();
  if (c.has_adamw()) o.adamw = c.adamw();
  return o;
}

}  // namespace

absl::string_view PrecisionName(Precision p) {
  switch (p) {
    case FP32: return "fp32";
    case BF16: return "bf16";
    case FP16: return "fp16";
    default: return "?";
  }
}

absl::StatusOr<Precision> ParsePrecision(absl::string_view name) {
  for (Precision p : {FP32, BF16, FP16}) {
    if (PrecisionName(p) == name) return p;
  }
  return absl::InvalidArgumentError(absl::StrCat("precision '", name, "' is not one of fp32, bf16, fp16"));
}

DType ParamDType(Precision p) {
  switch (p) {
    case FP32: return DType::kF32;
    case FP16: return DType::kF16;
    default: return DType::kBF16;
  }
}

ZeroConfig WithDefaults(const ZeroConfig& c) {
  ZeroConfig out = c;
  if (!out.has_reduce_bucket_bytes()) out.set_reduce_bucket_bytes(kDefaultReduceBucketBytes);
  if (!out.has_allgather_bucket_bytes()) out.set_allgather_bucket_bytes(kDefaultAllgatherBucketBytes);
  if (!out.has_overlap_comm()) out.set_overlap_comm(true);
  if (!out.has_prefetch_bucket_bytes()) out.set_prefetch_bucket_bytes(kDefaultPrefetchBucketBytes);
  if (!out.has_param_persistence_threshold()) {
    out.set_param_persistence_threshold(kDefaultParamPersistenceThreshold);
  }
  if (!out.has_max_live_params()) out.set_max_live_params(kDefaultMaxLiveParams);
  if (out.offload_optimizer().device() != OffloadOptimizerConfig::NONE) {
    OffloadOptimizerConfig& o = *out.mutable_offload_optimizer();
    if (!o.has_pin_memory()) o.set_pin_memory(true);
    if (!o.has_tile_elements()) o.set_tile_elements(kDefaultOffloadTileElements);
    if (!o.has_delayed_update_after_steps()) o.set_delayed_update_after_steps(0);
  }
  if (out.offload_param().device() == OffloadParamConfig::NVME && !out.offload_param().has_buffer_count()) {
    out.mutable_offload_param()->set_buffer_count(kDefaultParamSwapBuffers);
  }
  if (out.offload_param().device() == OffloadParamConfig::NVME && !out.offload_param().has_read_ahead_buffers()) {
    out.mutable_offload_param()->set_read_ahead_buffers(out.offload_param().buffer_count() - 1);
  }
  return out;
}

absl::Status ValidateZeroConfig(const ZeroConfig& c, absl::string_view what) {
  auto Bad = [what](absl::string_view field, int64_t value, absl::string_view need) {
    return BadField(what, field, value, need);
  };
  if (c.stage() < 0 || c.stage() > 3) return Bad("stage", c.stage(), "must be 0, 1, 2 or 3");
  if (c.has_reduce_bucket_bytes() && c.reduce_bucket_bytes() <= 0) {
    return Bad("reduce_bucket_bytes", c.reduce_bucket_bytes(), "must be > 0 (unset: 64 MiB)");
  }
  if (c.has_allgather_bucket_bytes() && c.allgather_bucket_bytes() <= 0) {
    return Bad("allgather_bucket_bytes", c.allgather_bucket_bytes(), "must be > 0 (unset: 64 MiB)");
  }
  if (c.has_prefetch_bucket_bytes() && c.prefetch_bucket_bytes() < 0) {
    return Bad("prefetch_bucket_bytes", c.prefetch_bucket_bytes(),
               "must be >= 0 (0: no prefetch; unset: 32 MiB)");
  }
  if (c.has_param_persistence_threshold() && c.param_persistence_threshold() < 0) {
    return Bad("param_persistence_threshold", c.param_persistence_threshold(),
               "must be >= 0 elements (unset: 65536)");
  }
  if (c.has_max_live_params() && c.max_live_params() <= 0) {
    return Bad("max_live_params", c.max_live_params(), "must be > 0 elements (unset: 1e9)");
  }
  const OffloadOptimizerConfig& o = c.offload_optimizer();
  if (!OffloadOptimizerConfig::Device_IsValid(o.device())) {
    return Bad("offload_optimizer.device", o.device(), "must be NONE, CPU or NVME");
  }
  if (o.device() == OffloadOptimizerConfig::NONE) {
    // A setting of an optimizer that is not offloaded would be ignored.
    if (o.has_tile_elements()) {
      return Bad("offload_optimizer.tile_elements", o.tile_elements(), "needs offload_optimizer.device = CPU or NVME");
    }
    if (o.has_delayed_update_after_steps() && o.delayed_update_after_steps() != 0) {
      return Bad("offload_optimizer.delayed_update_after_steps", o.delayed_update_after_steps(),
                 "needs offload_optimizer.device = CPU or NVME");
    }
  }
  if (o.device() != OffloadOptimizerConfig::NVME) {
    if (!o.nvme_path().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(what, "offload_optimizer.nvme_path = \"", o.nvme_path(),
                                                     "\" needs offload_optimizer.device = NVME"));
    }
    if (o.has_pinned_budget_bytes()) {
      return Bad("offload_optimizer.pinned_budget_bytes", o.pinned_budget_bytes(), "needs offload_optimizer.device = NVME");
    }
  } else {
    if (o.nvme_path().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(what, "offload_optimizer.nvme_path is empty: device = NVME "
                                                     "needs the directory of the swap files"));
    }
    if (o.has_pinned_budget_bytes() && o.pinned_budget_bytes() < 0) {
      return Bad("offload_optimizer.pinned_budget_bytes", o.pinned_budget_bytes(), "must be >= 0 (0: three swap buffers)");
    }
  }
  if (const OffloadParamConfig::Device p = c.offload_param().device(); p != OffloadParamConfig::NONE) {
    if (c.stage() != 3) {
      return Bad(absl::StrCat("offload_param.device = ", OffloadParamConfig::Device_Name(p), " with stage"), c.stage(),
                 "needs stage 3 (only stage 3 partitions the 16-bit parameters)");
    }
  }
  if (!ZeroConfig::Partitioning_IsValid(c.partitioning())) {
    return Bad("partitioning", c.partitioning(), "must be CONTIGUOUS or BANDWIDTH_CENTRIC");
  }
  if (c.partitioning() == ZeroConfig::BANDWIDTH_CENTRIC && c.stage() != 3) {
    return Bad("partitioning = BANDWIDTH_CENTRIC with stage", c.stage(),
               "needs stage 3 (below it every rank holds every parameter)");
  }
  const OffloadParamConfig& param = c.offload_param();
  if (!OffloadParamConfig::Device_IsValid(param.device())) {
    return Bad("offload_param.device", param.device(), "must be NONE, CPU or NVME");
  }
  if (param.device() != OffloadParamConfig::NVME) {
    if (!param.nvme_path().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(what, "offload_param.nvme_path = \"", param.nvme_path(),
                                                     "\" needs offload_param.device = NVME"));
    }
    if (param.has_buffer_count()) {
      return Bad("offload_param.buffer_count", param.buffer_count(), "needs offload_param.device = NVME");
    }
    if (param.has_read_ahead_buffers()) {
      return Bad("offload_param.read_ahead_buffers", param.read_ahead_buffers(), "needs offload_param.device = NVME");
    }
  } else {
    if (param.nvme_path().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(what, "offload_param.nvme_path is empty: device = NVME "
                                                     "needs the directory of the parameter swap files"));
    }
    if (param.has_buffer_count() && param.buffer_count() < 2) {
      return Bad("offload_param.buffer_count", param.buffer_count(),
                 "must be >= 2 (one buffer read while the other is copied; unset: 4)");
    }
    const int64_t buffers = param.has_buffer_count() ? param.buffer_count() : kDefaultParamSwapBuffers;
    if (param.has_read_ahead_buffers() && (param.read_ahead_buffers() < 0 || param.read_ahead_buffers() > buffers - 1)) {
      return Bad("offload_param.read_ahead_buffers", param.read_ahead_buffers(),
                 absl::StrCat("must be in [0, buffer_count - 1 = ", buffers - 1,
                              "] (one swap-in buffer stays free for a gather's own reads; unset: buffer_count - 1)"));
    }
    if (o.device() == OffloadOptimizerConfig::NONE) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, "offload_param.device = NVME needs offload_optimizer.device = CPU or NVME: the CPU Adam writes "
                "the updated 16-bit parameters straight to the file, and the device's Adam cannot"));
    }
  }
  if (o.device() != OffloadOptimizerConfig::NONE) {
    if (c.stage() == 0) {
      return Bad(absl::StrCat("offload_optimizer.device = ", OffloadOptimizerConfig::Device_Name(o.device()),
                              " with stage"),
                 c.stage(), "needs stage 1, 2 or 3 (the offloaded optimizer steps this rank's shard)");
    }
    if (o.has_tile_elements() && o.tile_elements() <= 0) {
      return Bad("offload_optimizer.tile_elements", o.tile_elements(), "must be > 0 (unset: 4 Mi)");
    }
    if (o.has_delayed_update_after_steps() && o.delayed_update_after_steps() < 0) {
      return Bad("offload_optimizer.delayed_update_after_steps", o.delayed_update_after_steps(),
                 "must be >= 0 (0: no delayed parameter update; the paper uses 40)");
    }
  }
  // Upper bounds: each of these sizes a buffer or a loop.
  for (const auto& [field, value, limit, why] :
       {std::tuple<absl::string_view, int64_t, int64_t, absl::string_view>{
            "reduce_bucket_bytes", c.reduce_bucket_bytes(), kMaxBucketBytes, "a bucket is one device buffer"},
        {"allgather_bucket_bytes", c.allgather_bucket_bytes(), kMaxBucketBytes, "a bucket is one device buffer"},
        {"prefetch_bucket_bytes", c.prefetch_bucket_bytes(), kMaxBucketBytes, "a bucket is one device buffer"},
        {"param_persistence_threshold", c.param_persistence_threshold(), kMaxParameters, "elements; Ψ < 2^53"},
        {"max_live_params", c.max_live_params(), kMaxParameters, "elements; Ψ < 2^53"},
        {"offload_optimizer.tile_elements", o.tile_elements(), kMaxTileElements, "a tile is two pinned buffers"},
        {"offload_optimizer.delayed_update_after_steps", o.delayed_update_after_steps(), kMaxSteps, "steps"},
        {"offload_optimizer.pinned_budget_bytes", o.pinned_budget_bytes(), kMaxBudgetBytes, "bytes"},
        {"offload_param.buffer_count", param.buffer_count(), kMaxSwapBuffers, "each is a pinned swap buffer"},
        {"offload_param.read_ahead_buffers", param.read_ahead_buffers(), kMaxSwapBuffers, "at most buffer_count - 1"}}) {
    MEMWALL_RETURN_IF_ERROR(AtMost(what, field, value, limit, why));
  }
  return absl::OkStatus();
}

absl::Status CheckWorldSize(int64_t configured, int launched) {
  if (configured == launched) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "the experiment's world size is ", configured, " but ", launched,
      launched == 1 ? " rank was" : " ranks were",
      " launched (run it with mpirun -np ", configured, ")"));
}

absl::StatusOr<ZeroConfig> ParseZeroConfig(const std::string& text, const std::string& origin) {
  ZeroConfig c;
  if (absl::Status st = ParseTextProto(text, origin, &c); !st.ok()) return st;
  if (absl::Status st = ValidateZeroConfig(c); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": ", st.message()));
  }
  return c;
}

}  // namespace memwall::zero

namespace memwall::zero {

TrainingConfig WithDefaults(const TrainingConfig& c) {
  TrainingConfig out = c;
  if (!out.has_seq()) out.set_seq(kDefaultSeq);
  if (!out.has_micro_batch()) out.set_micro_batch(1);
  if (!out.has_accumulation()) out.set_accumulation(1);
  if (out.precision() == PRECISION_UNSPECIFIED) out.set_precision(kDefaultPrecision);
  // Adam's defaults have one home, ops::AdamOptions.
  const ops::AdamOptions adam = AdamFromConfig(c.adam());
  AdamConfig& a = *out.mutable_adam();
  a.set_lr(adam.lr);
  a.set_beta1(adam.beta1);
  a.set_beta2(adam.beta2);
  a.set_eps(adam.eps);
  a.set_weight_decay(adam.weight_decay);
  a.set_adamw(adam.adamw);
  if (!out.schedule().has_min_lr_ratio()) out.mutable_schedule()->set_min_lr_ratio(kDefaultMinLrRatio);
  if (!out.has_clip_norm()) out.set_clip_norm(kDefaultClipNorm);
  LossScaling& ls = *out.mutable_loss_scaling();
  if (!ls.has_initial_scale()) ls.set_initial_scale(kDefaultInitialLossScale);
  if (!ls.has_growth_interval()) ls.set_growth_interval(kDefaultLossScaleGrowthInterval);
  if (!ls.has_min_scale()) ls.set_min_scale(kDefaultMinLossScale);
  if (!out.has_seed()) out.set_seed(kDefaultSeed);
  *out.mutable_zero() = WithDefaults(c.zero());
  return out;
}

absl::Status ValidateTrainingConfig(const TrainingConfig& c, absl::string_view what) {
  auto Bad = [what](absl::string_view field, auto value, absl::string_view need) {
    return BadField(what, field, value, need);
  };
  if (c.has_seq() && c.seq() <= 0) return Bad("seq", c.seq(), "must be > 0 (unset: 128)");
  if (c.has_micro_batch() && c.micro_batch() <= 0) return Bad("micro_batch", c.micro_batch(), "must be > 0 (unset: 1)");
  if (c.has_accumulation() && c.accumulation() <= 0) {
    return Bad("accumulation", c.accumulation(), "must be > 0 (unset: 1)");
  }
  MEMWALL_RETURN_IF_ERROR(AtMost(what, "seq", c.seq(), kMaxCount, "tokens"));
  MEMWALL_RETURN_IF_ERROR(AtMost(what, "micro_batch", c.micro_batch(), kMaxCount, "sequences"));
  MEMWALL_RETURN_IF_ERROR(AtMost(what, "accumulation", c.accumulation(), kMaxCount, "micro-batches a step"));
  // A micro-batch's tokens index its activations' rows.
  if (absl::Status st = CheckedProduct(absl::StrCat(what, "tokens of a micro-batch"),
                                       {{"micro_batch", c.has_micro_batch() ? c.micro_batch() : 1},
                                        {"seq", c.has_seq() ? c.seq() : kDefaultSeq}},
                                       kMaxCount)
                            .status();
      !st.ok()) {
    return st;
  }
  if (!Precision_IsValid(c.precision())) {
    return Bad("precision", static_cast<int>(c.precision()), "must be FP32, BF16 or FP16 (unset: BF16)");
  }
  if (absl::Status st = ops::ValidateAdamOptions(AdamFromConfig(c.adam()), absl::StrCat(what, "adam."));
      !st.ok()) {
    return st;
  }
  const LrSchedule& s = c.schedule();
  if (s.warmup_steps() < 0) return Bad("schedule.warmup_steps", s.warmup_steps(), "must be >= 0");
  if (s.decay_steps() < 0) return Bad("schedule.decay_steps", s.decay_steps(), "must be >= 0 (0: no decay)");
  if (s.has_min_lr_ratio() && !(s.min_lr_ratio() >= 0 && s.min_lr_ratio() <= 1)) {
    return Bad("schedule.min_lr_ratio", s.min_lr_ratio(), "must be in [0, 1] (unset: 0.1)");
  }
  if (c.has_clip_norm() && !(c.clip_norm() >= 0 && std::isfinite(c.clip_norm()))) {
    return Bad("clip_norm", c.clip_norm(), "must be finite and >= 0 (0 disables clipping; unset: 1)");
  }
  const LossScaling& ls = c.loss_scaling();
  if (ls.has_initial_scale() && !(ls.initial_scale() >= 1 && std::isfinite(ls.initial_scale()))) {
    return Bad("loss_scaling.initial_scale", ls.initial_scale(), "must be finite and >= 1 (unset: 65536)");
  }
  if (ls.has_growth_interval() && ls.growth_interval() <= 0) {
    return Bad("loss_scaling.growth_interval", ls.growth_interval(), "must be > 0 (unset: 1000)");
  }
  MEMWALL_RETURN_IF_ERROR(AtMost(what, "schedule.warmup_steps", s.warmup_steps(), kMaxSteps, "steps"));
  MEMWALL_RETURN_IF_ERROR(AtMost(what, "schedule.decay_steps", s.decay_steps(), kMaxSteps, "steps"));
  MEMWALL_RETURN_IF_ERROR(AtMost(what, "loss_scaling.growth_interval", ls.growth_interval(), kMaxSteps, "steps"));
  if (ls.has_min_scale() && !(ls.min_scale() > 0 && std::isfinite(ls.min_scale()))) {
    return Bad("loss_scaling.min_scale", ls.min_scale(), "must be finite and > 0 (unset: 1)");
  }
  return ValidateZeroConfig(c.zero(), absl::StrCat(what, "zero."));
}

TrainingOptions::TrainingOptions() : TrainingOptions(WithDefaults(TrainingConfig())) {}

TrainingOptions::TrainingOptions(const TrainingConfig& filled)
    : config_(filled), adam_(AdamFromConfig(filled.adam())) {}

absl::StatusOr<TrainingOptions> TrainingOptions::Create(const TrainingConfig& config, absl::string_view what) {
  if (absl::Status st = ValidateTrainingConfig(config, what); !st.ok()) return st;
  return TrainingOptions(WithDefaults(config));
}

absl::StatusOr<TrainingOptions> TrainingOptions::Parse(const std::string& text, const std::string& origin) {
  TrainingConfig c;
  if (absl::Status st = ParseTextProto(text, origin, &c); !st.ok()) return st;
  return Create(c, absl::StrCat(origin, ": TrainingConfig "));
}

}  // namespace memwall::zero
