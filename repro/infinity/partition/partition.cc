#include "repro/infinity/partition/partition.h"

#include <cstdio>
#include <memory>

#include "engine/engine.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/data.h"
#include "models/gpt.h"
#include "repro/harness.h"
#include "repro/sweep.h"
#include "runtime/communicator.h"
#include "runtime/cpu_device.h"
#include "runtime/files.h"
#include "runtime/provenance.h"
#include "runtime/status.h"
#include "runtime/timeline.h"
#include "zero/config.h"

namespace memwall::repro {

std::string PartitionCsv(const PartitionRow& r) {
  return absl::StrFormat("%d,%s,measured,%d,%.1f,%.0f,%.6f,%.4f,%.4f,%.1f", r.ranks, r.partitioning, r.steps,
                         r.gathers_per_step, r.gathered_bytes_per_step, r.gather_seconds_per_step,
                         r.gather_gb_per_s(), r.step_seconds, r.tokens_per_second);
}

absl::StatusOr<std::vector<PartitionRow>> MeasurePartitioning(const Experiment& e, int world_size) {
  MEMWALL_ASSIGN_OR_RETURN(SweepRank rank, JoinSweep(world_size));
  Communicator* comm = rank.comm.get();
  const bool root = rank.root();
  auto data = models::SyntheticSource(1 << 16, e.model().vocab(), 7);
  std::vector<PartitionRow> rows;
  for (const auto partitioning : {zero::ZeroConfig::CONTIGUOUS, zero::ZeroConfig::BANDWIDTH_CENTRIC}) {
    PartitionRow row;
    row.ranks = world_size;
    row.partitioning = partitioning == zero::ZeroConfig::CONTIGUOUS ? "contiguous" : "bandwidth-centric";
    row.steps = e.steps();
    MEMWALL_ASSIGN_OR_RETURN(std::unique_ptr<Device> device, CreateCpuDevice());
    MEMWALL_ASSIGN_OR_RETURN(std::unique_ptr<models::Gpt> model, models::Gpt::Create(e.model()));
    Timeline timeline;
    zero::TrainerOptions options = TrainerOptionsFor(e, /*stage=*/3, world_size);
    zero::ZeroConfig& z = *options.training.mutable_zero();
    z.set_partitioning(partitioning);
    z.mutable_offload_param()->set_device(zero::OffloadParamConfig::CPU);
    z.mutable_offload_optimizer()->set_device(zero::OffloadOptimizerConfig::CPU);
    options.timeline = &timeline;
    MEMWALL_ASSIGN_OR_RETURN(auto trainer, engine::CreateTrainer(*model, *device, *comm, options));
    MEMWALL_RETURN_IF_ERROR(trainer->Step(*data).status());  // warm-up: records the module order
    double gathers = 0, bytes = 0, gather_ns = 0, seconds = 0, tokens = 0;
    for (int64_t step = 0; step < e.steps(); ++step) {
      timeline.Clear();
      MEMWALL_ASSIGN_OR_RETURN(const zero::StepStats stats, trainer->Step(*data));
      MEMWALL_RETURN_IF_ERROR(device->Synchronize());
      seconds += stats.seconds;
      tokens += double(stats.tokens);
      for (const Zone& z : timeline.Zones()) {
        if (!z.complete()) continue;
        if (z.kind == ZoneKind::kParamFetch || z.kind == ZoneKind::kParamGather) gather_ns += double(z.duration_ns());
        if (z.kind == ZoneKind::kParamGather) {
          gathers += 1;
          bytes += double(z.bytes);
        }
      }
    }
    const double n = double(e.steps());
    row.gathers_per_step = gathers / n;
    row.gathered_bytes_per_step = bytes / n;
    row.gather_seconds_per_step = gather_ns / 1e9 / n;
    row.step_seconds = seconds / n;
    row.tokens_per_second = seconds > 0 ? tokens / seconds : 0;
    if (root) {
      std::printf("  %d rank%s, %s: %.3f GB/s gathering (%.0f gathers, %.2f MB a step), %.1f tokens/s\n", world_size,
                  world_size == 1 ? "" : "s", row.partitioning.c_str(), row.gather_gb_per_s(), row.gathers_per_step,
                  row.gathered_bytes_per_step / 1e6, row.tokens_per_second);
      std::fflush(stdout);
      rows.push_back(row);
    }
  }
  return rows;
}

namespace {

absl::Status ValidatePartition(const Experiment& e) {
  if (absl::Status st = ValidateSweep(e); !st.ok()) return st;
  const zero::ZeroConfig& z = e.training().zero();
  if (z.has_offload_param() || z.partitioning() != zero::ZeroConfig::CONTIGUOUS) {
    return BadField("training.zero.offload_param/partitioning", "{...}", "must be unset: the sweep sets them");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> MeasurePartitionRows(const Experiment& e, int world) {
  std::string csv;
  MEMWALL_ASSIGN_OR_RETURN(const std::vector<PartitionRow> rows, MeasurePartitioning(e, world));
  for (const PartitionRow& r : rows) absl::StrAppend(&csv, PartitionCsv(r), "\n");
  return csv;
}

absl::Status DrivePartition(const Experiment& e, const RunContext& run) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string dir, ResultsDir(e, run));
  MEMWALL_ASSIGN_OR_RETURN(const std::string rows, SweepWorldSizes(e, run, dir, MeasurePartitionRows));
  MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/data.csv", absl::StrCat(kPartitionCsvHeader, "\n", rows)));
  MEMWALL_RETURN_IF_ERROR(RunFigureScript(run.figure_script, {dir + "/data.csv", dir + "/figure.png"}));
  Provenance p = ProvenanceOf(e, run);
  p.measured_or_modeled = absl::StrCat(
      "measured: each world size's ranks are processes on this machine (mpirun above one), each with its own "
      "CpuDevice; ZeRO-3 with offload_param and offload_optimizer on the CPU; one warm-up step, then ",
      e.steps(), " timed steps averaged; rank 0's timeline: gathered bytes and the time of its \"param fetch\" "
      "and \"param gather\" zones on the collective stream. The paper's Figure 6c (DGX-2 V100s, PCIe and "
      "NVMe) has no rows here: its gain is each GPU's own host link serving every gather, which a CpuDevice "
      "in one memory does not have");
  p.files["data.csv"] = "one row per (world size, partitioning)";
  MEMWALL_RETURN_IF_ERROR(WriteProvenance(dir + "/provenance.json", p));
  std::printf("wrote %s/{data.csv, figure.png, provenance.json}\n", dir.c_str());
  return absl::OkStatus();
}

}  // namespace

const ExperimentKind kInfinityPartitionKind = {
    Experiment::INFINITY_PARTITION, "repro/infinity/partition/figure.py", kModel | kWorldSizes, /*cuda=*/false,
    /*offload_in_training=*/false, /*fill_defaults=*/nullptr, ValidatePartition, DrivePartition, MeasurePartitionRows};

}  // namespace memwall::repro
