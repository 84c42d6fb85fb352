#include "repro/paired.h"

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "models/gpt.h"
#include "repro/harness.h"
#include "repro/sweep.h"
#include "runtime/files.h"
#include "runtime/memory.h"
#include "runtime/provenance.h"
#include "runtime/status.h"

namespace memwall::repro {

absl::StatusOr<std::vector<OffloadRow>> MeasurePaired(const Experiment& e, const PairedFeature& feature) {
  std::vector<OffloadRow> rows;
  const OffloadSweep& sweep = e.offload();
  const OffloadSweep::Mode mode = sweep.modes(0);
  for (int i = 0; i < sweep.ladder_size(); ++i) {
    for (const bool on : {false, true}) {
      models::GptConfig config = sweep.ladder(i);
      zero::TrainerOptions options = OffloadTrainerOptions(e, mode);
      feature.set(on, config, options);
      std::printf("[%d/%d] %s (%.1fM parameters), %s%s\n", 2 * i + on + 1, 2 * sweep.ladder_size(),
                  config.name().c_str(), models::CountParameters(config) / 1e6, ModeName(mode).c_str(),
                  on ? std::string(feature.suffix).c_str() : "");
      std::fflush(stdout);
      MEMWALL_ASSIGN_OR_RETURN(OffloadRow row, Attempt(e, config, mode, sweep.warmup_steps(), e.steps(), "", &options));
      if (on) absl::StrAppend(&row.mode, feature.suffix);
      if (row.fits) {
        std::printf("  %.1f tokens/s, device peak %s, pinned host peak %s, device idle %.0f%%\n", row.tokens_per_second,
                    FormatBytes(row.device_peak_bytes).c_str(), FormatBytes(row.host_pinned_peak_bytes).c_str(),
                    100 * row.device_idle_fraction);
      } else {
        std::printf("  does not fit: %s\n", row.reason.c_str());
      }
      std::fflush(stdout);
      rows.push_back(row);
    }
  }
  return rows;
}

std::string PairedSummaryCsv(const std::vector<OffloadRow>& rows) {
  std::string csv =
      "model,hidden,params,tokens_per_second_off,tokens_per_second_on,throughput_ratio,device_peak_off,"
      "device_peak_on,device_peak_ratio\n";
  for (size_t i = 0; i + 1 < rows.size(); i += 2) {
    const OffloadRow& off = rows[i];
    const OffloadRow& on = rows[i + 1];
    const bool both = off.fits && on.fits;
    const double peak_ratio = off.device_peak_bytes > 0 && on.device_peak_bytes >= 0
                                  ? double(on.device_peak_bytes) / double(off.device_peak_bytes)
                                  : -1.0;
    absl::StrAppend(&csv, CsvField(off.model), ",", off.hidden, ",", off.params, ",",
                    CsvCell(off.fits ? off.tokens_per_second : -1, "%.1f"), ",",
                    CsvCell(on.fits ? on.tokens_per_second : -1, "%.1f"), ",",
                    CsvCell(both ? on.tokens_per_second / off.tokens_per_second : -1, "%.3f"), ",",
                    CsvCell(off.device_peak_bytes), ",", CsvCell(on.device_peak_bytes), ",",
                    CsvCell(peak_ratio, "%.3f"), "\n");
  }
  return csv;
}

absl::Status DrivePaired(const Experiment& e, const RunContext& run, const PairedFeature& feature) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string dir, ResultsDir(e, run));
  MEMWALL_ASSIGN_OR_RETURN(const std::vector<OffloadRow> rows, MeasurePaired(e, feature));
  std::string csv = absl::StrCat(kThroughputCsvHeader, "\n");
  for (const OffloadRow& r : rows) absl::StrAppend(&csv, ThroughputCsv(r), "\n");
  const std::string summary = PairedSummaryCsv(rows);
  MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/data.csv", csv));
  MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/summary.csv", summary));
  std::printf("with the feature over without, per model:\n%s", summary.c_str());
  MEMWALL_RETURN_IF_ERROR(RunFigureScript(run.figure_script, {dir + "/data.csv", dir + "/figure.png"}));
  Provenance p = ProvenanceOf(e, run);
  p.measured_or_modeled = absl::StrCat(
      "measured on a CpuDevice (cpu:0), one rank, ", ModeName(e.offload().modes(0)), ": per model ",
      e.offload().warmup_steps(), " untimed then ", e.steps(), " timed steps ",
      feature.without_then_with,
      "; tokens/s over the timed steps, device and pinned host peaks from the allocators' accounts, the device-idle "
      "fraction from the timeline. Absolute rates on the CpuDevice are not a GPU's: compare the ratios. The paper's "
      "figure (ZeRO-Infinity §8.6) has no rows here: its gain comes from PCIe and NVMe links a CpuDevice does not have");
  p.files["data.csv"] = "one row per (model, without / with the feature), OFFLOAD_THROUGHPUT's columns";
  p.files["summary.csv"] = "per model: throughput and device peak with the feature over without";
  MEMWALL_RETURN_IF_ERROR(WriteProvenance(dir + "/provenance.json", p));
  std::printf("wrote %s/{data.csv, summary.csv, figure.png, provenance.json}\n", dir.c_str());
  return absl::OkStatus();
}

}  // namespace memwall::repro
