#include "infinity/nvme_parameter_store.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "runtime/status.h"

namespace memwall::infinity {
namespace {

int64_t RoundUp(int64_t bytes) { return (bytes + kAioAlignment - 1) / kAioAlignment * kAioAlignment; }
int64_t RoundDown(int64_t bytes) { return bytes / kAioAlignment * kAioAlignment; }

std::string SwapPath(const NvmeParameterStoreOptions& o) {
  return absl::StrCat(o.dir, "/memwall_params_rank", o.rank, ".swap");
}

int64_t FileBytes(const NvmeParameterStoreOptions& o) {
  return RoundUp(o.elements * static_cast<int64_t>(SizeOf(o.dtype)));
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
  };
  struct SwapOut {
    Buffer buffer;
    Span span;
    AioRequest request;
    bool writing = false;
  };

  NvmeParameterStore(Device& device, const NvmeParameterStoreOptions& o)
      : device_(device),
        path_(SwapPath(o)),
        elements_(o.elements),
        dtype_(o.dtype),
        elem_(static_cast<int64_t>(SizeOf(o.dtype))),
        limit_(std::max<int64_t>(1, o.buffer_elements)),
        timeline_(o.timeline) {}

  ~NvmeParameterStore() override {
    for (SwapIn& s : in_) {
      if (s.used) (void)s.copied->Synchronize();
    }
    for (SwapOut& s : out_) (void)Settle(s);
    // The engine first: it finishes every read still in flight (one whose
    // wait a failed stream skipped) before it closes the file under them.
    aio_.reset();
    ::unlink(path_.c_str());
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
  int64_t fetch_limit() const override { return limit_; }
  bool fails_alone() const override { return true; }

  absl::Status health() const override {
    absl::MutexLock lock(&mu_);
    if (broken_.ok()) return broken_;
    return absl::Status(broken_.code(),
                        absl::StrCat("NVMe parameters: resume from the last checkpoint: the swap file ", path_,
                                     " may hold stale parameters since an I/O error (", broken_.message(), ")"));
  }

  // Never fails for I/O (see the header): a broken store skips the read and
  // hands out the buffer as it is; health() says so.
  absl::StatusOr<Tensor> Fetch(int64_t begin, int64_t n, Stream& stream) override {
    MEMWALL_RETURN_IF_ERROR(CheckRange(begin, n));
    (void)SettleWrites();  // a read sees every update; a failure breaks the store
    SwapIn& slot = in_[next_in_++ % in_.size()];
    if (slot.used) MEMWALL_RETURN_IF_ERROR(slot.copied->Synchronize());
    slot.used = false;
    const Span span = SpanOf(begin, n);
    if (health().ok()) {
      absl::StatusOr<AioRequest> read = aio_->Read(file_, span.first, slot.buffer.data(), span.bytes());
      if (!read.ok()) {
        (void)Break(read.status());
      } else {
        MEMWALL_RETURN_IF_ERROR(stream.EnqueueHost([this, request = *std::move(read), span]() mutable {
          const absl::Status st = aio_->Wait(request);
          if (!st.ok()) {
            (void)Break(absl::Status(st.code(), absl::StrCat("swap-in of bytes [", span.first, ", ", span.last,
                                                       "): ", st.message())));
          } else if (timeline_ != nullptr) {
            timeline_->AddSpan(kParamSwapInTrack, ZoneKind::kParamSwapIn, request.submitted_ns(),
                               request.completed_ns(), span.bytes());
          }
          return absl::OkStatus();
        }));
      }
    }
    return Tensor::Flat(slot.buffer.as<char>() + (begin * elem_ - span.first), dtype_, n);
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
      absl::StatusOr<AioRequest> read = aio_->Read(file_, slot.span.first, slot.buffer.data(), slot.span.bytes());
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
      absl::StatusOr<AioRequest> write = aio_->Write(file_, s.span.first, s.buffer.data(), s.span.bytes());
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
                                                     "holds ", limit_, " (offload_optimizer.tile_elements)"));
    }
    return absl::OkStatus();
  }

  Span SpanOf(int64_t begin, int64_t n) const {
    return {RoundDown(begin * elem_), RoundUp((begin + n) * elem_)};
  }

  static bool Holds(const Buffer& b, const Tensor& t) {
    const char* p = t.data_as<char>();
    return p >= b.as<char>() && p < b.as<char>() + b.bytes();
  }

  // Keeps the first failure (see health()) and returns `st`.
  absl::Status Break(absl::Status st) {
    absl::MutexLock lock(&mu_);
    if (broken_.ok()) broken_ = st;
    return st;
  }

  absl::Status Settle(SwapOut& s) {
    if (!s.writing) return absl::OkStatus();
    s.writing = false;
    const absl::Status st = aio_->Wait(s.request);
    if (!st.ok()) {
      return Break(absl::Status(st.code(), absl::StrCat("NVMe parameters, swap-out of bytes [", s.span.first, ", ",
                                                        s.span.last, "): ", st.message())));
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
  Timeline* const timeline_;
  std::vector<SwapIn> in_;
  std::vector<SwapOut> out_;
  size_t next_in_ = 0, next_out_ = 0;
  std::unique_ptr<AioEngine> aio_;
  AioFileId file_ = -1;
  mutable absl::Mutex mu_;
  absl::Status broken_;  // the first failed transfer (reads fail on the streams' threads)
};

}  // namespace

NvmeParameterStoreOptions ParameterStoreOptions(const zero::PlanShape& shape, int rank) {
  NvmeParameterStoreOptions o;
  o.dir = shape.zero.offload_param().nvme_path();
  o.rank = rank;
  o.elements = shape.shard;
  o.dtype = shape.dtype;
  o.tag = shape.values_tag();
  o.buffer_elements = std::min(shape.zero.offload_optimizer().tile_elements(), std::max<int64_t>(1, shape.shard));
  o.buffer_count = shape.zero.offload_param().buffer_count();
  return o;
}

int64_t ParameterSwapBufferBytes(const NvmeParameterStoreOptions& o) {
  return RoundUp(std::max<int64_t>(1, o.buffer_elements) * static_cast<int64_t>(SizeOf(o.dtype))) + kAioAlignment;
}

MemoryPlan NvmeParameterStorePlan(const NvmeParameterStoreOptions& o) {
  MemoryPlan plan;
  const int64_t bytes = ParameterSwapBufferBytes(o);
  for (int64_t i = 0; i < o.buffer_count; ++i) {
    plan.Add(absl::StrCat("param swap-in buffer ", i), MemorySpace::kPinnedHost, o.tag, bytes);
  }
  for (int64_t i = 0; i < kParamSwapOutBuffers; ++i) {
    plan.Add(absl::StrCat("param swap-out buffer ", i), MemorySpace::kPinnedHost, o.tag, bytes);
  }
  plan.Add("param swap file", MemorySpace::kNvme, o.tag, FileBytes(o));
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
  if (o.dir.empty()) return absl::InvalidArgumentError("NVMe parameters: offload_param.nvme_path is empty");
  auto store = std::make_unique<NvmeParameterStore>(device, o);
  MEMWALL_RETURN_IF_ERROR(store->Init(o));
  return std::unique_ptr<zero::ParameterStore>(std::move(store));
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
