#include "repro/ladder.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

#include "engine/engine.h"
#include "engine/estimate.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/data.h"
#include "models/gpt.h"
#include "infinity/nvme_parameter_store.h"
#include "offload/host_optimizer.h"
#include "ops/ops.h"
#include "repro/sweep.h"
#include "repro/harness.h"
#include "runtime/bounds.h"
#include "runtime/communicator.h"
#include "runtime/cpu_device.h"
#include "runtime/files.h"
#include "runtime/memory.h"
#include "runtime/provenance.h"
#include "runtime/cuda_device.h"
#include "runtime/status.h"
#include "runtime/timeline.h"

namespace memwall::repro {
namespace {

using Mode = OffloadSweep::Mode;

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// The first line of a status message (a CSV cell, a log line).
std::string FirstLine(const absl::Status& st) {
  const std::string m(st.message());
  return m.substr(0, m.find('\n'));
}

// The experiment's device (`device: "cpu"` or `"cuda"`) with these budgets
// (0: the device's own memory; unlimited pinned host memory).
absl::StatusOr<std::unique_ptr<Device>> CreateExperimentDevice(const Experiment& e, size_t device_bytes,
                                                               size_t pinned_bytes) {
  if (e.device() == "cuda") {
    CudaDeviceOptions o;
    o.memory_budget_bytes = device_bytes;
    o.pinned_budget_bytes = pinned_bytes;
    return CreateCudaDevice(o);
  }
  CpuDeviceOptions o;
  o.memory_budget_bytes = device_bytes;
  o.pinned_budget_bytes = pinned_bytes;
  return CreateCpuDevice(o);
}

// trace_root/<model>_<mode>, emptied and created; "" when trace_root is.
absl::StatusOr<std::string> FreshTraceDir(const std::string& trace_root, const models::GptConfig& config, Mode mode) {
  if (trace_root.empty()) return std::string();
  const std::string dir = absl::StrCat(trace_root, "/", config.name(), "_", ModeName(mode));
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  MEMWALL_RETURN_IF_ERROR(CreateWritableDirectory(dir, "write_traces: the traces"));
  return dir;
}

}  // namespace

absl::StatusOr<OffloadRow> Attempt(const Experiment& e, const models::GptConfig& config, Mode mode,
                                   int64_t warmup, int64_t timed, const std::string& trace_dir,
                                   const zero::TrainerOptions* given) {
  OffloadRow row;
  row.model = config.name();
  row.params = models::CountParameters(config);
  row.layers = config.layers();
  row.hidden = config.hidden();
  row.mode = ModeName(mode);
  const auto start = std::chrono::steady_clock::now();

  MEMWALL_ASSIGN_OR_RETURN(std::unique_ptr<Device> device,
                           CreateExperimentDevice(e, static_cast<size_t>(e.offload().device_memory_bytes()),
                                                  static_cast<size_t>(e.offload().host_pinned_memory_bytes())));
  row.device = device->name();
  const double device_seconds = Seconds(start);
  std::unique_ptr<Communicator> comm = CreateSingleProcessCommunicator();
  auto data = models::SyntheticSource(1 << 20, config.vocab(), 11);
  Timeline timeline;
  zero::TrainerOptions options = given != nullptr ? *given : OffloadTrainerOptions(e, mode);
  row.micro_batch = options.training.micro_batch();
  options.timeline = &timeline;
  options.trace_dir = trace_dir;

  auto record_failure = [&](const absl::Status& st) -> absl::StatusOr<OffloadRow> {
    if (st.code() != absl::StatusCode::kResourceExhausted) {
      return absl::Status(st.code(), absl::StrCat(row.model, " under ", row.mode, ": ", st.message()));
    }
    row.fits = false;
    row.reason = FirstLine(st);
    row.device_peak_bytes = static_cast<int64_t>(device->memory().account().total_peak());
    row.host_pinned_peak_bytes = static_cast<int64_t>(device->pinned_host().account().total_peak());
    row.attempt_seconds = Seconds(start);
    if (!trace_dir.empty()) std::filesystem::remove_all(trace_dir);  // an attempt that did not fit keeps no traces
    return row;
  };

  {
    auto model = models::Gpt::Create(config);
    if (!model.ok()) return model.status();
    auto trainer = engine::CreateTrainer(**model, *device, *comm, options);
    if (!trainer.ok()) return record_failure(trainer.status());
    // Setting up is most of a large model's attempt (its pinned host
    // memory is allocated, locked and initialized here): say how long.
    std::printf("    %s %s: set up in %.1f s (the device %.1f s, allocating pinned host memory %.1f s); %s of device "
                "memory and %s of pinned host memory in use\n",
                row.model.c_str(), row.mode.c_str(), Seconds(start), device_seconds,
                device->pinned_host().allocate_seconds(),
                FormatBytes(device->memory().account().total_current()).c_str(),
                FormatBytes(device->pinned_host().account().total_current()).c_str());
    std::fflush(stdout);
    double timed_seconds = 0, idle = 0;
    int64_t timed_tokens = 0;
    double flops = 0;
    for (int64_t step = 0; step < warmup + timed; ++step) {
      timeline.Clear();  // the trainer reads (and traces) one step's zones
      const bool is_timed = step >= warmup;
      auto stats = (*trainer)->Step(*data);
      if (!stats.ok()) return record_failure(stats.status());
      std::printf("    %s %s: %s\n", row.model.c_str(), row.mode.c_str(), (*trainer)->LogLine(*stats).c_str());
      std::fflush(stdout);
      if (!is_timed) continue;
      timed_seconds += stats->seconds;
      timed_tokens += stats->tokens;
      flops += stats->tflops * 1e12 * stats->seconds;
      idle += stats->device_idle_fraction * stats->seconds;
      row.breakdown = stats->breakdown;
    }
    row.fits = true;
    row.steps = warmup + timed;
    row.timed_steps = timed;
    if (timed > 0) {
      row.step_seconds = timed_seconds / double(timed);
      row.tokens_per_second = double(timed_tokens) / timed_seconds;
      row.tflops = flops / timed_seconds / 1e12;
      row.device_idle_fraction = idle / timed_seconds;
    }
  }
  row.device_peak_bytes = static_cast<int64_t>(device->memory().account().total_peak());
  row.host_pinned_peak_bytes = static_cast<int64_t>(device->pinned_host().account().total_peak());
  row.attempt_seconds = Seconds(start);
  return row;
}

namespace {

std::string CsvOf(absl::string_view header, std::string (*csv)(const OffloadRow&),
                  const std::vector<OffloadRow>& rows) {
  std::string text = absl::StrCat(header, "\n");
  for (const OffloadRow& r : rows) absl::StrAppend(&text, csv(r), "\n");
  return text;
}

constexpr char kPartialCsv[] = "/data.partial.csv";

}  // namespace

RowsSoFar PartialCsv(const std::string& dir, absl::string_view header, std::string (*csv)(const OffloadRow&)) {
  std::error_code ec;
  std::filesystem::remove(dir + kPartialCsv, ec);
  return [dir, header = std::string(header), csv](const std::vector<OffloadRow>& rows) {
    return WriteFileAtomically(dir + kPartialCsv, CsvOf(header, csv, rows));
  };
}

absl::Status CompleteCsv(const std::string& dir, absl::string_view header, std::string (*csv)(const OffloadRow&),
                         const std::vector<OffloadRow>& rows) {
  MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/data.csv", CsvOf(header, csv, rows)));
  std::error_code ec;
  std::filesystem::remove(dir + kPartialCsv, ec);
  return absl::OkStatus();
}

std::string MaxModelCsv(const OffloadRow& r) {
  return absl::StrCat(CsvField(r.model), ",", r.params, ",", r.layers, ",", r.hidden, ",", r.mode, ",",
                      r.fits ? "yes" : "no", ",", r.steps, ",", CsvCell(r.device_peak_bytes), ",",
                      CsvCell(r.host_pinned_peak_bytes), ",", absl::StrFormat("%.2f", r.attempt_seconds), ",",
                      CsvCell(r.timed_steps > 0 ? r.step_seconds : -1, "%.4f"), ",",
                      CsvCell(r.timed_steps > 0 ? r.tflops : -1, "%.5f"), ",",
                      CsvCell(r.timed_steps > 0 ? r.device_idle_fraction : -1, "%.4f"), ",", CsvField(r.breakdown),
                      ",", CsvField(r.reason), ",", CsvField(r.device));
}

std::string ThroughputCsv(const OffloadRow& r) {
  const double fraction = r.fits && r.gemm_tflops > 0 ? r.tflops / r.gemm_tflops : -1;
  return absl::StrCat(CsvField(r.model), ",", r.params, ",", r.layers, ",", r.hidden, ",", r.micro_batch, ",",
                      r.mode, ",", r.fits ? "yes" : "no", ",", r.timed_steps, ",", CsvCell(r.fits ? r.step_seconds : -1, "%.4f"), ",",
                      CsvCell(r.fits ? r.tokens_per_second : -1, "%.1f"), ",", CsvCell(r.fits ? r.tflops : -1, "%.5f"),
                      ",", CsvCell(r.fits && r.gemm_tflops > 0 ? r.gemm_tflops : -1, "%.5f"), ",", CsvCell(fraction, "%.4f"), ",",
                      CsvCell(r.device_idle_fraction, "%.4f"), ",", CsvCell(r.device_peak_bytes), ",",
                      CsvCell(r.host_pinned_peak_bytes), ",", CsvField(r.breakdown), ",", CsvField(r.reason), ",",
                      CsvField(r.device));
}

namespace {

// Where a mode's max-model walk starts: the smallest model, or with
// start_at_estimate the largest one whose estimate fits the experiment's
// budgets (the smallest when none does).
absl::StatusOr<int> WalkStart(const Experiment& e, Mode mode) {
  const OffloadSweep& sweep = e.offload();
  if (!sweep.start_at_estimate()) return 0;
  const zero::TrainerOptions options = OffloadTrainerOptions(e, mode);
  int start = 0;
  for (int i = 0; i < sweep.ladder_size(); ++i) {
    MEMWALL_ASSIGN_OR_RETURN(const engine::Estimate est,
                             engine::EstimateMemory(BudgetedEstimateInput(e, options, sweep.ladder(i))));
    if (!est.fits) break;
    start = i;
  }
  return start;
}

}  // namespace

absl::StatusOr<std::vector<OffloadRow>> MeasureMaxModel(const Experiment& e, const std::string& trace_root,
                                                        const RowsSoFar& rows_so_far) {
  std::vector<OffloadRow> rows, attempted;
  const OffloadSweep& sweep = e.offload();
  for (int m = 0; m < sweep.modes_size(); ++m) {
    const Mode mode = sweep.modes(m);
    auto attempt = [&](int i) -> absl::StatusOr<OffloadRow> {
      const models::GptConfig& config = sweep.ladder(i);
      std::printf("[%s %d/%d] %s (%.1fM parameters)\n", ModeName(mode).c_str(), i + 1, sweep.ladder_size(),
                  config.name().c_str(), models::CountParameters(config) / 1e6);
      std::fflush(stdout);
      MEMWALL_ASSIGN_OR_RETURN(const std::string trace_dir, FreshTraceDir(trace_root, config, mode));
      // Every step but the last warms up; the last is timed (with DPU it
      // runs the delayed update, ValidateOffloadMaxModel).
      MEMWALL_ASSIGN_OR_RETURN(OffloadRow row, Attempt(e, config, mode, e.steps() - 1, 1, trace_dir));
      if (row.fits) {
        std::printf("  %s: trains (device peak %s, pinned host peak %s; last step %.3f s, %.4g TFLOPS, device idle "
                    "%.0f%%; %.1f s in all)\n",
                    row.model.c_str(), FormatBytes(row.device_peak_bytes).c_str(),
                    FormatBytes(row.host_pinned_peak_bytes).c_str(), row.step_seconds, row.tflops,
                    100 * row.device_idle_fraction, row.attempt_seconds);
      } else {
        std::printf("  %s: does not fit: %s (device peak %s, pinned host peak %s, %.1f s)\n", row.model.c_str(),
                    row.reason.c_str(), FormatBytes(row.device_peak_bytes).c_str(),
                    FormatBytes(row.host_pinned_peak_bytes).c_str(), row.attempt_seconds);
      }
      std::fflush(stdout);
      attempted.push_back(row);
      if (rows_so_far) MEMWALL_RETURN_IF_ERROR(rows_so_far(attempted));
      return row;
    };
    MEMWALL_ASSIGN_OR_RETURN(const int start, WalkStart(e, mode));
    if (sweep.start_at_estimate()) {
      std::printf("[%s] the walk starts at %s, the largest model the estimate fits\n", ModeName(mode).c_str(),
                  sweep.ladder(start).name().c_str());
    }
    MEMWALL_ASSIGN_OR_RETURN(const std::vector<OffloadRow> walk, WalkLadder(start, sweep.ladder_size(), attempt));
    rows.insert(rows.end(), walk.begin(), walk.end());
  }
  return rows;
}

absl::StatusOr<std::vector<OffloadRow>> WalkLadder(
    int start, int n, const std::function<absl::StatusOr<OffloadRow>(int)>& attempt) {
  if (n <= 0 || start < 0 || start >= n) {
    return absl::InvalidArgumentError(absl::StrCat("a ladder walk from ", start, " over ", n, " models"));
  }
  // Up from `start` to the first refusal.
  std::vector<OffloadRow> walk;
  for (int i = start; i < n; ++i) {
    MEMWALL_ASSIGN_OR_RETURN(OffloadRow row, attempt(i));
    walk.push_back(row);
    if (!row.fits) break;
  }
  // The start itself refused: down until a model trains. Only the lowest
  // refusal stays, the one a walk from the smallest model would have met.
  for (int i = start - 1; i >= 0 && !walk.front().fits; --i) {
    MEMWALL_ASSIGN_OR_RETURN(OffloadRow row, attempt(i));
    if (row.fits) {
      walk.insert(walk.begin(), row);
    } else {
      walk.front() = row;
    }
  }
  return walk;
}

engine::EstimateInput EstimateInputFor(const zero::TrainerOptions& options, const models::GptConfig& config,
                                     int64_t ranks) {
  engine::EstimateInput in;
  in.model = config;
  in.ranks = ranks;
  in.training = options.training;
  return in;
}

engine::EstimateInput BudgetedEstimateInput(const Experiment& e, const zero::TrainerOptions& options,
                                            const models::GptConfig& config) {
  engine::EstimateInput in = EstimateInputFor(options, config, 1);
  in.device_bytes = e.offload().device_memory_bytes();
  in.host_bytes = e.offload().host_pinned_memory_bytes();
  // Swap files go where the trainer will put them; that file system's free
  // bytes are the disk's budget (unknown: none).
  const zero::ZeroConfig& z = options.training.zero();
  const std::string& swap_dir =
      !z.offload_optimizer().nvme_path().empty() ? z.offload_optimizer().nvme_path() : z.offload_param().nvme_path();
  if (const int64_t free = swap_dir.empty() ? -1 : FileSystemAvailableBytes(swap_dir); free >= 0) {
    in.disk_bytes = std::max<int64_t>(free, 1);  // 0 would be no budget
  }
  return in;
}

std::string LargestPerMode(const std::vector<OffloadRow>& rows, const std::vector<RatioColumn>& ratios) {
  std::vector<std::string> modes;
  std::map<std::string, const OffloadRow*> largest;
  for (const OffloadRow& r : rows) {
    if (std::find(modes.begin(), modes.end(), r.mode) == modes.end()) modes.push_back(r.mode);
    if (r.fits && (!largest[r.mode] || r.params > largest[r.mode]->params)) largest[r.mode] = &r;
  }
  std::string csv = "mode,largest_model,largest_params,";
  for (const RatioColumn& c : ratios) absl::StrAppend(&csv, c.name, ",");
  csv += "tflops,device_idle_fraction,source\n";
  for (const std::string& mode : modes) {
    const OffloadRow* r = largest[mode];
    absl::StrAppend(&csv, mode, ",", r ? CsvField(r->model) : "", ",", r ? absl::StrCat(r->params) : "0", ",");
    for (const RatioColumn& c : ratios) {
      const OffloadRow* base = largest[c.base_mode];
      absl::StrAppend(&csv, r && base ? absl::StrFormat("%.3f", double(r->params) / double(base->params)) : "", ",");
    }
    const bool timed = r != nullptr && r->timed_steps > 0;
    absl::StrAppend(&csv, CsvCell(timed ? r->tflops : -1, "%.5f"), ",",
                    CsvCell(timed ? r->device_idle_fraction : -1, "%.4f"), ",measured\n");
  }
  return csv;
}

int64_t MicroBatchOf(const Experiment& e, int i) {
  const OffloadSweep& sweep = e.offload();
  return sweep.micro_batches().empty() ? e.training().micro_batch() : sweep.micro_batches(i);
}

absl::StatusOr<std::vector<OffloadRow>> MeasureThroughput(const Experiment& e, const std::string& trace_root,
                                                          const RowsSoFar& rows_so_far) {
  std::vector<OffloadRow> rows;
  const OffloadSweep& sweep = e.offload();
  for (int i = 0; i < sweep.ladder_size(); ++i) {
    const models::GptConfig& config = sweep.ladder(i);
    const int64_t micro_batch = MicroBatchOf(e, i);
    const int64_t tokens = micro_batch * e.training().seq();
    // The bound: the model's largest matmul, the MLP's c_fc (tokens, d) x
    // (d, 4d) at the model's micro-batch, on a device of its own, before
    // and after the model's runs (the faster: the first GEMM of a process
    // measured 7-10x slow).
    auto gemm_rate = [&]() -> absl::StatusOr<double> {
      MEMWALL_ASSIGN_OR_RETURN(std::unique_ptr<Device> gemm_device, CreateExperimentDevice(e, 0, 0));
      return MeasureGemmFlops(*gemm_device, zero::ParamDType(e.training().precision()), tokens, config.hidden(),
                              4 * config.hidden(), 9);
    };
    MEMWALL_ASSIGN_OR_RETURN(const double gemm_before, gemm_rate());
    const size_t first_row = rows.size();
    for (int m = 0; m < sweep.modes_size(); ++m) {
      const Mode mode = sweep.modes(m);
      std::printf("[%d/%d] %s (%.1fM parameters), %s, micro-batch %lld\n", i * sweep.modes_size() + m + 1,
                  sweep.ladder_size() * sweep.modes_size(), config.name().c_str(),
                  models::CountParameters(config) / 1e6, ModeName(mode).c_str(), (long long)micro_batch);
      std::fflush(stdout);
      zero::TrainerOptions options = OffloadTrainerOptions(e, mode);
      OffloadRow row;
      // The listed micro-batch, then (halve_micro_batch_to_fit) half of
      // it until one fits or 1 does not.
      for (int64_t b = micro_batch;; b /= 2) {
        MEMWALL_ASSIGN_OR_RETURN(const std::string trace_dir, FreshTraceDir(trace_root, config, mode));
        options.training.set_micro_batch(b);
        MEMWALL_ASSIGN_OR_RETURN(row, Attempt(e, config, mode, sweep.warmup_steps(), e.steps(), trace_dir, &options));
        if (row.fits || !sweep.halve_micro_batch_to_fit() || b == 1) break;
        std::printf("  does not fit at micro-batch %lld (%s): trying %lld\n", (long long)b, row.reason.c_str(),
                    (long long)(b / 2));
        std::fflush(stdout);
      }
      if (row.fits) {
        std::printf("  micro-batch %lld: %.1f tokens/s, %.4f TFLOPS, device idle %.0f%%\n", (long long)row.micro_batch,
                    row.tokens_per_second, row.tflops, 100 * row.device_idle_fraction);
      } else {
        std::printf("  does not fit: %s\n", row.reason.c_str());
      }
      std::fflush(stdout);
      row.gemm_tflops = gemm_before / 1e12;  // until the rate after the model's runs is in
      rows.push_back(row);
      if (rows_so_far) MEMWALL_RETURN_IF_ERROR(rows_so_far(rows));
    }
    MEMWALL_ASSIGN_OR_RETURN(const double gemm_after, gemm_rate());
    const double gemm = std::max(gemm_before, gemm_after);
    std::printf("%s: the device's GEMM rate for (%lld, %lld) x (%lld, %lld): %.4f TFLOPS (before %.4f, after %.4f)\n",
                config.name().c_str(), (long long)tokens, (long long)config.hidden(), (long long)config.hidden(),
                (long long)(4 * config.hidden()), gemm / 1e12, gemm_before / 1e12, gemm_after / 1e12);
    for (size_t r = first_row; r < rows.size(); ++r) {
      rows[r].gemm_tflops = gemm / 1e12;
      if (rows[r].fits) {
        std::printf("  %s: %.0f%% of the GEMM rate\n", rows[r].mode.c_str(), 100 * rows[r].tflops / rows[r].gemm_tflops);
      }
    }
    if (rows_so_far) MEMWALL_RETURN_IF_ERROR(rows_so_far(rows));
  }
  return rows;
}

absl::StatusOr<double> MeasureGemmFlops(Device& device, DType dtype, int64_t m, int64_t k, int64_t n,
                                        int repeats) {
  Stream& s = device.compute_stream();
  const size_t e = SizeOf(dtype);
  MEMWALL_ASSIGN_OR_RETURN(Buffer a, device.Allocate(size_t(m * k) * e, MemoryTag::kWorkspace));
  MEMWALL_ASSIGN_OR_RETURN(Buffer b, device.Allocate(size_t(k * n) * e, MemoryTag::kWorkspace));
  MEMWALL_ASSIGN_OR_RETURN(Buffer c, device.Allocate(size_t(m * n) * e, MemoryTag::kWorkspace));
  MEMWALL_RETURN_IF_ERROR(s.Memset(a.data(), 0, a.bytes()));
  MEMWALL_RETURN_IF_ERROR(s.Memset(b.data(), 0, b.bytes()));
  const Tensor ta(a.data(), dtype, {m, k}, &device), tb(b.data(), dtype, {k, n}, &device),
      tc(c.data(), dtype, {m, n}, &device);
  std::vector<double> seconds;
  double total = 0;
  for (int r = 0; r <= repeats || total < 0.2; ++r) {
    MEMWALL_RETURN_IF_ERROR(s.Synchronize());
    const auto start = std::chrono::steady_clock::now();
    MEMWALL_RETURN_IF_ERROR(ops::Matmul(ta, false, tb, false, tc, 1.0f, 0.0f, s));
    MEMWALL_RETURN_IF_ERROR(s.Synchronize());
    if (r > 0) seconds.push_back(Seconds(start));
    if (r > 0) total += seconds.back();
  }
  // The fastest call: a bound is what the device can do, and on a shared
  // machine noise only ever slows a call down.
  return 2.0 * double(m) * double(k) * double(n) / *std::min_element(seconds.begin(), seconds.end());
}

absl::Status ValidateLadder(const Experiment& e, LadderFields reads) {
  const OffloadSweep& o = e.offload();
  if (o.ladder().empty()) return BadField("offload.ladder", "[]", "must list at least one model");
  int64_t previous = 0;
  for (int i = 0; i < o.ladder_size(); ++i) {
    const models::GptConfig& m = o.ladder(i);
    const std::string field = absl::StrCat("offload.ladder[", i, "] (\"", m.name(), "\")");
    if (absl::Status st = models::ValidateConfig(m); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("Experiment ", field, ": ", st.message()));
    }
    if (e.training().seq() > m.positions()) {
      return BadField("training.seq", e.training().seq(),
                      absl::StrCat("must be <= ", field, ".positions = ", m.positions()));
    }
    const int64_t params = models::CountParameters(m);
    if (params <= previous) {
      return BadField(field, absl::StrCat(params, " parameters"),
                      absl::StrCat("must be larger than the model before it (", previous, "): the ladder grows"));
    }
    previous = params;
  }
  std::set<int> seen;
  for (int mode : o.modes()) {
    if (mode == OffloadSweep::MODE_UNSPECIFIED) return BadField("offload.modes", "MODE_UNSPECIFIED", "is not a mode");
    if (!seen.insert(mode).second) {
      return BadField("offload.modes", OffloadSweep::Mode_Name(OffloadSweep::Mode(mode)), "is listed twice");
    }
  }
  if (o.device_memory_bytes() < (int64_t{1} << 20)) {
    return BadField("offload.device_memory_bytes", o.device_memory_bytes(), "must be >= 1 MiB (unset: 1 GiB)");
  }
  if (o.dpu_after_steps() < 1) return BadField("offload.dpu_after_steps", o.dpu_after_steps(), "must be >= 1 (unset: 1)");
  if (o.warmup_steps() < 0) return BadField("offload.warmup_steps", o.warmup_steps(), "must be >= 0");
  if (o.write_traces() && !reads.traces) {
    return BadField("offload.write_traces", "true", "is for OFFLOAD_THROUGHPUT, OFFLOAD_MAX_MODEL and INFINITY_MAX_MODEL");
  }
  if (!o.tiling_factors().empty() && !reads.tiling) return BadField("offload.tiling_factors", "[...]", "is for INFINITY_TILING");
  if (!o.micro_batches().empty()) {
    if (!reads.micro_batches) return BadField("offload.micro_batches", "[...]", "is for OFFLOAD_THROUGHPUT");
    if (o.micro_batches_size() != o.ladder_size()) {
      return BadField("offload.micro_batches", absl::StrCat(o.micro_batches_size(), " entries"),
                      absl::StrCat("must give one per ladder model (", o.ladder_size(), ")"));
    }
    for (int i = 0; i < o.micro_batches_size(); ++i) {
      // A micro-batch's tokens are bounded as the trainer bounds them.
      const int64_t most = kMaxCount / std::max<int64_t>(e.training().seq(), 1);
      if (o.micro_batches(i) < 1 || o.micro_batches(i) > most) {
        return BadField(absl::StrCat("offload.micro_batches[", i, "] (\"", o.ladder(i).name(), "\")"),
                        o.micro_batches(i),
                        absl::StrCat("must be in [1, ", most, "] (at most ", kMaxCount, " tokens at training.seq = ",
                                     e.training().seq(), ")"));
      }
    }
  }
  if (o.halve_micro_batch_to_fit() && !reads.micro_batches) {
    return BadField("offload.halve_micro_batch_to_fit", "true", "is for OFFLOAD_THROUGHPUT");
  }
  if (o.dpu_values_on_device() && !RunsDpu(o)) {
    return BadField("offload.dpu_values_on_device", "true", "needs a mode with the delayed update (OFFLOAD_DPU)");
  }
  if (o.start_at_estimate() && !reads.max_model_walk) {
    return BadField("offload.start_at_estimate", "true", "is for OFFLOAD_MAX_MODEL and INFINITY_MAX_MODEL");
  }
  if (o.host_pinned_memory_bytes() < 0) {
    return BadField("offload.host_pinned_memory_bytes", o.host_pinned_memory_bytes(), "must be >= 0 (0: unlimited)");
  }
  if (o.tile_elements() < 0) return BadField("offload.tile_elements", o.tile_elements(), "must be >= 0 (0: 4 Mi)");
  if (o.swap_buffer_bytes() < 0) {
    return BadField("offload.swap_buffer_bytes", o.swap_buffer_bytes(), "must be >= 0 (0: three swap buffers)");
  }
  bool nvme = false;  // a mode with a swap file
  for (int mode : o.modes()) {
    const zero::ZeroConfig& overlay = ModeOverlay(OffloadSweep::Mode(mode));
    nvme |= overlay.offload_optimizer().device() == zero::OffloadOptimizerConfig::NVME ||
            overlay.offload_param().device() == zero::OffloadParamConfig::NVME;
  }
  if (!nvme && (!o.nvme_path().empty() || o.swap_buffer_bytes() != 0)) {
    return BadField(o.nvme_path().empty() ? "offload.swap_buffer_bytes" : "offload.nvme_path",
                    o.nvme_path().empty() ? absl::StrCat(o.swap_buffer_bytes()) : absl::StrCat("\"", o.nvme_path(), "\""),
                    "needs an NVMe mode (STAGE3_NVME, STAGE3_NVME_CPU_PARAMS, STAGE3_NVME_NVME_PARAMS, STAGE3_NVME_ALL)");
  }
  return absl::OkStatus();
}

bool RunsDpu(const OffloadSweep& o) {
  for (int mode : o.modes()) {
    if (ModeOverlay(OffloadSweep::Mode(mode)).offload_optimizer().delayed_update_after_steps() > 0) return true;
  }
  return false;
}

absl::Status ValidateOneStage3Mode(const Experiment& e) {
  const OffloadSweep& o = e.offload();
  if (o.modes_size() != 1) {
    return BadField("offload.modes", o.modes_size(),
                    absl::StrCat("must name exactly one mode for ", Experiment::Kind_Name(e.kind())));
  }
  if (ModeOverlay(o.modes(0)).stage() != 3) {
    return BadField("offload.modes", OffloadSweep::Mode_Name(o.modes(0)),
                    "must be a ZeRO-3 mode (tiles, prefetch and offloaded activations are ZeRO-Infinity's)");
  }
  return absl::OkStatus();
}

void FillLadder(Experiment& e, std::initializer_list<OffloadSweep::Mode> modes) {
  OffloadSweep& o = *e.mutable_offload();
  if (o.modes().empty()) {
    for (OffloadSweep::Mode mode : modes) o.add_modes(mode);
  }
  if (o.device_memory_bytes() == 0) o.set_device_memory_bytes(int64_t{1} << 30);
  if (o.dpu_after_steps() == 0) o.set_dpu_after_steps(1);
  if (o.warmup_steps() == 0) o.set_warmup_steps(o.dpu_after_steps() + 1);
}

void FillOffloadModes(Experiment& e) {
  FillLadder(e, {OffloadSweep::STAGE0, OffloadSweep::STAGE2, OffloadSweep::OFFLOAD, OffloadSweep::OFFLOAD_DPU});
}

void FillInfCpuMode(Experiment& e) { FillLadder(e, {OffloadSweep::STAGE3_OFFLOAD_CPU_PARAMS}); }

absl::Status DriveMaxModelWalk(const Experiment& e, const RunContext& run, const MaxModelReport& report) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string dir, ResultsDir(e, run));
  Provenance p = ProvenanceOf(e, run);
  const std::string budget = FormatBytes(size_t(e.offload().device_memory_bytes()));
  const std::string traces = e.offload().write_traces() ? dir + "/traces" : "";
  if (!traces.empty()) std::filesystem::remove_all(traces);
  MEMWALL_ASSIGN_OR_RETURN(const std::vector<OffloadRow> rows,
                           MeasureMaxModel(e, traces, PartialCsv(dir, kMaxModelCsvHeader, MaxModelCsv)));
  const std::string summary = report.summary_csv(rows);
  MEMWALL_RETURN_IF_ERROR(CompleteCsv(dir, kMaxModelCsvHeader, MaxModelCsv, rows));
  MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/summary.csv", summary));
  const std::string budgets =
      e.offload().host_pinned_memory_bytes() > 0
          ? absl::StrCat(budget, " device budget and a ", FormatBytes(size_t(e.offload().host_pinned_memory_bytes())),
                         " pinned host budget")
          : absl::StrCat(budget, " budget");
  std::printf("largest model per mode (%s):\n%s", budgets.c_str(), summary.c_str());
  p.measured_or_modeled = absl::StrCat(
      "data.csv: measured, every row an attempt on a fresh ", e.device() == "cuda" ? "GPU (cuda:0) device" : "CpuDevice",
      " with a ", budgets, " (one rank, no MPI",
      report.disk,
      "): fits = every training step completed; peaks from the device's and the pinned host allocator's "
      "accounts; step_seconds, tflops (model FLOPs: 3 x forward, per token, over the step time) and "
      "device_idle_fraction (time the compute stream ran no zone) are the last step's, at training.micro_batch = ",
      e.training().micro_batch(), ". summary.csv: source=measured rows derived from data.csv; source=paper rows are ",
      report.paper_rows);
  p.files["data.csv"] = "one row per (mode, ladder model) attempted; a mode stops at its first model that does not fit";
  p.files["summary.csv"] = absl::StrCat("per mode the largest model that trained, its size over ", report.ratio_base,
                                        "'s, and its last step's tflops and device_idle_fraction");
  if (!traces.empty()) {
    p.files["traces/"] = "<model>_<mode>/step_<k>.json: each step's zones of every attempt that trained, Chrome trace "
                         "format (Perfetto)";
  }
  // The provenance before the figure: a GPU machine may have no matplotlib,
  // and the measurement must survive that (the figure can be drawn later).
  MEMWALL_RETURN_IF_ERROR(WriteProvenance(dir + "/provenance.json", p));
  MEMWALL_RETURN_IF_ERROR(RunFigureScript(run.figure_script,
                                          {dir + "/data.csv", dir + "/figure.png"}));
  std::printf("wrote %s/\n", dir.c_str());
  return absl::OkStatus();
}

}  // namespace memwall::repro
