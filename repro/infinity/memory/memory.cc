#include "repro/infinity/memory/memory.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/estimate.h"
#include "models/gpt.h"
#include "repro/harness.h"
#include "repro/ladder.h"
#include "repro/sweep.h"
#include "runtime/files.h"
#include "runtime/memory.h"
#include "runtime/provenance.h"
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

namespace {

absl::Status ValidateMemoryTable(const Experiment& e) {
  const MemoryTable& t = e.memory_table();
  if (t.models().empty()) return BadField("memory_table.models", "[]", "must name at least one model of models/configs/papers.textproto");
  if (t.ranks() < 1) return BadField("memory_table.ranks", t.ranks(), "must be >= 1");
  for (int mode : t.placements()) {
    if (ModeOverlay(OffloadSweep::Mode(mode)).stage() != 3) {
      return BadField("memory_table.placements", OffloadSweep::Mode_Name(OffloadSweep::Mode(mode)), "must be a ZeRO-3 mode");
    }
  }
  return absl::OkStatus();
}

// ZeRO-3 and the paper's two placements: ZeRO-Inf-CPU, ZeRO-Inf-NVMe (with
// the gradient shard in host memory, then on NVMe with the rest).
void FillPlacements(Experiment& e) {
  if (!e.memory_table().placements().empty()) return;
  for (auto mode : {OffloadSweep::STAGE3, OffloadSweep::STAGE3_OFFLOAD_CPU_PARAMS, OffloadSweep::STAGE3_NVME_NVME_PARAMS,
                    OffloadSweep::STAGE3_NVME_ALL}) {
    e.mutable_memory_table()->add_placements(mode);
  }
}

absl::Status DriveMemoryTable(const Experiment& e, const RunContext& run) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string dir, ResultsDir(e, run));
  MEMWALL_ASSIGN_OR_RETURN(const std::vector<MemoryTableRow> rows,
                           ModelMemoryTable(e, WorkspaceDir() + "/models/configs/papers.textproto"));
  std::string csv = absl::StrCat(kMemoryTableCsvHeader, "\n");
  for (const MemoryTableRow& r : rows) {
    absl::StrAppend(&csv, MemoryTableCsv(r), "\n");
    std::printf("%-16s %-26s %-14s model states %s, device/rank %s, host/rank %s, NVMe/rank %s\n", r.model.c_str(),
                r.placement.c_str(), r.source.c_str(), FormatBytes(size_t(r.model_states_total)).c_str(),
                r.device_per_rank < 0 ? "-" : FormatBytes(size_t(r.device_per_rank)).c_str(),
                r.host_per_rank < 0 ? "-" : FormatBytes(size_t(r.host_per_rank)).c_str(),
                r.nvme_per_rank < 0 ? "-" : FormatBytes(size_t(r.nvme_per_rank)).c_str());
  }
  MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/data.csv", csv));
  MEMWALL_RETURN_IF_ERROR(RunFigureScript(run.figure_script, {dir + "/data.csv", dir + "/figure.png"}));
  Provenance p = ProvenanceOf(e, run);
  p.measured_or_modeled = absl::StrCat(
      "modeled, nothing run: source=estimator rows are engine/estimate.h over ", e.memory_table().ranks(),
      " ranks at micro_batch ", e.training().micro_batch(), " x seq ", e.training().seq(),
      " (the plans the engine allocates from); source=paper formula rows are ZeRO-Infinity §3's formulas "
      "(the paper's numbers) on the same shapes. The figure's printed values are not in this repository, so "
      "no row copies them");
  p.files["data.csv"] = "per model: the formula row, then one estimator row per placement; bytes";
  MEMWALL_RETURN_IF_ERROR(WriteProvenance(dir + "/provenance.json", p));
  std::printf("wrote %s/{data.csv, figure.png, provenance.json}\n", dir.c_str());
  return absl::OkStatus();
}

}  // namespace

const ExperimentKind kInfinityMemoryKind = {
    Experiment::INFINITY_MEMORY, "repro/infinity/memory/figure.py", kMemoryTable, /*cuda=*/false,
    /*offload_in_training=*/false, FillPlacements, ValidateMemoryTable, DriveMemoryTable};

}  // namespace memwall::repro
