#include "runtime/device.h"

#include <sys/mman.h>

#include <chrono>
#include <cstdint>
#include <utility>

namespace memwall {

void AdviseHugePages(void* p, size_t bytes) {
  constexpr uintptr_t kHugePageBytes = uintptr_t{2} << 20;  // x86-64's transparent huge page
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHugePageBytes - 1);
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

absl::string_view DeviceKindName(DeviceKind kind) {
  return kind == DeviceKind::kCuda ? "cuda" : "cpu";
}

absl::StatusOr<Buffer> Allocator::Allocate(size_t bytes, MemoryTag tag, Stream* stream) {
  Buffer buffer;
  if (bytes == 0) return buffer;
  // Account first: a request past the budget fails without touching memory.
  if (absl::Status s = account().Reserve(tag, bytes); !s.ok()) return s;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<void*> ptr = AllocateRaw(bytes, tag, stream);
  allocate_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  if (!ptr.ok()) {
    account().Release(tag, bytes);
    return ptr.status();
  }
  buffer.allocator_ = this;
  buffer.stream_ = stream;
  buffer.data_ = *ptr;
  buffer.bytes_ = bytes;
  buffer.tag_ = tag;
  return buffer;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Reset();
    allocator_ = std::exchange(other.allocator_, nullptr);
    stream_ = std::exchange(other.stream_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    tag_ = other.tag_;
  }
  return *this;
}

void Buffer::Reset() {
  if (data_ == nullptr) return;
  // FreeRaw releases the accounting when the memory is really returned
  // (immediately, or in stream order).
  allocator_->FreeRaw(data_, bytes_, tag_, stream_);
  allocator_ = nullptr;
  stream_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace memwall
