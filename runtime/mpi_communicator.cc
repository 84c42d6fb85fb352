// OpenMPI backend: collectives over host memory, run in stream order through
// Stream::EnqueueHost. See runtime/communicator.h.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/collective_watchdog.h"
#include "runtime/communicator.h"
#include "runtime/communicator_internal.h"
#include "runtime/launch.h"
#include "runtime/status.h"

namespace memwall::comm_internal {
namespace {

std::string MpiErrorString(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return absl::StrCat("error ", code);
  return std::string(text, len);
}

#define MEMWALL_MPI_RETURN_IF_ERROR(call)                                                \
  do {                                                                                   \
    const int memwall_mpi_rc_ = (call);                                                  \
    if (memwall_mpi_rc_ != MPI_SUCCESS) {                                                \
      return MEMWALL_ERROR(absl::StatusCode::kInternal, #call, " failed: ",              \
                           MpiErrorString(memwall_mpi_rc_));                             \
    }                                                                                    \
  } while (false)

// Finalizes MPI at process exit if memwall initialized it.
struct MpiFinalizer {
  ~MpiFinalizer() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
};

// Largest element count one MPI call may take (its counts are ints).
constexpr size_t kMaxMpiCount = size_t{1} << 30;

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  ~MpiCommunicator() override { MPI_Comm_free(&comm_); }

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  CommBackend backend() const override { return CommBackend::kMpi; }

 protected:
  absl::Status CheckMemory(const Tensor& t, absl::string_view what) const override {
    if (t.on_host()) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is ", t.DebugString(),
                     ": the MPI backend reads host memory only (CreateCommunicator stages a GPU's through "
                     "pinned host buffers)"));
  }

  absl::Status DoAllReduce(const Tensor& send, const Tensor& recv, ReduceOp op,
                           Stream& stream) override {
    return stream.EnqueueHost([this, send, recv, op]() -> absl::Status {
      const WatchedCollective watch("AllReduce", rank_);
      const size_t n = send.numel();
      const bool in_place = send.data() == recv.data();
      // See [Note: 16-bit reductions]: widen, reduce in fp32, round once.
      std::vector<float> wide(HasNativeType(send.dtype()) ? 0 : std::min(n, kHostCallElements));
      for (size_t j = 0; j < n; j += kHostCallElements) {  // see [Note: bounded host collectives]
        const size_t c = std::min(kHostCallElements, n - j);
        const Tensor in = send.Slice(j, c), out = recv.Slice(j, c);
        if (!wide.empty()) {
          MEMWALL_RETURN_IF_ERROR(Convert(in.data(), in.dtype(), wide.data(), DType::kF32, c));
          MEMWALL_MPI_RETURN_IF_ERROR(
              MPI_Allreduce(MPI_IN_PLACE, wide.data(), static_cast<int>(c), MPI_FLOAT, MpiOp(op), comm_));
          MEMWALL_RETURN_IF_ERROR(Convert(wide.data(), DType::kF32, out.data(), out.dtype(), c));
          continue;
        }
        MEMWALL_MPI_RETURN_IF_ERROR(MPI_Allreduce(in_place ? MPI_IN_PLACE : in.data(), out.data(),
                                                  static_cast<int>(c), NativeType(send.dtype()), MpiOp(op),
                                                  comm_));
      }
      return absl::OkStatus();
    });
  }

  absl::Status DoReduceScatter(const Tensor& send, const Tensor& recv, ReduceOp op,
                               Stream& stream) override {
    return stream.EnqueueHost([this, send, recv, op]() -> absl::Status {
      const WatchedCollective watch("ReduceScatter", rank_);
      const size_t n = send.numel();
      // Chunk j: elements [j, j + k) of every rank's block ([Note: bounded
      // host collectives]), copied one after another (widened to fp32 when
      // 16-bit, see [Note: 16-bit reductions]); MPI then writes this rank's
      // piece straight into recv (widened: through `reduced`). recv may be
      // this rank's block of send (ZeRO reduces a bucket in place), which
      // MPI forbids of its own buffers but not of the copy: the piece a
      // chunk writes was copied before, and no later chunk reads it.
      const size_t k = std::max<size_t>(1, kHostCallElements / size_);
      const size_t longest = BlockShard(n, size_, 0).size;
      const bool widened = !HasNativeType(send.dtype());
      const DType wire = widened ? DType::kF32 : send.dtype();
      const size_t elem = SizeOf(wire);
      std::vector<char> pieces(std::min(n, k * size_) * elem);
      std::vector<char> reduced(widened ? std::min(longest, k) * elem : 0);
      std::vector<int> counts(size_);
      for (size_t j = 0; j < longest; j += k) {
        size_t at = 0;
        for (int r = 0; r < size_; ++r) {
          const ShardRange block = BlockShard(n, size_, r);
          const size_t c = block.size > j ? std::min(k, block.size - j) : 0;
          counts[r] = static_cast<int>(c);
          if (c > 0) {
            MEMWALL_RETURN_IF_ERROR(
                Convert(send.Slice(block.offset + j, c).data(), send.dtype(), pieces.data() + at * elem, wire, c));
          }
          at += c;
        }
        const Tensor mine = recv.Slice(j, counts[rank_]);
        void* out = widened ? reduced.data() : mine.data();
        MEMWALL_MPI_RETURN_IF_ERROR(
            MPI_Reduce_scatter(pieces.data(), out, counts.data(), NativeType(wire), MpiOp(op), comm_));
        if (widened) {
          MEMWALL_RETURN_IF_ERROR(Convert(reduced.data(), wire, mine.data(), recv.dtype(), counts[rank_]));
        }
      }
      return absl::OkStatus();
    });
  }

  absl::Status DoAllGather(const Tensor& send, const Tensor& recv, Stream& stream) override {
    MEMWALL_RETURN_IF_ERROR(CheckCount(recv.numel(), "AllGather"));
    return stream.EnqueueHost([this, send, recv]() -> absl::Status {
      const WatchedCollective watch("AllGather", rank_);
      const size_t n = recv.numel();
      std::vector<int> counts(size_), displs(size_);
      for (int r = 0; r < size_; ++r) {
        const ShardRange b = BlockShard(n, size_, r);
        counts[r] = static_cast<int>(b.size);
        displs[r] = static_cast<int>(b.offset);
      }
      // No arithmetic: move 16-bit elements as uint16 and fp32 as float.
      MPI_Datatype type = HasNativeType(send.dtype()) ? NativeType(send.dtype()) : MPI_UINT16_T;
      const void* src = send.data() == recv.Slice(displs[rank_], 0).data()
                            ? MPI_IN_PLACE
                            : send.data();
      MEMWALL_MPI_RETURN_IF_ERROR(MPI_Allgatherv(src, counts[rank_], type, recv.data(),
                                                 counts.data(), displs.data(), type, comm_));
      return absl::OkStatus();
    });
  }

  absl::Status DoReduce(const Tensor& send, const Tensor& recv, ReduceOp op, int root,
                        Stream& stream) override {
    return stream.EnqueueHost([this, send, recv, op, root]() -> absl::Status {
      const WatchedCollective watch("Reduce", rank_);
      const size_t n = send.numel();
      const bool is_root = rank_ == root, in_place = send.data() == recv.data();
      // See [Note: 16-bit reductions]: widen, reduce in fp32, round once on root.
      std::vector<float> wide(HasNativeType(send.dtype()) ? 0 : std::min(n, kHostCallElements));
      for (size_t j = 0; j < n; j += kHostCallElements) {  // see [Note: bounded host collectives]
        const size_t c = std::min(kHostCallElements, n - j);
        const Tensor in = send.Slice(j, c);
        if (!wide.empty()) {
          MEMWALL_RETURN_IF_ERROR(Convert(in.data(), in.dtype(), wide.data(), DType::kF32, c));
          MEMWALL_MPI_RETURN_IF_ERROR(MPI_Reduce(is_root ? MPI_IN_PLACE : wide.data(),
                                                 is_root ? wide.data() : nullptr, static_cast<int>(c),
                                                 MPI_FLOAT, MpiOp(op), root, comm_));
          if (is_root) {
            MEMWALL_RETURN_IF_ERROR(Convert(wide.data(), DType::kF32, recv.Slice(j, c).data(), recv.dtype(), c));
          }
          continue;
        }
        const void* src = is_root && in_place ? MPI_IN_PLACE : in.data();
        MEMWALL_MPI_RETURN_IF_ERROR(MPI_Reduce(src, is_root ? recv.Slice(j, c).data() : nullptr,
                                               static_cast<int>(c), NativeType(send.dtype()), MpiOp(op),
                                               root, comm_));
      }
      return absl::OkStatus();
    });
  }

  absl::Status DoBroadcast(const Tensor& buffer, int root, Stream& stream) override {
    return stream.EnqueueHost([this, buffer, root]() -> absl::Status {
      const WatchedCollective watch("Broadcast", rank_);
      char* data = static_cast<char*>(buffer.data());
      size_t remaining = buffer.bytes();
      while (remaining > 0) {
        const size_t chunk = std::min(remaining, kMaxMpiCount);
        MEMWALL_MPI_RETURN_IF_ERROR(
            MPI_Bcast(data, static_cast<int>(chunk), MPI_BYTE, root, comm_));
        data += chunk;
        remaining -= chunk;
      }
      return absl::OkStatus();
    });
  }

  absl::Status DoBarrier(Stream& stream) override {
    return stream.EnqueueHost([this]() -> absl::Status {
      const WatchedCollective watch("Barrier", rank_);
      MEMWALL_MPI_RETURN_IF_ERROR(MPI_Barrier(comm_));
      return absl::OkStatus();
    });
  }

 private:
  static MPI_Op MpiOp(ReduceOp op) { return op == ReduceOp::kSum ? MPI_SUM : MPI_MAX; }

  absl::Status CheckCount(size_t n, absl::string_view op) const {
    if (n <= static_cast<size_t>(INT_MAX)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        op, " of ", n, " elements exceeds MPI's int counts; split it into calls of at most ",
        INT_MAX, " elements"));
  }

  // fp32 and int32 reduce as themselves; fp16/bf16 are widened to fp32 (MPI
  // has no 16-bit float types).
  static bool HasNativeType(DType dtype) { return dtype == DType::kF32 || dtype == DType::kI32; }
  static MPI_Datatype NativeType(DType dtype) {
    return dtype == DType::kI32 ? MPI_INT : MPI_FLOAT;
  }

  MPI_Comm comm_;
  const int rank_;
  const int size_;
};

}  // namespace

absl::Status EnsureMpiInitialized(int* rank, int* size) {
  static std::once_flag once;
  static absl::Status init_status;
  std::call_once(once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;
    // A rank blocked in a collective polls for its messages, and OpenMPI
    // yields the core between polls only when it counts more ranks than
    // slots. A memwall rank's own threads (its streams, the CPU Adam, swap
    // I/O) need the core it would spin on: two 2-rank test jobs sharing 2
    // cores ran 5x slower spinning than yielding, and one alone no faster.
    // A setting from the launcher (mpirun --mca mpi_yield_when_idle 0) wins.
    setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
    int provided = 0;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) {
      init_status = MEMWALL_ERROR(absl::StatusCode::kUnavailable,
                                  "MPI_Init_thread failed: ", MpiErrorString(rc));
      return;
    }
    static MpiFinalizer finalizer;
    if (provided < MPI_THREAD_MULTIPLE) {
      init_status = MEMWALL_ERROR(absl::StatusCode::kFailedPrecondition,
                                  "MPI provides thread level ", provided,
                                  " but memwall's streams need MPI_THREAD_MULTIPLE");
    }
  });
  MEMWALL_RETURN_IF_ERROR(init_status);
  MPI_Comm_rank(MPI_COMM_WORLD, rank);
  MPI_Comm_size(MPI_COMM_WORLD, size);
  return absl::OkStatus();
}

absl::Status MpiBroadcastBytes(void* data, int bytes) {
  MEMWALL_MPI_RETURN_IF_ERROR(MPI_Bcast(data, bytes, MPI_BYTE, 0, MPI_COMM_WORLD));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateMpiCommunicator(Device& device) {
  int rank = 0, size = 1;
  MEMWALL_RETURN_IF_ERROR(EnsureMpiInitialized(&rank, &size));
  MEMWALL_ASSIGN_OR_RETURN(const LaunchInfo launch,
                           DiscoverLaunch([](const char* n) { return std::getenv(n); }));
  if (launch.launcher != Launcher::kSingleProcess &&
      (launch.world_size != size || launch.rank != rank)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MPI says rank ", rank, " of ", size, " but ", LauncherName(launch.launcher),
        " launched rank ", launch.rank, " of ", launch.world_size,
        ": the world size does not match the launch"));
  }
  MPI_Comm comm;
  MEMWALL_MPI_RETURN_IF_ERROR(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  // Errors come back as codes (and become Status) instead of aborting the job.
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  return std::unique_ptr<Communicator>(std::make_unique<MpiCommunicator>(comm, rank, size));
}

}  // namespace memwall::comm_internal
