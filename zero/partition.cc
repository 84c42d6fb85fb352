#include "zero/partition.h"

#include <algorithm>

namespace memwall::zero {

FlatLayout::FlatLayout(models::Module& root, int world, int rank)
    : world_(world), rank_(rank), params_(root.Parameters()) {
  for (models::Parameter* p : params_) {
    offsets_[p] = numel_;
    numel_ += p->numel();
  }
  shard_ = (numel_ + world - 1) / world;
}

FlatRange FlatLayout::OwnedReal(int rank) const {
  return {std::min(numel_, rank * shard_), std::min(numel_, (rank + 1) * shard_)};
}

FlatRange FlatLayout::OwnRange(const models::Module& m) const {
  const auto& own = m.own_parameters();
  if (own.empty()) return {};
  const int64_t begin = offsets_.at(own.front().get());
  return {begin, offsets_.at(own.back().get()) + own.back()->numel()};
}

std::vector<Piece> FlatLayout::Pieces(FlatRange range) const {
  std::vector<Piece> out;
  for (int64_t at = range.begin; at < range.end;) {
    const int owner = static_cast<int>(at / shard_);
    const int64_t end = std::min(range.end, (owner + 1) * shard_);
    out.push_back({owner, at, end - at});
    at = end;
  }
  return out;
}

int64_t LargestModuleParameters(models::Module& root) {
  int64_t own = 0;
  for (const auto& p : root.own_parameters()) own += p->numel();
  for (models::Module* child : root.children()) own = std::max(own, LargestModuleParameters(*child));
  return own;
}

}  // namespace memwall::zero
