// A memory plan: the buffers a component will allocate, stated from its
// configuration and layout alone, before anything is allocated. The
// component allocates from its plan (AllocatePlanned), and the memory
// estimator (engine/estimate.h) sums the same plans, so a buffer's size has
// one home: the component's Plan function.
//
//   MemoryPlan plan;
//   plan.Add("reduce bucket 0", MemorySpace::kDevice, MemoryTag::kCommBuffers, capacity * 2);
//   MEMWALL_ASSIGN_OR_RETURN(Buffer b, AllocatePlanned(device, plan, "reduce bucket 0"));
//
// A buffer allocated and freed while training runs (a gathered module at
// stage 3) is planned as a peak bound with `transient` set: the estimator
// counts it, the component allocates its pieces itself.
#ifndef MEMWALL_RUNTIME_MEMORY_PLAN_H_
#define MEMWALL_RUNTIME_MEMORY_PLAN_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/device.h"
#include "runtime/memory.h"

namespace memwall {

// kNvme: bytes in a file on a drive (ZeRO-Infinity's swap files): planned
// and estimated, never allocated through AllocatePlanned.
enum class MemorySpace : uint8_t { kDevice, kPinnedHost, kNvme };

struct PlannedBuffer {
  std::string name;  // unique within a plan, e.g. "reduce bucket 1"
  MemorySpace space = MemorySpace::kDevice;
  MemoryTag tag = MemoryTag::kOther;
  int64_t bytes = 0;
  bool transient = false;  // a peak bound for buffers made and freed in use
  std::string file;        // kNvme: the file that holds it ("" when not known)
};

class MemoryPlan {
 public:
  // Adds a buffer (names must be unique: a repeated name is an internal
  // error and aborts).
  MemoryPlan& Add(absl::string_view name, MemorySpace space, MemoryTag tag, int64_t bytes,
                  bool transient = false);
  // Adds a kNvme buffer kept in `file` (several buffers may share a file).
  MemoryPlan& AddFile(absl::string_view name, absl::string_view file, MemoryTag tag, int64_t bytes);
  // Adds `bytes` to the buffer `name` (made if absent; a different space or
  // tag for the same name is an internal error and aborts): for a group of
  // tensors planned one by one.
  MemoryPlan& Grow(absl::string_view name, MemorySpace space, MemoryTag tag, int64_t bytes);
  // Every buffer of `other`, each name prefixed with `prefix`.
  MemoryPlan& Append(const MemoryPlan& other, absl::string_view prefix = "");

  const std::vector<PlannedBuffer>& buffers() const { return buffers_; }
  // The buffer called `name`; aborts when there is none (a component asked
  // for a buffer its own plan does not state).
  const PlannedBuffer& at(absl::string_view name) const;
  bool contains(absl::string_view name) const;

  // Bytes per tag in one space, and their sum.
  std::array<int64_t, kNumMemoryTags> ByTag(MemorySpace space) const;
  int64_t Total(MemorySpace space) const;
  // One line per buffer: "name  space  tag  bytes  bytes in GiB/MiB/KiB",
  // the names padded to the longest.
  std::string ToText() const;

 private:
  PlannedBuffer* Find(absl::string_view name);

  std::vector<PlannedBuffer> buffers_;
  // Name to position in buffers_: adding, finding and allocating a buffer
  // stay O(1) in a plan of tens of thousands (an NVMe store's swap buffers
  // of a small sub-group under a large budget).
  absl::flat_hash_map<std::string, size_t> index_;
};

// Whether `plan` fits what is left, checked before anything of it is
// allocated or written: for device and pinned host memory, its total
// against the account's budget less the bytes in use (no budget: nothing to
// check); spaces without a budget that live in host memory (pinned host,
// a CpuDevice's memory) together against the machine's MemAvailable; for
// each directory of its kNvme files, their bytes against the
// file system's available space plus what those files already occupy (they
// are truncated and allocated again). A miss is ResourceExhausted with the
// plan's numbers: the space, what it needs by tag and its largest buffers,
// what is free. The files are only a lower bound on what a directory needs
// when several ranks of a machine share it; allocating them checks the rest.
absl::Status CheckPlanFits(const MemoryPlan& plan, Device& device);

// Allocates the plan's buffer `name` from `device`'s memory of its space
// (device memory or pinned host memory), with its tag and size.
absl::StatusOr<Buffer> AllocatePlanned(Device& device, const MemoryPlan& plan, absl::string_view name);

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_MEMORY_PLAN_H_
