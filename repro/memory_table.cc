#include "repro/memory_table.h"

#include "engine/engine.h"
#include "engine/estimate.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/gpt.h"
#include "repro/harness.h"
#include "repro/offload.h"
#include "runtime/status.h"

namespace memwall::repro {
namespace {

std::string Bytes(double v) { return v < 0 ? "" : absl::StrFormat("%.0f", v); }

constexpr MemoryTag kModelStates[] = {MemoryTag::kParams16, MemoryTag::kGrads, MemoryTag::kMasterParams,
                                      MemoryTag::kOptimizerStates};

}  // namespace

std::string MemoryTableCsv(const MemoryTableRow& r) {
  return absl::StrCat(CsvField(r.model), ",", r.params, ",", r.layers, ",", r.hidden, ",", r.placement, ",", r.source,
                      ",", Bytes(r.model_states_total), ",", Bytes(r.device_per_rank), ",", Bytes(r.host_per_rank), ",",
                      Bytes(r.nvme_per_rank), ",", Bytes(r.activation_checkpoints_per_rank), ",",
                      Bytes(r.model_state_working_per_rank), ",", Bytes(r.activation_working_per_rank));
}

absl::StatusOr<std::vector<MemoryTableRow>> ModelMemoryTable(const Experiment& e, const std::string& configs_path) {
  MEMWALL_ASSIGN_OR_RETURN(const models::GptConfigList list, models::LoadConfigs(configs_path));
  const MemoryTable& table = e.memory_table();
  const double bsz = double(e.training().micro_batch()), seq = double(e.training().seq());
  std::vector<MemoryTableRow> rows;
  for (const std::string& name : table.models()) {
    MEMWALL_ASSIGN_OR_RETURN(const models::GptConfig config, models::FindConfig(list, name));
    MemoryTableRow base;
    base.model = name;
    base.params = models::CountParameters(config);
    base.layers = config.layers();
    base.hidden = config.hidden();
    const double hd = double(config.hidden()), nl = double(config.layers()), heads = double(config.heads());

    MemoryTableRow formula = base;
    formula.placement = "any";
    formula.source = "paper formula";
    formula.model_states_total = 20.0 * double(base.params);
    formula.activation_checkpoints_per_rank = 2.0 * bsz * seq * hd * nl;
    formula.model_state_working_per_rank = 4.0 * hd * 4.0 * hd;
    formula.activation_working_per_rank = bsz * seq * (16.0 * hd + 2.0 * heads * seq);
    rows.push_back(formula);

    for (int mode : table.placements()) {
      const OffloadSweep::Mode placement = OffloadSweep::Mode(mode);
      const zero::TrainerOptions options = OffloadTrainerOptions(e, placement);
      MEMWALL_ASSIGN_OR_RETURN(const engine::Estimate est, engine::EstimateMemory(EstimateInputFor(options, config, table.ranks())));
      MemoryTableRow row = base;
      row.placement = ModeName(placement);
      row.source = "estimator";
      for (MemoryTag tag : kModelStates) {
        const int t = static_cast<int>(tag);
        row.model_states_total += double(est.device[t] + est.host[t] + est.nvme[t]) * double(table.ranks());
      }
      row.device_per_rank = double(est.total_device_bytes);
      row.host_per_rank = double(est.host_bytes);
      row.nvme_per_rank = double(est.nvme_bytes);
      for (const PlannedBuffer& b : est.plan.buffers()) {
        if (b.name == "model: residual stream") row.activation_checkpoints_per_rank += double(b.bytes);
        if (b.name == "model: block activations" || b.name == "model: backward scratch") {
          row.activation_working_per_rank += double(b.bytes);
        }
      }
      row.model_state_working_per_rank = double(est.of(MemoryTag::kCommBuffers));
      rows.push_back(row);
    }
  }
  return rows;
}

std::string MaxModelTableCsv(const MaxModelTableRow& r) {
  return absl::StrCat(r.model_parallel, ",", r.gpus, ",", r.stage, ",", r.source, ",", r.max_params, ",",
                      absl::StrFormat("%.6f", r.bytes_per_param));
}

absl::StatusOr<std::vector<MaxModelTableRow>> ZeroMaxModelTable(const Experiment& e) {
  const MaxModelTable& t = e.max_model_table();
  const int64_t budget = t.device_bytes(), nd = t.data_parallel();
  std::vector<MaxModelTableRow> rows;
  for (int64_t mp : t.model_parallel()) {
    for (int stage = 0; stage <= 3; ++stage) {
      engine::EstimateInput in;
      in.ranks = nd;
      in.training = e.training();
      in.training.mutable_zero()->set_stage(stage);
      // Per device, for `part` parameters (one MP part): model states, and
      // the whole plan.
      const auto bytes = [&](int64_t part, bool whole) -> absl::StatusOr<int64_t> {
        in.params = part;
        MEMWALL_ASSIGN_OR_RETURN(const engine::Estimate est, engine::EstimateMemory(in));
        return whole ? est.total_device_bytes : est.model_states_bytes;
      };
      MaxModelTableRow base;
      base.model_parallel = mp;
      base.gpus = mp * nd;
      base.stage = stage;

      MaxModelTableRow formula = base;
      formula.source = "paper formula";
      const double n = double(nd);
      formula.bytes_per_param = stage == 0 ? 16.0 : stage == 1 ? 4.0 + 12.0 / n : stage == 2 ? 2.0 + 14.0 / n : 16.0 / n;
      formula.max_params = mp * static_cast<int64_t>(double(budget) / formula.bytes_per_param);
      rows.push_back(formula);

      for (bool whole : {false, true}) {
        // The largest part in [lo, hi) that fits: bytes grow with the part.
        int64_t lo = 0, hi = budget * nd + 1;
        while (hi - lo > 1) {
          const int64_t mid = lo + (hi - lo) / 2;
          MEMWALL_ASSIGN_OR_RETURN(const int64_t b, bytes(mid, whole));
          (b <= budget ? lo : hi) = mid;
        }
        MaxModelTableRow row = base;
        row.source = whole ? "estimator with buckets" : "estimator";
        row.max_params = lo * mp;
        if (lo > 0) {
          MEMWALL_ASSIGN_OR_RETURN(const int64_t b, bytes(lo, false));
          row.bytes_per_param = double(b) / double(lo);
        }
        rows.push_back(row);
      }
    }
  }
  return rows;
}

}  // namespace memwall::repro
