#include "infinity/nvme_parameter_store.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"
#include "runtime/thread_pool.h"

namespace memwall::infinity {
namespace {

int64_t RoundDown(int64_t bytes) { return bytes / kAioAlignment * kAioAlignment; }

std::string SwapPath(const NvmeParameterStoreOptions& o) {
  return absl::StrCat(o.dir, "/memwall_params_rank", o.rank, ".swap");
}

int64_t HostElements(const NvmeParameterStoreOptions& o) {
  return std::clamp<int64_t>(o.host_elements, 0, std::max<int64_t>(0, o.elements));
}

// The part of the shard on the drive: [H, elements).
int64_t DriveElements(const NvmeParameterStoreOptions& o) { return std::max<int64_t>(0, o.elements) - HostElements(o); }

int64_t FileBytes(const NvmeParameterStoreOptions& o) {
  return AioAligned(DriveElements(o) * static_cast<int64_t>(SizeOf(o.dtype)));
}

class NvmeParameterStore : public zero::ParameterStore {
 public:
  // Bytes [first, last) of the file: the aligned blocks around a range.
  struct Span {
    int64_t first = 0, last = 0;
    int64_t bytes() const { return last - first; }
  };
  struct SwapIn {
    Buffer buffer;
    std::unique_ptr<Event> copied;  // recorded by Release: the stream is done with it
    bool used = false;
    bool reserved = false;          // holds a read-ahead not fetched yet
  };
  // A read-ahead: elements [begin, begin + n) read into in_[slot].
  struct Ahead {
    int64_t begin = 0, n = 0;
    size_t slot = 0;
    Span span;
    AioRequest request;
  };
  struct SwapOut {
    Buffer buffer;
    Span span;
    AioRequest request;
    bool writing = false;
  };

  // The drive part of `o`: elements [H, o.elements) of the shard, as its
  // own elements [0, o.elements - H).
  NvmeParameterStore(Device& device, const NvmeParameterStoreOptions& o)
      : device_(device),
        path_(SwapPath(o)),
        elements_(DriveElements(o)),
        dtype_(o.dtype),
        elem_(static_cast<int64_t>(SizeOf(o.dtype))),
        limit_(std::max<int64_t>(1, o.buffer_elements)),
        read_ahead_buffers_(o.read_ahead_buffers),
        timeline_(o.timeline) {}

  ~NvmeParameterStore() override {
    (void)CancelReadAhead();
    for (SwapIn& s : in_) {
      if (s.used) (void)s.copied->Synchronize();
    }
    for (SwapOut& s : out_) (void)Settle(s);
    // The engine first: it finishes every read still in flight (one whose
    // wait a failed stream skipped) before the buffers under them go.
    aio_.reset();
  }

  absl::Status Init(const NvmeParameterStoreOptions& o) {
    const MemoryPlan plan = NvmeParameterStorePlan(o);
    for (int64_t i = 0; i < o.buffer_count; ++i) {
      SwapIn s;
      MEMWALL_ASSIGN_OR_RETURN(s.buffer, AllocatePlanned(device_, plan, absl::StrCat("param swap-in buffer ", i)));
      MEMWALL_ASSIGN_OR_RETURN(s.copied, device_.CreateEvent());
      in_.push_back(std::move(s));
    }
    for (int64_t i = 0; i < kParamSwapOutBuffers; ++i) {
      SwapOut s;
      MEMWALL_ASSIGN_OR_RETURN(s.buffer, AllocatePlanned(device_, plan, absl::StrCat("param swap-out buffer ", i)));
      out_.push_back(std::move(s));
    }
    MEMWALL_ASSIGN_OR_RETURN(aio_, AioEngine::Create(o.aio));
    if (o.fault_injector) aio_->SetFaultInjector(o.fault_injector);
    MEMWALL_ASSIGN_OR_RETURN(file_, CreateSwapFile(*aio_, path_, FileBytes(o), "NVMe parameters",
                                                   "offload_param.nvme_path"));
    return absl::OkStatus();
  }

  int64_t elements() const override { return elements_; }
  DType dtype() const override { return dtype_; }
  std::optional<Tensor> resident() const override { return std::nullopt; }
  int64_t FetchLimit(int64_t) const override { return limit_; }
  bool fails_alone() const override { return true; }

  absl::Status health() const override {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.ok()) return broken_;
    return WithErrno(absl::Status(broken_.code(),
                                  absl::StrCat("NVMe parameters: resume from the last checkpoint: the swap file ", path_,
                                               " may hold stale parameters since an I/O error (", broken_.message(),
                                               ")")),
                     ErrnoOf(broken_));
  }

  // Never fails for I/O (see the header): a broken store skips the read and
  // hands out the buffer as it is; health() says so.
  absl::StatusOr<Tensor> Fetch(int64_t begin, int64_t n, Stream& stream) override {
    MEMWALL_RETURN_IF_ERROR(CheckRange(begin, n));
    for (auto it = ahead_.begin(); it != ahead_.end(); ++it) {  // read ahead: already in flight
      if (it->begin != begin || it->n != n) continue;
      Ahead hit = std::move(*it);
      ahead_.erase(it);
      SwapIn& slot = in_[hit.slot];
      slot.reserved = false;
      MEMWALL_RETURN_IF_ERROR(AwaitOn(stream, std::move(hit.request), hit.span));
      return Tensor::Flat(slot.buffer.as<char>() + (begin * elem_ - hit.span.first), dtype_, n);
    }
    (void)SettleWrites();  // a read sees every update; a failure breaks the store
    size_t index = next_in_++ % in_.size();
    while (in_[index].reserved) index = next_in_++ % in_.size();  // read_ahead_buffers < buffer_count
    SwapIn& slot = in_[index];
    if (slot.used) MEMWALL_RETURN_IF_ERROR(slot.copied->Synchronize());
    slot.used = false;
    const Span span = SpanOf(begin, n);
    if (health().ok()) {
      absl::StatusOr<AioRequest> read = aio_->Read(file_.id(), span.first, slot.buffer.data(), span.bytes());
      if (!read.ok()) {
        (void)Break(read.status());
      } else {
        MEMWALL_RETURN_IF_ERROR(AwaitOn(stream, *std::move(read), span));
      }
    }
    return Tensor::Flat(slot.buffer.as<char>() + (begin * elem_ - span.first), dtype_, n);
  }

  // [Note: parameter read-ahead]
  // A free swap-in buffer (not reserved, its last copy out done) takes the
  // read now; Fetch of the same range finds it in flight. At most read_ahead_buffers are reserved, so a gather's own
  // Fetch always has a buffer. None starts while a write is in flight (it
  // could read the old values), and an update cancels them all.
  bool ReadAhead(int64_t begin, int64_t n) override {
    for (const Ahead& a : ahead_) {
      if (a.begin == begin && a.n == n) return true;
    }
    if (static_cast<int64_t>(ahead_.size()) >= read_ahead_buffers_ || !CheckRange(begin, n).ok() || !health().ok()) {
      return false;
    }
    for (const SwapOut& s : out_) {
      if (s.writing) return false;
    }
    for (size_t i = 0; i < in_.size(); ++i) {
      SwapIn& slot = in_[i];
      if (slot.reserved) continue;
      if (slot.used) {
        absl::StatusOr<bool> done = slot.copied->Query();
        if (!done.ok() || !*done) continue;
      }
      const Span span = SpanOf(begin, n);
      absl::StatusOr<AioRequest> read = aio_->Read(file_.id(), span.first, slot.buffer.data(), span.bytes());
      if (!read.ok()) {
        (void)Break(read.status());
        return false;
      }
      slot.used = false;
      slot.reserved = true;
      ahead_.push_back({begin, n, i, span, *std::move(read)});
      return true;
    }
    return false;
  }

  absl::Status CancelReadAhead() override {
    absl::Status first;
    for (Ahead& a : ahead_) {
      in_[a.slot].reserved = false;
      const absl::Status st = aio_->Wait(a.request);
      if (!st.ok() && first.ok()) first = Break(SwapInError(st, a.span));
    }
    ahead_.clear();
    return first;
  }

  absl::Status Release(const Tensor& fetched, Stream& stream) override {
    for (SwapIn& s : in_) {
      if (Holds(s.buffer, fetched)) {
        s.used = true;
        return stream.Record(*s.copied);
      }
    }
    return absl::InternalError("NVMe parameters: released memory that no swap-in buffer holds");
  }

  absl::StatusOr<Tensor> BeginUpdate(int64_t begin, int64_t n, Stream&) override {
    MEMWALL_RETURN_IF_ERROR(CheckRange(begin, n));
    MEMWALL_RETURN_IF_ERROR(CancelReadAhead());  // they would hold the old values
    MEMWALL_RETURN_IF_ERROR(health());
    for (SwapIn& s : in_) {  // no read of the old values is still in flight
      if (s.used) MEMWALL_RETURN_IF_ERROR(s.copied->Synchronize());
    }
    SwapOut& slot = out_[next_out_++ % out_.size()];
    MEMWALL_RETURN_IF_ERROR(Settle(slot));
    slot.span = SpanOf(begin, n);
    const int64_t head = begin * elem_ - slot.span.first;
    const int64_t tail = slot.span.last - (begin + n) * elem_;
    const bool shard_end = begin + n == elements_;  // past it the file holds nothing
    if (head != 0 || (tail != 0 && !shard_end)) {
      // The edge blocks hold neighbours: read them once every write is in.
      MEMWALL_RETURN_IF_ERROR(SettleWrites());
      absl::StatusOr<AioRequest> read = aio_->Read(file_.id(), slot.span.first, slot.buffer.data(), slot.span.bytes());
      if (!read.ok()) return Break(read.status());
      if (absl::Status st = aio_->Wait(*read); !st.ok()) return Break(st);
    } else if (tail != 0) {
      std::memset(slot.buffer.as<char>() + slot.span.bytes() - tail, 0, tail);
    }
    return Tensor::Flat(slot.buffer.as<char>() + head, dtype_, n);
  }

  absl::Status EndUpdate(const Tensor& updated, Stream& stream) override {
    for (SwapOut& s : out_) {
      if (!Holds(s.buffer, updated)) continue;
      MEMWALL_RETURN_IF_ERROR(stream.Synchronize());  // the copy into it is done
      absl::StatusOr<AioRequest> write = aio_->Write(file_.id(), s.span.first, s.buffer.data(), s.span.bytes());
      if (!write.ok()) return Break(write.status());
      s.request = *std::move(write);
      s.writing = true;
      return absl::OkStatus();
    }
    return absl::InternalError("NVMe parameters: an update in memory that no swap-out buffer holds");
  }

  absl::Status Sync() override {
    MEMWALL_RETURN_IF_ERROR(SettleWrites());
    return health();
  }

 private:
  absl::Status CheckRange(int64_t begin, int64_t n) const {
    if (begin < 0 || n < 0 || begin + n > elements_) {
      return absl::OutOfRangeError(absl::StrCat("parameter shard elements [", begin, ", ", begin + n,
                                                ") outside the shard's ", elements_));
    }
    if (n > limit_) {
      return absl::InvalidArgumentError(absl::StrCat("NVMe parameters: ", n, " elements at once, but a swap buffer "
                                                     "holds ", limit_, " (offload_param.buffer_elements)"));
    }
    return absl::OkStatus();
  }

  Span SpanOf(int64_t begin, int64_t n) const {
    return {RoundDown(begin * elem_), AioAligned((begin + n) * elem_)};
  }

  static bool Holds(const Buffer& b, const Tensor& t) {
    const char* p = t.data_as<char>();
    return p >= b.as<char>() && p < b.as<char>() + b.bytes();
  }

  static absl::Status SwapInError(const absl::Status& st, Span span) {
    return Annotate(st, absl::StrCat("swap-in of bytes [", span.first, ", ", span.last, ")"));
  }

  // Queues on `stream` the wait for a read into a swap-in buffer; a failure
  // breaks the store (health()), it does not fail the stream.
  absl::Status AwaitOn(Stream& stream, AioRequest request, Span span) {
    return stream.EnqueueHost([this, request = std::move(request), span]() mutable {
      const absl::Status st = aio_->Wait(request);
      if (!st.ok()) {
        (void)Break(SwapInError(st, span));
      } else if (timeline_ != nullptr) {
        timeline_->AddSpan(kParamSwapInTrack, ZoneKind::kParamSwapIn, request.submitted_ns(), request.completed_ns(),
                           span.bytes());
      }
      return absl::OkStatus();
    });
  }

  // Keeps the first failure (see health()) and returns `st`.
  absl::Status Break(absl::Status st) {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.ok()) broken_ = st;
    return st;
  }

  absl::Status Settle(SwapOut& s) {
    if (!s.writing) return absl::OkStatus();
    s.writing = false;
    const absl::Status st = aio_->Wait(s.request);
    if (!st.ok()) {
      return Break(Annotate(st, absl::StrCat("NVMe parameters, swap-out of bytes [", s.span.first, ", ", s.span.last,
                                             ")")));
    }
    if (timeline_ != nullptr) {
      timeline_->AddSpan(kParamSwapOutTrack, ZoneKind::kParamSwapOut, s.request.submitted_ns(),
                         s.request.completed_ns(), s.span.bytes());
    }
    return absl::OkStatus();
  }

  absl::Status SettleWrites() {
    absl::Status first;
    for (SwapOut& s : out_) {
      const absl::Status st = Settle(s);
      if (first.ok()) first = st;
    }
    return first;
  }

  Device& device_;
  const std::string path_;
  const int64_t elements_;
  const DType dtype_;
  const int64_t elem_;
  const int64_t limit_;
  const int64_t read_ahead_buffers_;
  Timeline* const timeline_;
  std::vector<SwapIn> in_;
  std::vector<Ahead> ahead_;  // read-aheads in flight, oldest first
  std::vector<SwapOut> out_;
  size_t next_in_ = 0, next_out_ = 0;
  std::unique_ptr<AioEngine> aio_;
  SwapFile file_;  // locked while this store lives
  mutable std::mutex mu_;
  absl::Status broken_;  // the first failed transfer (reads fail on the streams' threads)
};

// [Note: the host part] (the header): elements [0, H) in pinned host
// memory, [H, elements) in `drive` (null when nothing is on the drive).
class HostPartStore : public zero::ParameterStore {
 public:
  HostPartStore(Buffer host, Tensor part, int64_t elements, std::unique_ptr<zero::ParameterStore> drive)
      : host_(std::move(host)), part_(std::move(part)), elements_(elements), drive_(std::move(drive)) {}

  int64_t elements() const override { return elements_; }
  DType dtype() const override { return part_.dtype(); }
  std::optional<Tensor> resident() const override { return std::nullopt; }
  int64_t FetchLimit(int64_t begin) const override {
    if (begin < H()) return H() - begin;
    return drive_ ? drive_->FetchLimit(begin - H()) : std::numeric_limits<int64_t>::max();
  }
  bool fails_alone() const override { return drive_ != nullptr; }
  absl::Status health() const override { return drive_ ? drive_->health() : absl::OkStatus(); }

  absl::StatusOr<Tensor> Fetch(int64_t begin, int64_t n, Stream& stream) override {
    MEMWALL_RETURN_IF_ERROR(CheckRange(begin, n));
    if (begin < H() || !drive_) return part_.Slice(begin, n);
    return drive_->Fetch(begin - H(), n, stream);
  }
  absl::Status Release(const Tensor& fetched, Stream& stream) override {
    return InHost(fetched) || !drive_ ? absl::OkStatus() : drive_->Release(fetched, stream);
  }
  absl::StatusOr<Tensor> BeginUpdate(int64_t begin, int64_t n, Stream& stream) override {
    MEMWALL_RETURN_IF_ERROR(CheckRange(begin, n));
    if (begin < H() || !drive_) return part_.Slice(begin, n);
    return drive_->BeginUpdate(begin - H(), n, stream);
  }
  absl::Status EndUpdate(const Tensor& updated, Stream& stream) override {
    return InHost(updated) || !drive_ ? absl::OkStatus() : drive_->EndUpdate(updated, stream);
  }
  absl::Status Sync() override { return drive_ ? drive_->Sync() : absl::OkStatus(); }
  bool ReadAhead(int64_t begin, int64_t n) override {
    if (begin < H() || !drive_) return true;  // nothing to read: the caller hints on
    return drive_->ReadAhead(begin - H(), n);
  }
  absl::Status CancelReadAhead() override { return drive_ ? drive_->CancelReadAhead() : absl::OkStatus(); }

 private:
  int64_t H() const { return part_.numel(); }

  absl::Status CheckRange(int64_t begin, int64_t n) const {
    if (begin < 0 || n < 0 || begin + n > elements_) {
      return absl::OutOfRangeError(absl::StrCat("parameter shard elements [", begin, ", ", begin + n,
                                                ") outside the shard's ", elements_));
    }
    if (begin < H() && begin + n > H()) {
      return absl::InvalidArgumentError(absl::StrCat("NVMe parameters: elements [", begin, ", ", begin + n,
                                                     ") span the host part's end at ", H(),
                                                     " (offload_param.host_elements); FetchLimit stops there"));
    }
    return absl::OkStatus();
  }

  bool InHost(const Tensor& t) const {
    const char* p = t.data_as<char>();
    return p >= host_.as<char>() && p < host_.as<char>() + host_.bytes();
  }

  Buffer host_;
  Tensor part_;  // [0, H) of the shard, over host_
  const int64_t elements_;
  std::unique_ptr<zero::ParameterStore> drive_;
};

}  // namespace

NvmeParameterStoreOptions ParameterStoreOptions(const zero::PlanShape& shape, int rank) {
  NvmeParameterStoreOptions o;
  o.dir = shape.zero.offload_param().nvme_path();
  o.rank = rank;
  o.elements = shape.shard;
  o.dtype = shape.dtype;
  o.tag = shape.values_tag();
  const zero::OffloadParamConfig& param = shape.zero.offload_param();
  o.host_elements = param.host_elements();
  o.buffer_elements = std::min(param.has_buffer_elements() ? param.buffer_elements()
                                                           : shape.zero.offload_optimizer().tile_elements(),
                               std::max<int64_t>(1, DriveElements(o)));
  o.buffer_count = shape.zero.offload_param().buffer_count();
  o.read_ahead_buffers = shape.zero.offload_param().read_ahead_buffers();
  o.aio = AioOptionsFor(shape.zero.aio());
  return o;
}

int64_t ParameterSwapBufferBytes(const NvmeParameterStoreOptions& o) {
  return AioAligned(std::max<int64_t>(1, o.buffer_elements) * static_cast<int64_t>(SizeOf(o.dtype))) + kAioAlignment;
}

MemoryPlan NvmeParameterStorePlan(const NvmeParameterStoreOptions& o) {
  MemoryPlan plan;
  if (HostElements(o) > 0) {
    plan.Add("param host part", MemorySpace::kPinnedHost, o.tag,
             HostElements(o) * static_cast<int64_t>(SizeOf(o.dtype)));
  }
  if (DriveElements(o) == 0) return plan;
  const int64_t bytes = ParameterSwapBufferBytes(o);
  for (int64_t i = 0; i < o.buffer_count; ++i) {
    plan.Add(absl::StrCat("param swap-in buffer ", i), MemorySpace::kPinnedHost, o.tag, bytes);
  }
  for (int64_t i = 0; i < kParamSwapOutBuffers; ++i) {
    plan.Add(absl::StrCat("param swap-out buffer ", i), MemorySpace::kPinnedHost, o.tag, bytes);
  }
  plan.AddFile("param swap file", SwapPath(o), o.tag, FileBytes(o));
  return plan;
}

absl::StatusOr<std::unique_ptr<zero::ParameterStore>> CreateNvmeParameterStore(Device& device,
                                                                              const NvmeParameterStoreOptions& o) {
  if (o.elements <= 0 || o.buffer_elements <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("NVMe parameters: ", o.elements, " elements through buffers of ",
                                                   o.buffer_elements));
  }
  if (o.buffer_count < 2) {
    return absl::InvalidArgumentError(absl::StrCat("NVMe parameters: offload_param.buffer_count = ", o.buffer_count,
                                                   " must be >= 2"));
  }
  if (o.read_ahead_buffers < 0 || o.read_ahead_buffers > o.buffer_count - 1) {
    return absl::InvalidArgumentError(absl::StrCat("NVMe parameters: offload_param.read_ahead_buffers = ",
                                                   o.read_ahead_buffers, " must be in [0, buffer_count - 1 = ",
                                                   o.buffer_count - 1, "]"));
  }
  if (o.host_elements < 0) {
    return absl::InvalidArgumentError(absl::StrCat("NVMe parameters: offload_param.host_elements = ", o.host_elements,
                                                   " must be >= 0"));
  }
  if (o.dir.empty()) return absl::InvalidArgumentError("NVMe parameters: offload_param.nvme_path is empty");
  std::unique_ptr<zero::ParameterStore> drive;
  if (DriveElements(o) > 0) {
    auto store = std::make_unique<NvmeParameterStore>(device, o);
    MEMWALL_RETURN_IF_ERROR(store->Init(o));
    drive = std::move(store);
  }
  if (HostElements(o) == 0) return drive;
  const MemoryPlan plan = NvmeParameterStorePlan(o);
  MEMWALL_ASSIGN_OR_RETURN(Buffer host, AllocatePlanned(device, plan, "param host part"));
  ZeroHost(host.data(), host.bytes());
  Tensor part = Tensor::OfBuffer(host, o.dtype, &device);
  return std::unique_ptr<zero::ParameterStore>(
      std::make_unique<HostPartStore>(std::move(host), std::move(part), o.elements, std::move(drive)));
}

zero::ParameterStoreProvider NvmeParameterStoreProvider(int rank, Timeline* timeline,
                                                        AioFaultInjector fault_injector) {
  zero::ParameterStoreProvider p;
  p.plan = [rank](const zero::PlanShape& shape) { return NvmeParameterStorePlan(ParameterStoreOptions(shape, rank)); };
  p.create = [rank, timeline, fault_injector](Device& device, const zero::PlanShape& shape) {
    NvmeParameterStoreOptions o = ParameterStoreOptions(shape, rank);
    o.timeline = timeline;
    o.fault_injector = fault_injector;
    return CreateNvmeParameterStore(device, o);
  };
  return p;
}

}  // namespace memwall::infinity
