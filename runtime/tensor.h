// Tensor: a non-owning view of typed memory (pointer, dtype, shape, device).
// Ownership stays with a Buffer (or the caller); a Tensor never frees.
#ifndef MEMWALL_RUNTIME_TENSOR_H_
#define MEMWALL_RUNTIME_TENSOR_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "runtime/device.h"
#include "runtime/dtype.h"

namespace memwall {

class Tensor {
 public:
  Tensor() = default;
  // `device` == nullptr: host memory (pageable or pinned).
  Tensor(void* data, DType dtype, std::vector<int64_t> shape, Device* device = nullptr)
      : data_(data), dtype_(dtype), shape_(std::move(shape)), device_(device) {}
  // A 1-D view of n elements.
  static Tensor Flat(void* data, DType dtype, int64_t n, Device* device = nullptr) {
    return Tensor(data, dtype, {n}, device);
  }
  // A 1-D view over a whole Buffer.
  static Tensor OfBuffer(const Buffer& buffer, DType dtype, Device* device) {
    return Flat(buffer.data(), dtype, static_cast<int64_t>(buffer.bytes() / SizeOf(dtype)),
                device);
  }

  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  Device* device() const { return device_; }
  bool on_host() const { return device_ == nullptr || device_->kind() == DeviceKind::kCpu; }

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape_) n *= d;
    return n;
  }
  size_t bytes() const { return static_cast<size_t>(numel()) * SizeOf(dtype_); }

  // Elements [offset, offset + count) of the flattened tensor, as 1-D.
  Tensor Slice(int64_t offset, int64_t count) const {
    return Flat(static_cast<char*>(data_) + offset * SizeOf(dtype_), dtype_, count, device_);
  }

  // "bf16[4, 1024] on cuda:0".
  std::string DebugString() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_;
  Device* device_ = nullptr;
};

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_TENSOR_H_
