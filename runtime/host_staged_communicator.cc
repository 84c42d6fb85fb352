// A host backend's collectives on device memory, through pinned staging
// buffers in the stream's order: see [Note: host staging] in
// runtime/communicator.h.
//
// Every chunk is three steps on the caller's stream: copy the operands from
// the device into the stream's staging buffer, run the host backend's
// collective there (itself stream-ordered host work), copy the result back.
// The stream runs them in order, so one buffer per stream serves every
// chunk of every collective issued on it.
#include <algorithm>
#include <map>
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "runtime/communicator.h"
#include "runtime/communicator_internal.h"
#include "runtime/status.h"

namespace memwall::comm_internal {
namespace {

class HostStagedCommunicator final : public Communicator {
 public:
  HostStagedCommunicator(std::unique_ptr<Communicator> host, Device& device, size_t staging_bytes)
      : host_(std::move(host)), device_(device), staging_bytes_(staging_bytes) {}

  int rank() const override { return host_->rank(); }
  int world_size() const override { return host_->world_size(); }
  CommBackend backend() const override { return host_->backend(); }
  bool host_staged() const override { return true; }

 protected:
  // This device's memory or host memory; the copies reach either.
  absl::Status CheckMemory(const Tensor& t, absl::string_view what) const override {
    if (t.on_host() || t.device() == &device_) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(what, " is ", t.DebugString(),
                                                   " but this communicator stages ",
                                                   device_.name(), "'s memory"));
  }

  // Elementwise: chunk c of send → staging → collective in place → chunk c
  // of recv.
  absl::Status DoAllReduce(const Tensor& send, const Tensor& recv, ReduceOp op,
                           Stream& stream) override {
    return Elementwise(send, recv, stream, /*copy_in=*/true, /*copy_back=*/true,
                       [&](const Tensor& piece) { return host_->AllReduce(piece, piece, op, stream); });
  }

  absl::Status DoReduce(const Tensor& send, const Tensor& recv, ReduceOp op, int root,
                        Stream& stream) override {
    return Elementwise(send, recv, stream, /*copy_in=*/true, /*copy_back=*/rank() == root,
                       [&](const Tensor& piece) { return host_->Reduce(piece, piece, op, root, stream); });
  }

  // Only the root's data matters going in; everyone else's coming out.
  absl::Status DoBroadcast(const Tensor& buffer, int root, Stream& stream) override {
    return Elementwise(buffer, buffer, stream, /*copy_in=*/rank() == root, /*copy_back=*/rank() != root,
                       [&](const Tensor& piece) { return host_->Broadcast(piece, root, stream); });
  }

  // Chunk j takes elements [j, j + k) of every rank's block: the pieces of
  // all ranks, one after another, are the block distribution of their total
  // (their sizes differ by at most one, the longer first).
  absl::Status DoReduceScatter(const Tensor& send, const Tensor& recv, ReduceOp op,
                               Stream& stream) override {
    const size_t n = send.numel();
    MEMWALL_ASSIGN_OR_RETURN(const Tensor stage, Staging(stream, send.dtype()));
    const BlockChunks chunks(n, world_size(), stage.numel());
    for (size_t j = 0; j < chunks.longest_block; j += chunks.k) {
      size_t total = 0;
      for (int r = 0; r < world_size(); ++r) {
        const ShardRange block = BlockShard(n, world_size(), r);
        const size_t c = chunks.PieceOf(block, j);
        if (c == 0) continue;  // the shorter blocks' last chunk
        MEMWALL_RETURN_IF_ERROR(stream.Copy(stage.Slice(total, c).data(),
                                            send.Slice(block.offset + j, c).data(),
                                            c * SizeOf(send.dtype())));
        total += c;
      }
      const size_t mine = chunks.PieceOf(BlockShard(n, world_size(), rank()), j);
      const Tensor reduced = stage.Slice(chunks.OutputOffset(), mine);
      MEMWALL_RETURN_IF_ERROR(host_->ReduceScatter(stage.Slice(0, total), reduced, op, stream));
      if (mine == 0) continue;
      MEMWALL_RETURN_IF_ERROR(
          stream.Copy(recv.Slice(j, mine).data(), reduced.data(), reduced.bytes()));
    }
    return absl::OkStatus();
  }

  absl::Status DoAllGather(const Tensor& send, const Tensor& recv, Stream& stream) override {
    const size_t n = recv.numel();
    MEMWALL_ASSIGN_OR_RETURN(const Tensor stage, Staging(stream, recv.dtype()));
    const BlockChunks chunks(n, world_size(), stage.numel());
    for (size_t j = 0; j < chunks.longest_block; j += chunks.k) {
      const size_t mine = chunks.PieceOf(BlockShard(n, world_size(), rank()), j);
      const Tensor piece = stage.Slice(chunks.OutputOffset(), mine);
      if (mine > 0) {
        MEMWALL_RETURN_IF_ERROR(stream.Copy(piece.data(), send.Slice(j, mine).data(), piece.bytes()));
      }
      size_t total = 0;
      for (int r = 0; r < world_size(); ++r) {
        total += chunks.PieceOf(BlockShard(n, world_size(), r), j);
      }
      MEMWALL_RETURN_IF_ERROR(host_->AllGather(piece, stage.Slice(0, total), stream));
      size_t at = 0;
      for (int r = 0; r < world_size(); ++r) {
        const ShardRange block = BlockShard(n, world_size(), r);
        const size_t c = chunks.PieceOf(block, j);
        if (c == 0) continue;
        MEMWALL_RETURN_IF_ERROR(stream.Copy(recv.Slice(block.offset + j, c).data(),
                                            stage.Slice(at, c).data(), c * SizeOf(recv.dtype())));
        at += c;
      }
    }
    return absl::OkStatus();
  }

  absl::Status DoBarrier(Stream& stream) override { return host_->Barrier(stream); }

 private:
  // How a block-distributed collective of n elements is cut: k elements of
  // each block a chunk, staged as W pieces [0, W k) and this rank's result
  // [W k, (W + 1) k).
  struct BlockChunks {
    BlockChunks(size_t n, int world, size_t staged_elements)
        : world_size(static_cast<size_t>(world)),
          k(staged_elements / (world_size + 1)),
          longest_block(BlockShard(n, world, 0).size) {}
    size_t PieceOf(const ShardRange& block, size_t j) const {
      return block.size > j ? std::min(k, block.size - j) : 0;
    }
    size_t OutputOffset() const { return world_size * k; }
    size_t world_size;
    size_t k;  // >= 1: staging_bytes >= MinStagingBytes
    size_t longest_block;
  };

  // Elementwise collectives (all-reduce, reduce, broadcast): each chunk of
  // send staged where `copy_in`, `collective` on it in place, the result
  // copied to recv where `copy_back`.
  template <typename Collective>
  absl::Status Elementwise(const Tensor& send, const Tensor& recv, Stream& stream, bool copy_in,
                           bool copy_back, Collective collective) {
    MEMWALL_ASSIGN_OR_RETURN(const Tensor stage, Staging(stream, send.dtype()));
    const size_t n = send.numel(), k = stage.numel();
    for (size_t done = 0; done < n; done += k) {
      const size_t c = std::min(k, n - done);
      const Tensor piece = stage.Slice(0, c);
      if (copy_in) {
        MEMWALL_RETURN_IF_ERROR(stream.Copy(piece.data(), send.Slice(done, c).data(), piece.bytes()));
      }
      MEMWALL_RETURN_IF_ERROR(collective(piece));
      if (copy_back) {
        MEMWALL_RETURN_IF_ERROR(stream.Copy(recv.Slice(done, c).data(), piece.data(), piece.bytes()));
      }
    }
    return absl::OkStatus();
  }

  // `stream`'s staging buffer as host elements of `dtype`, allocated on its
  // first collective.
  absl::StatusOr<Tensor> Staging(Stream& stream, DType dtype) {
    std::lock_guard<std::mutex> lock(mu_);
    Buffer& buffer = staging_[&stream];
    if (buffer.empty()) {
      MEMWALL_ASSIGN_OR_RETURN(buffer, device_.pinned_host().Allocate(staging_bytes_,
                                                                     MemoryTag::kCommBuffers));
    }
    return Tensor::Flat(buffer.data(), dtype, static_cast<int64_t>(staging_bytes_ / SizeOf(dtype)));
  }

  const std::unique_ptr<Communicator> host_;
  Device& device_;
  const size_t staging_bytes_;
  std::mutex mu_;
  std::map<const Stream*, Buffer> staging_;
};

}  // namespace

std::unique_ptr<Communicator> CreateHostStagedCommunicator(std::unique_ptr<Communicator> host,
                                                           Device& device, size_t staging_bytes) {
  return std::make_unique<HostStagedCommunicator>(std::move(host), device, staging_bytes);
}

}  // namespace memwall::comm_internal
