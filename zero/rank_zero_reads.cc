#include "zero/rank_zero_reads.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/agreement.h"
#include "runtime/status.h"

namespace memwall::zero {
namespace {

// A request as the Broadcast carries it: the begin as two int32 halves (Ψ
// passes 2^31), then the count (at most a chunk; -1 ends the serving).
constexpr int kRequestInts = 3;

absl::Status CheckRange(const Partition& partition, int64_t begin, int64_t n) {
  if (begin < 0 || n < 0 || begin > partition.numel() - n) {
    return absl::InvalidArgumentError(absl::StrCat("flat range [", begin, ", ", begin + n,
                                                   ") is outside the model's ", partition.numel(), " parameters"));
  }
  return absl::OkStatus();
}

// Reads this rank's elements of [begin, begin + n) into out[0, n), where
// out is laid out in flat order; elements other ranks own are untouched.
absl::Status ReadOwned(const Partition& partition, int rank, const ShardValueReader& read_shard, int64_t begin,
                       int64_t n, float* out) {
  for (const Piece& p : partition.Pieces({begin, begin + n})) {
    if (p.rank != rank || p.size == 0) continue;
    MEMWALL_RETURN_IF_ERROR(read_shard(p.shard_offset, p.size, out + (p.begin - begin)));
  }
  return absl::OkStatus();
}

class Rounds {
 public:
  Rounds(Communicator& comm, Device& device, const Partition& partition, const ShardValueReader& read_shard,
         int64_t chunk, Buffer staging)
      : comm_(comm),
        device_(device),
        partition_(partition),
        read_shard_(read_shard),
        chunk_(chunk),
        staging_(std::move(staging)),
        host_(chunk + comm.world_size()) {}

  // The request: Broadcast from rank 0 (whose `begin` and `count` are
  // sent; the others' are overwritten).
  absl::Status Request(int64_t& begin, int64_t& count) {
    int32_t request[kRequestInts] = {};
    if (comm_.rank() == 0) {
      std::memcpy(request, &begin, sizeof(begin));
      request[2] = static_cast<int32_t>(count);
    }
    Stream& s = device_.compute_stream();
    const Tensor on_device = Tensor::Flat(staging_.data(), DType::kI32, kRequestInts, &device_);
    MEMWALL_RETURN_IF_ERROR(s.Copy(on_device.data(), request, sizeof(request)));
    MEMWALL_RETURN_IF_ERROR(comm_.Broadcast(on_device, 0, s));
    MEMWALL_RETURN_IF_ERROR(s.Copy(request, on_device.data(), sizeof(request)));
    MEMWALL_RETURN_IF_ERROR(s.Synchronize());
    std::memcpy(&begin, request, sizeof(begin));
    count = request[2];
    return absl::OkStatus();
  }

  // One round for [begin, begin + count): every rank's share summed on
  // rank 0, where it lands in `out` (count floats) and `failed` lists the
  // ranks whose reads failed (each keeps its error in local()). The round
  // completes whatever a read did; its Status is the collectives'.
  absl::Status Assemble(int64_t begin, int64_t count, float* out, std::vector<int>& failed) {
    const int world = comm_.world_size();
    std::fill_n(host_.data(), count, -0.0f);
    std::fill_n(host_.data() + count, world, 0.0f);
    if (absl::Status read = ReadOwned(partition_, comm_.rank(), read_shard_, begin, count, host_.data());
        !read.ok()) {
      if (local_.ok()) local_ = read;
      host_[count + comm_.rank()] = 1.0f;
    }
    Stream& s = device_.compute_stream();
    const Tensor sum = Tensor::Flat(static_cast<char*>(staging_.data()) + kRequestInts * sizeof(int32_t),
                                    DType::kF32, count + world, &device_);
    MEMWALL_RETURN_IF_ERROR(s.Copy(sum.data(), host_.data(), sum.bytes()));
    MEMWALL_RETURN_IF_ERROR(comm_.Reduce(sum, sum, ReduceOp::kSum, 0, s));
    if (comm_.rank() != 0) return s.Synchronize();
    MEMWALL_RETURN_IF_ERROR(s.Copy(host_.data(), sum.data(), sum.bytes()));
    MEMWALL_RETURN_IF_ERROR(s.Synchronize());
    failed.clear();
    for (int r = 0; r < world; ++r) {
      if (host_[count + r] != 0.0f) failed.push_back(r);
    }
    std::memcpy(out, host_.data(), count * sizeof(float));
    return absl::OkStatus();
  }

  int64_t chunk() const { return chunk_; }
  const absl::Status& local() const { return local_; }

 private:
  Communicator& comm_;
  Device& device_;
  const Partition& partition_;
  const ShardValueReader& read_shard_;
  const int64_t chunk_;
  Buffer staging_;  // the request, then chunk_ + world floats
  std::vector<float> host_;
  absl::Status local_;  // this rank's first failed read
};

}  // namespace

absl::Status ReadOnRankZero(Communicator& comm, Device& device, const Partition& partition,
                            const ShardValueReader& read_shard,
                            const std::function<absl::Status(const models::FlatValueReader&)>& consume,
                            int64_t chunk_elements) {
  const int rank = comm.rank();
  if (partition.owners() == 1) {  // rank 0 owns everything: no collective
    if (rank != 0) return absl::OkStatus();
    return consume([&](int64_t begin, int64_t n, float* out) {
      MEMWALL_RETURN_IF_ERROR(CheckRange(partition, begin, n));
      return ReadOwned(partition, 0, read_shard, begin, n, out);
    });
  }
  if (partition.owners() != comm.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("ReadOnRankZero: a partition over ", partition.owners(),
                                                   " owners on ", comm.world_size(), " ranks"));
  }
  const int64_t chunk = std::max<int64_t>(1, chunk_elements);
  absl::StatusOr<Buffer> staging = device.Allocate(
      kRequestInts * sizeof(int32_t) + (chunk + comm.world_size()) * sizeof(float), MemoryTag::kStaging);
  MEMWALL_RETURN_IF_ERROR(
      AgreeAcrossRanks(comm, device, staging.status(), "allocating the staging for reads on rank 0"));
  Rounds rounds(comm, device, partition, read_shard, chunk, *std::move(staging));

  std::vector<int> failed;
  if (rank != 0) {  // serve until the end request
    for (;;) {
      int64_t begin = 0, count = 0;
      MEMWALL_RETURN_IF_ERROR(rounds.Request(begin, count));
      if (count < 0) return rounds.local();
      MEMWALL_RETURN_IF_ERROR(rounds.Assemble(begin, count, nullptr, failed));
    }
  }
  absl::Status communication;  // a failed collective: no more requests
  const models::FlatValueReader read = [&](int64_t begin, int64_t n, float* out) -> absl::Status {
    MEMWALL_RETURN_IF_ERROR(CheckRange(partition, begin, n));
    for (int64_t done = 0; done < n; done += rounds.chunk()) {
      int64_t at = begin + done, count = std::min(rounds.chunk(), n - done);
      if (absl::Status sent = rounds.Request(at, count); !sent.ok()) return communication = sent;
      if (absl::Status round = rounds.Assemble(at, count, out + done, failed); !round.ok()) {
        return communication = round;
      }
      if (!rounds.local().ok()) return rounds.local();  // rank 0's own read
      if (!failed.empty()) {
        return absl::DataLossError(absl::StrCat("flat range [", at, ", ", at + count, "): rank(s) ",
                                                absl::StrJoin(failed, ", "), " could not read their shard"));
      }
    }
    return absl::OkStatus();
  };
  const absl::Status consumed = consume(read);
  if (communication.ok()) {
    int64_t begin = 0, end = -1;
    const absl::Status ended = rounds.Request(begin, end);
    if (consumed.ok()) MEMWALL_RETURN_IF_ERROR(ended);
  }
  return consumed;
}

}  // namespace memwall::zero
