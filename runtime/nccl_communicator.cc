// NCCL backend: collectives over CUDA device memory on the stream's
// cudaStream_t. The NCCL unique id is made by rank 0 and broadcast over MPI
// when there is more than one rank. A watchdog aborts a hung communicator
// and fails its streams ([Note: aborting a hung communicator] in
// runtime/stream_watchdog.h). See runtime/communicator.h.
#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"
#include "runtime/collective_watchdog.h"
#include "runtime/communicator.h"
#include "runtime/communicator_internal.h"
#include "runtime/launch.h"
#include "runtime/status.h"
#include "runtime/stream_watchdog.h"

#if MEMWALL_HAS_CUDA && MEMWALL_HAS_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "runtime/cuda_check.h"
#endif

namespace memwall::comm_internal {

#if !(MEMWALL_HAS_CUDA && MEMWALL_HAS_NCCL)

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Device&) {
  return absl::UnavailableError("memwall was built without NCCL");
}

#else

namespace {

#define MEMWALL_NCCL_RETURN_IF_ERROR(call)                                              \
  do {                                                                                  \
    const ncclResult_t memwall_nccl_rc_ = (call);                                       \
    if (memwall_nccl_rc_ != ncclSuccess) {                                              \
      return MEMWALL_ERROR(absl::StatusCode::kInternal, #call, " failed: ",             \
                           ncclGetErrorString(memwall_nccl_rc_));                       \
    }                                                                                   \
  } while (false)

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI32:
      return ncclInt32;
  }
  return ncclFloat32;
}

ncclRedOp_t NcclOp(ReduceOp op) { return op == ReduceOp::kSum ? ncclSum : ncclMax; }

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Device& device, ncclComm_t comm, int rank, int size)
      : comm_(comm), rank_(rank), size_(size) {
    if (size == 1) return;  // nothing to wait for
    watchdog_ = std::make_unique<StreamWatchdog>(
        device, "NCCL", rank, std::chrono::seconds(CollectiveTimeoutSeconds()),
        [this] {
          ncclCommAbort(comm_);  // ends the communicator's kernels and frees it
          aborted_ = true;
        },
        [this]() -> absl::Status {
          ncclResult_t error = ncclSuccess;
          if (ncclCommGetAsyncError(comm_, &error) != ncclSuccess) return absl::OkStatus();
          if (error == ncclSuccess || error == ncclInProgress) return absl::OkStatus();
          return absl::UnavailableError(absl::StrCat(ncclGetErrorString(error), ": ", ncclGetLastError(comm_)));
        });
  }
  ~NcclCommunicator() override {
    watchdog_.reset();  // joins its thread: aborted_ is final
    if (!aborted_) ncclCommDestroy(comm_);
    if (barrier_ != nullptr) cudaFree(barrier_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  CommBackend backend() const override { return CommBackend::kNccl; }

 protected:
  absl::Status CheckMemory(const Tensor& t, absl::string_view what) const override {
    if (t.device() != nullptr && t.device()->kind() == DeviceKind::kCuda) {
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(absl::StrCat(
        what, " is ", t.DebugString(), ": the NCCL backend needs CUDA device memory"));
  }

  absl::Status DoAllReduce(const Tensor& send, const Tensor& recv, ReduceOp op,
                           Stream& stream) override {
    MEMWALL_RETURN_IF_ERROR(Usable());
    MEMWALL_NCCL_RETURN_IF_ERROR(ncclAllReduce(send.data(), recv.data(), send.numel(),
                                               NcclType(send.dtype()), NcclOp(op), comm_,
                                               Native(stream)));
    return Watch("AllReduce", stream);
  }

  absl::Status DoReduceScatter(const Tensor& send, const Tensor& recv, ReduceOp op,
                               Stream& stream) override {
    MEMWALL_RETURN_IF_ERROR(Usable());
    const size_t n = send.numel();
    if (n % size_ == 0) {
      MEMWALL_NCCL_RETURN_IF_ERROR(ncclReduceScatter(send.data(), recv.data(), n / size_,
                                                     NcclType(send.dtype()), NcclOp(op), comm_,
                                                     Native(stream)));
      return Watch("ReduceScatter", stream);
    }
    // Uneven blocks: one reduce per block to its owner, fused in a group.
    const size_t elem = SizeOf(send.dtype());
    MEMWALL_RETURN_IF_ERROR(GroupedPerBlock(n, [&](int r, const ShardRange& b) {
      return ncclReduce(static_cast<const char*>(send.data()) + b.offset * elem,
                        r == rank_ ? recv.data() : nullptr, b.size, NcclType(send.dtype()),
                        NcclOp(op), r, comm_, Native(stream));
    }));
    return Watch("ReduceScatter", stream);
  }

  absl::Status DoAllGather(const Tensor& send, const Tensor& recv, Stream& stream) override {
    MEMWALL_RETURN_IF_ERROR(Usable());
    const size_t n = recv.numel();
    if (n % size_ == 0) {
      MEMWALL_NCCL_RETURN_IF_ERROR(ncclAllGather(send.data(), recv.data(), n / size_,
                                                 NcclType(send.dtype()), comm_,
                                                 Native(stream)));
      return Watch("AllGather", stream);
    }
    // Uneven blocks: every rank broadcasts its block into place, grouped.
    const size_t elem = SizeOf(send.dtype());
    MEMWALL_RETURN_IF_ERROR(GroupedPerBlock(n, [&](int r, const ShardRange& b) {
      return ncclBroadcast(r == rank_ ? send.data() : nullptr,
                           static_cast<char*>(recv.data()) + b.offset * elem, b.size,
                           NcclType(send.dtype()), r, comm_, Native(stream));
    }));
    return Watch("AllGather", stream);
  }

  absl::Status DoReduce(const Tensor& send, const Tensor& recv, ReduceOp op, int root,
                        Stream& stream) override {
    MEMWALL_RETURN_IF_ERROR(Usable());
    MEMWALL_NCCL_RETURN_IF_ERROR(ncclReduce(send.data(), rank_ == root ? recv.data() : nullptr,
                                            send.numel(), NcclType(send.dtype()), NcclOp(op), root,
                                            comm_, Native(stream)));
    return Watch("Reduce", stream);
  }

  absl::Status DoBroadcast(const Tensor& buffer, int root, Stream& stream) override {
    MEMWALL_RETURN_IF_ERROR(Usable());
    MEMWALL_NCCL_RETURN_IF_ERROR(ncclBroadcast(buffer.data(), buffer.data(), buffer.numel(),
                                               NcclType(buffer.dtype()), root, comm_,
                                               Native(stream)));
    return Watch("Broadcast", stream);
  }

  absl::Status DoBarrier(Stream& stream) override {
    // A one-element all-reduce orders the stream after every rank's arrival.
    MEMWALL_RETURN_IF_ERROR(Usable());
    if (barrier_ == nullptr) {
      MEMWALL_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&barrier_, sizeof(float), Native(stream)));
      MEMWALL_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(barrier_, 0, sizeof(float), Native(stream)));
    }
    MEMWALL_NCCL_RETURN_IF_ERROR(
        ncclAllReduce(barrier_, barrier_, 1, ncclFloat32, ncclSum, comm_, Native(stream)));
    return Watch("Barrier", stream);
  }

 private:
  // Calls fn(r, block r) -> ncclResult_t for every non-empty block of n
  // elements inside one NCCL group (see [Note: block distribution]).
  template <typename Fn>
  absl::Status GroupedPerBlock(size_t n, Fn fn) {
    MEMWALL_NCCL_RETURN_IF_ERROR(ncclGroupStart());
    for (int r = 0; r < size_; ++r) {
      const ShardRange b = BlockShard(n, size_, r);
      if (b.size == 0) continue;
      if (const ncclResult_t rc = fn(r, b); rc != ncclSuccess) {
        ncclGroupEnd();
        MEMWALL_NCCL_RETURN_IF_ERROR(rc);
      }
    }
    MEMWALL_NCCL_RETURN_IF_ERROR(ncclGroupEnd());
    return absl::OkStatus();
  }

  // OK unless the watchdog aborted the communicator.
  absl::Status Usable() const { return watchdog_ == nullptr ? absl::OkStatus() : watchdog_->status(); }
  absl::Status Watch(absl::string_view op, Stream& stream) {
    return watchdog_ == nullptr ? absl::OkStatus() : watchdog_->Watch(op, stream);
  }

  static cudaStream_t Native(Stream& stream) {
    return static_cast<cudaStream_t>(stream.native_handle());
  }

  ncclComm_t comm_;
  const int rank_;
  const int size_;
  void* barrier_ = nullptr;  // (1,) fp32 on the device, made by the first Barrier
  bool aborted_ = false;     // set by the watchdog's thread, read after it is joined
  std::unique_ptr<StreamWatchdog> watchdog_;  // none for a world of one
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Device& device) {
  if (device.kind() != DeviceKind::kCuda) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL needs a CUDA device, not ", device.name()));
  }
  MEMWALL_ASSIGN_OR_RETURN(const LaunchInfo launch,
                           DiscoverLaunch([](const char* n) { return std::getenv(n); }));
  int rank = 0, size = 1;
  ncclUniqueId id;
  if (launch.world_size > 1 && launch.launcher == Launcher::kTorchrun) {
    // No MPI: the id travels over TCP from rank 0 at MASTER_ADDR:MASTER_PORT.
    rank = launch.rank;
    size = launch.world_size;
    if (rank == 0) MEMWALL_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
    MEMWALL_RETURN_IF_ERROR(TcpBroadcastBytes(launch, &id, sizeof(id)));
  } else if (launch.world_size > 1) {
    MEMWALL_RETURN_IF_ERROR(EnsureMpiInitialized(&rank, &size));
    if (size != launch.world_size) {
      return absl::InvalidArgumentError(absl::StrCat("MPI world size ", size, " but ",
                                                     LauncherName(launch.launcher),
                                                     " launched ", launch.world_size));
    }
    if (rank == 0) MEMWALL_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
    MEMWALL_RETURN_IF_ERROR(MpiBroadcastBytes(&id, sizeof(id)));
  } else {
    MEMWALL_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
  }
  ncclComm_t comm;
  MEMWALL_NCCL_RETURN_IF_ERROR(ncclCommInitRank(&comm, size, id, rank));
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(device, comm, rank, size));
}

#endif

}  // namespace memwall::comm_internal
