// SwapBuffers, the pinned buffers that cache a swap file (swap_channel.h),
// on their own, with the file as the reference:
//   - a buffer for a new sub-group is an empty one first, else the least
//     recently used one not held; a dirty one is written before it is
//     reused, so that reading its sub-group back gives what it held;
//   - a held buffer is never reused, and with every buffer held there is
//     none;
//   - read-ahead takes a buffer free of work only: never a held, dirty or
//     transferring one, an empty one before a clean one;
//   - a failed write leaves its buffer empty, is the Status of the wait
//     (naming the file, the sub-group and the errno), and breaks the
//     channel ("resume from the last checkpoint");
//   - the file goes with the buffers.
#include "infinity/swap_channel.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/cpu_device.h"

namespace memwall::infinity {
namespace {

constexpr int64_t kGroupBytes = 2 * kAioAlignment;
constexpr int64_t kSubGroups = 6;

using Slot = SwapBuffers::Slot;

std::string SwapPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name, ".swap");
}

struct Fixture {
  explicit Fixture(const std::string& name, int64_t count, AioFaultInjector faults = {}) : path(SwapPath(name)) {
    device = *CreateCpuDevice();
    MemoryPlan plan;
    for (int64_t i = 0; i < count; ++i) {
      plan.Add(absl::StrCat("test buffer ", i), MemorySpace::kPinnedHost, MemoryTag::kStaging, kGroupBytes);
    }
    SwapChannel::Options c;
    c.what = "swap test";
    c.contents = "test values";
    c.path = path;
    c.sub_groups = kSubGroups;
    c.group_bytes = kGroupBytes;
    c.fault_injector = std::move(faults);
    auto created = SwapBuffers::Create(*device, plan, "test buffer", count, c);
    EXPECT_TRUE(created.ok()) << created.status();
    if (created.ok()) buffers = *std::move(created);
  }

  // An empty buffer holding sub-group k filled with k + 1, dirty.
  Slot* Fill(int64_t k) {
    absl::StatusOr<Slot*> slot = buffers->Evict();
    EXPECT_TRUE(slot.ok() && *slot != nullptr) << slot.status();
    std::memset((*slot)->buffer.data(), int(k + 1), kGroupBytes);
    (*slot)->group = k;
    (*slot)->dirty = true;
    buffers->Touch(**slot);
    return *slot;
  }

  // Whether the file holds sub-group k as Fill wrote it, read through a
  // buffer.
  bool FileHolds(int64_t k) {
    absl::StatusOr<Slot*> slot = buffers->Evict();
    if (!slot.ok() || *slot == nullptr) return false;
    if (!buffers->StartRead(**slot, k).ok() || !buffers->Settle(**slot).ok()) return false;
    const char* bytes = (*slot)->buffer.as<char>();
    for (int64_t i = 0; i < kGroupBytes; ++i) {
      if (bytes[i] != char(k + 1)) return false;
    }
    return true;
  }

  std::string path;
  std::unique_ptr<Device> device;
  std::unique_ptr<SwapBuffers> buffers;
};

TEST(SwapBuffers, ReusesTheLeastRecentlyUsedBufferAndWritesItsSubGroupFirst) {
  Fixture f("lru", 3);
  ASSERT_NE(f.buffers, nullptr);
  Slot* zero = f.Fill(0);
  Slot* one = f.Fill(1);
  Slot* two = f.Fill(2);
  EXPECT_TRUE(zero != one && one != two && zero != two) << "three empty buffers first";
  f.buffers->Touch(*zero);  // now 1 is the least recently used
  Slot* three = f.Fill(3);
  EXPECT_EQ(three, one);
  EXPECT_EQ(f.buffers->Find(1), nullptr);
  // Sub-group 1 went to the file before its buffer took 3.
  EXPECT_TRUE(f.FileHolds(1));
  ASSERT_TRUE(f.buffers->SettleAll().ok());
}

TEST(SwapBuffers, NeverReusesAHeldBuffer) {
  Fixture f("held", 2);
  ASSERT_NE(f.buffers, nullptr);
  Slot* zero = f.Fill(0);
  Slot* one = f.Fill(1);
  zero->held = true;  // the least recently used, but held
  EXPECT_EQ(f.Fill(2), one);
  one->held = true;
  absl::StatusOr<Slot*> none = f.buffers->Evict();
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, nullptr) << "every buffer is held";
  EXPECT_EQ(zero->group, 0);
  EXPECT_TRUE(zero->dirty);
}

TEST(SwapBuffers, ReadsAheadOnlyIntoABufferFreeOfWork) {
  Fixture f("spare", 4);
  ASSERT_NE(f.buffers, nullptr);
  Slot* held = f.Fill(0);
  held->held = true;
  Slot* dirty = f.Fill(1);
  Slot* writing = f.Fill(2);
  ASSERT_TRUE(f.buffers->StartWrite(*writing).ok());
  Slot* empty = &f.buffers->slots()[3];
  ASSERT_EQ(empty->group, -1);
  EXPECT_EQ(f.buffers->Spare(), empty) << "an empty buffer first";
  ASSERT_TRUE(f.buffers->StartRead(*empty, 3).ok());
  EXPECT_EQ(f.buffers->Spare(), nullptr) << "held, dirty, writing and reading buffers are not free of work";
  ASSERT_TRUE(f.buffers->Settle(*writing).ok());
  EXPECT_EQ(f.buffers->Spare(), writing) << "a clean copy is";
  ASSERT_TRUE(f.buffers->Settle(*empty).ok());
  f.buffers->Touch(*writing);
  EXPECT_EQ(f.buffers->Spare(), empty) << "the least recently used clean one";
  EXPECT_TRUE(dirty->dirty);
}

TEST(SwapBuffers, AFailedWriteEmptiesItsBufferAndBreaksTheChannel) {
  Fixture f("broken", 2, [](const AioBlockOp& op) -> std::optional<int64_t> {
    if (op.write) return -EIO;
    return std::nullopt;
  });
  ASSERT_NE(f.buffers, nullptr);
  EXPECT_TRUE(f.buffers->channel().Broken().ok());
  Slot* one = f.Fill(1);
  ASSERT_TRUE(f.buffers->StartWrite(*one).ok());
  const absl::Status st = f.buffers->Settle(*one);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(absl::StrContains(st.message(), "swap test, sub-group 1 swap-out")) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), f.path)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "errno 5")) << st;
  EXPECT_EQ(one->group, -1);
  EXPECT_EQ(one->transfer, Slot::Transfer::kNone);
  const absl::Status broken = f.buffers->channel().Broken();
  EXPECT_EQ(broken.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(broken.message(), "resume from the last checkpoint")) << broken;
  EXPECT_TRUE(absl::StrContains(broken.message(), "may hold stale test values")) << broken;
}

TEST(SwapBuffers, TheFileGoesWithTheBuffers) {
  std::string path;
  {
    Fixture f("gone", 2);
    ASSERT_NE(f.buffers, nullptr);
    path = f.path;
    EXPECT_TRUE(std::filesystem::exists(path));
    Slot* zero = f.Fill(0);
    ASSERT_TRUE(f.buffers->StartWrite(*zero).ok());  // in flight when the buffers go
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace memwall::infinity
