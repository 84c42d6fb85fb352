// Timeline: zones stamped in stream order, overlap and precedence read from
// them (two CpuDevice streams made to run together, or ordered by an
// event), the interval arithmetic on hand-made zones, and the Chrome trace.
#include "runtime/timeline.h"

#include <atomic>
#include <chrono>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "runtime/cpu_device.h"

namespace memwall {
namespace {

Zone Z(const std::string& track, int64_t b, int64_t e) { return Zone{track, ZoneKind::kAdam, b, e}; }

TEST(Timeline, IntervalArithmetic) {
  const std::vector<Zone> busy = {Z("c", 0, 10), Z("c", 5, 20), Z("c", 30, 40)};
  EXPECT_EQ(BusyNs(busy), 30);  // [0, 20) and [30, 40)
  EXPECT_EQ(OverlapNs(busy, {Z("x", 8, 32)}), 14);  // [8, 20) and [30, 32)
  EXPECT_EQ(OverlapNs(busy, {Z("x", 20, 30)}), 0);
  EXPECT_DOUBLE_EQ(IdleFraction(busy, 0, 50), 1.0 - 30.0 / 50.0);
  EXPECT_DOUBLE_EQ(IdleFraction(busy, 15, 35), 1.0 - 10.0 / 20.0);
  EXPECT_DOUBLE_EQ(IdleFraction({}, 0, 10), 1.0);
  // Incomplete zones (a stamp not reached) count for nothing.
  EXPECT_EQ(BusyNs({Zone{"c", ZoneKind::kAdam, 5, -1}}), 0);
  const ZoneKind x = ZoneKind::kGradD2H, y = ZoneKind::kParamH2D;
  const std::vector<Zone> mixed = {Zone{"a", x, 0, 1}, Zone{"b", x, 0, 1}, Zone{"a", y, 2, 3}, Zone{"a", x, 4, -1}};
  EXPECT_EQ(Select(mixed, "a").size(), 2u);
  EXPECT_EQ(Select(mixed, "a", x).size(), 1u);
}

TEST(Timeline, EveryZoneKindHasItsOwnName) {
  std::set<std::string> names;
  for (int k = 0; k < kNumZoneKinds; ++k) {
    const std::string name(ZoneName(static_cast<ZoneKind>(k)));
    EXPECT_NE(name, "?") << "ZoneKind " << k << " has no name";
    EXPECT_TRUE(names.insert(name).second) << name << " twice";
  }
  EXPECT_EQ(ZoneName(ZoneKind::kForwardBackward), "forward+backward");
}

// Spins until `flag` is set; false after ~10 s (a test failure, not a hang).
bool AwaitFlag(const std::atomic<bool>& flag) {
  for (int i = 0; i < 10000 && !flag.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return flag.load();
}

class TimelineOnStreams : public testing::Test {
 protected:
  void SetUp() override {
    device_ = *CreateCpuDevice();
    a_ = *device_->CreateStream("stream_a");
    b_ = *device_->CreateStream("stream_b");
  }
  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> a_, b_;
};

TEST_F(TimelineOnStreams, ZonesThatMustRunTogetherOverlap) {
  Timeline t;
  std::atomic<bool> a_running{false}, b_running{false};
  // Each zone's work waits until the other's has started, so each zone
  // begins before the other ends: they overlap whatever the timing.
  auto za = *t.Begin(*a_, ZoneKind::kGradD2H);
  ASSERT_TRUE(a_->EnqueueHost([&] {
    a_running = true;
    return AwaitFlag(b_running) ? absl::OkStatus() : absl::DeadlineExceededError("b never ran");
  }).ok());
  ASSERT_TRUE(t.End(*a_, za).ok());
  auto zb = *t.Begin(*b_, ZoneKind::kParamH2D);
  ASSERT_TRUE(b_->EnqueueHost([&] {
    b_running = true;
    return AwaitFlag(a_running) ? absl::OkStatus() : absl::DeadlineExceededError("a never ran");
  }).ok());
  ASSERT_TRUE(t.End(*b_, zb).ok());
  ASSERT_TRUE(a_->Synchronize().ok());
  ASSERT_TRUE(b_->Synchronize().ok());
  const std::vector<Zone> zones = t.Zones();
  const auto on_a = Select(zones, "stream_a", ZoneKind::kGradD2H);
  const auto on_b = Select(zones, "stream_b", ZoneKind::kParamH2D);
  ASSERT_EQ(on_a.size(), 1u);
  ASSERT_EQ(on_b.size(), 1u);
  EXPECT_LT(on_a[0].begin_ns, on_b[0].end_ns);
  EXPECT_LT(on_b[0].begin_ns, on_a[0].end_ns);
  EXPECT_GT(OverlapNs(on_a, on_b), 0);
}

TEST_F(TimelineOnStreams, ZonesOrderedByAnEventDoNotOverlap) {
  Timeline t;
  auto event = *device_->CreateEvent();
  {
    StreamZone za(&t, *a_, ZoneKind::kCpuAdam);
    ASSERT_TRUE(a_->EnqueueHost([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return absl::OkStatus();
    }).ok());
  }
  ASSERT_TRUE(a_->Record(*event).ok());
  ASSERT_TRUE(b_->Wait(*event).ok());
  { StreamZone zb(&t, *b_, ZoneKind::kParamH2D); }
  ASSERT_TRUE(b_->Synchronize().ok());
  const std::vector<Zone> zones = t.Zones();
  const auto first = Select(zones, "stream_a"), second = Select(zones, "stream_b");
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_GE(second[0].begin_ns, first[0].end_ns);
  EXPECT_EQ(OverlapNs(first, second), 0);
  {
    HostZone z(&t, ZoneKind::kCpuAdam);
  }
  EXPECT_EQ(Select(t.Zones(), kHostTrack, ZoneKind::kCpuAdam).size(), 1u);
  t.Clear();
  EXPECT_TRUE(t.Zones().empty());
}

TEST_F(TimelineOnStreams, ChromeTraceHasOneEventPerZoneAndOneThreadPerTrack) {
  Timeline t;
  auto quoted = *device_->CreateStream("copy \"tiles\"");
  for (int i = 0; i < 3; ++i) {
    StreamZone z(&t, *quoted, ZoneKind::kParamH2D, i == 0 ? "h.0.mlp" : "");
  }
  { HostZone z(&t, ZoneKind::kCpuAdam); }
  ASSERT_TRUE(quoted->Synchronize().ok());
  t.AddSpan("disk", ZoneKind::kParamSwapIn, 10, 20, 4096);
  ASSERT_EQ(Select(t.Zones(), "copy \"tiles\"").front().label, "h.0.mlp");
  const std::string json = t.ChromeTraceJson(/*pid=*/3);
  auto count = [&](const std::string& what) {
    int n = 0;
    for (size_t at = json.find(what); at != std::string::npos; at = json.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("\"ph\": \"X\""), 5) << json;
  EXPECT_EQ(count("\"thread_name\""), 3) << json;  // the copy stream, host and disk
  EXPECT_EQ(count("\"pid\": 3"), 8) << json;
  EXPECT_EQ(count("\"args\": {\"label\": \"h.0.mlp\"}"), 1) << json;  // a zone's label
  EXPECT_EQ(count("\"args\": {\"bytes\": 4096}"), 1) << json;         // a transfer's bytes
  EXPECT_NE(json.find("copy \\\"tiles\\\""), std::string::npos) << json;  // escaped
  EXPECT_NE(json.find("\"name\": \"param H2D\""), std::string::npos) << json;  // ZoneName
  EXPECT_EQ(json.rfind("]}\n"), json.size() - 3);
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir ? dir : "/tmp") + "/trace.json";
  ASSERT_TRUE(t.WriteChromeTrace(path, 3).ok());
}

TEST(Timeline, AStampForAClearedZoneIsDropped) {
  Timeline t;
  std::optional<HostZone> open;
  open.emplace(&t, ZoneKind::kCpuAdamDelayed);  // a delayed update running while a step's trace is cut
  t.Clear();
  { HostZone z(&t, ZoneKind::kCpuAdam); }
  const int64_t end_before = t.Zones().at(0).end_ns;
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  open.reset();  // its end stamp must not land on the newer zone
  const std::vector<Zone> zones = t.Zones();
  ASSERT_EQ(zones.size(), 1u);
  EXPECT_EQ(zones[0].kind, ZoneKind::kCpuAdam);
  EXPECT_EQ(zones[0].end_ns, end_before) << "the cleared zone's end was stamped on the newer zone";
  { HostZone z(&t, ZoneKind::kGradNorm); }
  ASSERT_EQ(t.Zones().size(), 2u);
  EXPECT_TRUE(t.Zones()[1].complete());
}

TEST_F(TimelineOnStreams, DisabledRecordsNothing) {
  Timeline t(/*enabled=*/false);
  auto z = t.Begin(*a_, ZoneKind::kAdam);
  ASSERT_TRUE(z.ok());
  ASSERT_TRUE(t.End(*a_, *z).ok());
  { HostZone h(&t, ZoneKind::kCpuAdam); }
  { StreamZone s(&t, *a_, ZoneKind::kAdam); }
  { StreamZone s(nullptr, *a_, ZoneKind::kAdam); }
  { HostZone h(nullptr, ZoneKind::kCpuAdam); }
  ASSERT_TRUE(a_->Synchronize().ok());
  EXPECT_TRUE(t.Zones().empty());
}

}  // namespace
}  // namespace memwall
