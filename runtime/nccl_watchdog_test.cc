// NCCL with real ranks, a GPU each: a rank that goes its own way costs
// every rank a Status, not a hang ([Note: aborting a hung communicator] in
// runtime/stream_watchdog.h). The ranks but the last issue an all-reduce
// the last one does not: their watchdogs abort after the timeout. The last
// then issues it too, with no one left to meet: its watchdog aborts as
// well. NCCL cannot put two ranks on one GPU, so this skips, saying so,
// where fewer GPUs than ranks are visible.
#include <stdlib.h>

#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "runtime/best_device.h"
#include "runtime/communicator.h"
#include "runtime/cuda_device.h"
#include "runtime/launch.h"

namespace memwall {
namespace {

constexpr int kTimeoutSeconds = 3;

TEST(NcclWatchdog, AHungCollectiveIsAStatusOnEveryRank) {
  std::string reason;
  const int gpus = CudaDeviceCount(&reason);
  const LaunchInfo& launch = CurrentLaunch();
  if (gpus < launch.world_size || launch.world_size < 2) {
    GTEST_SKIP() << "needs 2 or more ranks with a GPU each (NCCL cannot share one): " << launch.world_size
                 << " ranks, " << gpus << " GPUs" << (gpus == 0 ? ": " + reason : "");
  }
  ASSERT_EQ(setenv("MEMWALL_COLLECTIVE_TIMEOUT_S", std::to_string(kTimeoutSeconds).c_str(), 1), 0);
  auto device = CreateDeviceForRank("cuda", launch);
  ASSERT_TRUE(device.ok()) << device.status();
  auto comm = CreateCommunicator(**device, CommBackend::kNccl);
  ASSERT_TRUE(comm.ok()) << comm.status();
  Stream& s = (*device)->compute_stream();
  const size_t n = 1 << 20;
  auto buffer = (*device)->Allocate(n * sizeof(float), MemoryTag::kCommBuffers);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  const Tensor t = Tensor::Flat(buffer->data(), DType::kF32, n, device->get());
  ASSERT_TRUE(s.Memset(t.data(), 0, t.bytes()).ok());
  // Every rank meets once: the communicator works.
  ASSERT_TRUE((*comm)->AllReduce(t, t, ReduceOp::kSum, s).ok());
  ASSERT_TRUE(s.Synchronize().ok());

  const bool last = (*comm)->rank() == (*comm)->world_size() - 1;
  if (last) std::this_thread::sleep_for(std::chrono::seconds(2 * kTimeoutSeconds));
  const auto start = std::chrono::steady_clock::now();
  // The last rank's watchdog may have tripped already, on NCCL's report that
  // its peers are gone: then the all-reduce itself returns the Status.
  absl::Status got = (*comm)->AllReduce(t, t, ReduceOp::kSum, s);
  if (got.ok()) got = s.Synchronize();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(got.ok()) << "rank " << (*comm)->rank() << " returned from a collective no one else joined";
  // The waiting ranks time out; the last may instead hear from NCCL that
  // its peers are gone (an asynchronous error): a Status either way.
  if (!last) {
    EXPECT_EQ(got.code(), absl::StatusCode::kDeadlineExceeded) << got;
    EXPECT_NE(got.message().find("NCCL AllReduce"), std::string::npos) << got;
  } else {
    EXPECT_TRUE(got.code() == absl::StatusCode::kDeadlineExceeded || got.code() == absl::StatusCode::kUnavailable)
        << got;
  }
  EXPECT_NE(got.message().find("aborted its communicator"), std::string::npos) << got;
  EXPECT_LT(waited, 10.0 * kTimeoutSeconds) << got;
  // The aborted communicator refuses later collectives at once.
  const absl::Status again = (*comm)->AllReduce(t, t, ReduceOp::kSum, s);
  EXPECT_EQ(again.code(), got.code()) << again;
}

}  // namespace
}  // namespace memwall
