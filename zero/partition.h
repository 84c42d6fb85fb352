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
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "models/module.h"

namespace memwall::zero {

// Flat elements [begin, begin + size) owned by `rank`.
struct Piece {
  int rank = 0;
  int64_t begin = 0;
  int64_t size = 0;
};

struct FlatRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

class FlatLayout {
 public:
  FlatLayout() = default;
  FlatLayout(models::Module& root, int world, int rank);

  int world() const { return world_; }
  int rank() const { return rank_; }
  int64_t numel() const { return numel_; }             // Ψ
  int64_t shard() const { return shard_; }             // ceil(Ψ / N)
  int64_t padded() const { return shard_ * world_; }   // N · shard
  int64_t shard_begin() const { return shard_ * rank_; }
  // A rank's shard, clipped to Ψ (the elements that are real parameters):
  // [r shard, (r + 1) shard) ∩ [0, Ψ).
  FlatRange OwnedReal(int rank) const;
  FlatRange OwnedReal() const { return OwnedReal(rank_); }

  const std::vector<models::Parameter*>& params() const { return params_; }
  int64_t offset(const models::Parameter* p) const { return offsets_.at(p); }
  // The flat range of m's own parameters (empty when it has none).
  FlatRange OwnRange(const models::Module& m) const;
  // [range.begin, range.end) split at shard boundaries, in order.
  std::vector<Piece> Pieces(FlatRange range) const;

 private:
  int world_ = 1, rank_ = 0;
  int64_t numel_ = 0, shard_ = 0;
  std::vector<models::Parameter*> params_;
  absl::flat_hash_map<const models::Parameter*, int64_t> offsets_;
};

// The largest number of elements any one module owns directly: a reduce
// bucket must hold one module's gradients, and stage 3 gathers one
// module's parameters at a time.
int64_t LargestModuleParameters(models::Module& root);

}  // namespace memwall::zero

#endif  // MEMWALL_ZERO_PARTITION_H_
