#include "runtime/timeline.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "runtime/files.h"

namespace memwall {
namespace {

// The union of complete zones as sorted, disjoint intervals.
std::vector<std::pair<int64_t, int64_t>> Union(const std::vector<Zone>& zones) {
  std::vector<std::pair<int64_t, int64_t>> in;
  for (const Zone& z : zones) {
    if (z.complete() && z.end_ns > z.begin_ns) in.emplace_back(z.begin_ns, z.end_ns);
  }
  std::sort(in.begin(), in.end());
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& iv : in) {
    if (!out.empty() && iv.first <= out.back().second) {
      out.back().second = std::max(out.back().second, iv.second);
    } else {
      out.push_back(iv);
    }
  }
  return out;
}

}  // namespace

absl::string_view ZoneName(ZoneKind kind) {
  switch (kind) {
    case ZoneKind::kForwardBackward: return "forward+backward";
    case ZoneKind::kAdam: return "adam";
    case ZoneKind::kAllGather: return "all-gather";
    case ZoneKind::kGradD2H: return "grad D2H";
    case ZoneKind::kGradAccumulate: return "grad accumulate";
    case ZoneKind::kGradNorm: return "grad norm";
    case ZoneKind::kGradNormPass: return "grad norm pass";
    case ZoneKind::kCpuAdam: return "cpu_adam";
    case ZoneKind::kCpuAdamDelayed: return "cpu_adam (delayed)";
    case ZoneKind::kParamH2D: return "param H2D";
    case ZoneKind::kSwapWait: return "swap wait";
    case ZoneKind::kSwapIn: return "swap-in";
    case ZoneKind::kSwapOut: return "swap-out";
    case ZoneKind::kParamFetch: return "param fetch";
    case ZoneKind::kParamGather: return "param gather";
    case ZoneKind::kParamSwapIn: return "param swap-in";
    case ZoneKind::kParamSwapOut: return "param swap-out";
  }
  return "?";
}

int64_t TimelineNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Timeline::ZoneId Timeline::Add(absl::string_view track, ZoneKind kind, absl::string_view label, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  zones_.push_back(Zone{std::string(track), kind, -1, -1, bytes, std::string(label)});
  return first_id_ + static_cast<ZoneId>(zones_.size()) - 1;
}

void Timeline::AddSpan(absl::string_view track, ZoneKind kind, int64_t begin_ns, int64_t end_ns, int64_t bytes) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  zones_.push_back(Zone{std::string(track), kind, begin_ns, end_ns, bytes});
}

void Timeline::Stamp(ZoneId id, bool end) {
  const int64_t now = TimelineNowNs();
  std::lock_guard<std::mutex> lock(mu_);
  const ZoneId index = id - first_id_;
  if (index < 0 || index >= static_cast<ZoneId>(zones_.size())) return;  // cleared meanwhile
  (end ? zones_[index].end_ns : zones_[index].begin_ns) = now;
}

absl::StatusOr<Timeline::ZoneId> Timeline::Begin(Stream& stream, ZoneKind kind, absl::string_view label,
                                                 int64_t bytes) {
  if (!enabled_) return ZoneId{-1};
  const ZoneId id = Add(stream.name(), kind, label, bytes);
  absl::Status st = stream.EnqueueHost([this, id] {
    Stamp(id, false);
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  return id;
}

absl::Status Timeline::End(Stream& stream, ZoneId zone) {
  if (!enabled_ || zone < 0) return absl::OkStatus();
  return stream.EnqueueHost([this, zone] {
    Stamp(zone, true);
    return absl::OkStatus();
  });
}

StreamZone::StreamZone(Timeline* timeline, Stream& stream, ZoneKind kind, absl::string_view label, int64_t bytes)
    : timeline_(timeline), stream_(stream) {
  if (timeline_ == nullptr || !timeline_->enabled()) return;
  absl::StatusOr<Timeline::ZoneId> id = timeline_->Begin(stream_, kind, label, bytes);
  if (id.ok()) {
    id_ = *id;
  } else {
    stream_.Fail(id.status());
  }
}

StreamZone::~StreamZone() {
  if (id_ < 0) return;
  if (absl::Status st = timeline_->End(stream_, id_); !st.ok()) stream_.Fail(st);
}

HostZone::HostZone(Timeline* timeline, ZoneKind kind, absl::string_view track) : timeline_(timeline) {
  if (timeline_ == nullptr || !timeline_->enabled()) return;
  id_ = timeline_->Add(track, kind);
  timeline_->Stamp(id_, false);
}

HostZone::~HostZone() {
  if (id_ >= 0) timeline_->Stamp(id_, true);
}

std::vector<Zone> Timeline::Zones() const {
  std::lock_guard<std::mutex> lock(mu_);
  return zones_;
}

void Timeline::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  first_id_ += static_cast<ZoneId>(zones_.size());
  zones_.clear();
}

std::string Timeline::ChromeTraceJson(int pid) const { return memwall::ChromeTraceJson(Zones(), pid); }

std::string ChromeTraceJson(const std::vector<Zone>& zones, int pid) {
  int64_t origin = INT64_MAX;
  for (const Zone& z : zones) {
    if (z.complete()) origin = std::min(origin, z.begin_ns);
  }
  std::map<std::string, int> tids;  // track -> thread id, in order of appearance
  std::string json = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  bool first = true;
  auto append = [&](const std::string& event) {
    absl::StrAppend(&json, first ? "  " : ",\n  ", event);
    first = false;
  };
  for (const Zone& z : zones) {
    if (!z.complete()) continue;
    auto [it, added] = tids.emplace(z.track, static_cast<int>(tids.size()) + 1);
    if (added) {
      append(absl::StrFormat(
          R"({"name": "thread_name", "ph": "M", "pid": %d, "tid": %d, "args": {"name": %s}})", pid,
          it->second, JsonString(z.track)));
    }
    std::vector<std::string> args;
    if (z.bytes > 0) args.push_back(absl::StrFormat(R"("bytes": %d)", z.bytes));
    if (!z.label.empty()) args.push_back(absl::StrCat(R"("label": )", JsonString(z.label)));
    append(absl::StrFormat(R"({"name": %s, "ph": "X", "pid": %d, "tid": %d, "ts": %.3f, "dur": %.3f%s})",
                           JsonString(z.name()), pid, it->second, (z.begin_ns - origin) / 1e3,
                           z.duration_ns() / 1e3,
                           args.empty() ? "" : absl::StrCat(R"(, "args": {)", absl::StrJoin(args, ", "), "}")));
  }
  json += "\n]}\n";
  return json;
}

absl::Status Timeline::WriteChromeTrace(const std::string& path, int pid) const {
  return WriteFileAtomically(path, ChromeTraceJson(pid));
}

int64_t BusyNs(const std::vector<Zone>& zones) {
  int64_t busy = 0;
  for (const auto& [b, e] : Union(zones)) busy += e - b;
  return busy;
}

int64_t OverlapNs(const std::vector<Zone>& a, const std::vector<Zone>& b) {
  const auto ua = Union(a), ub = Union(b);
  int64_t overlap = 0;
  size_t i = 0, j = 0;
  while (i < ua.size() && j < ub.size()) {
    const int64_t lo = std::max(ua[i].first, ub[j].first);
    const int64_t hi = std::min(ua[i].second, ub[j].second);
    if (hi > lo) overlap += hi - lo;
    (ua[i].second < ub[j].second) ? ++i : ++j;
  }
  return overlap;
}

double IdleFraction(const std::vector<Zone>& zones, int64_t begin_ns, int64_t end_ns) {
  if (end_ns <= begin_ns) return 0.0;
  std::vector<Zone> clipped;
  for (const Zone& z : zones) {
    if (!z.complete()) continue;
    Zone c = z;
    c.begin_ns = std::max(z.begin_ns, begin_ns);
    c.end_ns = std::min(z.end_ns, end_ns);
    if (c.end_ns > c.begin_ns) clipped.push_back(c);
  }
  return 1.0 - double(BusyNs(clipped)) / double(end_ns - begin_ns);
}

std::vector<Zone> Select(const std::vector<Zone>& all, absl::string_view track) {
  std::vector<Zone> out;
  for (const Zone& z : all) {
    if (z.complete() && z.track == track) out.push_back(z);
  }
  return out;
}

std::vector<Zone> Select(const std::vector<Zone>& all, absl::string_view track, ZoneKind kind) {
  std::vector<Zone> out;
  for (const Zone& z : Select(all, track)) {
    if (z.kind == kind) out.push_back(z);
  }
  return out;
}

}  // namespace memwall
