#include "zero/config.h"

#include "absl/strings/str_cat.h"
#include "runtime/files.h"

namespace memwall::zero {
namespace {

absl::Status Bad(absl::string_view field, int64_t value, absl::string_view need) {
  return absl::InvalidArgumentError(
      absl::StrCat("ZeroConfig ", field, " = ", value, " ", need));
}

}  // namespace

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
  return out;
}

absl::Status ValidateZeroConfig(const ZeroConfig& c) {
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
  if (o.device() != OffloadOptimizerConfig::NONE) {
    if (c.stage() != 1 && c.stage() != 2) {
      return Bad("offload_optimizer.device = CPU with stage", c.stage(),
                 "needs stage 1 or 2 (ZeRO-Offload; stage 3 offload is ZeRO-Infinity's)");
    }
    if (o.has_tile_elements() && o.tile_elements() <= 0) {
      return Bad("offload_optimizer.tile_elements", o.tile_elements(), "must be > 0 (unset: 4 Mi)");
    }
    if (o.has_delayed_update_after_steps() && o.delayed_update_after_steps() < 0) {
      return Bad("offload_optimizer.delayed_update_after_steps", o.delayed_update_after_steps(),
                 "must be >= 0 (0: no delayed parameter update; the paper uses 40)");
    }
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
