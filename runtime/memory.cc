#include "runtime/memory.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace memwall {

absl::string_view MemoryTagName(MemoryTag tag) {
  switch (tag) {
    case MemoryTag::kParams16:
      return "params16";
    case MemoryTag::kGrads:
      return "grads";
    case MemoryTag::kMasterParams:
      return "master_params";
    case MemoryTag::kOptimizerStates:
      return "optimizer_states";
    case MemoryTag::kActivations:
      return "activations";
    case MemoryTag::kCommBuffers:
      return "comm_buffers";
    case MemoryTag::kWorkspace:
      return "workspace";
    case MemoryTag::kStaging:
      return "staging";
    case MemoryTag::kOther:
      return "other";
  }
  return "unknown";
}

std::string FormatBytes(size_t bytes) {
  constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (value >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.2f %s", value, kUnits[unit]);
}

std::string MemorySnapshot::ToString() const {
  std::string out = absl::StrCat(space, ": ", FormatBytes(total_current), " in use (peak ",
                                 FormatBytes(total_peak), ")");
  if (budget != 0) absl::StrAppend(&out, " of ", FormatBytes(budget));
  const char* sep = "; ";
  for (int t = 0; t < kNumMemoryTags; ++t) {
    if (current[t] == 0 && peak[t] == 0) continue;
    absl::StrAppend(&out, sep, MemoryTagName(static_cast<MemoryTag>(t)), " ",
                    FormatBytes(current[t]), " (peak ", FormatBytes(peak[t]), ")");
    sep = ", ";
  }
  return out;
}

MemoryAccount::MemoryAccount(std::string name, size_t budget_bytes)
    : name_(std::move(name)), budget_(budget_bytes) {
  state_.space = name_;
  state_.budget = budget_;
}

absl::Status MemoryAccount::Reserve(MemoryTag tag, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const int t = static_cast<int>(tag);
  if (budget_ != 0 && (bytes > budget_ || state_.total_current > budget_ - bytes)) {
    std::string in_use;
    for (int i = 0; i < kNumMemoryTags; ++i) {
      if (state_.current[i] == 0) continue;
      absl::StrAppend(&in_use, in_use.empty() ? "" : ", ",
                      MemoryTagName(static_cast<MemoryTag>(i)), " ",
                      FormatBytes(state_.current[i]));
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        name_, ": budget ", FormatBytes(budget_), " exceeded by ", MemoryTagName(tag),
        " request of ", FormatBytes(bytes), " (", bytes, " bytes); in use ",
        FormatBytes(state_.total_current), in_use.empty() ? "" : ": ", in_use,
        "; does not fit: try activation checkpointing, a higher ZeRO stage or offload"));
  }
  state_.current[t] += bytes;
  state_.peak[t] = std::max(state_.peak[t], state_.current[t]);
  state_.total_current += bytes;
  state_.total_peak = std::max(state_.total_peak, state_.total_current);
  return absl::OkStatus();
}

void MemoryAccount::Release(MemoryTag tag, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const int t = static_cast<int>(tag);
  if (bytes > state_.current[t]) {
    std::fprintf(stderr, "memwall: %s: releasing %zu bytes of %s but only %zu are held\n",
                 name_.c_str(), bytes, std::string(MemoryTagName(tag)).c_str(),
                 state_.current[t]);
    std::abort();
  }
  state_.current[t] -= bytes;
  state_.total_current -= bytes;
}

size_t MemoryAccount::current(MemoryTag tag) const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.current[static_cast<int>(tag)];
}
size_t MemoryAccount::peak(MemoryTag tag) const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.peak[static_cast<int>(tag)];
}
size_t MemoryAccount::total_current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.total_current;
}
size_t MemoryAccount::total_peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.total_peak;
}

void MemoryAccount::ResetPeaks() {
  std::lock_guard<std::mutex> lock(mu_);
  state_.peak = state_.current;
  state_.total_peak = state_.total_current;
}

MemorySnapshot MemoryAccount::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

namespace {
// `field` of /proc/self/status ("VmHWM: 1234 kB"), in bytes; 0 if absent.
size_t ProcStatusBytes(absl::string_view field) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (absl::StartsWith(line, absl::StrCat(field, ":"))) {
      return std::strtoull(line.c_str() + field.size() + 1, nullptr, 10) * 1024;
    }
  }
  return 0;
}
}  // namespace

size_t PeakResidentBytes() { return ProcStatusBytes("VmHWM"); }
size_t ResidentBytes() { return ProcStatusBytes("VmRSS"); }
bool ResetPeakResident() { return static_cast<bool>(std::ofstream("/proc/self/clear_refs") << "5"); }

}  // namespace memwall
