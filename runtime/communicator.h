// Collectives across data-parallel ranks, ordered on a stream.
//
// Backends:
//   single process  world size 1; collectives are copies
//   OpenMPI         host memory (the CpuDevice, pinned host buffers); used by
//                   CI and every multi-rank CPU test
//   NCCL            CUDA device memory; the unique id is broadcast over MPI
//                   when MPI runs the job, over TCP (MASTER_ADDR:MASTER_PORT)
//                   otherwise
//   TCP             host memory, through rank 0 at MASTER_ADDR:MASTER_PORT:
//                   CpuDevice jobs started by a torchrun-style launcher
//                   (runtime/tcp_communicator.cc)
//   host-staged     MPI or TCP over device memory, through pinned host
//                   buffers: ranks that share a GPU ([Note: host staging])
// Rank and world size come from the launcher (runtime/launch.h).
//
// [Note: block distribution]
// Element counts need not divide by the world size. ReduceScatter and
// AllGather split n elements into world_size contiguous blocks, the first
// n % W of them one element longer (BlockShard). The ZeRO engine pads its
// flat buffers so every block is equal; the collectives do not require it.
//
// [Note: 16-bit reductions]
// fp16/bf16 sums are accumulated in fp32 and rounded once at the end by the
// MPI backend (so |error| <= 2^-8 |sum| for bf16, 2^-11 for fp16, plus fp32
// accumulation error); NCCL rounds at every step of its ring or tree, so its
// error is bounded by (W - 1) * 2^-8 * sum|x_r| for bf16. Tests state which.
//
// [Note: host staging]
// NCCL needs a GPU of its own for every rank, so ranks that share one GPU
// (--share_gpus; the GPU machines we test on have one) reach each other
// through host memory instead: each collective copies its operands from the
// device into a pinned staging buffer, runs the MPI (or TCP) collective
// there and copies the result back, all in the stream's order, in chunks
// of at most CommOptions::staging_bytes. A reduce-scatter or all-gather
// chunk takes the elements [j, j + k) of every rank's block, so each chunk
// is itself a block-distributed collective (see [Note: block distribution]).
// Each stream that issues collectives gets one staging buffer of
// staging_bytes, pinned host memory tagged kCommBuffers, kept until the
// communicator is destroyed. Reductions round as the host backend does.
//
// [Note: bounded host collectives]
// The host backends (MPI, TCP) run a collective as calls of at most 4 Mi
// elements a rank (kHostCallElements): an all-reduce or reduce takes
// elements [j, j + k) at a time; MPI's reduce-scatter takes [j, j + k) of
// every rank's block (itself block-distributed), TCP's reduces [j, j + k)
// of the whole on rank 0 and sends each rank its part. What a call
// allocates (16-bit values widened to fp32, rank 0's sums, OpenMPI's own
// ring buffers, each the size of the message) is so bounded by the chunk,
// not by the model: stages 0 and 1 reduce the whole gradient in one
// collective, where whole-size temporaries took 6 to 12 bytes a parameter
// that no plan counts. Each chunk is reduced on its own: the same sums,
// across ranks in the order the backend picks for that chunk.
#ifndef MEMWALL_RUNTIME_COMMUNICATOR_H_
#define MEMWALL_RUNTIME_COMMUNICATOR_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/device.h"
#include "runtime/tensor.h"

namespace memwall {

enum class ReduceOp { kSum, kMax };

// The rank's block of n elements: see [Note: block distribution].
struct ShardRange {
  size_t offset = 0;
  size_t size = 0;
};
ShardRange BlockShard(size_t n, int world_size, int rank);

enum class CommBackend { kAuto, kSingleProcess, kMpi, kNccl, kTcp };
absl::string_view CommBackendName(CommBackend backend);
// "auto", "mpi", "nccl", "tcp" (a command line's choice); anything else is
// InvalidArgument listing them.
absl::StatusOr<CommBackend> ParseCommBackend(absl::string_view name);

// Collectives are enqueued on the given stream and run later: the
// communicator and the tensors' memory must outlive that work (synchronize
// the stream before destroying either). Every rank must issue the same
// collectives in the same order.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual CommBackend backend() const = 0;
  // Whether device memory goes through pinned host staging buffers
  // ([Note: host staging]).
  virtual bool host_staged() const { return false; }
  // "mpi", "nccl", "mpi, host-staged".
  std::string Describe() const;

  // recv = op over ranks of send. send and recv have the same dtype and
  // element count; send == recv (in place) is allowed.
  absl::Status AllReduce(const Tensor& send, const Tensor& recv, ReduceOp op, Stream& stream);
  // send holds n elements on every rank; recv holds BlockShard(n, W, rank)
  // elements and receives op over ranks of that block. recv may be send's
  // own block (in place: ZeRO-Infinity reduces a bucket's parameter so).
  absl::Status ReduceScatter(const Tensor& send, const Tensor& recv, ReduceOp op,
                             Stream& stream);
  // recv holds n elements; send holds this rank's BlockShard(n, W, rank)
  // block. Afterwards recv[block r] = send of rank r on every rank. send may
  // be recv's own block (in place).
  absl::Status AllGather(const Tensor& send, const Tensor& recv, Stream& stream);
  // recv on `root` = op over ranks of send (n elements each); recv is only
  // written on root (other ranks may pass send again). send == recv is
  // allowed: ZeRO reduces a gradient bucket's piece to its owner in place.
  absl::Status Reduce(const Tensor& send, const Tensor& recv, ReduceOp op, int root,
                      Stream& stream);
  // Every rank's `buffer` receives root's.
  absl::Status Broadcast(const Tensor& buffer, int root, Stream& stream);
  // Work submitted to `stream` after the barrier runs only once every rank
  // has reached it.
  absl::Status Barrier(Stream& stream);

 protected:
  // Called with validated arguments.
  virtual absl::Status DoAllReduce(const Tensor& send, const Tensor& recv, ReduceOp op,
                                   Stream& stream) = 0;
  virtual absl::Status DoReduceScatter(const Tensor& send, const Tensor& recv, ReduceOp op,
                                       Stream& stream) = 0;
  virtual absl::Status DoAllGather(const Tensor& send, const Tensor& recv, Stream& stream) = 0;
  virtual absl::Status DoReduce(const Tensor& send, const Tensor& recv, ReduceOp op, int root,
                                Stream& stream) = 0;
  virtual absl::Status DoBroadcast(const Tensor& buffer, int root, Stream& stream) = 0;
  virtual absl::Status DoBarrier(Stream& stream) = 0;
  // Whether this backend can read and write `t`'s memory.
  virtual absl::Status CheckMemory(const Tensor& t, absl::string_view what) const = 0;

 private:
  // Same dtype, data present, memory this backend can reach.
  absl::Status CheckPair(const Tensor& send, const Tensor& recv, absl::string_view op) const;
};

// A dead or stuck rank: a collective of the MPI backend that waits longer
// than MEMWALL_COLLECTIVE_TIMEOUT_S (default 600 s) ends its process with
// exit code 75 and a line naming the collective (collective_watchdog.h), so
// a job never hangs in one; mpirun then ends the others.
//
// Default size of a stream's staging buffer ([Note: host staging]).
inline constexpr size_t kDefaultStagingBytes = size_t{32} << 20;
// Smallest staging buffer accepted: a page, and room for one fp32 element
// of every rank's block plus this rank's.
size_t MinStagingBytes(int world_size);

struct CommOptions {
  // kAuto: a single process when the launch has one rank; otherwise for a
  // CUDA device NCCL, or MPI (TCP under a torchrun-style launch) with host
  // staging when ranks_share_device; for the CpuDevice MPI under mpirun or
  // srun and TCP under a torchrun-style launch.
  CommBackend backend = CommBackend::kAuto;
  // Several ranks of this node compute on one GPU: NCCL cannot serve them.
  bool ranks_share_device = false;
  // Stage through pinned host memory even where the backend could read the
  // device's memory (tests the staging on the CpuDevice).
  bool force_host_staging = false;
  size_t staging_bytes = kDefaultStagingBytes;
};

// The options a launcher's switches give (//:train's --comm_backend and
// --share_gpus, memwall.Trainer's comm_backend and share_gpus): `backend`,
// and host staging when ranks share a GPU (share_gpus on a CUDA device;
// on the CpuDevice every rank has its own memory and sharing changes
// nothing).
CommOptions LaunchCommOptions(CommBackend backend, bool share_gpus, const Device& device);

// The communicator `options` ask for. MPI or TCP on a CUDA device stage
// through host memory. Requesting a backend that was not built in, NCCL for
// ranks that share a device, or a staging buffer under MinStagingBytes is an
// error. The world size MPI reports must match the launcher's (else
// InvalidArgument).
absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(Device& device,
                                                                  const CommOptions& options);
absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(
    Device& device, CommBackend backend = CommBackend::kAuto);

// A world of this process alone, whatever the launcher started: for a
// 1-rank reference computed inside a multi-rank job (tests, repro).
std::unique_ptr<Communicator> CreateSingleProcessCommunicator();

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_COMMUNICATOR_H_
