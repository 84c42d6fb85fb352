#include "runtime/cuda_device.h"

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

#if MEMWALL_HAS_CUDA
#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "runtime/cuda_check.h"
#include "runtime/thread_pool.h"
#endif

namespace memwall {

#if !MEMWALL_HAS_CUDA

bool BuiltWithCuda() { return false; }

int CudaDeviceCount(std::string* reason) {
  if (reason != nullptr) *reason = "memwall was built without a CUDA toolkit";
  return 0;
}

absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(const CudaDeviceOptions&) {
  return absl::UnavailableError("memwall was built without a CUDA toolkit");
}

#else  // MEMWALL_HAS_CUDA

bool BuiltWithCuda() { return true; }

int CudaDeviceCount(std::string* reason) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (reason != nullptr) {
      *reason = absl::StrCat("no CUDA device visible (cudaGetDeviceCount: ",
                             cudaGetErrorString(err), ")");
    }
    cudaGetLastError();  // clear
    return 0;
  }
  if (count == 0 && reason != nullptr) *reason = "no CUDA device visible";
  return count;
}

namespace {

class CudaDevice;

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(cudaEvent_t event) : event_(event) {}
  ~CudaEvent() override { cudaEventDestroy(event_); }
  absl::Status Synchronize() override {
    MEMWALL_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event_));
    return absl::OkStatus();
  }
  absl::StatusOr<bool> Query() override {
    const cudaError_t err = cudaEventQuery(event_);
    if (err == cudaSuccess) return true;
    if (err == cudaErrorNotReady) return false;
    MEMWALL_CUDA_RETURN_IF_ERROR(err);
    return false;
  }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_;
};

class CudaStream final : public Stream {
 public:
  CudaStream(CudaDevice* device, std::string name, cudaStream_t stream)
      : device_(device), name_(std::move(name)), stream_(stream) {}
  ~CudaStream() override;

  Device& device() override;
  const std::string& name() const override { return name_; }
  void* native_handle() override { return stream_; }

  absl::Status Record(Event& event) override {
    auto* e = dynamic_cast<CudaEvent*>(&event);
    if (e == nullptr) return absl::InvalidArgumentError("Record: event is not a CUDA event");
    MEMWALL_CUDA_RETURN_IF_ERROR(cudaEventRecord(e->get(), stream_));
    return absl::OkStatus();
  }
  absl::Status Wait(Event& event) override {
    auto* e = dynamic_cast<CudaEvent*>(&event);
    if (e == nullptr) return absl::InvalidArgumentError("Wait: event is not a CUDA event");
    MEMWALL_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, e->get(), 0));
    return absl::OkStatus();
  }
  absl::Status Synchronize() override {
    MEMWALL_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    std::lock_guard<std::mutex> lock(mu_);
    return host_error_;
  }
  absl::Status Copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    MEMWALL_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
    return absl::OkStatus();
  }
  absl::Status Memset(void* dst, int value, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    MEMWALL_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst, value, bytes, stream_));
    return absl::OkStatus();
  }
  absl::Status EnqueueHost(std::function<absl::Status()> fn) override {
    struct Call {
      CudaStream* stream;
      std::function<absl::Status()> fn;
    };
    auto* call = new Call{this, std::move(fn)};
    const cudaError_t err = cudaLaunchHostFunc(
        stream_,
        [](void* arg) {
          std::unique_ptr<Call> c(static_cast<Call*>(arg));
          {
            std::lock_guard<std::mutex> lock(c->stream->mu_);
            if (!c->stream->host_error_.ok()) return;  // sticky: skip later work
          }
          absl::Status status = c->fn();
          std::lock_guard<std::mutex> lock(c->stream->mu_);
          if (!status.ok() && c->stream->host_error_.ok()) {
            c->stream->host_error_ =
                Annotate(status, absl::StrCat("stream '", c->stream->name_, "'"));
          }
        },
        call);
    if (err != cudaSuccess) delete call;
    MEMWALL_CUDA_RETURN_IF_ERROR(err);
    return absl::OkStatus();
  }

  void Fail(absl::Status status) override {
    if (status.ok()) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (host_error_.ok()) host_error_ = Annotate(status, absl::StrCat("stream '", name_, "'"));
  }

 private:
  CudaDevice* const device_;
  const std::string name_;
  cudaStream_t stream_;
  std::mutex mu_;
  absl::Status host_error_;
};

// Sets the calling thread's current device for the scope of a call.
class ScopedDevice {
 public:
  explicit ScopedDevice(int ordinal) {
    cudaGetDevice(&previous_);
    if (previous_ != ordinal) cudaSetDevice(ordinal);
  }
  ~ScopedDevice() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

class CudaMemory final : public Allocator {
 public:
  CudaMemory(int ordinal, std::string name, size_t budget, cudaStream_t alloc_stream)
      : ordinal_(ordinal), account_(std::move(name), budget), alloc_stream_(alloc_stream) {}
  MemoryAccount& account() override { return account_; }
  bool host_accessible() const override { return false; }

 protected:
  absl::StatusOr<void*> AllocateRaw(size_t bytes, MemoryTag tag, Stream* stream) override {
    ScopedDevice scoped(ordinal_);
    cudaStream_t s = stream != nullptr ? static_cast<cudaStream_t>(stream->native_handle())
                                       : alloc_stream_;
    void* ptr = nullptr;
    const cudaError_t err = cudaMallocAsync(&ptr, bytes, s);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      return MEMWALL_ERROR(absl::StatusCode::kResourceExhausted, account_.name(),
                           ": cudaMallocAsync of ", FormatBytes(bytes), " for ",
                           MemoryTagName(tag), " failed: out of memory (GPU free ",
                           FormatBytes(free_bytes), " of ", FormatBytes(total_bytes),
                           "; memwall in use ", FormatBytes(account_.total_current()),
                           "); does not fit: try activation checkpointing, a higher "
                           "ZeRO stage or offload");
    }
    MEMWALL_CUDA_RETURN_IF_ERROR(err);
    if (stream == nullptr) MEMWALL_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
    return ptr;
  }
  void FreeRaw(void* ptr, size_t bytes, MemoryTag tag, Stream* stream) override {
    ScopedDevice scoped(ordinal_);
    if (stream != nullptr) {
      cudaFreeAsync(ptr, static_cast<cudaStream_t>(stream->native_handle()));
    } else {
      // No stream: the contract says no queued work uses it any more.
      cudaFreeAsync(ptr, alloc_stream_);
      cudaStreamSynchronize(alloc_stream_);
    }
    account_.Release(tag, bytes);
  }

 private:
  const int ordinal_;
  MemoryAccount account_;
  cudaStream_t alloc_stream_;
};

class PinnedHostMemory final : public Allocator {
 public:
  PinnedHostMemory(int ordinal, std::string name, size_t budget)
      : ordinal_(ordinal), account_(std::move(name), budget) {}
  MemoryAccount& account() override { return account_; }
  bool host_accessible() const override { return true; }

 protected:
  // Whole pages from mmap, page-locked (portable and mapped, as
  // cudaHostAlloc's under unified addressing) with cudaHostRegister: the
  // buffer starts on a page (kPinnedHostAlignment), which cudaHostAlloc does
  // not promise (seen on an H100: a 36 KiB buffer off a page, which O_DIRECT
  // refused).
  //
  // Registering faults every page in on one thread; an 8B model's offload
  // pins about 110 GB (a 6B's modes took 76-92 s each to set up on an
  // H200 box). So the pages are
  // touched first on every host thread (ZeroHost), as transparent huge
  // pages where the kernel offers them (512x fewer faults, and a free
  // that does not walk 4 KiB pages), and registering finds them present.
  absl::StatusOr<void*> AllocateRaw(size_t bytes, MemoryTag tag, Stream*) override {
    ScopedDevice scoped(ordinal_);
    const size_t rounded = WholePages(bytes);
    void* ptr = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ptr == MAP_FAILED) {
      return MEMWALL_ERROR(absl::StatusCode::kResourceExhausted, account_.name(), ": mmap of ",
                           FormatBytes(bytes), " for ", MemoryTagName(tag), " failed: out of host memory");
    }
    AdviseHugePages(ptr, rounded);
    ZeroHost(ptr, rounded);
    const cudaError_t err = cudaHostRegister(ptr, rounded, cudaHostRegisterPortable | cudaHostRegisterMapped);
    if (err != cudaSuccess) {
      cudaGetLastError();
      munmap(ptr, rounded);
      return MEMWALL_ERROR(absl::StatusCode::kResourceExhausted, account_.name(),
                           ": cudaHostRegister of ", FormatBytes(bytes), " for ",
                           MemoryTagName(tag), " failed: ", cudaGetErrorString(err),
                           " (pinned memory is limited by RAM and ulimit -l)");
    }
    return ptr;
  }
  void FreeRaw(void* ptr, size_t bytes, MemoryTag tag, Stream*) override {
    cudaHostUnregister(ptr);
    munmap(ptr, WholePages(bytes));
    account_.Release(tag, bytes);
  }

 private:
  const int ordinal_;
  MemoryAccount account_;
};

class CudaDevice final : public Device {
 public:
  CudaDevice(int ordinal, std::string name, const CudaDeviceOptions& options,
             cudaStream_t alloc_stream, cudaStream_t compute)
      : ordinal_(ordinal),
        name_(std::move(name)),
        alloc_stream_(alloc_stream),
        memory_(ordinal, absl::StrCat(name_, " device memory"), options.memory_budget_bytes,
                alloc_stream),
        pinned_(ordinal, absl::StrCat(name_, " pinned host memory"),
                options.pinned_budget_bytes),
        compute_(std::make_unique<CudaStream>(this, "compute", compute)) {}
  ~CudaDevice() override {
    ScopedDevice scoped(ordinal_);
    compute_.reset();
    cudaStreamDestroy(alloc_stream_);
  }

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  const std::string& name() const override { return name_; }
  Allocator& memory() override { return memory_; }
  Allocator& pinned_host() override { return pinned_; }
  Stream& compute_stream() override { return *compute_; }
  int ordinal() const { return ordinal_; }

  absl::StatusOr<std::unique_ptr<Stream>> CreateStream(absl::string_view name) override {
    ScopedDevice scoped(ordinal_);
    cudaStream_t s;
    MEMWALL_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return std::unique_ptr<Stream>(std::make_unique<CudaStream>(this, std::string(name), s));
  }
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override {
    ScopedDevice scoped(ordinal_);
    cudaEvent_t e;
    MEMWALL_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return std::unique_ptr<Event>(std::make_unique<CudaEvent>(e));
  }
  absl::Status Synchronize() override {
    ScopedDevice scoped(ordinal_);
    MEMWALL_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    return compute_->Synchronize();
  }

 private:
  const int ordinal_;
  const std::string name_;
  cudaStream_t alloc_stream_;
  CudaMemory memory_;
  PinnedHostMemory pinned_;
  std::unique_ptr<CudaStream> compute_;
};

CudaStream::~CudaStream() { cudaStreamDestroy(stream_); }
Device& CudaStream::device() { return *device_; }

}  // namespace

absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(const CudaDeviceOptions& options) {
  std::string reason;
  const int count = CudaDeviceCount(&reason);
  if (count == 0) return absl::UnavailableError(reason);
  if (options.ordinal < 0 || options.ordinal >= count) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ordinal ", options.ordinal,
                                                   " is outside [0, ", count, ")"));
  }
  MEMWALL_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.ordinal));
  cudaDeviceProp prop;
  MEMWALL_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, options.ordinal));
  // Keep freed memory in the pool instead of returning it to the driver at
  // every synchronization: the point of a caching, stream-ordered allocator.
  cudaMemPool_t pool;
  MEMWALL_CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(&pool, options.ordinal));
  uint64_t threshold = UINT64_MAX;
  MEMWALL_CUDA_RETURN_IF_ERROR(
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  cudaStream_t alloc_stream, compute;
  MEMWALL_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&alloc_stream, cudaStreamNonBlocking));
  MEMWALL_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  return std::unique_ptr<Device>(std::make_unique<CudaDevice>(
      options.ordinal, absl::StrCat("cuda:", options.ordinal, " (", prop.name, ")"), options,
      alloc_stream, compute));
}

#endif  // MEMWALL_HAS_CUDA

}  // namespace memwall
