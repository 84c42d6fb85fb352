// Sharded checkpoints of the ZeRO engine: Trainer::Save and
// Trainer::Load (declared in trainer.h, defined in checkpoint.cc) and the
// consolidation into one Hugging Face GPT-2 safetensors file.
//
// Layout of DIR/step_00000010/:
//   rank_00000.shard ... one per rank that owns parameters (stage 0: rank 0
//                        alone, holding everything): a 24-byte header
//                        ("MWSHARD1", flat begin, count as int64) then the
//                        fp32 master weights, Adam's m and v of the flat
//                        elements that rank owned, only real elements (no
//                        padding): one run under ZeRO's contiguous
//                        partition, a chunk of every parameter under
//                        bandwidth-centric partitioning (the metadata
//                        lists the runs)
//   metadata.pb          CheckpointMetadata (checkpoint.proto): world size,
//                        stage, tensor table, each shard's range, size and
//                        CRC-32, the trainer's counters
//   COMPLETE             the CRC-32 of metadata.pb, written last
// Every file is written to a temporary name, fsynced and renamed (and the
// directory fsynced), so a file under its real name is whole. A checkpoint
// counts only once COMPLETE exists: rank 0 writes metadata and marker after
// an all-gather that every rank enters only once its shard is in place, so
// a rank killed mid-save leaves no marker and the directory is refused.
//
// Loading checks the marker, metadata's CRC, the tensor table against the
// model, every shard's presence, size and CRC, and then reads the flat range
// this rank owns now: from one file when the world size and partitioning
// are unchanged, from the overlapping old shards when they differ
// (re-partitioning; a checkpoint holds flat elements, so a bandwidth-centric
// run's checkpoint resumes a contiguous run and the other way round). Errors are
// agreed on by all ranks (one all-gather), so every rank returns a Status
// and none is left in a collective; a load that fails verification changes
// nothing.
//
// Save and Load stream: 1 Mi elements of one state at a time between the
// shard file and the optimizer's store (ZeRO-Infinity's NVMe store swaps
// its sub-groups through its pinned buffers), so neither holds the shard
// in memory: 4 MiB of host staging, whatever the model.
#ifndef MEMWALL_ZERO_CHECKPOINT_H_
#define MEMWALL_ZERO_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "zero/checkpoint.pb.h"

namespace memwall::zero {

// "DIR/step_00000010".
std::string CheckpointPath(const std::string& dir, int64_t step);

// The bytes of a shard file holding `count` elements: the 24-byte header,
// then 12 bytes an element (master, m, v), 16 with a pending update's
// gradients. A checkpoint is about ShardFileBytes(Ψ, ...) in all.
uint64_t ShardFileBytes(uint64_t count, bool pending_update);

// The complete checkpoint (marker present) with the highest step under
// `dir`; NotFound when there is none.
absl::StatusOr<std::string> LatestCheckpoint(const std::string& dir);

// Keeps the newest `keep` (>= 1) complete checkpoints under `dir` and
// deletes the older complete ones, each marker first: a deletion cut short
// leaves a directory every reader refuses as incomplete, never a
// complete-looking one with shards missing. Step directories without a
// marker (a save that did not finish, or is under way) are left alone.
// Returns the deleted step directories, oldest first. Call it on one rank,
// after a save that every rank has finished.
absl::StatusOr<std::vector<std::string>> PruneCheckpoints(const std::string& dir, int64_t keep);

// Reads and verifies `step_dir`'s marker and metadata (not the shards).
absl::StatusOr<CheckpointMetadata> ReadCheckpointMetadata(const std::string& step_dir);

// What ReadCheckpointMetadata does once the marker's and metadata.pb's
// bytes are read (`step_dir` only names them): the marker must hold
// metadata's CRC-32 (CheckpointMarker), and the metadata must parse and
// pass ValidateCheckpointMetadata. A violation is DataLoss naming the
// directory (fuzzed: zero/checkpoint_fuzzer.cc).
absl::StatusOr<CheckpointMetadata> ParseCheckpointMetadata(const std::string& marker, const std::string& metadata,
                                                           const std::string& step_dir);
// The COMPLETE marker's contents for `metadata`'s bytes: "crc32 %08x\n".
std::string CheckpointMarker(const std::string& metadata);
// What any reader may rely on once this passes: world_size >= 1, a known
// stage and precision, non-negative counters, a finite positive loss
// scale; shards named by plain file names (never paths), each of 24 + 12
// count bytes (16 count with a pending update), its pieces (if listed)
// non-empty, in flat order and adding up to its count, and all shards'
// runs together tiling [0, numel) exactly once; every tensor's shape positive and
// inside [0, numel) from its offset (so no size computed from them
// overflows).
absl::Status ValidateCheckpointMetadata(const CheckpointMetadata& meta, const std::string& step_dir);
// A shard file's 24-byte header ("MWSHARD1", flat begin, count) against
// its metadata entry; DataLoss naming `path` when they differ.
absl::Status CheckShardHeader(absl::string_view header, const CheckpointShard& shard, const std::string& path);

// Writes the full fp32 weights of a checkpoint (`path`: a step directory,
// or a directory of them for the latest) as one safetensors file in the
// Hugging Face GPT-2 layout, holding one tensor in memory at a time; every
// shard's CRC is verified first. Returns the step directory it read.
absl::StatusOr<std::string> ConsolidateCheckpoint(const std::string& path, const std::string& out);

// Tests: called by Save after this rank's shard file is in place and before
// the metadata and marker exist (to kill a rank mid-save).
using AfterShardWritten = std::function<void(int rank)>;

}  // namespace memwall::zero

#endif  // MEMWALL_ZERO_CHECKPOINT_H_
