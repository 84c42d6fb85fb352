#include "zero/estimator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/gpt.h"
#include "runtime/status.h"
#include "zero/partition.h"
#include "zero/config.h"

namespace memwall::zero {
namespace {

void Add(Estimate& e, MemoryTag tag, int64_t bytes) { e.device[static_cast<int>(tag)] += bytes; }
void AddHost(Estimate& e, MemoryTag tag, int64_t bytes) { e.host[static_cast<int>(tag)] += bytes; }

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("memory estimate: ", what));
}

}  // namespace

absl::StatusOr<Estimate> EstimateMemory(const EstimateInput& in) {
  if (in.ranks < 1) return Bad(absl::StrCat("ranks = ", in.ranks, " must be >= 1"));
  if (absl::Status st = ValidateZeroConfig(in.zero); !st.ok()) return st;
  if (in.micro_batch <= 0) return Bad(absl::StrCat("micro_batch = ", in.micro_batch, " must be > 0"));
  if (in.seq <= 0) return Bad(absl::StrCat("seq = ", in.seq, " must be > 0"));
  if (in.device_bytes < 0) return Bad(absl::StrCat("device_bytes = ", in.device_bytes, " must be >= 0"));
  if (in.model.has_value()) {
    if (absl::Status st = models::ValidateConfig(*in.model); !st.ok()) return st;
    if (in.seq > in.model->positions()) {
      return Bad(absl::StrCat("seq = ", in.seq, " exceeds the model's ", in.model->positions(),
                              " positions"));
    }
  } else if (in.params <= 0) {
    return Bad(absl::StrCat("params = ", in.params, " must be > 0 (or give a model)"));
  }
  const ZeroConfig z = WithDefaults(in.zero);
  const int stage = z.stage();
  Estimate e;
  e.params = in.model.has_value() ? models::CountParameters(*in.model) : in.params;
  const int64_t psi = e.params;
  const int64_t shard = (psi + in.ranks - 1) / in.ranks;
  const bool half = in.precision != Precision::kFp32;
  const int64_t c = half ? 2 : 4;

  // What the engine sizes from the model's modules (zero/partition.h):
  // the largest module's own parameters, and stage 3's persistent ones.
  int64_t largest_module = 0, persistent = 0;
  if (in.model.has_value()) {
    MEMWALL_ASSIGN_OR_RETURN(std::unique_ptr<models::Gpt> gpt, models::Gpt::Create(*in.model));
    largest_module = LargestModuleParameters(*gpt);
    for (models::Parameter* p : gpt->Parameters()) {
      if (p->numel() <= z.param_persistence_threshold()) persistent += p->numel();
    }
  }
  const int64_t padded = shard * in.ranks;

  // Model states (the table in estimator.h; stages 1 and 2 pad the
  // replicated buffers to N shard elements).
  const bool offload = z.offload_optimizer().device() == OffloadOptimizerConfig::CPU;
  const bool bucketed = stage >= 2 || offload;  // gradients travel in reduce buckets
  const int64_t replicated = stage == 0 ? psi : padded;
  const int64_t capacity = std::min(padded, std::max(z.reduce_bucket_bytes() / c, largest_module));
  Add(e, half ? MemoryTag::kParams16 : MemoryTag::kMasterParams,
      c * (stage < 3 ? replicated : shard + persistent));
  if (!offload) {
    Add(e, MemoryTag::kGrads, c * (stage < 2 ? replicated : shard));
    if (half || stage > 0) Add(e, MemoryTag::kMasterParams, 4 * (stage == 0 ? psi : shard));
    Add(e, MemoryTag::kOptimizerStates, 8 * (stage == 0 ? psi : shard));
  } else {
    // ZeRO-Offload: the shard's states in pinned host memory (the table in
    // estimator.h), two gradient shards with the delayed update, and the
    // staging: the largest piece a flush delivers (one reduce bucket), two
    // tiles of updated values, the norm pair; with DPU in 16-bit modes the
    // delayed step's values, whole.
    const bool delayed = z.offload_optimizer().delayed_update_after_steps() > 0;
    const int64_t tile = std::max<int64_t>(1, std::min(z.offload_optimizer().tile_elements(), shard));
    AddHost(e, MemoryTag::kMasterParams, 4 * shard);
    AddHost(e, MemoryTag::kOptimizerStates, 8 * shard);
    AddHost(e, MemoryTag::kGrads, c * shard * (delayed ? 2 : 1));
    AddHost(e, MemoryTag::kStaging, c * capacity + 2 * c * tile + 8 + (delayed && half ? c * shard : 0));
  }
  for (int64_t bytes : e.host) e.host_bytes += bytes;
  e.model_states_bytes = e.of(MemoryTag::kParams16) + e.of(MemoryTag::kGrads) +
                         e.of(MemoryTag::kMasterParams) + e.of(MemoryTag::kOptimizerStates);

  // The trainer's two scalars: [sum of squares, overflow flag] and the
  // [loss sum, tokens] pair it all-reduces.
  Add(e, MemoryTag::kWorkspace, 2 * sizeof(float));
  Add(e, MemoryTag::kCommBuffers, 2 * sizeof(float));
  // Communication buffers, as zero/trainer.cc sizes them.
  if (stage == 1 || stage == 2) {  // the all-gather bucket: N equal chunks
    const int64_t chunk = std::max<int64_t>(1, std::min(padded, z.allgather_bucket_bytes() / c) / in.ranks);
    Add(e, MemoryTag::kCommBuffers, c * chunk * in.ranks);
  }
  if (bucketed) {  // reduce buckets: two with overlap_comm
    Add(e, MemoryTag::kCommBuffers, c * capacity * (z.overlap_comm() ? 2 : 1));
  }
  if (stage == 3) {
    // Gathered modules: the one in use plus what prefetch may hold; and
    // the divergence check's 2 int32 per rank.
    Add(e, MemoryTag::kCommBuffers, c * largest_module + std::min(z.prefetch_bucket_bytes(), c * psi) +
                                        8 * in.ranks);
  }

  // One micro-batch of the GPT (models/gpt.cc, Run).
  if (in.model.has_value()) {
    const models::GptConfig& m = *in.model;
    const int64_t rows = in.micro_batch * in.seq, d = m.hidden(), layers = m.layers();
    const int64_t heads = m.heads(), v = m.vocab();
    const bool checkpoint = in.checkpointing.value_or(m.activation_checkpointing());
    const int64_t blocks = checkpoint ? 1 : layers;
    const int64_t floats = (layers + 1) * rows * d                 // residual stream
                           + blocks * rows * (15 * d + heads + 4)  // block activations
                           + rows * (2 * d + 6)                    // embeddings, ln_f, losses, ids
                           + rows * (12 * d + heads);              // backward scratch
    Add(e, MemoryTag::kActivations, 4 * floats);
    const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(rows, (int64_t{1} << 26) / v));
    Add(e, MemoryTag::kWorkspace, 4 * chunk * v);
    if (half) Add(e, MemoryTag::kWorkspace, 2 * (2 * rows * 4 * d + rows * d + chunk * v));
    e.activations_counted = true;
  }
  for (int64_t bytes : e.device) e.total_device_bytes += bytes;
  e.device_budget = in.device_bytes;
  e.fits = in.device_bytes == 0 || e.total_device_bytes <= in.device_bytes;
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
  if (device_budget > 0) {
    absl::StrAppendFormat(&out, "%s %s of device memory\n", fits ? "fits in" : "DOES NOT FIT in",
                          FormatBytes(device_budget));
  }
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
                      ", \"activations_counted\": ", activations_counted ? "true" : "false",
                      ", \"device_budget_bytes\": ", device_budget,
                      ", \"fits\": ", fits ? "true" : "false",
                      ", \"device_bytes_per_rank_by_tag\": {", tags, "}",
                      ", \"host_bytes_per_rank_by_tag\": {", host_tags, "}}");
}

}  // namespace memwall::zero
