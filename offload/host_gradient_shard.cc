#include "offload/host_gradient_shard.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace memwall::offload {

MemoryPlan HostGradientShard::Plan(int64_t elements, DType dtype, int64_t largest_piece, bool double_buffered) {
  const int64_t g = SizeOf(dtype);
  MemoryPlan plan;
  plan.Add("gradients 0", MemorySpace::kPinnedHost, MemoryTag::kGrads, g * elements);
  if (double_buffered) plan.Add("gradients 1", MemorySpace::kPinnedHost, MemoryTag::kGrads, g * elements);
  plan.Add("staging gradients", MemorySpace::kPinnedHost, MemoryTag::kStaging, g * largest_piece)
      .Add("norm", MemorySpace::kPinnedHost, MemoryTag::kStaging, 2 * sizeof(float));
  return plan;
}

HostGradientShard::HostGradientShard(Device& device, int64_t elements, DType dtype, int64_t largest_piece,
                                     Timeline* timeline)
    : device_(device), n_(elements), dtype_(dtype), staging_elements_(largest_piece), timeline_(timeline), pool_(0) {}

absl::Status HostGradientShard::Init(const MemoryPlan& plan) {
  for (int i = 0; i < 2; ++i) {
    const std::string name = absl::StrCat("gradients ", i);
    if (!plan.contains(name)) continue;
    MEMWALL_ASSIGN_OR_RETURN(grads_[i], AllocatePlanned(device_, plan, name));
    std::memset(grads_[i].data(), 0, grads_[i].bytes());
  }
  MEMWALL_ASSIGN_OR_RETURN(staging_, AllocatePlanned(device_, plan, "staging gradients"));
  MEMWALL_ASSIGN_OR_RETURN(norm_host_, AllocatePlanned(device_, plan, "norm"));
  return absl::OkStatus();
}

// The zeroing runs on the compute stream ahead of the forward, so it is on
// every step's critical path: on all the pool's threads, in 16 MiB pieces
// (one thread left 2 bytes per parameter to a single memset, about 0.3 s of
// an H100 step for 1.1B parameters, and the forward waited for it).
absl::Status HostGradientShard::ZeroGradients(Stream& stream) {
  const Buffer* grads = &grads_[active_];
  return stream.EnqueueHost([this, grads] {
    constexpr size_t kPiece = size_t{16} << 20;
    char* bytes = grads->as<char>();
    const size_t total = grads->bytes();
    pool_.ParallelFor(static_cast<int64_t>((total + kPiece - 1) / kPiece), [&](int64_t k) {
      const size_t begin = static_cast<size_t>(k) * kPiece;
      std::memset(bytes + begin, 0, std::min(kPiece, total - begin));
    });
    folded_ = {};
    folded_ranges_.clear();
    return absl::OkStatus();
  });
}

// A reduced piece this rank owns: D2H into staging, then the host add, both
// in the collective stream's order (the bucket is reused after them).
absl::Status HostGradientShard::AddPiece(const Tensor& reduced, int64_t shard_offset, Stream& coll) {
  const int64_t n = reduced.numel();
  if (n > staging_elements_ || shard_offset < 0 || shard_offset + n > n_) {
    return absl::InternalError(absl::StrCat("offload: gradient piece of ", n, " elements at ", shard_offset,
                                            " does not fit the staging (", staging_elements_, ") or the shard (",
                                            n_, ")"));
  }
  {
    StreamZone d2h(timeline_, coll, ZoneKind::kGradD2H);
    MEMWALL_RETURN_IF_ERROR(coll.Copy(staging_.data(), reduced.data(), reduced.bytes()));
  }
  StreamZone add(timeline_, coll, ZoneKind::kGradAccumulate);
  char* dst = grads_[active_].as<char>() + shard_offset * SizeOf(dtype_);
  // The last pass completes the gradient: its adds also sum the squares of
  // their results. Host functions on one stream run in order, so folded_
  // needs no lock.
  const bool fold = last_pass_;
  return coll.EnqueueHost([this, dst, n, shard_offset, fold] {
    if (fold) folded_ranges_.emplace_back(shard_offset, shard_offset + n);
    return ops::HostAdd(dst, staging_.data(), dst, dtype_, n, fold ? &folded_ : nullptr, &pool_);
  });
}

// The folded sum, unless one pass added to some element twice (GPT's tied
// wte when a flush falls between its head and embedding gradients): the
// first add's square would count too, so then one pass over the gradient
// shard recomputes the norm (zone kGradNormPass).
absl::Status HostGradientShard::Norm(const Tensor& norm, Stream& stream) {
  StreamZone zone(timeline_, stream, ZoneKind::kGradNorm);
  const Buffer* grads = &grads_[active_];
  MEMWALL_RETURN_IF_ERROR(stream.EnqueueHost([this, grads]() -> absl::Status {
    ops::SquareSum g = folded_;
    std::sort(folded_ranges_.begin(), folded_ranges_.end());
    bool twice = false;
    for (size_t i = 1; i < folded_ranges_.size(); ++i) twice |= folded_ranges_[i].first < folded_ranges_[i - 1].second;
    if (twice) {
      HostZone pass(timeline_, ZoneKind::kGradNormPass);
      MEMWALL_ASSIGN_OR_RETURN(g, ops::HostSquaredNorm(grads->data(), dtype_, n_, &pool_));
    }
    float* out = norm_host_.as<float>();
    out[0] = static_cast<float>(g.sum_of_squares);
    out[1] = g.nonfinite ? 1.0f : 0.0f;
    return absl::OkStatus();
  }));
  return stream.Copy(norm.data(), norm_host_.data(), 2 * sizeof(float));
}

absl::Status HostGradientShard::CheckRange(int64_t begin, int64_t n) const {
  if (begin >= 0 && n >= 0 && begin <= n_ - n) return absl::OkStatus();
  return absl::OutOfRangeError(absl::StrCat("offload: gradients [", begin, ", +", n, ") of a shard of ", n_));
}

absl::Status HostGradientShard::ReadActive(int64_t begin, int64_t n, float* out) const {
  MEMWALL_RETURN_IF_ERROR(CheckRange(begin, n));
  return Convert(active() + begin * SizeOf(dtype_), dtype_, out, DType::kF32, n);
}

absl::Status HostGradientShard::WriteActive(int64_t begin, int64_t n, const float* in) {
  MEMWALL_RETURN_IF_ERROR(CheckRange(begin, n));
  return Convert(in, DType::kF32, grads_[active_].as<char>() + begin * SizeOf(dtype_), dtype_, n);
}

const char* HostGradientShard::Swap() {
  const int consumed = active_;
  active_ ^= 1;
  return grads_[consumed].as<char>();
}

}  // namespace memwall::offload
