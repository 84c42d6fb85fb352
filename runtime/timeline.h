// A timeline of named zones on streams and host threads, to see what
// overlaps what (ZeRO-Offload §5: gradient D2H under backward, parameter H2D
// under the CPU Adam, the delayed parameter update under the next forward).
//
//   Timeline t;
//   {
//     StreamZone zone(&t, copy_stream, ZoneKind::kGradD2H);  // stamped when the stream gets there
//     ... enqueue the copy ...
//   }                                                        // the end stamp, enqueued
//   { HostZone z(&t, ZoneKind::kCpuAdam); adam->Step(...); }
//   ... synchronize ...
//   t.WriteChromeTrace("step_12.json");   // opens in Perfetto / chrome://tracing
//
// Every zone is a ZoneKind: its name (the trace's event name) has one home,
// ZoneName. The scopes take a Timeline* that may be null (nothing recorded).
//
// A stream zone's begin and end are host functions enqueued on the stream
// (Stream::EnqueueHost), so they are stamped, with one steady clock, when the
// stream reaches them: on the CpuDevice that is when the work runs; on CUDA
// it is when the GPU gets there plus the host callback's latency (a few
// microseconds). The track of a stream zone is the stream's name. Zones are
// facts about order: tests assert overlap and precedence from them, never a
// duration.
#ifndef MEMWALL_RUNTIME_TIMELINE_H_
#define MEMWALL_RUNTIME_TIMELINE_H_

#include <mutex>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "runtime/device.h"

namespace memwall {

// The phases memwall records: one per step of the papers' schedules.
enum class ZoneKind : uint8_t {
  kForwardBackward,  // "forward+backward": one micro-batch (compute stream)
  kAdam,             // "adam": the device optimizer's step (compute stream)
  kAllGather,        // "all-gather": updated 16-bit parameters to every rank (stages 1, 2)
  kGradD2H,          // "grad D2H": a reduced gradient piece to pinned host memory (offload)
  kGradAccumulate,   // "grad accumulate": ... added into the host gradient shard
  kGradNorm,         // "grad norm": the host shard's norm and inf/NaN flag to the device
  kGradNormPass,     // "grad norm pass": a pass over the parts of the host shard the folded norm cannot serve
  kCpuAdam,          // "cpu_adam": the CPU Adam of one tile (host)
  kCpuAdamDelayed,   // "cpu_adam (delayed)": the delayed parameter update's CPU Adam
  kParamH2D,         // "param H2D": updated parameters (a tile) to the device
  kSwapWait,         // "swap wait": the host waiting on a swap-in or swap-out of optimizer states (NVMe)
  kSwapIn,           // "swap-in": a sub-group's states read from NVMe, submission to completion (bytes)
  kSwapOut,          // "swap-out": ... written back to NVMe (bytes)
  kParamFetch,       // "param fetch": a stage-3 gather's own pieces from the shard's store (the H2D hop when offloaded; bytes)
  kParamGather,      // "param gather": its collectives, every rank's pieces to all (bytes gathered)
  kParamSwapIn,      // "param swap-in": 16-bit parameters read from NVMe, submission to completion (bytes)
  kParamSwapOut,     // "param swap-out": ... written to NVMe (bytes)
};
inline constexpr int kNumZoneKinds = 17;
absl::string_view ZoneName(ZoneKind kind);

// The host tracks; a stream zone's track is its stream's name.
inline constexpr absl::string_view kHostTrack = "host";

struct Zone {
  std::string track;  // stream name, or a host track
  ZoneKind kind = ZoneKind::kForwardBackward;
  int64_t begin_ns = -1, end_ns = -1;  // steady clock; -1: not reached yet
  int64_t bytes = 0;                   // a transfer's bytes (swap-in, swap-out); 0 otherwise
  std::string label;                   // what it worked on (a gather's module path), or empty
  absl::string_view name() const { return ZoneName(kind); }
  bool complete() const { return begin_ns >= 0 && end_ns >= begin_ns; }
  int64_t duration_ns() const { return complete() ? end_ns - begin_ns : 0; }
};

class Timeline {
 public:
  using ZoneId = int64_t;
  // A disabled timeline records nothing and enqueues nothing.
  explicit Timeline(bool enabled = true) : enabled_(enabled) {}

  bool enabled() const { return enabled_; }
  // Enqueues the zone's begin (end) stamp on `stream` (StreamZone does both).
  absl::StatusOr<ZoneId> Begin(Stream& stream, ZoneKind kind, absl::string_view label = "", int64_t bytes = 0);
  absl::Status End(Stream& stream, ZoneId zone);
  // A zone whose times were taken elsewhere, on TimelineNowNs's clock (an
  // I/O request's submission and completion), moving `bytes`.
  void AddSpan(absl::string_view track, ZoneKind kind, int64_t begin_ns, int64_t end_ns, int64_t bytes = 0);

  // The zones so far (copies; those whose stamps have not run are
  // incomplete). Synchronize the streams first for a whole picture.
  std::vector<Zone> Zones() const;
  void Clear();

  // Chrome's trace-event format: one complete ("X") event per zone, times in
  // microseconds from the first zone, process = `pid` (the rank), one
  // thread per track; a zone's bytes and label are its args.
  std::string ChromeTraceJson(int pid = 0) const;
  absl::Status WriteChromeTrace(const std::string& path, int pid = 0) const;

 private:
  friend class HostZone;
  ZoneId Add(absl::string_view track, ZoneKind kind, absl::string_view label = "", int64_t bytes = 0);
  void Stamp(ZoneId id, bool end);

  const bool enabled_;
  mutable std::mutex mu_;
  std::vector<Zone> zones_;
  // The id of zones_[0]: ids stay unique across Clear(), so a stamp for a
  // zone cleared meanwhile is dropped instead of landing on a newer one.
  ZoneId first_id_ = 0;
};

// A zone of work on `stream`, from construction to destruction, each end
// stamped when the stream reaches it. A failure to enqueue a stamp becomes
// the stream's sticky error (Stream::Fail), reported by its next
// Synchronize. A null or disabled timeline records nothing.
class StreamZone {
 public:
  // `label` and `bytes`: what the zone works on and moves (Zone).
  StreamZone(Timeline* timeline, Stream& stream, ZoneKind kind, absl::string_view label = "", int64_t bytes = 0);
  ~StreamZone();
  StreamZone(const StreamZone&) = delete;
  StreamZone& operator=(const StreamZone&) = delete;

 private:
  Timeline* timeline_;
  Stream& stream_;
  Timeline::ZoneId id_ = -1;
};

// A zone of host work on the calling thread, from construction to
// destruction, on `track`.
class HostZone {
 public:
  HostZone(Timeline* timeline, ZoneKind kind, absl::string_view track = kHostTrack);
  ~HostZone();
  HostZone(const HostZone&) = delete;
  HostZone& operator=(const HostZone&) = delete;

 private:
  Timeline* timeline_;
  Timeline::ZoneId id_ = -1;
};

// The trace of `zones` (e.g. one step's, from Zones()): as
// Timeline::ChromeTraceJson.
std::string ChromeTraceJson(const std::vector<Zone>& zones, int pid = 0);

// Nanoseconds on the clock zones are stamped with.
int64_t TimelineNowNs();

// Total time during which some zone of `a` and some zone of `b` both run
// (the measure of the intersection of their unions), in ns.
int64_t OverlapNs(const std::vector<Zone>& a, const std::vector<Zone>& b);
// Time covered by at least one zone (the measure of their union), in ns.
int64_t BusyNs(const std::vector<Zone>& zones);
// 1 - BusyNs(zones clipped to [begin, end)) / (end - begin): the fraction of
// a window in which none of `zones` runs (a device's idle fraction when the
// zones are its compute stream's).
double IdleFraction(const std::vector<Zone>& zones, int64_t begin_ns, int64_t end_ns);
// The complete zones of `all` on `track` (and of `kind`, when given).
std::vector<Zone> Select(const std::vector<Zone>& all, absl::string_view track);
std::vector<Zone> Select(const std::vector<Zone>& all, absl::string_view track, ZoneKind kind);

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_TIMELINE_H_
