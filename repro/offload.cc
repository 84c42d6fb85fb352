#include "repro/offload.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <map>

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
#include "runtime/communicator.h"
#include "runtime/cpu_device.h"
#include "runtime/cuda_device.h"
#include "runtime/status.h"
#include "runtime/timeline.h"

namespace memwall::repro {
namespace {

using Mode = OffloadSweep::Mode;

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

std::string Cell(int64_t v) { return v < 0 ? "" : absl::StrCat(v); }
std::string Cell(double v, const char* format) { return v < 0 ? "" : absl::StrFormat(format, v); }

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

// One attempt: a fresh device of the experiment's budget (so its peaks are
// this attempt's alone), the model, the trainer, `warmup + timed` steps.
// Returns the row; a ResourceExhausted anywhere is "does not fit".
absl::StatusOr<OffloadRow> Attempt(const Experiment& e, const models::GptConfig& config, Mode mode,
                                   int64_t warmup, int64_t timed, const std::string& trace_dir,
                                   const zero::TrainerOptions* given = nullptr) {
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
  std::unique_ptr<Communicator> comm = CreateSingleProcessCommunicator();
  auto data = models::SyntheticSource(1 << 20, config.vocab(), 11);
  Timeline timeline;
  zero::TrainerOptions options = given != nullptr ? *given : OffloadTrainerOptions(e, mode);
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
    row.seconds = Seconds(start);
    return row;
  };

  {
    auto model = models::Gpt::Create(config);
    if (!model.ok()) return model.status();
    auto trainer = engine::CreateTrainer(**model, *device, *comm, options);
    if (!trainer.ok()) return record_failure(trainer.status());
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
    row.steps = timed > 0 ? timed : warmup;
    if (timed > 0) {
      row.seconds = timed_seconds / double(timed);
      row.tokens_per_second = double(timed_tokens) / timed_seconds;
      row.tflops = flops / timed_seconds / 1e12;
      row.device_idle_fraction = idle / timed_seconds;
    }
  }
  row.device_peak_bytes = static_cast<int64_t>(device->memory().account().total_peak());
  row.host_pinned_peak_bytes = static_cast<int64_t>(device->pinned_host().account().total_peak());
  if (timed == 0) row.seconds = Seconds(start);
  return row;
}

}  // namespace

std::string MaxModelCsv(const OffloadRow& r) {
  return absl::StrCat(CsvField(r.model), ",", r.params, ",", r.layers, ",", r.hidden, ",", r.mode, ",",
                      r.fits ? "yes" : "no", ",", r.steps, ",", Cell(r.device_peak_bytes), ",",
                      Cell(r.host_pinned_peak_bytes), ",", absl::StrFormat("%.2f", r.seconds), ",",
                      CsvField(r.reason), ",", CsvField(r.device));
}

std::string ThroughputCsv(const OffloadRow& r) {
  const double fraction = r.fits && r.gemm_tflops > 0 ? r.tflops / r.gemm_tflops : -1;
  return absl::StrCat(CsvField(r.model), ",", r.params, ",", r.layers, ",", r.hidden, ",", r.mode, ",",
                      r.fits ? "yes" : "no", ",", r.steps, ",", Cell(r.fits ? r.seconds : -1, "%.4f"), ",",
                      Cell(r.fits ? r.tokens_per_second : -1, "%.1f"), ",", Cell(r.fits ? r.tflops : -1, "%.5f"),
                      ",", Cell(r.fits ? r.gemm_tflops : -1, "%.5f"), ",", Cell(fraction, "%.4f"), ",",
                      Cell(r.device_idle_fraction, "%.4f"), ",", Cell(r.device_peak_bytes), ",",
                      Cell(r.host_pinned_peak_bytes), ",", CsvField(r.breakdown), ",", CsvField(r.reason), ",",
                      CsvField(r.device));
}

absl::StatusOr<std::vector<OffloadRow>> MeasureMaxModel(const Experiment& e) {
  std::vector<OffloadRow> rows;
  const OffloadSweep& sweep = e.offload();
  for (int m = 0; m < sweep.modes_size(); ++m) {
    const Mode mode = sweep.modes(m);
    for (int i = 0; i < sweep.ladder_size(); ++i) {
      const models::GptConfig& config = sweep.ladder(i);
      std::printf("[%s %d/%d] %s (%.1fM parameters)\n", ModeName(mode).c_str(), i + 1, sweep.ladder_size(),
                  config.name().c_str(), models::CountParameters(config) / 1e6);
      std::fflush(stdout);
      MEMWALL_ASSIGN_OR_RETURN(OffloadRow row,
                               Attempt(e, config, mode, e.steps(), 0, ""));
      std::printf("  %s: %s (device peak %s, pinned host peak %s, %.1f s)\n", row.model.c_str(),
                  row.fits ? "trains" : absl::StrCat("does not fit: ", row.reason).c_str(),
                  FormatBytes(row.device_peak_bytes).c_str(), FormatBytes(row.host_pinned_peak_bytes).c_str(),
                  row.seconds);
      std::fflush(stdout);
      rows.push_back(row);
      if (!row.fits) break;
    }
  }
  return rows;
}

engine::EstimateInput EstimateInputFor(const zero::TrainerOptions& options, const models::GptConfig& config,
                                     int64_t ranks) {
  engine::EstimateInput in;
  in.model = config;
  in.ranks = ranks;
  in.training = options.training;
  return in;
}

std::string TilingCsv(const TilingRow& row) {
  const OffloadRow& r = row.attempt;
  return absl::StrCat(row.tiling, ",", CsvField(r.model), ",", r.params, ",", r.hidden, ",", r.mode, ",", row.source,
                      ",", r.fits ? "yes" : "no", ",", Cell(r.device_peak_bytes), ",", Cell(r.host_pinned_peak_bytes),
                      ",", row.source == "measured" ? absl::StrFormat("%.2f", r.seconds) : "", ",", CsvField(r.reason), ",",
                      CsvField(r.device));
}

absl::StatusOr<std::vector<TilingRow>> MeasureTiling(const Experiment& e) {
  std::vector<TilingRow> rows;
  const OffloadSweep& sweep = e.offload();
  const Mode mode = sweep.modes(0);
  const zero::TrainerOptions options = OffloadTrainerOptions(e, mode);
  for (const int64_t factor : sweep.tiling_factors()) {
    // The estimator's verdict on every model the factor divides.
    for (const models::GptConfig& base : sweep.ladder()) {
      if (base.hidden() % factor != 0) continue;
      models::GptConfig config = base;
      config.set_tiling(factor);
      engine::EstimateInput in = EstimateInputFor(options, config, 1);
      in.device_bytes = sweep.device_memory_bytes();
      in.host_bytes = sweep.host_pinned_memory_bytes();
      MEMWALL_ASSIGN_OR_RETURN(const engine::Estimate est, engine::EstimateMemory(in));
      TilingRow row{factor, "estimator", {}};
      row.attempt.model = config.name();
      row.attempt.params = models::CountParameters(config);
      row.attempt.layers = config.layers();
      row.attempt.hidden = config.hidden();
      row.attempt.mode = ModeName(mode);
      row.attempt.fits = est.fits;
      row.attempt.device_peak_bytes = est.total_device_bytes;
      row.attempt.host_pinned_peak_bytes = est.host_bytes;
      if (!est.fits_device) row.attempt.reason = "estimate exceeds the device budget";
      if (!est.fits_host) row.attempt.reason = "estimate exceeds the pinned host budget";
      rows.push_back(row);
    }
    // The measured walk: up the ladder until a model does not fit.
    for (const models::GptConfig& base : sweep.ladder()) {
      if (base.hidden() % factor != 0) continue;
      models::GptConfig config = base;
      config.set_tiling(factor);
      std::printf("[tiling %lld] %s: hidden %lld (%.1fM parameters)\n", static_cast<long long>(factor),
                  config.name().c_str(), static_cast<long long>(config.hidden()),
                  models::CountParameters(config) / 1e6);
      std::fflush(stdout);
      MEMWALL_ASSIGN_OR_RETURN(OffloadRow attempt, Attempt(e, config, mode, e.steps(), 0, ""));
      std::printf("  %s (device peak %s, pinned host peak %s, %.1f s)\n",
                  attempt.fits ? "trains" : absl::StrCat("does not fit: ", attempt.reason).c_str(),
                  FormatBytes(attempt.device_peak_bytes).c_str(), FormatBytes(attempt.host_pinned_peak_bytes).c_str(),
                  attempt.seconds);
      std::fflush(stdout);
      rows.push_back({factor, "measured", attempt});
      if (!attempt.fits) break;
    }
  }
  return rows;
}

std::string TilingSummaryCsv(const std::vector<TilingRow>& rows) {
  // (factor, source) -> the largest fitting row, in first-seen order.
  std::vector<std::pair<int64_t, std::string>> keys;
  std::map<std::pair<int64_t, std::string>, const OffloadRow*> largest;
  for (const TilingRow& r : rows) {
    const auto key = std::make_pair(r.tiling, r.source);
    if (!largest.count(key)) keys.push_back(key);
    const OffloadRow*& best = largest[key];
    // The estimator's walk stops at its first refusal, as the measured one does.
    if (r.attempt.fits && (best == nullptr || r.attempt.hidden > best->hidden)) {
      bool refused_below = false;
      for (const TilingRow& o : rows) {
        refused_below |= o.tiling == r.tiling && o.source == r.source && !o.attempt.fits && o.attempt.hidden < r.attempt.hidden;
      }
      if (!refused_below) best = &r.attempt;
    }
  }
  std::string csv = "tiling,source,largest_model,largest_hidden,ratio_to_untiled\n";
  for (const auto& key : keys) {
    const OffloadRow* r = largest[key];
    const auto base_it = largest.find(std::make_pair(int64_t{1}, key.second));
    const OffloadRow* base = base_it != largest.end() ? base_it->second : nullptr;
    absl::StrAppend(&csv, key.first, ",", key.second, ",", r ? CsvField(r->model) : "", ",", r ? r->hidden : 0, ",",
                    r && base ? absl::StrFormat("%.3f", double(r->hidden) / double(base->hidden)) : "", "\n");
  }
  // ZeRO-Infinity §8.1 (Figure 6b): one 32 GB V100.
  return absl::StrCat(csv, "1,paper,,8192,1.000\n16,paper,,65536,8.000\n");
}

namespace {

// Per mode the largest model that fit and its Ψ over each base mode's
// largest (empty where the base has none), a "measured" row each, under the
// header "mode,largest_model,largest_params,<ratio columns>,source".
struct RatioColumn {
  std::string base_mode, name;
};
std::string LargestPerMode(const std::vector<OffloadRow>& rows, const std::vector<RatioColumn>& ratios) {
  std::vector<std::string> modes;
  std::map<std::string, const OffloadRow*> largest;
  for (const OffloadRow& r : rows) {
    if (std::find(modes.begin(), modes.end(), r.mode) == modes.end()) modes.push_back(r.mode);
    if (r.fits && (!largest[r.mode] || r.params > largest[r.mode]->params)) largest[r.mode] = &r;
  }
  std::string csv = "mode,largest_model,largest_params,";
  for (const RatioColumn& c : ratios) absl::StrAppend(&csv, c.name, ",");
  csv += "source\n";
  for (const std::string& mode : modes) {
    const OffloadRow* r = largest[mode];
    absl::StrAppend(&csv, mode, ",", r ? CsvField(r->model) : "", ",", r ? absl::StrCat(r->params) : "0", ",");
    for (const RatioColumn& c : ratios) {
      const OffloadRow* base = largest[c.base_mode];
      absl::StrAppend(&csv, r && base ? absl::StrFormat("%.3f", double(r->params) / double(base->params)) : "", ",");
    }
    csv += "measured\n";
  }
  return csv;
}

}  // namespace

std::string MaxModelSummaryCsv(const std::vector<OffloadRow>& rows) {
  // ZeRO-Offload §6.2.1, Figure 7: one 32 GB V100.
  return absl::StrCat(LargestPerMode(rows, {{"stage0", "ratio_to_stage0"}}),
                      "stage0,PyTorch DDP (paper),1400000000,1.000,paper\n",
                      "stage2+offload,ZeRO-Offload (paper),13000000000,9.286,paper\n");
}

std::string InfinityMaxModelSummaryCsv(const std::vector<OffloadRow>& rows) {
  // ZeRO-Infinity §8.1, Figure 6a: one DGX-2 (16 V100 32 GB, 1.5 TB host
  // memory, 28 TB NVMe). ZeRO-Inf-CPU moves the parameters and the
  // optimizer states to the CPU (stage3+offload+params here); ZeRO-Inf-NVMe
  // moves both to NVMe (stage3+nvme+nvme-params). The paper's ratios are
  // over ZeRO-Inf-CPU.
  return absl::StrCat(LargestPerMode(rows, {{"stage3+offload", "ratio_to_cpu_offload"},
                                            {"stage3+offload+params", "ratio_to_cpu_offload_with_params"}}),
                      "stage3,ZeRO-3 (paper),20000000000,,0.286,paper\n",
                      "stage3+offload+params,ZeRO-Inf-CPU (paper),70000000000,,1.000,paper\n",
                      "stage3+nvme+nvme-params,ZeRO-Inf-NVMe (paper),1000000000000,,14.286,paper\n");
}

absl::StatusOr<std::vector<OffloadRow>> MeasureThroughput(const Experiment& e, const std::string& trace_root) {
  std::vector<OffloadRow> rows;
  const OffloadSweep& sweep = e.offload();
  for (int i = 0; i < sweep.ladder_size(); ++i) {
    const models::GptConfig& config = sweep.ladder(i);
    // The bound: the model's largest matmul, the MLP's c_fc (tokens, d) x
    // (d, 4d), on a device of its own, before and after the model's runs
    // (the faster: the first GEMM of a process measured 7-10x slow).
    const zero::TrainerOptions o = OffloadTrainerOptions(e, OffloadSweep::STAGE0);
    auto gemm_rate = [&]() -> absl::StatusOr<double> {
      MEMWALL_ASSIGN_OR_RETURN(std::unique_ptr<Device> gemm_device, CreateExperimentDevice(e, 0, 0));
      return MeasureGemmFlops(*gemm_device, zero::ParamDType(o.training.precision()), o.training.micro_batch() * o.training.seq(), config.hidden(),
                              4 * config.hidden(), 9);
    };
    MEMWALL_ASSIGN_OR_RETURN(const double gemm_before, gemm_rate());
    const size_t first_row = rows.size();
    for (int m = 0; m < sweep.modes_size(); ++m) {
      const Mode mode = sweep.modes(m);
      std::printf("[%d/%d] %s (%.1fM parameters), %s\n", i * sweep.modes_size() + m + 1,
                  sweep.ladder_size() * sweep.modes_size(), config.name().c_str(),
                  models::CountParameters(config) / 1e6, ModeName(mode).c_str());
      std::fflush(stdout);
      std::string trace_dir;
      if (!trace_root.empty()) {
        trace_dir = absl::StrCat(trace_root, "/", config.name(), "_", ModeName(mode));
        std::error_code ec;
        std::filesystem::remove_all(trace_dir, ec);
        std::filesystem::create_directories(trace_dir, ec);
        if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", trace_dir, ": ", ec.message()));
      }
      MEMWALL_ASSIGN_OR_RETURN(OffloadRow row,
                               Attempt(e, config, mode, sweep.warmup_steps(), e.steps(), trace_dir));
      if (row.fits) {
        std::printf("  %.1f tokens/s, %.4f TFLOPS, device idle %.0f%%\n", row.tokens_per_second, row.tflops,
                    100 * row.device_idle_fraction);
      } else {
        std::printf("  does not fit: %s\n", row.reason.c_str());
        if (!trace_dir.empty()) std::filesystem::remove_all(trace_dir);
      }
      std::fflush(stdout);
      rows.push_back(row);
    }
    MEMWALL_ASSIGN_OR_RETURN(const double gemm_after, gemm_rate());
    const double gemm = std::max(gemm_before, gemm_after);
    std::printf("%s: the device's GEMM rate for (%lld, %lld) x (%lld, %lld): %.4f TFLOPS (before %.4f, after %.4f)\n",
                config.name().c_str(), (long long)(o.training.micro_batch() * o.training.seq()), (long long)config.hidden(),
                (long long)config.hidden(), (long long)(4 * config.hidden()), gemm / 1e12, gemm_before / 1e12,
                gemm_after / 1e12);
    for (size_t r = first_row; r < rows.size(); ++r) {
      rows[r].gemm_tflops = gemm / 1e12;
      if (rows[r].fits) {
        std::printf("  %s: %.0f%% of the GEMM rate\n", rows[r].mode.c_str(), 100 * rows[r].tflops / rows[r].gemm_tflops);
      }
    }
  }
  return rows;
}

absl::StatusOr<std::vector<OffloadRow>> MeasurePaired(const Experiment& e) {
  std::vector<OffloadRow> rows;
  const OffloadSweep& sweep = e.offload();
  const Mode mode = sweep.modes(0);
  const bool prefetch = e.kind() == Experiment::INFINITY_PREFETCH;
  const std::string feature = prefetch ? "+prefetch" : "+activation-offload";
  for (int i = 0; i < sweep.ladder_size(); ++i) {
    for (const bool on : {false, true}) {
      models::GptConfig config = sweep.ladder(i);
      zero::TrainerOptions options = OffloadTrainerOptions(e, mode);
      if (prefetch && !on) {  // no hop runs ahead: no gathers, and no NVMe read-ahead either
        options.training.mutable_zero()->set_prefetch_bucket_bytes(0);
        if (options.training.zero().offload_param().device() == zero::OffloadParamConfig::NVME) {
          options.training.mutable_zero()->mutable_offload_param()->set_read_ahead_buffers(0);
        }
      }
      if (!prefetch) config.set_offload_activations(on);
      std::printf("[%d/%d] %s (%.1fM parameters), %s%s\n", 2 * i + on + 1, 2 * sweep.ladder_size(),
                  config.name().c_str(), models::CountParameters(config) / 1e6, ModeName(mode).c_str(),
                  on ? feature.c_str() : "");
      std::fflush(stdout);
      MEMWALL_ASSIGN_OR_RETURN(OffloadRow row, Attempt(e, config, mode, sweep.warmup_steps(), e.steps(), "", &options));
      if (on) row.mode += feature;
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
    absl::StrAppend(&csv, CsvField(off.model), ",", off.hidden, ",", off.params, ",",
                    Cell(off.fits ? off.tokens_per_second : -1, "%.1f"), ",", Cell(on.fits ? on.tokens_per_second : -1, "%.1f"),
                    ",", Cell(both ? on.tokens_per_second / off.tokens_per_second : -1, "%.3f"), ",",
                    Cell(off.device_peak_bytes), ",", Cell(on.device_peak_bytes), ",",
                    Cell(off.device_peak_bytes > 0 && on.device_peak_bytes >= 0
                             ? double(on.device_peak_bytes) / double(off.device_peak_bytes)
                             : -1.0,
                         "%.3f"),
                    "\n");
  }
  return csv;
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

}  // namespace memwall::repro
