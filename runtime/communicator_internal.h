// Backend factories behind CreateCommunicator (runtime/communicator.h).
#ifndef MEMWALL_RUNTIME_COMMUNICATOR_INTERNAL_H_
#define MEMWALL_RUNTIME_COMMUNICATOR_INTERNAL_H_

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/communicator.h"
#include "runtime/launch.h"

namespace memwall::comm_internal {

// The most elements a rank passes to one call of a host backend: see
// [Note: bounded host collectives] in runtime/communicator.h.
inline constexpr size_t kHostCallElements = size_t{1} << 22;  // 4 Mi

absl::StatusOr<std::unique_ptr<Communicator>> CreateMpiCommunicator(Device& device);
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Device& device);
// Host memory over TCP, rank 0 at the launch's MASTER_ADDR:MASTER_PORT
// (runtime/tcp_communicator.cc).
absl::StatusOr<std::unique_ptr<Communicator>> CreateTcpCommunicator(Device& device);
// `host`'s collectives on `device`'s memory through pinned staging buffers
// of `staging_bytes` (>= MinStagingBytes) each ([Note: host staging];
// runtime/host_staged_communicator.cc).
std::unique_ptr<Communicator> CreateHostStagedCommunicator(std::unique_ptr<Communicator> host,
                                                           Device& device, size_t staging_bytes);
// Broadcasts `bytes` bytes from rank 0 over a TCP rendezvous at the
// launch's MASTER_ADDR:MASTER_PORT (NCCL bootstrap without MPI).
absl::Status TcpBroadcastBytes(const LaunchInfo& launch, void* data, size_t bytes);

// Initializes MPI once per process (MPI_THREAD_MULTIPLE) and finalizes it at
// exit. Returns this process's rank and size in MPI_COMM_WORLD.
absl::Status EnsureMpiInitialized(int* rank, int* size);
// Broadcasts `bytes` bytes from rank 0 of MPI_COMM_WORLD (NCCL bootstrap).
absl::Status MpiBroadcastBytes(void* data, int bytes);

}  // namespace memwall::comm_internal

#endif  // MEMWALL_RUNTIME_COMMUNICATOR_INTERNAL_H_
