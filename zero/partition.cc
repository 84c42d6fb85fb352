#include "zero/partition.h"

#include <algorithm>

namespace memwall::zero {

namespace {

class Contiguous final : public Partition {
 public:
  Contiguous(int64_t numel, int owners)
      : numel_(numel), owners_(owners), shard_(owners > 0 ? (numel + owners - 1) / owners : 0) {}
  int owners() const override { return owners_; }
  int64_t numel() const override { return numel_; }
  int64_t shard() const override { return shard_; }
  std::vector<Piece> Owned(int rank) const override {
    const int64_t begin = std::min(numel_, rank * shard_), end = std::min(numel_, (rank + 1) * shard_);
    if (begin >= end) return {};
    return {Piece{rank, begin, end - begin, 0}};
  }
  std::vector<Piece> Pieces(FlatRange range) const override {
    std::vector<Piece> out;
    for (int64_t at = range.begin; at < range.end;) {
      const int owner = static_cast<int>(at / shard_);
      const int64_t end = std::min(range.end, (owner + 1) * shard_);
      out.push_back({owner, at, end - at, at - owner * shard_});
      at = end;
    }
    return out;
  }

 private:
  int64_t numel_;
  int owners_;
  int64_t shard_;
};

}  // namespace

std::shared_ptr<const Partition> ContiguousPartition(int64_t numel, int owners) {
  return std::make_shared<Contiguous>(numel, owners);
}

FlatLayout::FlatLayout(models::Module& root, int world, int rank) : rank_(rank), params_(root.Parameters()) {
  for (models::Parameter* p : params_) {
    offsets_[p] = numel_;
    numel_ += p->numel();
  }
  partition_ = ContiguousPartition(numel_, world);
}

FlatRange FlatLayout::OwnRange(const models::Module& m) const {
  const auto& own = m.own_parameters();
  if (own.empty()) return {};
  const int64_t begin = offsets_.at(own.front().get());
  return {begin, offsets_.at(own.back().get()) + own.back()->numel()};
}

int64_t LargestModuleParameters(models::Module& root) {
  int64_t own = 0;
  for (const auto& p : root.own_parameters()) own += p->numel();
  for (models::Module* child : root.children()) own = std::max(own, LargestModuleParameters(*child));
  return own;
}

}  // namespace memwall::zero
