#include "offload/host_gradient_shard.h"

#include <algorithm>
#include <iterator>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace memwall::offload {

void FoldedNorm::Add(int64_t begin, int64_t n, const std::vector<ops::SquareSum>& chunk_norms) {
  for (size_t c = 0; c < chunk_norms.size(); ++c) {
    const int64_t at = begin + static_cast<int64_t>(c) * ops::kAccumulateChunk;
    chunks_.push_back({at, std::min(begin + n, at + ops::kAccumulateChunk), chunk_norms[c]});
  }
}

FoldedNorm::Split FoldedNorm::For(int64_t n) {
  // Sorted by begin, chunk i overlaps an earlier one iff it begins before
  // the furthest end so far, and a later one iff it ends after the next
  // one begins.
  std::sort(chunks_.begin(), chunks_.end(),
            [](const Chunk& a, const Chunk& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  Split split;
  auto resum = [&split](int64_t begin, int64_t end) {
    if (begin >= end) return;
    if (!split.resum.empty() && split.resum.back().second >= begin) {
      split.resum.back().second = std::max(split.resum.back().second, end);
    } else {
      split.resum.emplace_back(begin, end);
    }
  };
  int64_t reach = 0;  // the furthest end so far: every element before it is covered
  for (size_t i = 0; i < chunks_.size(); ++i) {
    const Chunk& c = chunks_[i];
    const bool overlaps = c.begin < reach || (i + 1 < chunks_.size() && c.end > chunks_[i + 1].begin);
    resum(reach, c.begin);  // a gap no chunk covers
    if (overlaps) {
      resum(c.begin, c.end);
    } else {
      split.folded.Merge(c.sum);
    }
    reach = std::max(reach, c.end);
  }
  resum(reach, n);
  return split;
}

absl::Status FoldedNorm::Total(int64_t n, Timeline* timeline, const Resum& resum, float* out) {
  const Split split = For(n);
  ops::SquareSum g = split.folded;
  if (!split.resum.empty()) {
    HostZone pass(timeline, ZoneKind::kGradNormPass);
    for (const auto& [begin, end] : split.resum) {
      MEMWALL_ASSIGN_OR_RETURN(const ops::SquareSum part, resum(begin, end));
      g.Merge(part);
    }
  }
  out[0] = static_cast<float>(g.sum_of_squares);
  out[1] = g.nonfinite ? 1.0f : 0.0f;
  return absl::OkStatus();
}

void ElementRanges::Mark(int64_t begin, int64_t end) {
  if (begin >= end) return;
  // Absorb every range that overlaps or touches [begin, end).
  auto it = ranges_.upper_bound(begin);
  if (it != ranges_.begin() && std::prev(it)->second >= begin) --it;
  while (it != ranges_.end() && it->first <= end) {
    begin = std::min(begin, it->first);
    end = std::max(end, it->second);
    it = ranges_.erase(it);
  }
  ranges_.emplace(begin, end);
}

std::vector<std::pair<int64_t, int64_t>> ElementRanges::Unmarked(int64_t begin, int64_t end) const {
  std::vector<std::pair<int64_t, int64_t>> gaps;
  auto it = ranges_.upper_bound(begin);
  if (it != ranges_.begin() && std::prev(it)->second > begin) --it;
  int64_t at = begin;
  for (; it != ranges_.end() && it->first < end; ++it) {
    if (it->first > at) gaps.emplace_back(at, it->first);
    at = std::max(at, it->second);
  }
  if (at < end) gaps.emplace_back(at, end);
  return gaps;
}

MemoryPlan HostGradientShard::Plan(int64_t elements, DType dtype, int64_t largest_piece) {
  const int64_t g = SizeOf(dtype);
  MemoryPlan plan;
  plan.Add("gradients", MemorySpace::kPinnedHost, MemoryTag::kGrads, g * elements);
  plan.Add("staging gradients", MemorySpace::kPinnedHost, MemoryTag::kStaging, g * largest_piece)
      .Add("norm", MemorySpace::kPinnedHost, MemoryTag::kStaging, 2 * sizeof(float));
  return plan;
}

HostGradientShard::HostGradientShard(Device& device, int64_t elements, DType dtype, int64_t largest_piece,
                                     Timeline* timeline)
    : device_(device), n_(elements), dtype_(dtype), staging_elements_(largest_piece), timeline_(timeline), pool_(0) {}

absl::Status HostGradientShard::Init(const MemoryPlan& plan) {
  MEMWALL_ASSIGN_OR_RETURN(grads_, AllocatePlanned(device_, plan, "gradients"));
  ZeroHost(grads_.data(), grads_.bytes(), pool_);
  MEMWALL_ASSIGN_OR_RETURN(staging_, AllocatePlanned(device_, plan, "staging gradients"));
  MEMWALL_ASSIGN_OR_RETURN(norm_host_, AllocatePlanned(device_, plan, "norm"));
  return absl::OkStatus();
}

// Starts a step's gradient: nothing is cleared ([Note: a piece onto
// unwritten elements is copied]), and under the delayed step nothing may be.
absl::Status HostGradientShard::ZeroGradients(Stream& stream) {
  written_.Clear();
  completed_.Clear();
  return stream.EnqueueHost([this] {
    folded_.Clear();
    return absl::OkStatus();
  });
}

// A reduced piece this rank owns, in the collective stream's order (the
// bucket is reused after it): copied D2H into its place when no piece of
// this step has written its elements, else D2H into staging and added.
absl::Status HostGradientShard::AddPiece(const Tensor& reduced, int64_t shard_offset, Stream& coll) {
  const int64_t n = reduced.numel();
  if (n > staging_elements_ || shard_offset < 0 || shard_offset + n > n_) {
    return absl::InternalError(absl::StrCat("offload: gradient piece of ", n, " elements at ", shard_offset,
                                            " does not fit the staging (", staging_elements_, ") or the shard (",
                                            n_, ")"));
  }
  WaitConsumed(shard_offset, shard_offset + n);
  const size_t g = SizeOf(dtype_);
  char* dst = grads_.as<char>() + shard_offset * g;
  // The last pass completes the gradient: its adds also sum the squares of
  // their results. Host functions on one stream run in order, so folded_
  // needs no lock.
  const bool fold = last_pass_;
  std::vector<std::pair<int64_t, int64_t>> unwritten = written_.Unmarked(shard_offset, shard_offset + n);
  written_.Mark(shard_offset, shard_offset + n);
  if (fold) completed_.Mark(shard_offset, shard_offset + n);
  const bool onto_unwritten = unwritten.size() == 1 && unwritten[0].second - unwritten[0].first == n;
  if (onto_unwritten) {
    {
      StreamZone d2h(timeline_, coll, ZoneKind::kGradD2H);
      MEMWALL_RETURN_IF_ERROR(coll.Copy(dst, reduced.data(), reduced.bytes()));
    }
    if (!fold) return absl::OkStatus();
    StreamZone complete(timeline_, coll, ZoneKind::kGradAccumulate);
    return coll.EnqueueHost([this, dst, n, shard_offset]() -> absl::Status {
      MEMWALL_RETURN_IF_ERROR(ops::HostCompleteChunkNorms(dst, dtype_, n, &chunk_norms_, &pool_));
      folded_.Add(shard_offset, n, chunk_norms_);
      return absl::OkStatus();
    });
  }
  {
    StreamZone d2h(timeline_, coll, ZoneKind::kGradD2H);
    MEMWALL_RETURN_IF_ERROR(coll.Copy(staging_.data(), reduced.data(), reduced.bytes()));
  }
  StreamZone add(timeline_, coll, ZoneKind::kGradAccumulate);
  return coll.EnqueueHost([this, dst, n, g, shard_offset, fold, unwritten = std::move(unwritten)]() -> absl::Status {
    for (const auto& [begin, end] : unwritten) ZeroHost(grads_.as<char>() + begin * g, (end - begin) * g, pool_);
    if (!fold) return ops::HostAdd(dst, staging_.data(), dst, dtype_, n, nullptr, &pool_);
    MEMWALL_RETURN_IF_ERROR(ops::HostAddChunkNorms(dst, staging_.data(), dst, dtype_, n, &chunk_norms_, &pool_));
    folded_.Add(shard_offset, n, chunk_norms_);
    return absl::OkStatus();
  });
}

// The gradient completed, then its norm: what no piece wrote zeroed (the
// padding), what only an earlier pass wrote completed, then the folded
// squares and one pass over the elements they cannot serve (FoldedNorm): in
// the step's usual case GPT's tied wte, whose head and embedding gradients
// arrive in different flushes.
absl::Status HostGradientShard::Norm(const Tensor& norm, Stream& stream) {
  WaitConsumed(0, n_);
  std::vector<std::pair<int64_t, int64_t>> unwritten = written_.Unmarked(0, n_);
  std::vector<std::pair<int64_t, int64_t>> incomplete;
  for (const auto& [begin, end] : completed_.Unmarked(0, n_)) {
    // [begin, end) less its unwritten parts: written by an earlier pass only.
    int64_t at = begin;
    for (const auto& [lo, hi] : written_.Unmarked(begin, end)) {
      if (lo > at) incomplete.emplace_back(at, lo);
      at = hi;
    }
    if (at < end) incomplete.emplace_back(at, end);
  }
  StreamZone zone(timeline_, stream, ZoneKind::kGradNorm);
  MEMWALL_RETURN_IF_ERROR(stream.EnqueueHost([this, unwritten = std::move(unwritten),
                                              incomplete = std::move(incomplete)]() -> absl::Status {
    const size_t g = SizeOf(dtype_);
    char* shard = grads_.as<char>();
    for (const auto& [begin, end] : unwritten) ZeroHost(shard + begin * g, (end - begin) * g, pool_);
    std::vector<ops::SquareSum> unused;
    for (const auto& [begin, end] : incomplete) {
      MEMWALL_RETURN_IF_ERROR(ops::HostCompleteChunkNorms(shard + begin * g, dtype_, end - begin, &unused, &pool_));
    }
    return folded_.Total(n_, timeline_, [&](int64_t begin, int64_t end) {
      return ops::HostSquaredNorm(shard + begin * g, dtype_, end - begin, &pool_);
    }, norm_host_.as<float>());
  }));
  return stream.Copy(norm.data(), norm_host_.data(), 2 * sizeof(float));
}

absl::Status HostGradientShard::CheckRange(int64_t begin, int64_t n) const {
  if (begin >= 0 && n >= 0 && begin <= n_ - n) return absl::OkStatus();
  return absl::OutOfRangeError(absl::StrCat("offload: gradients [", begin, ", +", n, ") of a shard of ", n_));
}

absl::StatusOr<const char*> HostGradientShard::Gradients(int64_t begin, int64_t n) {
  MEMWALL_RETURN_IF_ERROR(CheckRange(begin, n));
  return shard() + begin * SizeOf(dtype_);
}

absl::Status HostGradientShard::ReadActive(int64_t begin, int64_t n, float* out) {
  MEMWALL_RETURN_IF_ERROR(CheckRange(begin, n));
  return Convert(shard() + begin * SizeOf(dtype_), dtype_, out, DType::kF32, n);
}

absl::Status HostGradientShard::WriteActive(int64_t begin, int64_t n, const float* in) {
  MEMWALL_RETURN_IF_ERROR(CheckRange(begin, n));
  return Convert(in, DType::kF32, grads_.as<char>() + begin * SizeOf(dtype_), dtype_, n);
}

// ---- [Note: one shard under the delayed step] --------------------------------

void HostGradientShard::BeginConsuming(int64_t sub_group_elements) {
  std::lock_guard<std::mutex> lock(mu_);
  sub_group_ = std::max<int64_t>(1, sub_group_elements);
  const int64_t groups = (n_ + sub_group_ - 1) / sub_group_;
  state_.assign(groups, SubGroup::kHeld);
  held_count_ = groups;
  wanted_.clear();
  next_in_order_ = 0;
  consuming_ = groups > 0;
}

int64_t HostGradientShard::NextToConsume() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!consuming_) return -1;
  // First what an add waits for, then the rest in order; each one once.
  auto take = [this](int64_t k) {
    if (state_[k] != SubGroup::kHeld) return false;
    state_[k] = SubGroup::kTaken;
    return true;
  };
  while (!wanted_.empty()) {
    const int64_t k = wanted_.front();
    wanted_.pop_front();
    if (take(k)) return k;
  }
  while (next_in_order_ < static_cast<int64_t>(state_.size())) {
    const int64_t k = next_in_order_++;
    if (take(k)) return k;
  }
  return -1;
}

void HostGradientShard::Consumed(int64_t k) {
  std::lock_guard<std::mutex> lock(mu_);
  state_[k] = SubGroup::kReturned;
  if (--held_count_ == 0) consuming_ = false;
  changed_.notify_all();
}

void HostGradientShard::StopConsuming() {
  std::lock_guard<std::mutex> lock(mu_);
  consuming_ = false;
  changed_.notify_all();
}

int64_t HostGradientShard::Wanted() {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (int64_t k : wanted_) n += state_[k] == SubGroup::kHeld;
  return n;
}

void HostGradientShard::WaitConsumed(int64_t begin, int64_t end) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!consuming_ || begin >= end) return;
  // Ask for the sub-groups of [begin, end) not yet taken, then wait until
  // every one of them is handed back (or the step stops).
  // (The step never waits: it finds the asked-for ones at its next take.)
  const int64_t first = begin / sub_group_, last = (end - 1) / sub_group_;
  for (int64_t k = first; k <= last; ++k) {
    if (state_[k] == SubGroup::kHeld) wanted_.push_back(k);
  }
  changed_.wait(lock, [&] {
    if (!consuming_) return true;
    for (int64_t k = first; k <= last; ++k) {
      if (state_[k] != SubGroup::kReturned) return false;
    }
    return true;
  });
}

}  // namespace memwall::offload
