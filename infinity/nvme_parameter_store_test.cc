// The NVMe parameter store with a host part (nvme_parameter_store.h, [Note:
// the host part]) on its own, against values written through it:
//   - FetchLimit stops a range at the host part's end and at a swap
//     buffer's elements past it; a range across the end is refused;
//   - values updated in both parts read back as written, each part from its
//     own memory: the host part as a view of pinned memory, the rest
//     through the file, at file byte (e - H) x 2;
//   - the plan holds the host part's bytes, the swap buffers and a file of
//     only the rest; a host part of the whole shard has neither buffers nor
//     a file, and no file is made.
#include "infinity/nvme_parameter_store.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/cpu_device.h"

namespace memwall::infinity {
namespace {

std::string Dir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
  std::filesystem::create_directories(dir);
  return dir;
}

NvmeParameterStoreOptions Options(const std::string& dir, int64_t elements, int64_t host, int64_t buffer) {
  NvmeParameterStoreOptions o;
  o.dir = dir;
  o.elements = elements;
  o.dtype = DType::kBF16;
  o.host_elements = host;
  o.buffer_elements = buffer;
  o.buffer_count = 3;
  o.read_ahead_buffers = 1;
  return o;
}

uint16_t ValueOf(int64_t e) { return static_cast<uint16_t>(e * 7 + 3); }

TEST(NvmeParameterStore, AHostPartAndTheRestThroughTheFile) {
  constexpr int64_t kElements = 5000, kHost = 1234, kBuffer = 700;
  const std::string dir = Dir("host_part");
  auto device = *CreateCpuDevice();
  auto store = CreateNvmeParameterStore(*device, Options(dir, kElements, kHost, kBuffer));
  ASSERT_TRUE(store.ok()) << store.status();
  zero::ParameterStore& s = **store;
  Stream& stream = device->compute_stream();
  EXPECT_TRUE(s.fails_alone());
  EXPECT_FALSE(s.resident().has_value());
  EXPECT_EQ(s.FetchLimit(0), kHost);
  EXPECT_EQ(s.FetchLimit(kHost - 10), 10);
  EXPECT_EQ(s.FetchLimit(kHost), kBuffer);
  EXPECT_EQ(s.FetchLimit(kElements - 1), kBuffer);
  const auto across = s.Fetch(kHost - 10, 20, stream);
  ASSERT_FALSE(across.ok());
  EXPECT_EQ(across.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(across.status().message(), "span the host part's end at 1234")) << across.status();
  EXPECT_EQ(s.Fetch(kElements - 5, 10, stream).status().code(), absl::StatusCode::kOutOfRange);

  // Every element, in the ranges FetchLimit allows.
  for (int64_t begin = 0; begin < kElements;) {
    const int64_t n = std::min(kElements - begin, s.FetchLimit(begin));
    auto to = s.BeginUpdate(begin, n, stream);
    ASSERT_TRUE(to.ok()) << to.status();
    std::vector<uint16_t> values(n);
    for (int64_t i = 0; i < n; ++i) values[i] = ValueOf(begin + i);
    ASSERT_TRUE(stream.Copy(to->data(), values.data(), n * 2).ok());
    ASSERT_TRUE(s.EndUpdate(*to, stream).ok());
    ASSERT_TRUE(stream.Synchronize().ok());  // `values` is gone after this iteration
    begin += n;
  }
  ASSERT_TRUE(s.Sync().ok());
  EXPECT_TRUE(s.ReadAhead(0, 100)) << "the host part needs no read: hint on";
  EXPECT_TRUE(s.ReadAhead(kHost, 100));
  for (int64_t begin = 0; begin < kElements;) {
    const int64_t n = std::min(kElements - begin, s.FetchLimit(begin));
    auto from = s.Fetch(begin, n, stream);
    ASSERT_TRUE(from.ok()) << from.status();
    std::vector<uint16_t> got(n);
    ASSERT_TRUE(stream.Copy(got.data(), from->data(), n * 2).ok());
    ASSERT_TRUE(stream.Synchronize().ok());
    ASSERT_TRUE(s.Release(*from, stream).ok());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], ValueOf(begin + i)) << "element " << begin + i;
    begin += n;
  }
  ASSERT_TRUE(s.CancelReadAhead().ok());
  ASSERT_TRUE(stream.Synchronize().ok());
  // The file holds the rest from its first byte: element kHost + i at 2i.
  const std::string file = absl::StrCat(dir, "/memwall_params_rank0.swap");
  ASSERT_TRUE(std::filesystem::exists(file));
  EXPECT_EQ(int64_t(std::filesystem::file_size(file)), AioAligned((kElements - kHost) * 2));
  {
    std::FILE* f = std::fopen(file.c_str(), "rb");
    ASSERT_NE(f, nullptr);
    std::vector<uint16_t> head(16);
    ASSERT_EQ(std::fread(head.data(), 2, head.size(), f), head.size());
    std::fclose(f);
    for (size_t i = 0; i < head.size(); ++i) EXPECT_EQ(head[i], ValueOf(kHost + int64_t(i)));
  }

  const MemoryPlan plan = NvmeParameterStorePlan(Options(dir, kElements, kHost, kBuffer));
  EXPECT_EQ(plan.at("param host part").bytes, kHost * 2);
  EXPECT_EQ(plan.at("param host part").space, MemorySpace::kPinnedHost);
  EXPECT_EQ(plan.at("param swap file").bytes, AioAligned((kElements - kHost) * 2));
  EXPECT_EQ(plan.at("param swap-in buffer 0").bytes, AioAligned(kBuffer * 2) + kAioAlignment);
  store->reset();
  EXPECT_FALSE(std::filesystem::exists(file)) << "the store removes its file";
}

TEST(NvmeParameterStore, AHostPartOfTheWholeShardMakesNoFile) {
  constexpr int64_t kElements = 3000;
  const std::string dir = Dir("host_whole");
  for (const int64_t host : {kElements, 10 * kElements}) {
    SCOPED_TRACE(host);
    auto device = *CreateCpuDevice();
    const MemoryPlan plan = NvmeParameterStorePlan(Options(dir, kElements, host, 512));
    EXPECT_EQ(plan.buffers().size(), 1u) << plan.ToText();
    EXPECT_EQ(plan.at("param host part").bytes, kElements * 2);
    auto store = CreateNvmeParameterStore(*device, Options(dir, kElements, host, 512));
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_FALSE((*store)->fails_alone());
    EXPECT_TRUE(std::filesystem::is_empty(dir));
    EXPECT_EQ((*store)->FetchLimit(100), kElements - 100);
    auto end = (*store)->Fetch(kElements, 0, device->compute_stream());
    EXPECT_TRUE(end.ok()) << end.status();
  }
}

TEST(NvmeParameterStore, RefusesANegativeHostPart) {
  auto device = *CreateCpuDevice();
  auto store = CreateNvmeParameterStore(*device, Options(Dir("host_negative"), 100, -1, 64));
  ASSERT_FALSE(store.ok());
  EXPECT_TRUE(absl::StrContains(store.status().message(), "offload_param.host_elements = -1 must be >= 0"))
      << store.status();
}

}  // namespace
}  // namespace memwall::infinity
