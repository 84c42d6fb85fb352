#include "runtime/block_pool.h"

#include <sanitizer/asan_interface.h>

#include <algorithm>
#include <cstdlib>

namespace memwall {

BlockPool::~BlockPool() {
  for (const auto& [bytes, block] : cached_) {
    ASAN_UNPOISON_MEMORY_REGION(block.ptr, bytes);
    std::free(block.ptr);
  }
}

void* BlockPool::Take(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = cached_.find(bytes); it != cached_.end()) {
    void* ptr = it->second.ptr;
    cached_.erase(it);
    cached_bytes_ -= bytes;
    Live(bytes);
    ASAN_UNPOISON_MEMORY_REGION(ptr, bytes);
    return ptr;
  }
  const size_t limit = std::max(peak_, live_ + bytes);
  while (!cached_.empty() && live_ + cached_bytes_ + bytes > limit) {
    auto oldest = cached_.begin();
    for (auto it = cached_.begin(); it != cached_.end(); ++it) {
      if (it->second.order < oldest->second.order) oldest = it;
    }
    ASAN_UNPOISON_MEMORY_REGION(oldest->second.ptr, oldest->first);
    std::free(oldest->second.ptr);
    cached_bytes_ -= oldest->first;
    cached_.erase(oldest);
  }
  return nullptr;
}

void BlockPool::Added(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  Live(bytes);
}

void BlockPool::Give(void* ptr, size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    live_ -= bytes;
    if (bytes >= kPooledBytes) {
      ASAN_POISON_MEMORY_REGION(ptr, bytes);
      cached_.emplace(bytes, Block{ptr, next_order_++});
      cached_bytes_ += bytes;
      return;
    }
  }
  std::free(ptr);
}

size_t BlockPool::live_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_;
}

size_t BlockPool::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_bytes_;
}

size_t BlockPool::peak_live_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

void BlockPool::Live(size_t bytes) {
  live_ += bytes;
  peak_ = std::max(peak_, live_);
}

}  // namespace memwall
