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
  int64_t GatheredElements(int64_t parameter_elements) const override { return parameter_elements; }
  std::vector<GatherUnit> GatherUnits(FlatRange range) const override {
    return {GatherUnit{range, 0, range.size()}};
  }

 private:
  int64_t numel_;
  int owners_;
  int64_t shard_;
};

class BandwidthCentric final : public Partition {
 public:
  BandwidthCentric(const std::vector<int64_t>& parameters, int owners) : owners_(owners) {
    int64_t flat = 0, at = 0;
    for (int64_t n : parameters) {
      params_.push_back({flat, n, at, BandwidthChunk(n, owners)});
      flat += n;
      at += params_.back().chunk;
    }
    numel_ = flat;
    shard_ = at;
  }
  bool splits_each_parameter() const override { return true; }
  int owners() const override { return owners_; }
  int64_t numel() const override { return numel_; }
  int64_t shard() const override { return shard_; }
  std::vector<Piece> Owned(int rank) const override {
    std::vector<Piece> out;
    for (const Param& p : params_) Chunk(p, rank, p.begin, p.begin + p.numel, out);
    return out;
  }
  std::vector<Piece> Pieces(FlatRange range) const override {
    std::vector<Piece> out;
    // The first parameter that ends after range.begin, then each in turn.
    auto it = std::upper_bound(params_.begin(), params_.end(), range.begin,
                               [](int64_t at, const Param& p) { return at < p.begin + p.numel; });
    for (; it != params_.end() && it->begin < range.end; ++it) {
      for (int r = 0; r < owners_; ++r) Chunk(*it, r, range.begin, range.end, out);
    }
    return out;
  }
  int64_t GatheredElements(int64_t parameter_elements) const override {
    return owners_ * BandwidthChunk(parameter_elements, owners_);
  }
  // One all-gather per parameter: rank r's chunk is chunk r of it.
  std::vector<GatherUnit> GatherUnits(FlatRange range) const override {
    std::vector<GatherUnit> out;
    auto it = std::upper_bound(params_.begin(), params_.end(), range.begin,
                               [](int64_t at, const Param& p) { return at < p.begin + p.numel; });
    for (; it != params_.end() && it->begin < range.end; ++it) {
      out.push_back({FlatRange{it->begin, it->begin + it->numel}, it->chunk, owners_ * it->chunk});
    }
    return out;
  }

 private:
  struct Param {
    int64_t begin, numel;  // flat
    int64_t at, chunk;     // its chunks' offset in every shard, and their elements
  };
  // Rank r's chunk of p, clipped to [lo, hi), appended when not empty.
  void Chunk(const Param& p, int r, int64_t lo, int64_t hi, std::vector<Piece>& out) const {
    const int64_t begin = std::max(lo, p.begin + std::min(p.numel, r * p.chunk));
    const int64_t end = std::min(hi, p.begin + std::min(p.numel, (r + 1) * p.chunk));
    if (begin < end) out.push_back({r, begin, end - begin, p.at + (begin - p.begin - r * p.chunk)});
  }

  int owners_;
  int64_t numel_ = 0, shard_ = 0;
  std::vector<Param> params_;
};

}  // namespace

std::shared_ptr<const Partition> BandwidthCentricPartition(const std::vector<int64_t>& parameters, int owners) {
  return std::make_shared<BandwidthCentric>(parameters, owners);
}

std::shared_ptr<const Partition> ContiguousPartition(int64_t numel, int owners) {
  return std::make_shared<Contiguous>(numel, owners);
}

FlatLayout::FlatLayout(models::Module& root, int world, int rank, bool bandwidth_centric)
    : rank_(rank), params_(root.Parameters()) {
  std::vector<int64_t> sizes;
  for (models::Parameter* p : params_) {
    offsets_[p] = numel_;
    numel_ += p->numel();
    sizes.push_back(p->numel());
  }
  partition_ = bandwidth_centric ? BandwidthCentricPartition(sizes, world) : ContiguousPartition(numel_, world);
}

FlatRange FlatLayout::OwnRange(const models::Module& m) const {
  const auto& own = m.own_parameters();
  if (own.empty()) return {};
  const int64_t begin = offsets_.at(own.front().get());
  return {begin, offsets_.at(own.back().get()) + own.back()->numel()};
}

int64_t LargestModuleParameters(models::Module& root, const Partition& partition) {
  int64_t own = 0;
  for (const auto& p : root.own_parameters()) own += partition.GatheredElements(p->numel());
  for (models::Module* child : root.children()) {
    own = std::max(own, LargestModuleParameters(*child, partition));
  }
  return own;
}

int64_t LargestModuleParameters(models::Module& root) {
  return LargestModuleParameters(root, *ContiguousPartition(0, 1));
}

}  // namespace memwall::zero
