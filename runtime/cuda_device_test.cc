// CudaDevice, CUDA conversion kernels and single-rank NCCL. Every test skips
// with the reason when no GPU is visible (CI has none); on a GPU machine the
// bundle (tools/gpu_bundle.sh) runs this binary.
#include "runtime/cuda_device.h"

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/communicator.h"
#include "runtime/cuda_convert.h"
#include "runtime/dtype.h"

namespace memwall {
namespace {

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string reason;
    if (CudaDeviceCount(&reason) == 0) GTEST_SKIP() << "needs a GPU: " << reason;
    auto device = CreateCudaDevice();
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = *std::move(device);
  }
  std::unique_ptr<Device> device_;
};

TEST_F(CudaDeviceTest, CopiesRoundTripThroughDeviceMemory) {
  const size_t n = (1 << 20) + 3;
  auto host = *device_->AllocatePinnedHost(n * 4, MemoryTag::kStaging);
  auto back = *device_->AllocatePinnedHost(n * 4, MemoryTag::kStaging);
  auto dev = *device_->Allocate(n * 4, MemoryTag::kMasterParams);
  for (size_t i = 0; i < n; ++i) host.as<float>()[i] = static_cast<float>(i) * 0.25f;
  Stream& s = device_->compute_stream();
  ASSERT_TRUE(s.Memset(back.data(), 0, n * 4).ok());
  ASSERT_TRUE(s.Copy(dev.data(), host.data(), n * 4).ok());
  ASSERT_TRUE(s.Copy(back.data(), dev.data(), n * 4).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  EXPECT_EQ(std::memcmp(host.data(), back.data(), n * 4), 0);
  EXPECT_FALSE(device_->memory().host_accessible());
  EXPECT_EQ(device_->memory().account().current(MemoryTag::kMasterParams), n * 4);
  EXPECT_EQ(device_->pinned_host().account().current(MemoryTag::kStaging), 2 * n * 4);
}

TEST_F(CudaDeviceTest, BudgetIsEnforcedWithTheSameMessageAsTheCpuDevice) {
  CudaDeviceOptions options;
  options.memory_budget_bytes = 1 << 20;
  auto small = *CreateCudaDevice(options);
  auto a = small->Allocate(768 << 10, MemoryTag::kParams16);
  ASSERT_TRUE(a.ok());
  auto b = small->Allocate(512 << 10, MemoryTag::kActivations);
  ASSERT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("activations request of 512.00 KiB"), std::string::npos)
      << b.status();
  EXPECT_EQ(small->memory().account().total_current(), size_t{768} << 10);
}

TEST_F(CudaDeviceTest, EventsOrderAKernelBeforeACopyOnAnotherStream) {
  const size_t n = size_t{1} << 26;  // 256 MiB of fp32: the kernel takes a while
  auto src = *device_->Allocate(n * 4, MemoryTag::kMasterParams);
  auto dst = *device_->Allocate(n * 2, MemoryTag::kParams16);
  auto host = *device_->AllocatePinnedHost(n * 2, MemoryTag::kStaging);
  auto compute = *device_->CreateStream("compute");
  auto copy = *device_->CreateStream("copy");
  auto done = *device_->CreateEvent();
  ASSERT_TRUE(compute->Memset(src.data(), 0x3F, n * 4).ok());  // 0x3F3F3F3F = 0.7470...
  ASSERT_TRUE(compute->Memset(dst.data(), 0, n * 2).ok());
  ASSERT_EQ(cuda::F32ToBF16(src.as<float>(), dst.as<uint16_t>(), n, compute->native_handle()), 0);
  ASSERT_TRUE(compute->Record(*done).ok());
  ASSERT_TRUE(copy->Wait(*done).ok());
  ASSERT_TRUE(copy->Copy(host.data(), dst.data(), n * 2).ok());
  ASSERT_TRUE(copy->Synchronize().ok());
  const uint16_t expected = FloatToBF16(BitsToFloat(0x3F3F3F3F));
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += host.as<uint16_t>()[i] != expected;
  EXPECT_EQ(wrong, 0u);
}

TEST_F(CudaDeviceTest, HostFunctionsRunInStreamOrderAndErrorsAreSticky) {
  auto stream = *device_->CreateStream("host");
  std::vector<int> order;
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(stream->EnqueueHost([&order, i] { order.push_back(i); return absl::OkStatus(); }).ok());
  }
  ASSERT_TRUE(stream->Synchronize().ok());
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
  ASSERT_TRUE(stream->EnqueueHost([] { return absl::DataLossError("bad"); }).ok());
  bool ran = false;
  ASSERT_TRUE(stream->EnqueueHost([&] { ran = true; return absl::OkStatus(); }).ok());
  EXPECT_EQ(stream->Synchronize().code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(ran);
}

TEST_F(CudaDeviceTest, StreamOrderedFreeReturnsAccounting) {
  auto stream = *device_->CreateStream("alloc");
  MemoryAccount& account = device_->memory().account();
  const size_t before = account.total_current();
  {
    auto b = *device_->Allocate(1 << 20, MemoryTag::kActivations, stream.get());
    EXPECT_EQ(account.total_current(), before + (1 << 20));
    ASSERT_TRUE(stream->Memset(b.data(), 0, 1 << 20).ok());
  }
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(account.total_current(), before);
}

// Pinned host buffers start on a page whatever their size (the NVMe stores
// hand them to O_DIRECT reads and writes), take async copies both ways, and
// return their accounting.
TEST_F(CudaDeviceTest, PinnedHostBuffersArePageAlignedAndCopyAsync) {
  MemoryAccount& account = device_->pinned_host().account();
  const size_t before = account.total_current();
  for (size_t bytes : {size_t{1}, size_t{100}, size_t{36864}, size_t{1} << 20, (size_t{3} << 20) + 5}) {
    auto host = device_->pinned_host().Allocate(bytes, MemoryTag::kStaging);
    ASSERT_TRUE(host.ok()) << host.status();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(host->data()) % kPinnedHostAlignment, 0u) << bytes << " bytes";
    EXPECT_EQ(account.total_current(), before + bytes);
    auto dev = *device_->Allocate(bytes, MemoryTag::kStaging);
    for (size_t i = 0; i < bytes; ++i) host->as<uint8_t>()[i] = static_cast<uint8_t>(i * 7 + 1);
    Stream& s = device_->compute_stream();
    ASSERT_TRUE(s.Copy(dev.data(), host->data(), bytes).ok());
    ASSERT_TRUE(s.Synchronize().ok());
    std::memset(host->data(), 0, bytes);
    ASSERT_TRUE(s.Copy(host->data(), dev.data(), bytes).ok());
    ASSERT_TRUE(s.Synchronize().ok());
    for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(host->as<uint8_t>()[i], static_cast<uint8_t>(i * 7 + 1)) << i;
  }
  EXPECT_EQ(account.total_current(), before);
}

// The CUDA kernels share runtime/dtype_bits.h with the CPU; this checks the
// compiled device code against the CPU result, bit for bit.
TEST_F(CudaDeviceTest, ConversionKernelsMatchTheCpuBitForBit) {
  Stream& s = device_->compute_stream();
  void* stream = s.native_handle();
  // Every 16-bit pattern, both formats, to fp32.
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  auto d16 = *device_->Allocate(65536 * 2, MemoryTag::kOther);
  auto d32 = *device_->Allocate(65536 * 4, MemoryTag::kOther);
  std::vector<uint32_t> gpu(65536), cpu(65536);
  for (DType narrow : {DType::kF16, DType::kBF16}) {
    ASSERT_TRUE(s.Copy(d16.data(), all.data(), 65536 * 2).ok());
    auto fn = narrow == DType::kF16 ? cuda::F16ToF32 : cuda::BF16ToF32;
    ASSERT_EQ(fn(d16.as<uint16_t>(), d32.as<float>(), 65536, stream), 0);
    ASSERT_TRUE(s.Copy(gpu.data(), d32.data(), 65536 * 4).ok());
    ASSERT_TRUE(s.Synchronize().ok());
    ASSERT_TRUE(Convert(all.data(), narrow, cpu.data(), DType::kF32, 65536).ok());
    EXPECT_EQ(gpu, cpu) << DTypeName(narrow) << " -> fp32";
  }
  // Random fp32 bit patterns (NaN, Inf, subnormals included) to both formats.
  const size_t n = 1 << 22;
  std::vector<uint32_t> in(n);
  std::mt19937 gen(5);
  for (auto& x : in) x = gen();
  auto s32 = *device_->Allocate(n * 4, MemoryTag::kOther);
  auto o16 = *device_->Allocate(n * 2, MemoryTag::kOther);
  std::vector<uint16_t> gpu16(n), cpu16(n);
  for (DType narrow : {DType::kF16, DType::kBF16}) {
    ASSERT_TRUE(s.Copy(s32.data(), in.data(), n * 4).ok());
    auto fn = narrow == DType::kF16 ? cuda::F32ToF16 : cuda::F32ToBF16;
    ASSERT_EQ(fn(s32.as<float>(), o16.as<uint16_t>(), n, stream), 0);
    ASSERT_TRUE(s.Copy(gpu16.data(), o16.data(), n * 2).ok());
    ASSERT_TRUE(s.Synchronize().ok());
    ASSERT_TRUE(Convert(in.data(), DType::kF32, cpu16.data(), narrow, n).ok());
    EXPECT_EQ(gpu16, cpu16) << "fp32 -> " << DTypeName(narrow);
  }
}

TEST_F(CudaDeviceTest, SingleRankNcclCollectives) {
  auto comm_or = CreateCommunicator(*device_, CommBackend::kNccl);
  if (absl::IsUnavailable(comm_or.status())) GTEST_SKIP() << comm_or.status();
  ASSERT_TRUE(comm_or.ok()) << comm_or.status();
  auto comm = *std::move(comm_or);
  EXPECT_EQ(comm->world_size(), 1);
  Stream& s = device_->compute_stream();
  const size_t n = 1001;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    std::vector<float> values(n);
    for (size_t i = 0; i < n; ++i) values[i] = static_cast<float>(i % 50) - 7.5f;
    std::vector<uint8_t> raw(n * SizeOf(dtype)), out(n * SizeOf(dtype));
    ASSERT_TRUE(Convert(values.data(), DType::kF32, raw.data(), dtype, n).ok());
    auto a = *device_->Allocate(raw.size(), MemoryTag::kCommBuffers);
    auto b = *device_->Allocate(raw.size(), MemoryTag::kCommBuffers);
    const Tensor ta = Tensor::Flat(a.data(), dtype, n, device_.get());
    const Tensor tb = Tensor::Flat(b.data(), dtype, n, device_.get());
    ASSERT_TRUE(s.Copy(a.data(), raw.data(), raw.size()).ok());
    ASSERT_TRUE(comm->AllReduce(ta, tb, ReduceOp::kSum, s).ok());
    ASSERT_TRUE(comm->ReduceScatter(tb, ta, ReduceOp::kSum, s).ok());
    ASSERT_TRUE(comm->AllGather(ta, tb, s).ok());
    ASSERT_TRUE(comm->Broadcast(tb, 0, s).ok());
    ASSERT_TRUE(comm->Barrier(s).ok());
    ASSERT_TRUE(s.Copy(out.data(), b.data(), out.size()).ok());
    ASSERT_TRUE(s.Synchronize().ok());
    EXPECT_EQ(out, raw) << DTypeName(dtype);
  }
  // The NCCL backend refuses host memory with a clear message.
  std::vector<float> host(4);
  const absl::Status st = comm->AllReduce(Tensor::Flat(host.data(), DType::kF32, 4),
                                          Tensor::Flat(host.data(), DType::kF32, 4),
                                          ReduceOp::kSum, s);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("needs CUDA device memory"), std::string::npos) << st;
}

TEST(CudaAvailabilityTest, ReportsWhyThereIsNoDevice) {
  std::string reason;
  if (CudaDeviceCount(&reason) > 0) GTEST_SKIP() << "a GPU is visible; nothing to report";
  EXPECT_FALSE(reason.empty());
  auto device = CreateCudaDevice();
  EXPECT_EQ(device.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(device.status().message(), reason);
}

}  // namespace
}  // namespace memwall
