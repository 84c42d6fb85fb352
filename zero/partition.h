// The flat layout every ZeRO stage shares (ZeRO §5; zero/README "Flat
// buffers"): the model's parameters laid end to end in Module::Parameters()
// order (the tensor table), Ψ elements, padded to N · shard with shard =
// ceil(Ψ / N). Rank r owns the flat range [r · shard, (r + 1) · shard); the
// padding (the last rank's tail) is zero and stays zero, since Adam leaves a
// zero parameter with a zero gradient at zero.
//
// A module's own parameters are contiguous in this order (own parameters
// come before its children's), so "module m's parameters" is one flat range,
// which may straddle shard boundaries: Pieces() splits a range by owner.
#ifndef MEMWALL_ZERO_PARTITION_H_
#define MEMWALL_ZERO_PARTITION_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "models/module.h"

namespace memwall::zero {

// Flat elements [begin, begin + size) owned by `rank`, held at
// [shard_offset, shard_offset + size) of that rank's shard.
struct Piece {
  int rank = 0;
  int64_t begin = 0;
  int64_t size = 0;
  int64_t shard_offset = 0;
};

struct FlatRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// One collective of a gather (stage 3 assembling whole parameters): the
// flat `range` it fills, laid in the gathered buffer as `gathered`
// elements. chunk > 0: every owner r gives `chunk` elements, which land at
// r · chunk (an all-gather; gathered = owners · chunk, the last chunk's
// padding included); chunk = 0: each owner broadcasts its pieces of the
// range (gathered = range.size()).
struct GatherUnit {
  FlatRange range;
  int64_t chunk = 0;
  int64_t gathered = 0;
};

// Which flat elements each of `owners()` ranks owns, and where each lands in
// that rank's shard: shard() elements on every rank, padding included, so
// collectives move equal blocks. Every real element has exactly one owner.
// ZeRO §5's contiguous partition is one implementation; ZeRO-Infinity's
// bandwidth-centric partitioning (every parameter split over all ranks) is
// the other, behind the same questions.
class Partition {
 public:
  virtual ~Partition() = default;
  // Whether every parameter is split evenly over all owners (bandwidth-
  // centric): each parameter p in BandwidthChunk(n_p, owners) chunks.
  virtual bool splits_each_parameter() const { return false; }
  virtual int owners() const = 0;
  virtual int64_t numel() const = 0;  // Ψ
  virtual int64_t shard() const = 0;
  // The real (not padding) elements `rank` owns, in flat order.
  virtual std::vector<Piece> Owned(int rank) const = 0;
  // `range` split by owner, in flat order.
  virtual std::vector<Piece> Pieces(FlatRange range) const = 0;
  // A parameter of n elements once gathered (what stage 3 holds of it
  // while its module runs): n, or more when the partition pads each
  // parameter.
  virtual int64_t GatheredElements(int64_t parameter_elements) const = 0;
  // The collectives that gather `range` (whole, adjacent parameters), in
  // flat order; their `gathered` sizes add up to the range's gathered
  // elements.
  virtual std::vector<GatherUnit> GatherUnits(FlatRange range) const = 0;
};

// ZeRO's partition: shard = ceil(Ψ / owners) and rank r owns
// [r shard, (r + 1) shard) ∩ [0, Ψ), at offset 0 of its shard.
std::shared_ptr<const Partition> ContiguousPartition(int64_t numel, int owners);

// ZeRO-Infinity §6.1: parameter p (of `parameters`, in flat order) is
// split into `owners` chunks of c_p = BandwidthChunk(n_p, owners) elements
// (the last one short, or empty, when owners does not divide n_p); rank r
// owns chunk r of every parameter, laid end to end in its shard, so
// shard = Σ c_p and rank r's chunk of p sits at Σ_{q < p} c_q.
std::shared_ptr<const Partition> BandwidthCentricPartition(const std::vector<int64_t>& parameters, int owners);
inline int64_t BandwidthChunk(int64_t parameter_elements, int owners) {
  return (parameter_elements + owners - 1) / owners;
}

class FlatLayout {
 public:
  FlatLayout() = default;
  // The tensor table of `root`, partitioned over `world` owners,
  // contiguously or bandwidth-centric.
  FlatLayout(models::Module& root, int world, int rank, bool bandwidth_centric = false);

  const Partition& partition() const { return *partition_; }
  int world() const { return partition_->owners(); }
  int rank() const { return rank_; }
  int64_t numel() const { return numel_; }                  // Ψ
  int64_t shard() const { return partition_->shard(); }     // ceil(Ψ / N)
  int64_t padded() const { return shard() * world(); }      // N · shard
  // The replicated flat buffer (stages 0-2, zero/parameter_placement.h)
  // holds rank r's shard at r · shard: ZeRO's contiguous partition (the
  // only one below stage 3).
  int64_t shard_begin() const { return shard() * rank_; }
  // The real elements a rank owns (this rank's by default), in flat order.
  std::vector<Piece> Owned(int rank) const { return partition_->Owned(rank); }
  std::vector<Piece> Owned() const { return Owned(rank_); }

  const std::vector<models::Parameter*>& params() const { return params_; }
  int64_t offset(const models::Parameter* p) const { return offsets_.at(p); }
  // The flat range of m's own parameters (empty when it has none).
  FlatRange OwnRange(const models::Module& m) const;
  // [range.begin, range.end) split by owner, in order.
  std::vector<Piece> Pieces(FlatRange range) const { return partition_->Pieces(range); }

 private:
  int rank_ = 0;
  int64_t numel_ = 0;
  std::shared_ptr<const Partition> partition_ = ContiguousPartition(0, 1);
  std::vector<models::Parameter*> params_;
  absl::flat_hash_map<const models::Parameter*, int64_t> offsets_;
};

// The largest number of elements any one module owns directly, each
// parameter counted as `partition` gathers it: a reduce bucket must hold
// one module's gradients, and stage 3 gathers one module's parameters at a
// time.
int64_t LargestModuleParameters(models::Module& root, const Partition& partition);
// Each parameter whole (the contiguous partition's count).
int64_t LargestModuleParameters(models::Module& root);

}  // namespace memwall::zero

#endif  // MEMWALL_ZERO_PARTITION_H_
