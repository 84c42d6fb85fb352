// The device abstraction every memwall layer computes on: memory with exact
// accounting, streams that run work in order, events that order streams.
//
// Two implementations share this interface (see docs/architecture.md):
//   CudaDevice (runtime/cuda_device.h)  a GPU: stream-ordered allocator,
//                                       CUDA streams/events, pinned host memory
//   CpuDevice  (runtime/cpu_device.h)   a simulated accelerator over host
//                                       memory with a byte budget; worker
//                                       threads play the streams
//
// [Note: buffer lifetime and streams]
// A Buffer allocated with a stream is freed in that stream's order: the
// memory returns to the device once all work submitted to that stream before
// the Buffer's destruction has run. Work on *other* streams that touches the
// buffer must be ordered before the destruction (the allocation stream waits
// on an event recorded after that work, or the caller synchronizes). A Buffer
// allocated without a stream is freed immediately, so no queued work may
// still use it. This is CUDA's stream-ordered allocator contract; the
// CpuDevice implements the same one. Accounting follows program order, not
// execution: a Buffer's bytes leave its MemoryAccount when Reset() or the
// destructor runs (as in CUDA, later work on the same stream may reuse them),
// so measured peaks are deterministic and identical on both devices.
//
// [Note: stream errors]
// Work enqueued on a stream may fail after the call that enqueued it returned.
// The first failure is sticky: later compute on that stream is skipped
// (Record and Wait still run, so other streams never hang on it) and
// Synchronize() returns the error. Fail() makes a failure to enqueue sticky
// the same way, where no caller can take its Status (a zone's destructor):
// the error surfaces at the next Synchronize, as a CUDA launch error does.
#ifndef MEMWALL_RUNTIME_DEVICE_H_
#define MEMWALL_RUNTIME_DEVICE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/memory.h"

namespace memwall {

class Buffer;
class Device;
class Stream;

enum class DeviceKind { kCpu, kCuda };

// Alignment of pinned host buffers (Device::pinned_host): a page.
inline constexpr size_t kPinnedHostAlignment = 4096;
// `bytes` rounded up to whole kPinnedHostAlignment pages: what a
// page-aligned allocation of `bytes` occupies.
constexpr size_t WholePages(size_t bytes) {
  return (bytes + kPinnedHostAlignment - 1) / kPinnedHostAlignment * kPinnedHostAlignment;
}
// Asks the kernel to back the 2 MiB-aligned part of [p, p + bytes) with
// transparent huge pages (madvise MADV_HUGEPAGE): 512x fewer page faults on
// first touch and TLB entries that each cover 2 MiB, for the gigabytes a
// state store or a gradient shard spans. A hint: where the kernel offers no
// huge pages, or the range holds no aligned 2 MiB, nothing changes.
void AdviseHugePages(void* p, size_t bytes);
absl::string_view DeviceKindName(DeviceKind kind);  // "cpu", "cuda"

// Allocates memory in one space (device memory or pinned host memory) and
// accounts every byte under its tag.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual MemoryAccount& account() = 0;
  // True when the host can dereference this memory (pinned host, CpuDevice).
  virtual bool host_accessible() const = 0;

  // A zero-byte request gives an empty Buffer. With `stream`, allocation and
  // free are ordered on it: see [Note: buffer lifetime and streams].
  absl::StatusOr<Buffer> Allocate(size_t bytes, MemoryTag tag, Stream* stream = nullptr);
  // Wall seconds spent getting memory so far (every Allocate, on any
  // thread): a large pinned allocation is its pages' first touch and
  // locking, which can be most of a large model's set-up.
  double allocate_seconds() const { return static_cast<double>(allocate_ns_.load()) * 1e-9; }

 protected:
  friend class Buffer;
  // Returns memory for `bytes` (> 0); Allocate has already reserved them.
  virtual absl::StatusOr<void*> AllocateRaw(size_t bytes, MemoryTag tag, Stream* stream) = 0;
  // Releases the accounting at once and the memory in `stream` order (or at
  // once without a stream).
  virtual void FreeRaw(void* ptr, size_t bytes, MemoryTag tag, Stream* stream) = 0;

 private:
  std::atomic<int64_t> allocate_ns_{0};
};

// Owns memory from an Allocator; returns it (and its accounting) on
// destruction. Move-only.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { Reset(); }

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }
  MemoryTag tag() const { return tag_; }
  Allocator* allocator() const { return allocator_; }
  bool empty() const { return data_ == nullptr; }
  // Frees now (in stream order if allocated with a stream).
  void Reset();

 private:
  friend class Allocator;
  Allocator* allocator_ = nullptr;
  Stream* stream_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  MemoryTag tag_ = MemoryTag::kOther;
};

// CUDA-style event: Record() captures the work submitted to a stream so far;
// Synchronize() waits for that work. Waiting for an event never recorded
// returns at once.
class Event {
 public:
  virtual ~Event() = default;
  virtual absl::Status Synchronize() = 0;
  // True when the recorded work has completed.
  virtual absl::StatusOr<bool> Query() = 0;
};

// An in-order queue of work on a device.
class Stream {
 public:
  virtual ~Stream() = default;
  virtual Device& device() = 0;
  virtual const std::string& name() const = 0;

  // Captures all work submitted to this stream so far in `event`.
  virtual absl::Status Record(Event& event) = 0;
  // Work submitted after this call starts only once `event`'s work is done.
  virtual absl::Status Wait(Event& event) = 0;
  // Blocks until all submitted work has run; returns the stream's sticky
  // error, if any (see [Note: stream errors]).
  virtual absl::Status Synchronize() = 0;

  // Copies `bytes` between any two of: this device's memory, pinned host
  // memory, pageable host memory (synchronous on CUDA for pageable memory).
  virtual absl::Status Copy(void* dst, const void* src, size_t bytes) = 0;
  virtual absl::Status Memset(void* dst, int value, size_t bytes) = 0;
  // Runs `fn` on the host in stream order (CpuDevice: how kernels run; CUDA:
  // cudaLaunchHostFunc, so `fn` must not call CUDA). A failing fn makes the
  // stream's error sticky.
  virtual absl::Status EnqueueHost(std::function<absl::Status()> fn) = 0;
  // Makes `status` (not OK) the stream's sticky error unless it already has
  // one; see [Note: stream errors].
  virtual void Fail(absl::Status status) = 0;
  // cudaStream_t for CUDA streams, nullptr otherwise.
  virtual void* native_handle() { return nullptr; }
};

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;
  // "cpu:0", "cuda:0 (NVIDIA H100 80GB HBM3)".
  virtual const std::string& name() const = 0;
  // Device memory, and pinned host memory for fast, async host<->device
  // copies. Pinned host buffers start on a kPinnedHostAlignment boundary on
  // every device, so they are ready for O_DIRECT I/O (the NVMe stores read
  // and write them directly).
  virtual Allocator& memory() = 0;
  virtual Allocator& pinned_host() = 0;

  virtual absl::StatusOr<std::unique_ptr<Stream>> CreateStream(absl::string_view name) = 0;
  virtual absl::StatusOr<std::unique_ptr<Event>> CreateEvent() = 0;
  // The stream that work without a more specific one goes to.
  virtual Stream& compute_stream() = 0;
  // Waits for all work on all of this device's streams.
  virtual absl::Status Synchronize() = 0;

  absl::StatusOr<Buffer> Allocate(size_t bytes, MemoryTag tag, Stream* stream = nullptr) {
    return memory().Allocate(bytes, tag, stream);
  }
  absl::StatusOr<Buffer> AllocatePinnedHost(size_t bytes, MemoryTag tag) {
    return pinned_host().Allocate(bytes, tag);
  }
};

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_DEVICE_H_
