#include "runtime/memory_plan.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/files.h"

namespace memwall {

MemoryPlan& MemoryPlan::Add(absl::string_view name, MemorySpace space, MemoryTag tag, int64_t bytes,
                            bool transient) {
  if (contains(name) || bytes < 0) {
    std::fprintf(stderr, "MemoryPlan: buffer '%s' (%lld bytes) is planned twice or negative\n",
                 std::string(name).c_str(), static_cast<long long>(bytes));
    std::abort();
  }
  index_.emplace(std::string(name), buffers_.size());
  buffers_.push_back({std::string(name), space, tag, bytes, transient, ""});
  return *this;
}

PlannedBuffer* MemoryPlan::Find(absl::string_view name) {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &buffers_[it->second];
}

MemoryPlan& MemoryPlan::AddFile(absl::string_view name, absl::string_view file, MemoryTag tag, int64_t bytes) {
  Add(name, MemorySpace::kNvme, tag, bytes);
  buffers_.back().file = std::string(file);
  return *this;
}

MemoryPlan& MemoryPlan::Grow(absl::string_view name, MemorySpace space, MemoryTag tag, int64_t bytes) {
  PlannedBuffer* b = Find(name);
  if (b == nullptr) return Add(name, space, tag, bytes);
  if (b->space != space || b->tag != tag || bytes < 0) {
    std::fprintf(stderr, "MemoryPlan: buffer '%s' grown with another space or tag\n", std::string(name).c_str());
    std::abort();
  }
  b->bytes += bytes;
  return *this;
}

MemoryPlan& MemoryPlan::Append(const MemoryPlan& other, absl::string_view prefix) {
  for (const PlannedBuffer& b : other.buffers_) {
    Add(absl::StrCat(prefix, b.name), b.space, b.tag, b.bytes, b.transient);
    buffers_.back().file = b.file;
  }
  return *this;
}

bool MemoryPlan::contains(absl::string_view name) const { return index_.contains(name); }

const PlannedBuffer& MemoryPlan::at(absl::string_view name) const {
  if (const auto it = index_.find(name); it != index_.end()) return buffers_[it->second];
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
  size_t width = 0;  // the longest name's, so the columns line up
  for (const PlannedBuffer& b : buffers_) width = std::max(width, b.name.size());
  std::string out;
  for (const PlannedBuffer& b : buffers_) {
    absl::StrAppendFormat(&out, "  %-*s  %-7s %-17s %14d  %10s%s\n", static_cast<int>(width), b.name,
                          b.space == MemorySpace::kDevice ? "device" : b.space == MemorySpace::kNvme ? "nvme" : "pinned",
                          MemoryTagName(b.tag), b.bytes, FormatBytes(b.bytes),
                          b.transient ? " (peak of transient buffers)" : "");
  }
  return out;
}

namespace {

// "params16 1.00 GiB, grads 512.00 MiB": the plan's bytes in `space` by tag.
std::string ByTagText(const MemoryPlan& plan, MemorySpace space) {
  std::vector<std::string> parts;
  const auto by_tag = plan.ByTag(space);
  for (int t = 0; t < kNumMemoryTags; ++t) {
    if (by_tag[t] > 0) {
      parts.push_back(absl::StrCat(MemoryTagName(static_cast<MemoryTag>(t)), " ", FormatBytes(by_tag[t])));
    }
  }
  return absl::StrJoin(parts, ", ");
}

// "reduce bucket 0 (64.00 MiB), ...": the largest `n` buffers in `space`.
std::string LargestText(const MemoryPlan& plan, MemorySpace space, size_t n) {
  std::vector<const PlannedBuffer*> in;
  for (const PlannedBuffer& b : plan.buffers()) {
    if (b.space == space && b.bytes > 0) in.push_back(&b);
  }
  std::stable_sort(in.begin(), in.end(), [](const PlannedBuffer* a, const PlannedBuffer* b) { return a->bytes > b->bytes; });
  std::vector<std::string> parts;
  for (size_t i = 0; i < std::min(n, in.size()); ++i) {
    parts.push_back(absl::StrCat(in[i]->name, " (", FormatBytes(in[i]->bytes), ")"));
  }
  return absl::StrJoin(parts, ", ");
}

absl::Status CheckMemory(const MemoryPlan& plan, MemorySpace space, const MemoryAccount& account) {
  const int64_t need = plan.Total(space);
  if (account.budget() == 0 || need == 0) return absl::OkStatus();
  const int64_t in_use = static_cast<int64_t>(account.total_current());
  const int64_t free = std::max<int64_t>(0, static_cast<int64_t>(account.budget()) - in_use);
  if (need <= free) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      account.name(), ": the plan needs ", FormatBytes(need), " (", need, " bytes: ", ByTagText(plan, space),
      "; largest: ", LargestText(plan, space, 3), ") but ", FormatBytes(free), " of its ",
      FormatBytes(account.budget()), " budget is free (", FormatBytes(in_use),
      " in use); does not fit: try activation checkpointing, a higher ZeRO stage or offload"));
}

std::string Directory(const std::string& file) {
  const size_t slash = file.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : file.substr(0, slash);
}

absl::Status CheckFiles(const MemoryPlan& plan) {
  struct Group {
    int64_t need = 0;
    std::map<std::string, int64_t> files;  // file -> planned bytes
  };
  std::map<std::string, Group> dirs;
  for (const PlannedBuffer& b : plan.buffers()) {
    if (b.space != MemorySpace::kNvme || b.file.empty()) continue;
    Group& g = dirs[Directory(b.file)];
    g.need += b.bytes;
    g.files[b.file] += b.bytes;
  }
  for (const auto& [dir, g] : dirs) {
    // A directory that cannot be read is left to the store that opens it,
    // which names the path.
    int64_t available = FileSystemAvailableBytes(dir);
    if (available < 0) continue;
    for (const auto& [file, bytes] : g.files) {
      struct stat st;
      if (::stat(file.c_str(), &st) == 0 && S_ISREG(st.st_mode)) available += int64_t{st.st_blocks} * 512;
    }
    if (g.need <= available) continue;
    std::vector<std::string> files;
    for (const auto& [file, bytes] : g.files) files.push_back(absl::StrCat(file, " ", FormatBytes(bytes)));
    return absl::ResourceExhaustedError(absl::StrCat(
        "NVMe swap files in ", dir, ": the plan needs ", FormatBytes(g.need), " (", g.need, " bytes: ",
        absl::StrJoin(files, ", "), ") but its file system has ", FormatBytes(available),
        " available; does not fit: give nvme_path a larger drive"));
  }
  return absl::OkStatus();
}

// MemAvailable of /proc/meminfo in bytes; -1 when it cannot be read.
int64_t HostMemAvailable() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return -1;
  char line[256];
  long long kib = -1;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::sscanf(line, "MemAvailable: %lld kB", &kib) == 1) break;
  }
  std::fclose(f);
  return kib < 0 ? -1 : static_cast<int64_t>(kib) * 1024;
}

// Spaces without a budget that live in host memory (pinned host memory, a
// CpuDevice's memory) against what the machine has available: past it the
// kernel's OOM killer ends the run hours later instead of a Status now.
absl::Status CheckHostMemory(const MemoryPlan& plan, Device& device) {
  int64_t need = 0;
  std::vector<std::string> parts;
  const auto add = [&](MemorySpace space, Allocator& allocator) {
    const int64_t bytes = plan.Total(space);
    if (allocator.account().budget() != 0 || !allocator.host_accessible() || bytes == 0) return;
    need += bytes;
    parts.push_back(absl::StrCat(allocator.account().name(), " ", FormatBytes(bytes)));
  };
  add(MemorySpace::kDevice, device.memory());
  add(MemorySpace::kPinnedHost, device.pinned_host());
  if (need == 0) return absl::OkStatus();
  const int64_t available = HostMemAvailable();
  if (available < 0 || need <= available) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "host memory: the plan needs ", FormatBytes(need), " (", need, " bytes: ", absl::StrJoin(parts, ", "),
      ") but the machine has ", FormatBytes(available),
      " available (MemAvailable in /proc/meminfo); does not fit: try a higher ZeRO stage, more ranks or NVMe offload"));
}

}  // namespace

absl::Status CheckPlanFits(const MemoryPlan& plan, Device& device) {
  if (absl::Status st = CheckMemory(plan, MemorySpace::kDevice, device.memory().account()); !st.ok()) return st;
  if (absl::Status st = CheckMemory(plan, MemorySpace::kPinnedHost, device.pinned_host().account()); !st.ok()) {
    return st;
  }
  if (absl::Status st = CheckHostMemory(plan, device); !st.ok()) return st;
  return CheckFiles(plan);
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
