// Test helper for ops on a device: owns device buffers for one test and
// moves values to and from them synchronously, in fp32 or a 16-bit format.
#ifndef MEMWALL_OPS_DEVICE_SCRATCH_TESTING_H_
#define MEMWALL_OPS_DEVICE_SCRATCH_TESTING_H_

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace memwall::ops::testing {

// `values` rounded to `dtype` and widened back: what a 16-bit buffer holds.
inline std::vector<float> RoundTo(const std::vector<float>& values, DType dtype) {
  if (dtype == DType::kF32) return values;
  std::vector<uint16_t> half(values.size());
  std::vector<float> out(values.size());
  EXPECT_TRUE(Convert(values.data(), DType::kF32, half.data(), dtype, values.size()).ok());
  EXPECT_TRUE(Convert(half.data(), dtype, out.data(), DType::kF32, values.size()).ok());
  return out;
}

class Scratch {
 public:
  // Every tensor starts `offset_bytes` past its allocation (which the device
  // aligns): 4 puts fp32 and bf16 data off a 16-byte boundary.
  explicit Scratch(Device& device, int64_t offset_bytes = 0) : device_(device), offset_(offset_bytes) {}
  // Raw bytes of `h` as a tensor of `dtype` (int32 ids, fp32 values).
  template <typename T>
  Tensor Upload(const std::vector<T>& h, std::vector<int64_t> shape, DType dtype = DType::kF32) {
    buffers_.push_back(*device_.Allocate(offset_ + h.size() * sizeof(T) + 4, MemoryTag::kActivations));
    char* const at = static_cast<char*>(buffers_.back().data()) + offset_;
    EXPECT_TRUE(stream().Copy(at, h.data(), h.size() * sizeof(T)).ok());
    EXPECT_TRUE(stream().Synchronize().ok());
    return Tensor(at, dtype, std::move(shape), &device_);
  }
  // fp32 values stored as `dtype` (rounded to nearest even when 16-bit).
  Tensor UploadAs(const std::vector<float>& h, std::vector<int64_t> shape, DType dtype) {
    if (dtype == DType::kF32) return Upload(h, std::move(shape));
    std::vector<uint16_t> half(h.size());
    EXPECT_TRUE(Convert(h.data(), DType::kF32, half.data(), dtype, h.size()).ok());
    return Upload(half, std::move(shape), dtype);
  }
  // All-zero bytes (0.0 in every float type), set on the device: no host
  // copy, which for the row-block tests' (9000, 2048) tensors was most of
  // their time.
  Tensor ZerosAs(std::vector<int64_t> shape, DType dtype) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const size_t bytes = static_cast<size_t>(n) * SizeOf(dtype);
    buffers_.push_back(*device_.Allocate(offset_ + bytes + 4, MemoryTag::kActivations));
    char* const at = static_cast<char*>(buffers_.back().data()) + offset_;
    EXPECT_TRUE(stream().Memset(at, 0, bytes).ok());
    EXPECT_TRUE(stream().Synchronize().ok());
    return Tensor(at, dtype, std::move(shape), &device_);
  }
  Tensor Zeros(std::vector<int64_t> shape) { return ZerosAs(std::move(shape), DType::kF32); }
  // Any floating tensor, widened exactly to fp32.
  std::vector<float> Download(const Tensor& t) {
    std::vector<char> raw(t.bytes());
    EXPECT_TRUE(stream().Copy(raw.data(), t.data(), t.bytes()).ok());
    EXPECT_TRUE(stream().Synchronize().ok());
    std::vector<float> out(t.numel());
    EXPECT_TRUE(Convert(raw.data(), t.dtype(), out.data(), DType::kF32, out.size()).ok());
    return out;
  }
  Stream& stream() { return device_.compute_stream(); }

 private:
  Device& device_;
  int64_t offset_;
  std::vector<Buffer> buffers_;
};

}  // namespace memwall::ops::testing

#endif  // MEMWALL_OPS_DEVICE_SCRATCH_TESTING_H_
