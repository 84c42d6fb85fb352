#include "runtime/memory_plan.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace memwall {

MemoryPlan& MemoryPlan::Add(absl::string_view name, MemorySpace space, MemoryTag tag, int64_t bytes,
                            bool transient) {
  if (contains(name) || bytes < 0) {
    std::fprintf(stderr, "MemoryPlan: buffer '%s' (%lld bytes) is planned twice or negative\n",
                 std::string(name).c_str(), static_cast<long long>(bytes));
    std::abort();
  }
  buffers_.push_back({std::string(name), space, tag, bytes, transient});
  return *this;
}

MemoryPlan& MemoryPlan::Grow(absl::string_view name, MemorySpace space, MemoryTag tag, int64_t bytes) {
  for (PlannedBuffer& b : buffers_) {
    if (b.name != name) continue;
    if (b.space != space || b.tag != tag || bytes < 0) {
      std::fprintf(stderr, "MemoryPlan: buffer '%s' grown with another space or tag\n", std::string(name).c_str());
      std::abort();
    }
    b.bytes += bytes;
    return *this;
  }
  return Add(name, space, tag, bytes);
}

MemoryPlan& MemoryPlan::Append(const MemoryPlan& other, absl::string_view prefix) {
  for (const PlannedBuffer& b : other.buffers_) {
    Add(absl::StrCat(prefix, b.name), b.space, b.tag, b.bytes, b.transient);
  }
  return *this;
}

bool MemoryPlan::contains(absl::string_view name) const {
  for (const PlannedBuffer& b : buffers_) {
    if (b.name == name) return true;
  }
  return false;
}

const PlannedBuffer& MemoryPlan::at(absl::string_view name) const {
  for (const PlannedBuffer& b : buffers_) {
    if (b.name == name) return b;
  }
  std::fprintf(stderr, "MemoryPlan: no buffer '%s' in the plan:\n%s", std::string(name).c_str(), ToText().c_str());
  std::abort();
}

std::array<int64_t, kNumMemoryTags> MemoryPlan::ByTag(MemorySpace space) const {
  std::array<int64_t, kNumMemoryTags> out{};
  for (const PlannedBuffer& b : buffers_) {
    if (b.space == space) out[static_cast<int>(b.tag)] += b.bytes;
  }
  return out;
}

int64_t MemoryPlan::Total(MemorySpace space) const {
  int64_t total = 0;
  for (int64_t bytes : ByTag(space)) total += bytes;
  return total;
}

std::string MemoryPlan::ToText() const {
  std::string out;
  for (const PlannedBuffer& b : buffers_) {
    absl::StrAppendFormat(&out, "  %-32s %-7s %-17s %14d%s\n", b.name,
                          b.space == MemorySpace::kDevice ? "device" : b.space == MemorySpace::kNvme ? "nvme" : "pinned",
                          MemoryTagName(b.tag), b.bytes,
                          b.transient ? " (peak of transient buffers)" : "");
  }
  return out;
}

absl::StatusOr<Buffer> AllocatePlanned(Device& device, const MemoryPlan& plan, absl::string_view name) {
  const PlannedBuffer& b = plan.at(name);
  if (b.space == MemorySpace::kNvme) {
    return absl::InvalidArgumentError(absl::StrCat("planned buffer '", name, "' is on NVMe: a file, not memory"));
  }
  Allocator& allocator = b.space == MemorySpace::kDevice ? device.memory() : device.pinned_host();
  return allocator.Allocate(static_cast<size_t>(b.bytes), b.tag);
}

}  // namespace memwall
