#include "repro/zero/memory/zero_memory.h"

#include <cstdio>

#include "engine/engine.h"
#include "engine/estimate.h"
#include "absl/strings/str_cat.h"
#include "models/data.h"
#include "models/gpt.h"
#include "repro/sweep.h"
#include "repro/harness.h"
#include "runtime/communicator.h"
#include "runtime/files.h"
#include "runtime/provenance.h"
#include "runtime/cpu_device.h"
#include "runtime/status.h"
#include "zero/config.h"
#include "zero/trainer.h"

namespace memwall::repro {
namespace {

std::string Cell(int64_t v) { return v < 0 ? "" : absl::StrCat(v); }

MemoryRow FromEstimate(const engine::Estimate& est, int stage, int64_t ranks) {
  MemoryRow r;
  r.stage = stage;
  r.ranks = ranks;
  r.params = est.params;
  r.source = "estimator";
  r.model_states_bytes = est.model_states_bytes;
  r.total_device_bytes = est.activations_counted ? est.total_device_bytes : -1;
  r.params16_bytes = est.of(MemoryTag::kParams16);
  r.grads_bytes = est.of(MemoryTag::kGrads);
  r.master_bytes = est.of(MemoryTag::kMasterParams);
  r.optimizer_bytes = est.of(MemoryTag::kOptimizerStates);
  return r;
}

MemoryRow Paper(int stage, int64_t params, int64_t ranks) {
  MemoryRow r;
  r.stage = stage;
  r.ranks = ranks;
  r.params = params;
  r.source = "paper";
  r.model_states_bytes = static_cast<int64_t>(PaperModelStateBytes(stage, double(params), double(ranks)));
  return r;
}

}  // namespace

std::string ToCsv(const MemoryRow& r) {
  return absl::StrCat(r.part, ",", CsvField(r.label), ",", r.stage, ",", r.ranks, ",", r.params, ",", r.source,
                      ",", r.model_states_bytes, ",", Cell(r.total_device_bytes), ",", Cell(r.params16_bytes),
                      ",", Cell(r.grads_bytes), ",", Cell(r.master_bytes), ",", Cell(r.optimizer_bytes));
}

double PaperModelStateBytes(int stage, double psi, double n) {
  switch (stage) {
    case 0: return 16 * psi;
    case 1: return 4 * psi + 12 * psi / n;
    case 2: return 2 * psi + 14 * psi / n;
    default: return 16 * psi / n;
  }
}

absl::StatusOr<std::vector<MemoryRow>> MeasureZeroMemory(const Experiment& e, int world_size) {
  MEMWALL_ASSIGN_OR_RETURN(SweepRank rank, JoinSweep(world_size));
  Communicator* comm = rank.comm.get();
  const bool root = rank.root();
  const int64_t psi = models::CountParameters(e.model());
  auto data = models::SyntheticSource(1 << 16, e.model().vocab(), 7);
  std::vector<MemoryRow> rows;
  for (int stage : e.stages()) {
    // A device per run, so its peaks are this run's alone.
    MEMWALL_ASSIGN_OR_RETURN(std::unique_ptr<Device> device, CreateCpuDevice());
    MEMWALL_ASSIGN_OR_RETURN(std::unique_ptr<models::Gpt> model, models::Gpt::Create(e.model()));
    const zero::TrainerOptions options = TrainerOptionsFor(e, stage, world_size);
    MEMWALL_ASSIGN_OR_RETURN(auto trainer, engine::CreateTrainer(*model, *device, *comm, options));
    for (int64_t step = 0; step < e.steps(); ++step) {
      MEMWALL_ASSIGN_OR_RETURN(zero::StepStats stats, trainer->Step(*data));
      (void)stats;
    }
    const MemoryAccount& account = device->memory().account();
    MemoryRow m;
    m.part = "sweep";
    m.stage = stage;
    m.ranks = world_size;
    m.params = psi;
    m.source = "measured";
    m.params16_bytes = account.peak(MemoryTag::kParams16);
    m.grads_bytes = account.peak(MemoryTag::kGrads);
    m.master_bytes = account.peak(MemoryTag::kMasterParams);
    m.optimizer_bytes = account.peak(MemoryTag::kOptimizerStates);
    m.model_states_bytes = m.params16_bytes + m.grads_bytes + m.master_bytes + m.optimizer_bytes;
    m.total_device_bytes = account.total_peak();

    engine::EstimateInput in;
    in.model = e.model();
    in.ranks = world_size;
    in.training = options.training;  // what the trainer ran with
    MEMWALL_ASSIGN_OR_RETURN(const engine::Estimate est, engine::EstimateMemory(in));
    MemoryRow estimated = FromEstimate(est, stage, world_size);
    estimated.part = "sweep";
    MemoryRow paper = Paper(stage, psi, world_size);
    paper.part = "sweep";
    if (root) {
      std::printf("  stage %d, %d rank%s: model states %lld B/rank (paper %lld, estimator %lld); "
                  "device peak %lld B, estimator %+.1f%%\n",
                  stage, world_size, world_size == 1 ? "" : "s", (long long)m.model_states_bytes,
                  (long long)paper.model_states_bytes, (long long)estimated.model_states_bytes,
                  (long long)m.total_device_bytes,
                  100.0 * (double(estimated.total_device_bytes) / double(m.total_device_bytes) - 1));
      std::fflush(stdout);
      rows.push_back(m);
      rows.push_back(estimated);
      rows.push_back(paper);
    }
  }
  return rows;
}

absl::StatusOr<std::vector<MemoryRow>> ModelZeroMemory(const Experiment& e) {
  std::vector<MemoryRow> rows;
  for (const ModeledPoint& point : e.modeled()) {
    for (int stage = 0; stage <= 3; ++stage) {
      engine::EstimateInput in;
      in.params = point.params();
      in.ranks = point.ranks();
      in.training = e.training();
      in.training.mutable_zero()->set_stage(stage);
      MEMWALL_ASSIGN_OR_RETURN(const engine::Estimate est, engine::EstimateMemory(in));
      MemoryRow estimated = FromEstimate(est, stage, point.ranks());
      MemoryRow paper = Paper(stage, point.params(), point.ranks());
      if (point.paper_bytes_size() == 4) {
        // The figure's printed value, not the formula's.
        paper.source = "paper_figure";
        paper.model_states_bytes = static_cast<int64_t>(point.paper_bytes(stage));
      }
      MemoryRow formula = Paper(stage, point.params(), point.ranks());
      for (MemoryRow* r : {&estimated, &paper, &formula}) {
        r->part = "modeled";
        r->label = point.label();
      }
      rows.push_back(estimated);
      rows.push_back(formula);
      if (paper.source == "paper_figure") rows.push_back(paper);
    }
  }
  return rows;
}

namespace {

absl::Status ValidateZeroMemory(const Experiment& e) {
  if (absl::Status st = ValidateSweep(e); !st.ok()) return st;
  if (e.stages().empty()) return BadField("stages", "[]", "must list at least one ZeRO stage");
  for (int s : e.stages()) {
    if (s < 0 || s > 3) return BadField("stages", s, "must be 0, 1, 2 or 3");
  }
  for (const ModeledPoint& m : e.modeled()) {
    if (m.params() <= 0) return BadField("modeled.params", m.params(), "must be > 0");
    if (m.ranks() < 1) return BadField("modeled.ranks", m.ranks(), "must be >= 1");
    if (m.paper_bytes_size() != 0 && m.paper_bytes_size() != 4) {
      return BadField("modeled.paper_bytes", m.paper_bytes_size(), "values given; must be none or 4 (stages 0-3)");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> MeasureZeroMemoryRows(const Experiment& e, int world) {
  std::string csv;
  MEMWALL_ASSIGN_OR_RETURN(const std::vector<MemoryRow> rows, MeasureZeroMemory(e, world));
  for (const MemoryRow& r : rows) absl::StrAppend(&csv, ToCsv(r), "\n");
  return csv;
}

absl::Status DriveZeroMemory(const Experiment& e, const RunContext& run) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string dir, ResultsDir(e, run));
  MEMWALL_ASSIGN_OR_RETURN(const std::string rows, SweepWorldSizes(e, run, dir, MeasureZeroMemoryRows));
  std::string csv = absl::StrCat(kMemoryCsvHeader, "\n", rows);
  MEMWALL_ASSIGN_OR_RETURN(std::vector<MemoryRow> modeled, ModelZeroMemory(e));
  for (const MemoryRow& r : modeled) absl::StrAppend(&csv, ToCsv(r), "\n");
  MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/data.csv", csv));

  MEMWALL_RETURN_IF_ERROR(RunFigureScript(run.figure_script,
                                          {dir + "/data.csv", dir + "/figure.png"}));
  Provenance p = ProvenanceOf(e, run);
  p.measured_or_modeled =
      "part=sweep: source=measured rows are measured on the CpuDevice (peak bytes per tag after the "
      "training steps, rank 0); source=estimator and source=paper rows are modeled (engine/estimate.h; "
      "ZeRO §5.1's formula). part=modeled: modeled only (estimator, formula, and the figure's printed "
      "values as source=paper_figure)";
  p.files["data.csv"] = "one row per (part, stage, ranks, source); bytes per rank";
  MEMWALL_RETURN_IF_ERROR(WriteProvenance(dir + "/provenance.json", p));
  std::printf("wrote %s/{data.csv, figure.png, provenance.json}\n", dir.c_str());
  return absl::OkStatus();
}

}  // namespace

const ExperimentKind kZeroMemoryKind = {
    Experiment::ZERO_MEMORY, "repro/zero/memory/figure.py", kModel | kWorldSizes | kStages | kModeled,
    /*cuda=*/false, /*offload_in_training=*/true, /*fill_defaults=*/nullptr, ValidateZeroMemory, DriveZeroMemory,
    MeasureZeroMemoryRows};

}  // namespace memwall::repro
