// Reading flat values that several ranks own, on rank 0, a range at a time:
// what a streamed export needs when the master weights are partitioned
// (stages 1-3 on more than one rank), without a Ψ-sized buffer anywhere.
//
// [Note: serving flat ranges to rank 0]
// Rank 0 runs `consume` with a models::FlatValueReader; every other rank
// serves that reader until `consume` returns. A request is one Broadcast
// from rank 0 of [begin, count] (count < 0: the end). Then every rank fills
// a chunk buffer with the elements of [begin, begin + count) that it owns
// (Partition::Pieces) and -0.0 everywhere else, plus one slot a rank, 1
// where its own read failed, and one sum Reduce to rank 0 assembles the
// range. The sum is exact: each real element has one owner, and
// x + (-0.0) == x for every float x (+0.0, -0.0 and NaN included), in any
// order. Rank 0 asks for the next range only when `consume` wants it, so it
// may stop at any point (a NaN refused, a write error, a failed read) and
// no rank is left in a collective: the end request always follows.
//
// Memory: one chunk of `chunk_elements` floats (plus a slot a rank) on the
// device for the collectives and on the host on every rank; rank 0's reader
// writes into the caller's buffer.
#ifndef MEMWALL_ZERO_RANK_ZERO_READS_H_
#define MEMWALL_ZERO_RANK_ZERO_READS_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "models/gpt_io.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "zero/partition.h"

namespace memwall::zero {

// Fills `n` values of this rank's shard from `shard_offset` (the optimizer's
// store, say).
using ShardValueReader = std::function<absl::Status(int64_t shard_offset, int64_t n, float* out)>;

// 256 Ki floats: 1 MiB a chunk.
inline constexpr int64_t kRankZeroReadChunk = int64_t{1} << 18;

// Every rank calls it with the same `partition` (owners() == the
// communicator's world size, or 1: then rank 0 reads its own store and no
// collective runs). Returns, on rank 0, `consume`'s Status; on every other
// rank, OK or the first of its own failed reads. Agree on it afterwards
// when every rank should hear of any failure. A range `consume` asks for
// outside [0, Ψ) is InvalidArgument from the reader, before any collective.
absl::Status ReadOnRankZero(Communicator& comm, Device& device, const Partition& partition,
                            const ShardValueReader& read_shard,
                            const std::function<absl::Status(const models::FlatValueReader&)>& consume,
                            int64_t chunk_elements = kRankZeroReadChunk);

}  // namespace memwall::zero

#endif  // MEMWALL_ZERO_RANK_ZERO_READS_H_
