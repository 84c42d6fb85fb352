#include "runtime/communicator.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "runtime/communicator_internal.h"
#include "runtime/launch.h"
#include "runtime/status.h"

namespace memwall {

ShardRange BlockShard(size_t n, int world_size, int rank) {
  const size_t w = static_cast<size_t>(world_size);
  const size_t r = static_cast<size_t>(rank);
  const size_t base = n / w;
  const size_t extra = n % w;
  return {r * base + std::min(r, extra), base + (r < extra ? 1 : 0)};
}

absl::string_view CommBackendName(CommBackend backend) {
  switch (backend) {
    case CommBackend::kAuto:
      return "auto";
    case CommBackend::kSingleProcess:
      return "single process";
    case CommBackend::kMpi:
      return "mpi";
    case CommBackend::kNccl:
      return "nccl";
    case CommBackend::kTcp:
      return "tcp";
  }
  return "unknown";
}

absl::StatusOr<CommBackend> ParseCommBackend(absl::string_view name) {
  constexpr CommBackend kChoices[] = {CommBackend::kAuto, CommBackend::kMpi, CommBackend::kNccl,
                                      CommBackend::kTcp};
  std::string names;
  for (CommBackend b : kChoices) {
    if (name == CommBackendName(b)) return b;
    absl::StrAppend(&names, names.empty() ? "" : ", ", CommBackendName(b));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("communication backend '", name, "' is not one of ", names));
}

namespace {

absl::Status SameDType(const Tensor& a, const Tensor& b, absl::string_view op) {
  if (a.dtype() == b.dtype()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": send is ", DTypeName(a.dtype()),
                                                 " but recv is ", DTypeName(b.dtype())));
}

absl::Status NotNull(const Tensor& t, absl::string_view op, absl::string_view what) {
  if (t.data() != nullptr || t.numel() == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", what, " has no data"));
}

}  // namespace

absl::Status Communicator::CheckPair(const Tensor& send, const Tensor& recv,
                                     absl::string_view op) const {
  MEMWALL_RETURN_IF_ERROR(SameDType(send, recv, op));
  MEMWALL_RETURN_IF_ERROR(NotNull(send, op, "send"));
  MEMWALL_RETURN_IF_ERROR(NotNull(recv, op, "recv"));
  MEMWALL_RETURN_IF_ERROR(CheckMemory(send, absl::StrCat(op, " send")));
  return CheckMemory(recv, absl::StrCat(op, " recv"));
}

absl::Status Communicator::AllReduce(const Tensor& send, const Tensor& recv, ReduceOp op,
                                     Stream& stream) {
  if (send.numel() != recv.numel()) {
    return absl::InvalidArgumentError(absl::StrCat("AllReduce: send has ", send.numel(),
                                                   " elements but recv has ", recv.numel()));
  }
  MEMWALL_RETURN_IF_ERROR(CheckPair(send, recv, "AllReduce"));
  if (send.numel() == 0) return absl::OkStatus();
  return DoAllReduce(send, recv, op, stream);
}

absl::Status Communicator::ReduceScatter(const Tensor& send, const Tensor& recv, ReduceOp op,
                                         Stream& stream) {
  const ShardRange block = BlockShard(send.numel(), world_size(), rank());
  if (static_cast<size_t>(recv.numel()) != block.size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ReduceScatter: recv has ", recv.numel(), " elements but rank ", rank(), "'s block of ",
        send.numel(), " over ", world_size(), " ranks has ", block.size));
  }
  MEMWALL_RETURN_IF_ERROR(CheckPair(send, recv, "ReduceScatter"));
  if (send.numel() == 0) return absl::OkStatus();
  return DoReduceScatter(send, recv, op, stream);
}

absl::Status Communicator::AllGather(const Tensor& send, const Tensor& recv, Stream& stream) {
  const ShardRange block = BlockShard(recv.numel(), world_size(), rank());
  if (static_cast<size_t>(send.numel()) != block.size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllGather: send has ", send.numel(), " elements but rank ", rank(), "'s block of ",
        recv.numel(), " over ", world_size(), " ranks has ", block.size));
  }
  MEMWALL_RETURN_IF_ERROR(CheckPair(send, recv, "AllGather"));
  if (recv.numel() == 0) return absl::OkStatus();
  return DoAllGather(send, recv, stream);
}

absl::Status Communicator::Reduce(const Tensor& send, const Tensor& recv, ReduceOp op, int root,
                                  Stream& stream) {
  if (root < 0 || root >= world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Reduce: root ", root, " is outside [0, ", world_size(), ")"));
  }
  if (send.numel() != recv.numel()) {
    return absl::InvalidArgumentError(absl::StrCat("Reduce: send has ", send.numel(),
                                                   " elements but recv has ", recv.numel()));
  }
  MEMWALL_RETURN_IF_ERROR(CheckPair(send, recv, "Reduce"));
  if (send.numel() == 0) return absl::OkStatus();
  return DoReduce(send, recv, op, root, stream);
}

absl::Status Communicator::Broadcast(const Tensor& buffer, int root, Stream& stream) {
  if (root < 0 || root >= world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Broadcast: root ", root, " is outside [0, ", world_size(), ")"));
  }
  MEMWALL_RETURN_IF_ERROR(NotNull(buffer, "Broadcast", "buffer"));
  MEMWALL_RETURN_IF_ERROR(CheckMemory(buffer, "Broadcast buffer"));
  if (buffer.numel() == 0) return absl::OkStatus();
  return DoBroadcast(buffer, root, stream);
}

absl::Status Communicator::Barrier(Stream& stream) { return DoBarrier(stream); }

namespace {

// World size 1: every collective is the identity, so at most a copy.
class SingleProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  CommBackend backend() const override { return CommBackend::kSingleProcess; }

 protected:
  absl::Status DoAllReduce(const Tensor& send, const Tensor& recv, ReduceOp,
                           Stream& stream) override {
    return CopyIfDistinct(send, recv, stream);
  }
  absl::Status DoReduceScatter(const Tensor& send, const Tensor& recv, ReduceOp,
                               Stream& stream) override {
    return CopyIfDistinct(send, recv, stream);
  }
  absl::Status DoAllGather(const Tensor& send, const Tensor& recv, Stream& stream) override {
    return CopyIfDistinct(send, recv, stream);
  }
  absl::Status DoReduce(const Tensor& send, const Tensor& recv, ReduceOp, int,
                        Stream& stream) override {
    return CopyIfDistinct(send, recv, stream);
  }
  absl::Status DoBroadcast(const Tensor&, int, Stream&) override { return absl::OkStatus(); }
  absl::Status DoBarrier(Stream&) override { return absl::OkStatus(); }
  absl::Status CheckMemory(const Tensor&, absl::string_view) const override {
    return absl::OkStatus();
  }

 private:
  static absl::Status CopyIfDistinct(const Tensor& send, const Tensor& recv, Stream& stream) {
    if (send.data() == recv.data()) return absl::OkStatus();
    return stream.Copy(recv.data(), send.data(), recv.bytes());
  }
};

}  // namespace

size_t MinStagingBytes(int world_size) {
  return std::max<size_t>(4096, (static_cast<size_t>(world_size) + 1) * SizeOf(DType::kF32));
}

std::string Communicator::Describe() const {
  return absl::StrCat(CommBackendName(backend()), host_staged() ? ", host-staged" : "");
}

CommOptions LaunchCommOptions(CommBackend backend, bool share_gpus, const Device& device) {
  CommOptions options;
  options.backend = backend;
  options.ranks_share_device = share_gpus && device.kind() == DeviceKind::kCuda;
  return options;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(Device& device,
                                                                  const CommOptions& options) {
  MEMWALL_ASSIGN_OR_RETURN(const LaunchInfo launch,
                           DiscoverLaunch([](const char* n) { return std::getenv(n); }));
  const CommBackend host_backend =
      launch.launcher == Launcher::kTorchrun ? CommBackend::kTcp : CommBackend::kMpi;
  CommBackend backend = options.backend;
  if (backend == CommBackend::kAuto) {
    if (launch.world_size == 1) {
      backend = CommBackend::kSingleProcess;
    } else if (device.kind() == DeviceKind::kCuda && !options.ranks_share_device) {
      backend = CommBackend::kNccl;
    } else {
      backend = host_backend;
    }
  }
  if (backend == CommBackend::kNccl && options.ranks_share_device) {
    return absl::InvalidArgumentError(
        "NCCL needs a GPU of its own for every rank, but the ranks share a device: use the mpi "
        "or tcp backend (or auto), which stage device memory through pinned host buffers");
  }
  if (backend == CommBackend::kNccl && options.force_host_staging) {
    return absl::InvalidArgumentError(
        "NCCL reads device memory itself: host staging is for the mpi and tcp backends");
  }
  // The host backends read host memory only: a GPU's goes through staging.
  const bool staged = options.force_host_staging ||
                      (device.kind() != DeviceKind::kCpu && backend != CommBackend::kSingleProcess);
  if (staged && options.staging_bytes < MinStagingBytes(launch.world_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("staging_bytes ", options.staging_bytes, " is under the ",
                     MinStagingBytes(launch.world_size), " a host-staged communicator of ",
                     launch.world_size, " ranks needs"));
  }
  std::unique_ptr<Communicator> comm;
  switch (backend) {
    case CommBackend::kSingleProcess:
      if (launch.world_size != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "single-process communicator requested but ", LauncherName(launch.launcher),
            " launched ", launch.world_size, " ranks"));
      }
      comm = CreateSingleProcessCommunicator();
      break;
    case CommBackend::kMpi: {
      MEMWALL_ASSIGN_OR_RETURN(comm, comm_internal::CreateMpiCommunicator(device));
      break;
    }
    case CommBackend::kNccl:
      return comm_internal::CreateNcclCommunicator(device);
    case CommBackend::kTcp: {
      MEMWALL_ASSIGN_OR_RETURN(comm, comm_internal::CreateTcpCommunicator(device));
      break;
    }
    case CommBackend::kAuto:
      return absl::InternalError("unreachable");
  }
  if (!staged) return comm;
  return comm_internal::CreateHostStagedCommunicator(std::move(comm), device, options.staging_bytes);
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(Device& device,
                                                                  CommBackend backend) {
  CommOptions options;
  options.backend = backend;
  return CreateCommunicator(device, options);
}

std::unique_ptr<Communicator> CreateSingleProcessCommunicator() {
  return std::make_unique<SingleProcessCommunicator>();
}

}  // namespace memwall
