#include "runtime/cpu_device.h"

#include <atomic>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/tensor.h"

namespace memwall {
namespace {

// A one-shot flag a thread can wait for (std::, so that ThreadSanitizer sees
// the synchronization: Debian's absl is not built with it).
class Notification {
 public:
  void Notify() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      notified_ = true;
    }
    cv_.notify_all();
  }
  void WaitForNotification() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return notified_; });
  }
  bool HasBeenNotified() {
    std::lock_guard<std::mutex> lock(mu_);
    return notified_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool notified_ = false;
};

std::unique_ptr<Device> MakeDevice(size_t budget = 0) {
  CpuDeviceOptions options;
  options.memory_budget_bytes = budget;
  auto device = CreateCpuDevice(options);
  EXPECT_TRUE(device.ok()) << device.status();
  return *std::move(device);
}

TEST(CpuDeviceTest, WorkOnOneStreamRunsInSubmissionOrder) {
  auto device = MakeDevice();
  auto stream = *device->CreateStream("s");
  std::vector<int> order;  // touched only by the stream's worker
  std::mt19937 gen(3);
  for (int i = 0; i < 500; ++i) {
    const int sleep_us = static_cast<int>(gen() % 50);
    ASSERT_TRUE(stream
                    ->EnqueueHost([&order, i, sleep_us] {
                      if (i % 50 == 0) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
                      order.push_back(i);
                      return absl::OkStatus();
                    })
                    .ok());
  }
  ASSERT_TRUE(stream->Synchronize().ok());
  std::vector<int> expected(500);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(order, expected);
}

TEST(CpuDeviceTest, EventsOrderWorkAcrossStreams) {
  auto device = MakeDevice();
  auto producer = *device->CreateStream("producer");
  auto consumer = *device->CreateStream("consumer");
  auto event = *device->CreateEvent();
  for (int round = 0; round < 20; ++round) {
    Notification release;
    std::atomic<int> value{0};
    int seen = -1;
    // The producer is held until we release it, so without the event the
    // consumer would certainly read 0.
    ASSERT_TRUE(producer->EnqueueHost([&] {
      release.WaitForNotification();
      value = round + 1;
      return absl::OkStatus();
    }).ok());
    ASSERT_TRUE(producer->Record(*event).ok());
    EXPECT_FALSE(*event->Query());
    ASSERT_TRUE(consumer->Wait(*event).ok());
    ASSERT_TRUE(consumer->EnqueueHost([&] {
      seen = value.load();
      return absl::OkStatus();
    }).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    release.Notify();
    ASSERT_TRUE(consumer->Synchronize().ok());
    EXPECT_EQ(seen, round + 1);
    EXPECT_TRUE(*event->Query());
  }
}

TEST(CpuDeviceTest, WaitUsesTheMostRecentRecord) {
  auto device = MakeDevice();
  auto a = *device->CreateStream("a");
  auto b = *device->CreateStream("b");
  auto event = *device->CreateEvent();
  // Waiting on a never-recorded event does not block.
  ASSERT_TRUE(b->Wait(*event).ok());
  ASSERT_TRUE(b->Synchronize().ok());
  EXPECT_TRUE(*event->Query());

  Notification first, second;
  std::atomic<int> stage{0};
  ASSERT_TRUE(a->EnqueueHost([&] { first.WaitForNotification(); stage = 1; return absl::OkStatus(); }).ok());
  ASSERT_TRUE(a->Record(*event).ok());
  ASSERT_TRUE(a->EnqueueHost([&] { second.WaitForNotification(); stage = 2; return absl::OkStatus(); }).ok());
  ASSERT_TRUE(a->Record(*event).ok());  // re-recorded: now covers stage 2
  int seen = 0;
  ASSERT_TRUE(b->Wait(*event).ok());
  ASSERT_TRUE(b->EnqueueHost([&] { seen = stage.load(); return absl::OkStatus(); }).ok());
  first.Notify();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  second.Notify();
  ASSERT_TRUE(b->Synchronize().ok());
  EXPECT_EQ(seen, 2);
  ASSERT_TRUE(event->Synchronize().ok());
}

TEST(CpuDeviceTest, CopiesAndMemsetRunOnTheStream) {
  auto device = MakeDevice();
  Stream& s = device->compute_stream();
  auto host = *device->AllocatePinnedHost(4096, MemoryTag::kStaging);
  auto dev = *device->Allocate(4096, MemoryTag::kParams16);
  auto back = *device->AllocatePinnedHost(4096, MemoryTag::kStaging);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(host.data()) % kCpuDeviceAlignment, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(dev.data()) % kCpuDeviceAlignment, 0u);
  for (int i = 0; i < 1024; ++i) host.as<float>()[i] = static_cast<float>(i) * 0.5f;
  ASSERT_TRUE(s.Copy(dev.data(), host.data(), 4096).ok());
  ASSERT_TRUE(s.Memset(back.data(), 0xFF, 4096).ok());
  ASSERT_TRUE(s.Copy(back.data(), dev.data(), 2048).ok());  // first half only
  ASSERT_TRUE(s.Synchronize().ok());
  EXPECT_EQ(std::memcmp(back.data(), host.data(), 2048), 0);
  EXPECT_EQ(back.as<uint32_t>()[600], 0xFFFFFFFFu);
  EXPECT_EQ(s.Copy(nullptr, host.data(), 4).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuDeviceTest, AllocationPastBudgetNamesTagRequestAndUsage) {
  auto device = MakeDevice(1 << 20);
  auto params = device->Allocate(768 << 10, MemoryTag::kParams16);
  ASSERT_TRUE(params.ok());
  const MemorySnapshot before = device->memory().account().Snapshot();
  auto too_big = device->Allocate(512 << 10, MemoryTag::kActivations);
  ASSERT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string m(too_big.status().message());
  EXPECT_NE(m.find("cpu:0 device memory"), std::string::npos) << m;
  EXPECT_NE(m.find("activations request of 512.00 KiB"), std::string::npos) << m;
  EXPECT_NE(m.find("in use 768.00 KiB: params16 768.00 KiB"), std::string::npos) << m;
  const MemorySnapshot after = device->memory().account().Snapshot();
  EXPECT_EQ(after.current, before.current);
  EXPECT_EQ(after.peak, before.peak);
  EXPECT_EQ(after.total_peak, before.total_peak);
  // Pinned host memory is a separate account, unaffected by the device budget.
  EXPECT_TRUE(device->AllocatePinnedHost(2 << 20, MemoryTag::kStaging).ok());
}

TEST(CpuDeviceTest, BuffersReturnMemoryAndAccountingOnDestruction) {
  auto device = MakeDevice();
  MemoryAccount& account = device->memory().account();
  {
    auto a = *device->Allocate(1000, MemoryTag::kMasterParams);
    auto b = *device->Allocate(3000, MemoryTag::kOptimizerStates);
    EXPECT_EQ(account.current(MemoryTag::kMasterParams), 1000u);
    EXPECT_EQ(account.current(MemoryTag::kOptimizerStates), 3000u);
    Buffer moved = std::move(a);
    EXPECT_TRUE(a.empty());
    EXPECT_EQ(account.total_current(), 4000u);
    moved.Reset();
    EXPECT_EQ(account.current(MemoryTag::kMasterParams), 0u);
  }
  EXPECT_EQ(account.total_current(), 0u);
  EXPECT_EQ(account.total_peak(), 4000u);
  auto empty = *device->Allocate(0, MemoryTag::kGrads);
  EXPECT_TRUE(empty.empty());
  EXPECT_EQ(account.total_current(), 0u);
}

// Each allocator counts the time its allocations took, apart; a request
// refused by the budget takes none.
TEST(CpuDeviceTest, EachAllocatorCountsTheSecondsItsAllocationsTook) {
  CpuDeviceOptions options;
  options.pinned_budget_bytes = size_t{128} << 20;
  auto device = *CreateCpuDevice(options);
  Allocator& pinned = device->pinned_host();
  EXPECT_EQ(pinned.allocate_seconds(), 0.0);
  EXPECT_EQ(device->memory().allocate_seconds(), 0.0);
  const auto start = std::chrono::steady_clock::now();
  auto a = *device->AllocatePinnedHost(size_t{64} << 20, MemoryTag::kStaging);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double counted = pinned.allocate_seconds();
  EXPECT_GT(counted, 0.0);
  EXPECT_LE(counted, took);
  EXPECT_EQ(device->memory().allocate_seconds(), 0.0);
  EXPECT_FALSE(device->AllocatePinnedHost(size_t{128} << 20, MemoryTag::kStaging).ok());  // past the budget
  EXPECT_EQ(pinned.allocate_seconds(), counted);
}

// The VmFlags of the mapping that holds `address` in /proc/self/smaps
// ("rd wr mr mw me ac hg ..."), or "" when no mapping holds it.
std::string VmFlagsAt(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(address);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR, &begin, &end) == 2) {  // a mapping's first line
      inside = begin <= at && at < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

// Device and pinned buffers of 2 MiB and more ask for transparent huge
// pages ("hg" in the mapping's flags) over their 2 MiB-aligned part, as the
// CUDA pinned allocator's do: a state store's first touch faults in 2 MiB
// pages, not 4 KiB ones. Needs a kernel built with huge pages.
TEST(CpuDeviceTest, LargeBuffersAskForTransparentHugePages) {
  if (!std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled")) {
    GTEST_SKIP() << "this kernel has no transparent huge pages";
  }
  auto device = MakeDevice();
  constexpr size_t kHuge = size_t{2} << 20;
  for (int pinned = 0; pinned < 2; ++pinned) {
    auto buffer = pinned ? *device->AllocatePinnedHost(4 * kHuge, MemoryTag::kStaging)
                         : *device->Allocate(4 * kHuge, MemoryTag::kOptimizerStates);
    const auto aligned = (reinterpret_cast<uintptr_t>(buffer.data()) + kHuge - 1) / kHuge * kHuge;
    const std::string flags = VmFlagsAt(reinterpret_cast<void*>(aligned));
    ASSERT_FALSE(flags.empty()) << "no mapping holds the buffer in /proc/self/smaps";
    EXPECT_NE((flags + " ").find(" hg "), std::string::npos) << (pinned ? "pinned: " : "device: ") << flags;
  }
}

TEST(CpuDeviceTest, StreamOrderedFreeWaitsForQueuedWork) {
  auto device = MakeDevice();
  auto stream = *device->CreateStream("s");
  MemoryAccount& account = device->memory().account();
  Notification release;
  auto buffer = *device->Allocate(8192, MemoryTag::kActivations, stream.get());
  float* data = buffer.as<float>();
  ASSERT_TRUE(stream->EnqueueHost([&] {
    release.WaitForNotification();
    data[0] = 1.0f;  // still valid: the free is queued behind this task
    return absl::OkStatus();
  }).ok());
  buffer.Reset();
  // Accounting follows program order; the memory itself stays valid until
  // the stream reaches the free (the task above writes to it after Reset).
  EXPECT_EQ(account.current(MemoryTag::kActivations), 0u);
  EXPECT_EQ(account.peak(MemoryTag::kActivations), 8192u);
  release.Notify();
  ASSERT_TRUE(stream->Synchronize().ok());
}

// Freed memory stays in the device's pool (runtime/block_pool.h) and is
// taken back by the next allocation of its size, but only once the stream
// that frees it has reached the free: until then it is still in use.
TEST(CpuDeviceTest, AFreedBlockIsReusedOnlyAfterItsStreamReachesTheFree) {
  auto device = MakeDevice();
  auto stream = *device->CreateStream("s");
  constexpr size_t kBytes = size_t{1} << 20;
  Notification release;
  auto first = *device->Allocate(kBytes, MemoryTag::kCommBuffers, stream.get());
  char* const first_data = first.as<char>();
  ASSERT_TRUE(stream->EnqueueHost([&] {
    release.WaitForNotification();
    std::memset(first_data, 1, kBytes);  // still this buffer's: its free is queued behind
    return absl::OkStatus();
  }).ok());
  first.Reset();
  auto second = *device->Allocate(kBytes, MemoryTag::kCommBuffers);
  EXPECT_NE(second.as<char>(), first_data) << "memory reused before its stream reached the free";
  char* const second_data = second.as<char>();
  std::memset(second_data, 2, kBytes);
  release.Notify();
  ASSERT_TRUE(stream->Synchronize().ok());
  second.Reset();
  // Both blocks are free now; two allocations of the size take both back.
  auto a = *device->Allocate(kBytes, MemoryTag::kCommBuffers);
  auto b = *device->Allocate(kBytes, MemoryTag::kCommBuffers);
  EXPECT_TRUE((a.as<char>() == first_data && b.as<char>() == second_data) ||
              (a.as<char>() == second_data && b.as<char>() == first_data));
  EXPECT_EQ(device->memory().account().total_current(), 2 * kBytes);
}

TEST(CpuDeviceTest, FailedWorkIsStickyButEventsStillComplete) {
  auto device = MakeDevice();
  auto failing = *device->CreateStream("failing");
  auto other = *device->CreateStream("other");
  auto event = *device->CreateEvent();
  bool later_ran = false;
  ASSERT_TRUE(failing->EnqueueHost([] { return absl::DataLossError("bad bytes"); }).ok());
  ASSERT_TRUE(failing->EnqueueHost([&] { later_ran = true; return absl::OkStatus(); }).ok());
  ASSERT_TRUE(failing->Record(*event).ok());
  ASSERT_TRUE(other->Wait(*event).ok());
  ASSERT_TRUE(other->Synchronize().ok());  // does not hang
  const absl::Status s = failing->Synchronize();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("stream 'failing'"), std::string::npos) << s;
  EXPECT_FALSE(later_ran);
  EXPECT_EQ(device->Synchronize().code(), absl::StatusCode::kDataLoss);
}

TEST(CpuDeviceTest, AFailedEnqueueIsStickyLikeFailedWork) {
  auto device = MakeDevice();
  auto stream = *device->CreateStream("zones");
  bool later_ran = false;
  stream->Fail(absl::OkStatus());  // no error: nothing changes
  ASSERT_TRUE(stream->Synchronize().ok());
  stream->Fail(absl::ResourceExhaustedError("no room for the end stamp"));
  stream->Fail(absl::InternalError("a second failure does not replace the first"));
  ASSERT_TRUE(stream->EnqueueHost([&] { later_ran = true; return absl::OkStatus(); }).ok());
  const absl::Status s = stream->Synchronize();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("stream 'zones'"), std::string::npos) << s;
  EXPECT_FALSE(later_ran);
}

TEST(CpuDeviceTest, RejectsStreamOfAnotherDevice) {
  auto a = MakeDevice();
  auto b = MakeDevice();
  auto status = a->Allocate(64, MemoryTag::kOther, &b->compute_stream()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
}

TEST(TensorTest, ViewsBuffers) {
  auto device = MakeDevice();
  auto buffer = *device->Allocate(24 * 2, MemoryTag::kParams16);
  Tensor t(buffer.data(), DType::kBF16, {2, 3, 4}, device.get());
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.bytes(), 48u);
  EXPECT_TRUE(t.on_host());
  EXPECT_EQ(t.Slice(4, 8).data(), static_cast<char*>(buffer.data()) + 8);
  EXPECT_EQ(t.DebugString(), "bf16[2, 3, 4] on cpu:0");
  EXPECT_EQ(Tensor::OfBuffer(buffer, DType::kF32, device.get()).numel(), 12);
}

}  // namespace
}  // namespace memwall
