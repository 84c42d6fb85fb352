// The watchdog that aborts a hung communicator ([Note: aborting a hung
// communicator]), on the CpuDevice: a "collective" is host work on a
// stream that returns only once the abort (or the test) releases it, as a
// NCCL kernel spins until ncclCommAbort.
#include "runtime/stream_watchdog.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "gtest/gtest.h"
#include "runtime/cpu_device.h"

namespace memwall {
namespace {

using std::chrono::milliseconds;

// A collective that spins until Release(), as a kernel waits for a rank
// that never comes.
class Hang {
 public:
  absl::Status Enqueue(Stream& stream) {
    return stream.EnqueueHost([this]() -> absl::Status {
      std::unique_lock<std::mutex> lock(mu_);
      // Bounded, so a broken watchdog fails the test instead of hanging it.
      cv_.wait_for(lock, std::chrono::seconds(20), [this] { return released_; });
      return absl::OkStatus();
    });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
};

TEST(StreamWatchdogTest, CollectivesThatFinishNeverTrip) {
  auto device = *CreateCpuDevice();
  std::atomic<int> aborts{0};
  // A deadline no stream thread misses for its scheduling alone on a loaded
  // machine, and twenty of its polls (every deadline / 8) after the work.
  StreamWatchdog watchdog(*device, "NCCL", 0, milliseconds(500), [&] { ++aborts; });
  Stream& s = device->compute_stream();
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(s.EnqueueHost([] { return absl::OkStatus(); }).ok());
    ASSERT_TRUE(watchdog.Watch("AllReduce", s).ok());
  }
  ASSERT_TRUE(s.Synchronize().ok());
  std::this_thread::sleep_for(milliseconds(1250));
  EXPECT_TRUE(watchdog.status().ok()) << watchdog.status();
  EXPECT_EQ(aborts.load(), 0);
}

TEST(StreamWatchdogTest, AHungCollectiveAbortsOnceAndFailsEveryStreamWaiting) {
  auto device = *CreateCpuDevice();
  auto other = *device->CreateStream("gather");
  Stream& coll = device->compute_stream();
  Hang hang;
  std::atomic<int> aborts{0};
  // The finished Broadcast must not trip first: a deadline as above.
  StreamWatchdog watchdog(*device, "NCCL", 3, milliseconds(500), [&] {
    ++aborts;
    hang.Release();  // ncclCommAbort ends the spinning kernels
  });
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(coll.EnqueueHost([] { return absl::OkStatus(); }).ok());
  ASSERT_TRUE(watchdog.Watch("Broadcast", coll).ok());  // finishes
  ASSERT_TRUE(hang.Enqueue(coll).ok());
  ASSERT_TRUE(watchdog.Watch("AllReduce", coll).ok());
  ASSERT_TRUE(hang.Enqueue(*other).ok());
  ASSERT_TRUE(watchdog.Watch("AllGather", *other).ok());

  const absl::Status got = coll.Synchronize();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(got.code(), absl::StatusCode::kDeadlineExceeded) << got;
  EXPECT_NE(got.message().find("NCCL AllReduce (collective 2 of this communicator) on stream 'compute'"),
            std::string::npos) << got;
  EXPECT_NE(got.message().find("MEMWALL_COLLECTIVE_TIMEOUT_S = 0.5"), std::string::npos) << got;
  EXPECT_NE(got.message().find("rank 3 aborted its communicator"), std::string::npos) << got;
  EXPECT_GE(waited, 0.5);
  EXPECT_LT(waited, 10.0) << "the hang would have lasted 20 s";
  EXPECT_EQ(other->Synchronize().code(), absl::StatusCode::kDeadlineExceeded) << "every stream waiting fails";
  EXPECT_EQ(aborts.load(), 1);
  // Later collectives get the same Status at once; the abort is not repeated.
  EXPECT_EQ(watchdog.Watch("AllReduce", coll).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(watchdog.status().code(), absl::StatusCode::kDeadlineExceeded);
  std::this_thread::sleep_for(milliseconds(750));
  EXPECT_EQ(aborts.load(), 1);
}

TEST(StreamWatchdogTest, AnAsynchronousErrorTripsWithoutATimeout) {
  auto device = *CreateCpuDevice();
  Stream& coll = device->compute_stream();
  Hang hang;
  std::atomic<bool> peer_failed{false};
  StreamWatchdog watchdog(
      *device, "NCCL", 0, milliseconds(0), [&] { hang.Release(); },
      [&]() -> absl::Status {
        if (!peer_failed) return absl::OkStatus();
        return absl::UnavailableError("ncclRemoteError: a remote peer failed");
      });
  ASSERT_TRUE(hang.Enqueue(coll).ok());
  ASSERT_TRUE(watchdog.Watch("ReduceScatter", coll).ok());
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_TRUE(watchdog.status().ok()) << "no deadline: a slow collective is not a failure";
  peer_failed = true;
  const absl::Status got = coll.Synchronize();
  EXPECT_EQ(got.code(), absl::StatusCode::kUnavailable) << got;
  EXPECT_NE(got.message().find("a remote peer failed"), std::string::npos) << got;
  EXPECT_NE(got.message().find("NCCL reports an asynchronous error"), std::string::npos) << got;
}

}  // namespace
}  // namespace memwall
