#include "repro/zero/max_model/max_model.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/estimate.h"
#include "repro/harness.h"
#include "runtime/files.h"
#include "runtime/provenance.h"
#include "runtime/status.h"

namespace memwall::repro {

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

namespace {

absl::Status ValidateMaxModelTable(const Experiment& e) {
  const MaxModelTable& t = e.max_model_table();
  if (t.device_bytes() <= 0) return BadField("max_model_table.device_bytes", t.device_bytes(), "must be > 0");
  if (t.data_parallel() < 1) return BadField("max_model_table.data_parallel", t.data_parallel(), "must be >= 1");
  if (t.model_parallel().empty()) return BadField("max_model_table.model_parallel", "[]", "must name at least one degree");
  for (int64_t mp : t.model_parallel()) {
    if (mp < 1) return BadField("max_model_table.model_parallel", mp, "must be >= 1");
  }
  return absl::OkStatus();
}

absl::Status DriveMaxModelTable(const Experiment& e, const RunContext& run) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string dir, ResultsDir(e, run));
  MEMWALL_ASSIGN_OR_RETURN(const std::vector<MaxModelTableRow> rows, ZeroMaxModelTable(e));
  std::string csv = absl::StrCat(kMaxModelTableCsvHeader, "\n");
  for (const MaxModelTableRow& r : rows) {
    absl::StrAppend(&csv, MaxModelTableCsv(r), "\n");
    std::printf("MP %-3lld %5lld GPUs  stage %d  %-24s %8.1fB parameters (%.4f bytes each per device)\n",
                (long long)r.model_parallel, (long long)r.gpus, r.stage, r.source.c_str(), r.max_params / 1e9,
                r.bytes_per_param);
  }
  MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/data.csv", csv));
  MEMWALL_RETURN_IF_ERROR(RunFigureScript(run.figure_script, {dir + "/data.csv", dir + "/figure.png"}));
  Provenance p = ProvenanceOf(e, run);
  p.measured_or_modeled = absl::StrCat(
      "modeled, nothing run: source=estimator rows are the largest model whose per-device model states (source="
      "estimator with buckets: whole plan, buckets included) from engine/estimate.h fit ",
      e.max_model_table().device_bytes(), " bytes, the model split over MP ranks and partitioned over ",
      e.max_model_table().data_parallel(), " data-parallel ranks, found by bisection; source=paper formula rows are "
      "ZeRO §5.1's 16, 4+12/N_d, 2+14/N_d and 16/N_d bytes per parameter, which give "
      "ZeRO Table 2's theoretical columns");
  p.files["data.csv"] = "per MP degree and stage: the formula row, then the estimator's without and with buckets";
  MEMWALL_RETURN_IF_ERROR(WriteProvenance(dir + "/provenance.json", p));
  std::printf("wrote %s/{data.csv, figure.png, provenance.json}\n", dir.c_str());
  return absl::OkStatus();
}

}  // namespace

const ExperimentKind kZeroMaxModelKind = {
    Experiment::ZERO_MAX_MODEL, "repro/zero/max_model/figure.py", kMaxModelTable, /*cuda=*/false,
    /*offload_in_training=*/false, /*fill_defaults=*/nullptr, ValidateMaxModelTable, DriveMaxModelTable};

}  // namespace memwall::repro
