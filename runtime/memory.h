// Memory accounting: current and peak bytes per tag, for one memory space
// (a device's memory, a pinned-host pool, later an NVMe swap space).
//
// Every allocation in memwall carries a MemoryTag naming what it holds in the
// papers' terms. Tests assert these counters against the ZeRO formulas, the
// repro harness reports them, and the estimator predicts them, so they count
// exactly the bytes requested (not allocator rounding).
//
// Peaks: peak(tag) is the largest current(tag) since the last ResetPeaks();
// total_peak() is the largest sum over tags at any one moment (not the sum
// of per-tag peaks).
#ifndef MEMWALL_RUNTIME_MEMORY_H_
#define MEMWALL_RUNTIME_MEMORY_H_

#include <mutex>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"

namespace memwall {

enum class MemoryTag : uint8_t {
  kParams16,         // 16-bit (fp16/bf16) model parameters
  kGrads,            // gradients (16-bit or fp32)
  kMasterParams,     // fp32 master copy of the parameters
  kOptimizerStates,  // Adam momentum and variance (fp32)
  kActivations,      // activations and activation checkpoints
  kCommBuffers,      // reduce/all-gather buckets, prefetch buffers
  kWorkspace,        // operator scratch (GEMM workspace, softmax rows, ...)
  kStaging,          // host<->device and NVMe staging buffers
  kOther,
};
inline constexpr int kNumMemoryTags = 9;

absl::string_view MemoryTagName(MemoryTag tag);  // "params16", "grads", ...

// "384.00 MiB", "1.00 GiB", "12 B".
std::string FormatBytes(size_t bytes);

struct MemorySnapshot {
  std::string space;  // the account's name, e.g. "cpu:0 device memory"
  size_t budget = 0;  // 0: unlimited
  std::array<size_t, kNumMemoryTags> current{};
  std::array<size_t, kNumMemoryTags> peak{};
  size_t total_current = 0;
  size_t total_peak = 0;

  size_t current_of(MemoryTag tag) const { return current[static_cast<int>(tag)]; }
  size_t peak_of(MemoryTag tag) const { return peak[static_cast<int>(tag)]; }
  // One line: "cpu:0 device memory: 1.50 GiB in use (peak 2.00 GiB) of
  // 4.00 GiB; params16 512.00 MiB (peak ...), ...". Tags at zero are omitted.
  std::string ToString() const;
};

class MemoryAccount {
 public:
  // budget_bytes == 0 means unlimited.
  MemoryAccount(std::string name, size_t budget_bytes);
  MemoryAccount(const MemoryAccount&) = delete;
  MemoryAccount& operator=(const MemoryAccount&) = delete;

  // Adds `bytes` under `tag`. Past the budget, returns ResourceExhausted that
  // names the space, the tag, the request and the bytes in use per tag, and
  // leaves every counter unchanged.
  absl::Status Reserve(MemoryTag tag, size_t bytes);
  // Subtracts `bytes` under `tag`; releasing more than is held is a bug and
  // aborts.
  void Release(MemoryTag tag, size_t bytes);

  size_t current(MemoryTag tag) const;
  size_t peak(MemoryTag tag) const;
  size_t total_current() const;
  size_t total_peak() const;
  size_t budget() const { return budget_; }
  const std::string& name() const { return name_; }

  // Sets every peak to its current value.
  void ResetPeaks();
  MemorySnapshot Snapshot() const;

 private:
  const std::string name_;
  const size_t budget_;
  mutable std::mutex mu_;
  MemorySnapshot state_;
};

// What the operating system counts against this process, beside the
// accounts above (which count memwall's buffers only): the resident set
// from /proc/self/status, in bytes, at its peak ("VmHWM", since the start or
// the last ResetPeakResident) or now ("VmRSS"); 0 where it cannot be read.
size_t PeakResidentBytes();
size_t ResidentBytes();
// Starts a new resident peak at the current resident set (Linux's
// /proc/self/clear_refs, 5); false where that is refused.
bool ResetPeakResident();

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_MEMORY_H_
