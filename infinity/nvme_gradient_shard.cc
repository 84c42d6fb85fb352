#include "infinity/nvme_gradient_shard.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "infinity/swap_channel.h"
#include "offload/host_gradient_shard.h"
#include "ops/host_accumulate.h"
#include "runtime/status.h"
#include "runtime/thread_pool.h"

namespace memwall::infinity {
namespace {

int64_t SubGroupElements(const NvmeGradientShardOptions& o) {
  return std::max<int64_t>(1, std::min(o.sub_group_elements, o.elements));
}
int64_t SubGroups(const NvmeGradientShardOptions& o) {
  const int64_t s = SubGroupElements(o);
  return (std::max<int64_t>(0, o.elements) + s - 1) / s;
}
// The largest piece (no piece is larger than the shard).
int64_t Piece(const NvmeGradientShardOptions& o) {
  return std::max<int64_t>(1, std::min(o.largest_piece, o.elements));
}
// A piece is added a block at a time: the whole piece, or whole
// accumulation chunks about a sub-group's worth, so that the blocks' chunk
// sums are the whole piece's.
int64_t Block(const NvmeGradientShardOptions& o) {
  const int64_t chunks = SubGroupElements(o) / ops::kAccumulateChunk;
  return std::min(Piece(o), std::max<int64_t>(1, chunks) * ops::kAccumulateChunk);
}
// The gathered buffer: a block, and at least one whole chunk, so that the
// norm's second pass reads whole chunks.
int64_t Gathered(const NvmeGradientShardOptions& o) { return std::max(Block(o), ops::kAccumulateChunk); }

std::string SwapPath(const NvmeGradientShardOptions& o) {
  return absl::StrCat(o.dir, "/memwall_gradients_rank", o.rank, ".swap");
}

class NvmeGradientShard final : public offload::GradientShard {
 public:
  using Slot = SwapBuffers::Slot;

  explicit NvmeGradientShard(const NvmeGradientShardOptions& o)
      : n_(o.elements),
        dtype_(o.dtype),
        g_(SizeOf(o.dtype)),
        sub_group_(SubGroupElements(o)),
        staging_elements_(Piece(o)),
        block_(Block(o)),
        gathered_elements_(Gathered(o)),
        timeline_(o.timeline),
        pool_(0),
        touched_(SubGroups(o), false) {}

  absl::Status Init(Device& device, const NvmeGradientShardOptions& o) {
    const MemoryPlan plan = NvmeGradientShardPlan(o);
    MEMWALL_ASSIGN_OR_RETURN(staging_, AllocatePlanned(device, plan, "staging gradients"));
    MEMWALL_ASSIGN_OR_RETURN(gathered_, AllocatePlanned(device, plan, "gathered gradients"));
    MEMWALL_ASSIGN_OR_RETURN(norm_host_, AllocatePlanned(device, plan, "norm"));
    SwapChannel::Options c;
    c.what = "NVMe gradient offload";
    c.contents = "gradients";
    c.path = SwapPath(o);
    c.sub_groups = SubGroups(o);
    c.group_bytes = GradientSwapBufferBytes(o);
    c.aio = o.aio;
    c.fault_injector = o.fault_injector;
    c.timeline = o.timeline;
    c.in_track = kGradientSwapInTrack;
    c.out_track = kGradientSwapOutTrack;
    MEMWALL_ASSIGN_OR_RETURN(buffers_,
                             SwapBuffers::Create(device, plan, "gradient swap buffer", GradientSwapBufferCount(o), c));
    return absl::OkStatus();
  }

  DType dtype() const override { return dtype_; }
  void BeginMicroBatch(int64_t index, int64_t count) override { last_pass_ = index + 1 == count; }

  bool fails_alone() const override { return true; }
  absl::Status Failure() override {
    std::lock_guard<std::mutex> lock(mu_);
    return failed_;
  }

  // A new step: a failure of an earlier step is now the file's ("resume
  // from the last checkpoint").
  absl::Status ZeroGradients(Stream& stream) override {
    written_.Clear();  // in the caller's order, as AddPiece reads it
    return stream.EnqueueHost([this] {
      std::lock_guard<std::mutex> lock(mu_);
      if (!Broken().ok()) failed_ = Broken();
      Alone([this]() -> absl::Status {
        for (Slot& s : buffers_->slots()) {
          MEMWALL_RETURN_IF_ERROR(buffers_->Settle(s));
          s.group = -1;
          s.dirty = s.held = false;
        }
        std::fill(touched_.begin(), touched_.end(), false);
        folded_.Clear();
        return absl::OkStatus();
      });
      return absl::OkStatus();
    });
  }

  // D2H into staging, then, on the host in the collective stream's order,
  // a block at a time: its current values gathered, the pinned shard's
  // add, the result scattered back, and the buffers it left behind
  // written. On the last pass a piece onto elements no piece of this step
  // has written is completed in staging and scattered as it is, the bits
  // of the add onto zeros without one ([Note: a piece onto unwritten
  // elements is copied] in offload/host_gradient_shard.h).
  absl::Status AddPiece(const Tensor& reduced, int64_t shard_offset, Stream& coll) override {
    const int64_t n = reduced.numel();
    if (n > staging_elements_ || shard_offset < 0 || shard_offset + n > n_) {
      return absl::InternalError(absl::StrCat("NVMe gradient offload: gradient piece of ", n, " elements at ",
                                              shard_offset, " does not fit the staging (", staging_elements_,
                                              ") or the shard (", n_, ")"));
    }
    {
      StreamZone d2h(timeline_, coll, ZoneKind::kGradD2H);
      MEMWALL_RETURN_IF_ERROR(coll.Copy(staging_.data(), reduced.data(), reduced.bytes()));
    }
    StreamZone add(timeline_, coll, ZoneKind::kGradAccumulate);
    const bool fold = last_pass_;
    const std::vector<std::pair<int64_t, int64_t>> unwritten = written_.Unmarked(shard_offset, shard_offset + n);
    written_.Mark(shard_offset, shard_offset + n);
    const bool copy = fold && unwritten.size() == 1 && unwritten[0].second - unwritten[0].first == n;
    return coll.EnqueueHost([this, n, shard_offset, fold, copy] {
      std::lock_guard<std::mutex> lock(mu_);
      Alone([&] { return copy ? Copy(n, shard_offset) : Add(n, shard_offset, fold); });
      return absl::OkStatus();
    });
  }

  // The folded squares, and the ranges they cannot serve read back a block
  // of whole chunks at a time, each chunk's sum merged in order: the bits
  // ops::HostSquaredNorm gives over the range in memory. After a failure:
  // an overflow.
  absl::Status Norm(const Tensor& norm, Stream& stream) override {
    StreamZone zone(timeline_, stream, ZoneKind::kGradNorm);
    MEMWALL_RETURN_IF_ERROR(stream.EnqueueHost([this] {
      std::lock_guard<std::mutex> lock(mu_);
      float* out = norm_host_.as<float>();
      Alone([&]() -> absl::Status {
        const int64_t block = gathered_elements_ / ops::kAccumulateChunk * ops::kAccumulateChunk;
        std::vector<ops::SquareSum> chunks;
        return folded_.Total(n_, timeline_, [&](int64_t begin, int64_t end) -> absl::StatusOr<ops::SquareSum> {
          ops::SquareSum part;
          for (int64_t at = begin; at < end; at += block) {
            const int64_t len = std::min(block, end - at);
            MEMWALL_RETURN_IF_ERROR(Gather(at, len, gathered_.as<char>()));
            MEMWALL_RETURN_IF_ERROR(ops::HostSquaredNormChunks(gathered_.data(), dtype_, len, &chunks, &pool_));
            for (const ops::SquareSum& c : chunks) part.Merge(c);
          }
          return part;
        }, out);
      });
      if (!failed_.ok()) out[0] = 0.0f, out[1] = 1.0f;
      return absl::OkStatus();
    }));
    return stream.Copy(norm.data(), norm_host_.data(), 2 * sizeof(float));
  }

  absl::StatusOr<const char*> Gradients(int64_t begin, int64_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    MEMWALL_RETURN_IF_ERROR(Broken());
    MEMWALL_RETURN_IF_ERROR(CheckRange(begin, n));
    const int64_t k = begin / sub_group_;
    if (n > 0 && (begin + n - 1) / sub_group_ != k) {
      return absl::InvalidArgumentError(absl::StrCat("NVMe gradient offload: gradients [", begin, ", +", n,
                                                     ") span sub-groups of ", sub_group_));
    }
    for (Slot& s : buffers_->slots()) s.held = false;
    MEMWALL_ASSIGN_OR_RETURN(Slot * slot, Load(k));
    slot->held = true;
    // Read ahead the next sub-group into a buffer that is free of work.
    if (k + 1 < static_cast<int64_t>(touched_.size()) && touched_[k + 1] && buffers_->Find(k + 1) == nullptr) {
      if (Slot* spare = buffers_->Spare()) MEMWALL_RETURN_IF_ERROR(buffers_->StartRead(*spare, k + 1));
    }
    return slot->buffer.as<const char>() + (begin - k * sub_group_) * g_;
  }

  absl::Status ReadActive(int64_t begin, int64_t n, float* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    MEMWALL_RETURN_IF_ERROR(Broken());
    MEMWALL_RETURN_IF_ERROR(CheckRange(begin, n));
    for (int64_t at = begin; at < begin + n; at += gathered_elements_) {
      const int64_t len = std::min(gathered_elements_, begin + n - at);
      MEMWALL_RETURN_IF_ERROR(Gather(at, len, gathered_.as<char>()));
      MEMWALL_RETURN_IF_ERROR(Convert(gathered_.data(), dtype_, out + (at - begin), DType::kF32, len));
    }
    return absl::OkStatus();
  }

  absl::Status WriteActive(int64_t begin, int64_t n, const float* in) override {
    std::lock_guard<std::mutex> lock(mu_);
    MEMWALL_RETURN_IF_ERROR(Broken());
    MEMWALL_RETURN_IF_ERROR(CheckRange(begin, n));
    for (int64_t at = begin; at < begin + n; at += gathered_elements_) {
      const int64_t len = std::min(gathered_elements_, begin + n - at);
      MEMWALL_RETURN_IF_ERROR(Convert(in + (at - begin), DType::kF32, gathered_.data(), dtype_, len));
      MEMWALL_RETURN_IF_ERROR(Scatter(at, len, gathered_.as<char>()));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Broken() const { return buffers_->channel().Broken(); }

  // Runs `work` unless this step failed already, and keeps its failure
  // instead of failing the stream (GradientShard::Failure).
  template <typename Work>
  void Alone(Work work) {
    if (!failed_.ok()) return;
    if (absl::Status st = work(); !st.ok()) failed_ = std::move(st);
  }

  // Piece [shard_offset, shard_offset + n) from staging onto elements that
  // hold nothing this step, on the last pass, a block at a time: completed
  // in staging (its squares, and +0 for -0) and scattered.
  absl::Status Copy(int64_t n, int64_t shard_offset) {
    chunk_norms_.clear();
    for (int64_t at = 0; at < n; at += block_) {
      const int64_t len = std::min(block_, n - at), begin = shard_offset + at;
      char* incoming = staging_.as<char>() + at * g_;
      MEMWALL_RETURN_IF_ERROR(ops::HostCompleteChunkNorms(incoming, dtype_, len, &block_norms_, &pool_));
      chunk_norms_.insert(chunk_norms_.end(), block_norms_.begin(), block_norms_.end());
      MEMWALL_RETURN_IF_ERROR(Scatter(begin, len, incoming));
      MEMWALL_RETURN_IF_ERROR(WriteBehind(begin / sub_group_, (begin + len - 1) / sub_group_));
    }
    folded_.Add(shard_offset, n, chunk_norms_);
    return absl::OkStatus();
  }

  // Piece [shard_offset, shard_offset + n) from staging, a block at a time.
  absl::Status Add(int64_t n, int64_t shard_offset, bool fold) {
    char* block = gathered_.as<char>();
    chunk_norms_.clear();
    for (int64_t at = 0; at < n; at += block_) {
      const int64_t len = std::min(block_, n - at), begin = shard_offset + at;
      const char* incoming = staging_.as<char>() + at * g_;
      MEMWALL_RETURN_IF_ERROR(Gather(begin, len, block));
      if (fold) {
        MEMWALL_RETURN_IF_ERROR(ops::HostAddChunkNorms(block, incoming, block, dtype_, len, &block_norms_, &pool_));
        chunk_norms_.insert(chunk_norms_.end(), block_norms_.begin(), block_norms_.end());
      } else {
        MEMWALL_RETURN_IF_ERROR(ops::HostAdd(block, incoming, block, dtype_, len, nullptr, &pool_));
      }
      MEMWALL_RETURN_IF_ERROR(Scatter(begin, len, block));
      MEMWALL_RETURN_IF_ERROR(WriteBehind(begin / sub_group_, (begin + len - 1) / sub_group_));
    }
    if (fold) folded_.Add(shard_offset, n, chunk_norms_);
    return absl::OkStatus();
  }

  absl::Status CheckRange(int64_t begin, int64_t n) const {
    if (begin >= 0 && n >= 0 && begin <= n_ - n) return absl::OkStatus();
    return absl::OutOfRangeError(
        absl::StrCat("NVMe gradient offload: gradients [", begin, ", +", n, ") of a shard of ", n_));
  }

  // Calls fn(k, begin, len) for each part of [begin, begin + n) in one
  // sub-group, in order.
  template <typename Fn>
  absl::Status ForEachPart(int64_t begin, int64_t n, Fn fn) {
    for (int64_t at = begin; at < begin + n;) {
      const int64_t k = at / sub_group_;
      const int64_t len = std::min(begin + n, (k + 1) * sub_group_) - at;
      MEMWALL_RETURN_IF_ERROR(fn(k, at, len));
      at += len;
    }
    return absl::OkStatus();
  }

  // Elements [begin, begin + n) into `out`: from a buffer that holds them,
  // else zero where nothing was added since ZeroGradients, else the file.
  absl::Status Gather(int64_t begin, int64_t n, char* out) {
    return ForEachPart(begin, n, [&](int64_t k, int64_t at, int64_t len) -> absl::Status {
      char* to = out + (at - begin) * g_;
      if (!touched_[k] && buffers_->Find(k) == nullptr) {
        std::memset(to, 0, len * g_);
        return absl::OkStatus();
      }
      MEMWALL_ASSIGN_OR_RETURN(Slot * slot, Load(k));
      std::memcpy(to, slot->buffer.as<char>() + (at - k * sub_group_) * g_, len * g_);
      return absl::OkStatus();
    });
  }

  // `in` into elements [begin, begin + n); their buffers become dirty.
  absl::Status Scatter(int64_t begin, int64_t n, const char* in) {
    return ForEachPart(begin, n, [&](int64_t k, int64_t at, int64_t len) -> absl::Status {
      MEMWALL_ASSIGN_OR_RETURN(Slot * slot, Load(k));
      std::memcpy(slot->buffer.as<char>() + (at - k * sub_group_) * g_, in + (at - begin) * g_, len * g_);
      slot->dirty = true;
      touched_[k] = true;
      return absl::OkStatus();
    });
  }

  // Every dirty buffer outside sub-groups [first, last] starts its write.
  absl::Status WriteBehind(int64_t first, int64_t last) {
    for (Slot& s : buffers_->slots()) {
      if (s.dirty && (s.group < first || s.group > last)) MEMWALL_RETURN_IF_ERROR(buffers_->StartWrite(s));
    }
    return absl::OkStatus();
  }

  // A buffer holding sub-group k, its transfers settled: the one that holds
  // it, else a reused one (never the optimizer's), read from the file or
  // zeroed.
  absl::StatusOr<Slot*> Load(int64_t k) {
    Slot* slot = buffers_->Find(k);
    if (slot == nullptr) {
      MEMWALL_ASSIGN_OR_RETURN(slot, buffers_->Evict());
      if (slot == nullptr) return absl::InternalError("NVMe gradient offload: no swap buffer to reuse");
      if (touched_[k]) {
        MEMWALL_RETURN_IF_ERROR(buffers_->StartRead(*slot, k));
      } else {
        std::memset(slot->buffer.data(), 0, slot->buffer.bytes());
        slot->group = k;
      }
    }
    MEMWALL_RETURN_IF_ERROR(buffers_->Settle(*slot));
    buffers_->Touch(*slot);
    return slot;
  }

  const int64_t n_;
  const DType dtype_;
  const int64_t g_;  // bytes an element
  const int64_t sub_group_;
  const int64_t staging_elements_, block_, gathered_elements_;
  Timeline* const timeline_;
  ThreadPool pool_;
  bool last_pass_ = true;  // set on the host before each micro-batch
  std::mutex mu_;          // the host functions of two streams and the optimizer's thread
  std::vector<bool> touched_;  // per sub-group: added to since ZeroGradients
  // Elements a piece of this step has landed on, in AddPiece's (the
  // caller's) order.
  offload::ElementRanges written_;
  Buffer staging_, gathered_, norm_host_;
  std::unique_ptr<SwapBuffers> buffers_;  // the optimizer's is held, from its last Gradients
  absl::Status failed_;  // this step's first failure, then the file's (Failure)
  offload::FoldedNorm folded_;
  std::vector<ops::SquareSum> chunk_norms_, block_norms_;  // one piece's, one block's
};

}  // namespace

int64_t GradientSwapBufferCount(const NvmeGradientShardOptions& o) {
  const int64_t span = (Block(o) - 1) / SubGroupElements(o) + 2;  // sub-groups one unaligned block can touch
  return std::max<int64_t>(1, std::min(SubGroups(o), span + 2));
}

int64_t GradientSwapBufferBytes(const NvmeGradientShardOptions& o) {
  return AioAligned(SubGroupElements(o) * static_cast<int64_t>(SizeOf(o.dtype)));
}

MemoryPlan NvmeGradientShardPlan(const NvmeGradientShardOptions& o) {
  const int64_t g = SizeOf(o.dtype);
  MemoryPlan plan;
  for (int64_t i = 0; i < GradientSwapBufferCount(o); ++i) {
    plan.Add(absl::StrCat("gradient swap buffer ", i), MemorySpace::kPinnedHost, MemoryTag::kGrads,
             GradientSwapBufferBytes(o));
  }
  plan.Add("staging gradients", MemorySpace::kPinnedHost, MemoryTag::kStaging, g * Piece(o))
      .Add("gathered gradients", MemorySpace::kPinnedHost, MemoryTag::kStaging, g * Gathered(o))
      .Add("norm", MemorySpace::kPinnedHost, MemoryTag::kStaging, 2 * sizeof(float));
  plan.AddFile("swap file: gradients", SwapPath(o), MemoryTag::kGrads, SubGroups(o) * GradientSwapBufferBytes(o));
  return plan;
}

absl::StatusOr<std::unique_ptr<offload::GradientShard>> CreateNvmeGradientShard(
    Device& device, const NvmeGradientShardOptions& o) {
  if (o.elements <= 0 || o.sub_group_elements <= 0 || o.largest_piece <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("NVMe gradient offload: ", o.elements,
                                                   " elements in sub-groups of ", o.sub_group_elements,
                                                   ", pieces of ", o.largest_piece));
  }
  if (!IsFloating(o.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("NVMe gradient offload: gradients are ", DTypeName(o.dtype), "; need fp32, fp16 or bf16"));
  }
  if (o.dir.empty()) return absl::InvalidArgumentError("NVMe gradient offload: offload_optimizer.nvme_path is empty");
  auto shard = std::make_unique<NvmeGradientShard>(o);
  MEMWALL_RETURN_IF_ERROR(shard->Init(device, o));
  return std::unique_ptr<offload::GradientShard>(std::move(shard));
}

}  // namespace memwall::infinity
