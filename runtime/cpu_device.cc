#include "runtime/cpu_device.h"

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "runtime/block_pool.h"
#include "runtime/status.h"

namespace memwall {
namespace {

class CpuDevice;

// Event state: `recorded` counts Record() calls; `completed` is the highest
// recorded generation whose work has run. Waiting for generation g means
// waiting for completed >= g.
class CpuEvent final : public Event {
 public:
  int64_t NextGeneration() {
    std::lock_guard<std::mutex> lock(mu_);
    return ++recorded_;
  }
  int64_t LastGeneration() {
    std::lock_guard<std::mutex> lock(mu_);
    return recorded_;
  }
  void Complete(int64_t generation) {
    // Notified under the lock: a waiter that returns may destroy the event
    // (and its condition variable) as soon as it can take the lock.
    std::lock_guard<std::mutex> lock(mu_);
    if (generation > completed_) completed_ = generation;
    completed_changed_.notify_all();
  }
  void WaitFor(int64_t generation) {
    std::unique_lock<std::mutex> lock(mu_);
    completed_changed_.wait(lock, [&] { return completed_ >= generation; });
  }

  absl::Status Synchronize() override {
    WaitFor(LastGeneration());
    return absl::OkStatus();
  }
  absl::StatusOr<bool> Query() override {
    std::lock_guard<std::mutex> lock(mu_);
    return completed_ >= recorded_;
  }

 private:
  std::mutex mu_;  // guards the two counters
  std::condition_variable completed_changed_;
  int64_t recorded_ = 0;
  int64_t completed_ = 0;
};

// One worker thread runs the stream's tasks in submission order.
class CpuStream final : public Stream {
 public:
  CpuStream(CpuDevice* device, std::string name);
  ~CpuStream() override;

  Device& device() override;
  const std::string& name() const override { return name_; }

  absl::Status Record(Event& event) override {
    auto* e = dynamic_cast<CpuEvent*>(&event);
    if (e == nullptr) return absl::InvalidArgumentError("Record: event is not a CpuDevice event");
    const int64_t generation = e->NextGeneration();
    Submit([e, generation] { e->Complete(generation); return absl::OkStatus(); },
           /*control=*/true);
    return absl::OkStatus();
  }

  absl::Status Wait(Event& event) override {
    auto* e = dynamic_cast<CpuEvent*>(&event);
    if (e == nullptr) return absl::InvalidArgumentError("Wait: event is not a CpuDevice event");
    const int64_t generation = e->LastGeneration();
    if (generation == 0) return absl::OkStatus();
    Submit([e, generation] { e->WaitFor(generation); return absl::OkStatus(); },
           /*control=*/true);
    return absl::OkStatus();
  }

  absl::Status Synchronize() override {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t target = submitted_;
    finished_changed_.wait(lock, [&] { return finished_ >= target; });
    return error_;
  }

  absl::Status Copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    if (dst == nullptr || src == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("Copy of ", bytes, " bytes on stream '",
                                                     name_, "': null pointer"));
    }
    Submit([dst, src, bytes] {
      std::memmove(dst, src, bytes);
      return absl::OkStatus();
    });
    return absl::OkStatus();
  }

  absl::Status Memset(void* dst, int value, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    if (dst == nullptr) return absl::InvalidArgumentError("Memset: null pointer");
    Submit([dst, value, bytes] {
      std::memset(dst, value, bytes);
      return absl::OkStatus();
    });
    return absl::OkStatus();
  }

  absl::Status EnqueueHost(std::function<absl::Status()> fn) override {
    Submit(std::move(fn));
    return absl::OkStatus();
  }

  void Fail(absl::Status status) override {
    if (status.ok()) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.ok()) error_ = Annotate(status, absl::StrCat("stream '", name_, "'"));
  }

  // Control tasks (event record/wait, stream-ordered frees) run even after
  // the stream has failed, so that nothing waiting on them hangs.
  void Submit(std::function<absl::Status()> fn, bool control = false) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back({std::move(fn), control});
      ++submitted_;
    }
    work_ready_.notify_one();
  }

 private:
  struct Task {
    std::function<absl::Status()> fn;
    bool control;
  };

  void Run() {
    while (true) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_ready_.wait(lock, [this] { return !queue_.empty() || stopping_; });
        if (queue_.empty()) return;  // stopping, and drained
        task = std::move(queue_.front());
        queue_.pop_front();
        if (!task.control && !error_.ok()) {
          ++finished_;
          lock.unlock();
          finished_changed_.notify_all();
          continue;
        }
      }
      absl::Status status = task.fn();
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!status.ok() && error_.ok()) {
          error_ = Annotate(status, absl::StrCat("stream '", name_, "'"));
        }
        ++finished_;
      }
      finished_changed_.notify_all();
    }
  }

  CpuDevice* const device_;
  const std::string name_;
  // mu_ guards the queue, the counters, stopping_ and error_.
  std::mutex mu_;
  std::condition_variable work_ready_;       // the queue grew, or stopping_
  std::condition_variable finished_changed_;  // finished_ grew
  std::deque<Task> queue_;
  int64_t submitted_ = 0;
  int64_t finished_ = 0;
  bool stopping_ = false;
  absl::Status error_;
  std::thread worker_;  // last: starts after the fields it reads exist
};

// Host memory under a budget. Device memory and pinned host memory of a
// CpuDevice are two of these with separate accounts.
class CpuAllocator final : public Allocator {
 public:
  CpuAllocator(CpuDevice* device, std::string name, size_t budget)
      : device_(device), account_(std::move(name), budget) {}

  MemoryAccount& account() override { return account_; }
  bool host_accessible() const override { return true; }

 protected:
  absl::StatusOr<void*> AllocateRaw(size_t bytes, MemoryTag tag, Stream* stream) override;
  // See [Note: buffer lifetime and streams]: the accounting is released now,
  // the memory once the stream reaches the free.
  void FreeRaw(void* ptr, size_t bytes, MemoryTag tag, Stream* stream) override {
    account_.Release(tag, bytes);
    const size_t rounded = WholePages(bytes);
    if (auto* s = dynamic_cast<CpuStream*>(stream); s != nullptr) {
      s->Submit(
          [this, ptr, rounded] {
            pool_.Give(ptr, rounded);
            return absl::OkStatus();
          },
          /*control=*/true);
      return;
    }
    pool_.Give(ptr, rounded);
  }

 private:
  CpuDevice* const device_;
  MemoryAccount account_;
  BlockPool pool_;  // runtime/block_pool.h; outlives the streams (~CpuDevice)
};

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(const CpuDeviceOptions& options)
      : name_(options.name),
        memory_(this, absl::StrCat(options.name, " device memory"), options.memory_budget_bytes),
        pinned_(this, absl::StrCat(options.name, " pinned host memory"),
                options.pinned_budget_bytes) {
    compute_ = std::make_unique<CpuStream>(this, "compute");
  }
  ~CpuDevice() override {
    compute_.reset();
    std::lock_guard<std::mutex> lock(mu_);
    if (!streams_.empty()) {
      std::fprintf(stderr, "memwall: %s destroyed while %zu of its streams are alive\n",
                   name_.c_str(), streams_.size());
      std::abort();
    }
  }

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  const std::string& name() const override { return name_; }
  Allocator& memory() override { return memory_; }
  Allocator& pinned_host() override { return pinned_; }
  Stream& compute_stream() override { return *compute_; }

  absl::StatusOr<std::unique_ptr<Stream>> CreateStream(absl::string_view name) override {
    return std::unique_ptr<Stream>(std::make_unique<CpuStream>(this, std::string(name)));
  }
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override {
    return std::unique_ptr<Event>(std::make_unique<CpuEvent>());
  }

  absl::Status Synchronize() override {
    std::vector<CpuStream*> streams;
    {
      std::lock_guard<std::mutex> lock(mu_);
      streams.assign(streams_.begin(), streams_.end());
    }
    absl::Status first;
    for (CpuStream* s : streams) {
      absl::Status status = s->Synchronize();
      if (first.ok()) first = status;
    }
    return first;
  }

  void Register(CpuStream* s) {
    std::lock_guard<std::mutex> lock(mu_);
    streams_.insert(s);
  }
  void Unregister(CpuStream* s) {
    std::lock_guard<std::mutex> lock(mu_);
    streams_.erase(s);
  }

 private:
  const std::string name_;
  CpuAllocator memory_;
  CpuAllocator pinned_;
  std::mutex mu_;  // guards streams_
  absl::flat_hash_set<CpuStream*> streams_;
  std::unique_ptr<CpuStream> compute_;
};

CpuStream::CpuStream(CpuDevice* device, std::string name)
    : device_(device), name_(std::move(name)), worker_([this] { Run(); }) {
  device_->Register(this);
}

CpuStream::~CpuStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_ready_.notify_one();
  worker_.join();  // runs what was queued first
  device_->Unregister(this);
}

Device& CpuStream::device() { return *device_; }

absl::StatusOr<void*> CpuAllocator::AllocateRaw(size_t bytes, MemoryTag tag, Stream* stream) {
  if (stream != nullptr && &stream->device() != device_) {
    return absl::InvalidArgumentError(absl::StrCat(
        account_.name(), ": allocation ordered on stream '", stream->name(),
        "' of another device (", stream->device().name(), ")"));
  }
  const size_t rounded = WholePages(bytes);
  if (void* cached = pool_.Take(rounded); cached != nullptr) return cached;
  void* ptr = nullptr;
  if (posix_memalign(&ptr, kCpuDeviceAlignment, rounded) != 0 || ptr == nullptr) {
    return MEMWALL_ERROR(absl::StatusCode::kResourceExhausted, account_.name(),
                         ": host allocation of ", FormatBytes(bytes), " for ",
                         MemoryTagName(tag), " failed: out of host memory");
  }
  AdviseHugePages(ptr, rounded);  // as the CUDA pinned allocator's pages
  pool_.Added(rounded);
  return ptr;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Device>> CreateCpuDevice(const CpuDeviceOptions& options) {
  if (options.name.empty()) return absl::InvalidArgumentError("CpuDeviceOptions.name is empty");
  return std::unique_ptr<Device>(std::make_unique<CpuDevice>(options));
}

}  // namespace memwall
