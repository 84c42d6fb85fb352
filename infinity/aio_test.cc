// The aio engine: what is written reads back, for block sizes, depths,
// thread counts and striping over several files; short transfers are
// continued; EIO, ENOSPC and an unexpected end of file become a Status
// naming the file, the offset and the errno (injected per block); misuse is
// refused with what is wrong.
#include "infinity/aio.h"

#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/io_probe.h"

namespace memwall::infinity {
namespace {

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

// A pattern that differs in every 8-byte word and between calls.
void Fill(char* p, int64_t bytes, uint64_t seed) {
  for (int64_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t v = (seed * 0x9E3779B97F4A7C15ull) ^ static_cast<uint64_t>(i);
    std::memcpy(p + i, &v, 8);
  }
}

// `bytes` of a pattern written at offset 0 of `f`, then read back equal.
void WriteThenReadBack(AioEngine& aio, AioFileId f, int64_t bytes, uint64_t seed) {
  auto out = AllocateAligned(bytes), in = AllocateAligned(bytes);
  Fill(out.get(), bytes, seed);
  auto w = aio.Write(f, 0, out.get(), bytes);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(aio.Wait(*w).ok());
  auto r = aio.Read(f, 0, in.get(), bytes);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(aio.Wait(*r).ok());
  EXPECT_EQ(std::memcmp(in.get(), out.get(), bytes), 0);
}

struct Case {
  int64_t block;
  int depth;
  int threads;
  int paths;
  bool io_uring = true;
};

TEST(Aio, WhatIsWrittenReadsBack) {
  const int64_t bytes = 3 * 1024 * 1024 + 5 * kAioAlignment;  // not a whole number of blocks
  for (const Case& c : {Case{64 << 10, 1, 1, 1}, Case{64 << 10, 8, 1, 1}, Case{128 << 10, 16, 3, 1},
                        Case{64 << 10, 4, 2, 3}, Case{1 << 20, 32, 4, 2},
                        Case{64 << 10, 8, 2, 3, /*io_uring=*/false}}) {
    SCOPED_TRACE(::testing::Message() << "block " << c.block << " depth " << c.depth << " threads " << c.threads
                                      << " paths " << c.paths << " io_uring " << c.io_uring);
    auto aio = AioEngine::Create({c.block, c.depth, c.threads, true, c.io_uring});
    ASSERT_TRUE(aio.ok()) << aio.status();
    if (!c.io_uring) {
      EXPECT_FALSE((*aio)->uses_io_uring());
    }
    std::vector<std::string> paths;
    for (int p = 0; p < c.paths; ++p) {
      paths.push_back(TmpPath("rt_" + std::to_string(c.block) + "_" + std::to_string(c.threads) + "_" +
                              std::to_string(c.paths) + "_" + std::to_string(c.io_uring) + "_" + std::to_string(p)));
      std::filesystem::remove(paths.back());
    }
    auto f = (*aio)->Open(paths, true);
    ASSERT_TRUE(f.ok()) << f.status();
    auto out = AllocateAligned(bytes), in = AllocateAligned(bytes);
    Fill(out.get(), bytes, c.block + c.paths);
    // Two requests in flight at once, at different offsets.
    auto w1 = (*aio)->Write(*f, 0, out.get(), bytes / 2 / kAioAlignment * kAioAlignment);
    const int64_t second = bytes / 2 / kAioAlignment * kAioAlignment;
    auto w2 = (*aio)->Write(*f, second, out.get() + second, bytes - second);
    ASSERT_TRUE(w1.ok() && w2.ok());
    ASSERT_TRUE((*aio)->Wait(*w1).ok());
    ASSERT_TRUE((*aio)->Wait(*w2).ok());
    std::memset(in.get(), 0, bytes);
    auto r = (*aio)->Read(*f, 0, in.get(), bytes);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE((*aio)->Wait(*r).ok());
    EXPECT_EQ(std::memcmp(in.get(), out.get(), bytes), 0);
    // Striping puts the bytes in every path.
    auto size = (*aio)->Size(*f);
    ASSERT_TRUE(size.ok());
    EXPECT_GE(*size, bytes);
    for (const std::string& p : paths) EXPECT_GT(std::filesystem::file_size(p), 0u) << p;
    EXPECT_TRUE((*aio)->Close(*f).ok());
  }
}

class AioBothEngines : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(IoUringAndPreadPwrite, AioBothEngines, ::testing::Bool());

TEST_P(AioBothEngines, ShortTransfersAreContinued) {
  auto aio = AioEngine::Create({64 << 10, 4, 1, true, GetParam()});
  ASSERT_TRUE(aio.ok());
  const int64_t bytes = 512 << 10;
  auto f = (*aio)->Open({TmpPath(GetParam() ? "short_uring" : "short_sync")}, true);
  ASSERT_TRUE(f.ok());
  int shortened = 0;
  // Every block's first completion reports a quarter of what it asked for
  // (kAioAlignment-aligned, as O_DIRECT needs to continue).
  (*aio)->SetFaultInjector([&](const AioBlockOp& op) -> std::optional<int64_t> {
    if (op.bytes == (64 << 10)) {
      ++shortened;
      return op.bytes / 4;
    }
    return std::nullopt;
  });
  WriteThenReadBack(**aio, *f, bytes, 7);
  EXPECT_EQ(shortened, 16) << "8 blocks written and 8 read, each shortened once";
}

TEST_P(AioBothEngines, FailuresNameTheFileTheOffsetAndTheErrno) {
  auto aio = AioEngine::Create({64 << 10, 8, 2, true, GetParam()});
  ASSERT_TRUE(aio.ok());
  const std::string path = TmpPath(GetParam() ? "faults_uring" : "faults_sync");
  std::filesystem::remove(path);
  auto f = (*aio)->Open({path}, true);
  ASSERT_TRUE(f.ok());
  const int64_t bytes = 1 << 20;
  auto buf = AllocateAligned(bytes);
  Fill(buf.get(), bytes, 3);
  struct Fault {
    int64_t result;
    absl::StatusCode code;
    const char* text;
  };
  for (const Fault& fault : {Fault{-EIO, absl::StatusCode::kDataLoss, "Input/output error (errno 5)"},
                             Fault{-ENOSPC, absl::StatusCode::kResourceExhausted, "No space left on device (errno 28)"}}) {
    // The 6th block of the request: offset 5 * 64 KiB.
    (*aio)->SetFaultInjector([&](const AioBlockOp& op) -> std::optional<int64_t> {
      if (op.write && op.offset == 5 * (64 << 10)) return fault.result;
      return std::nullopt;
    });
    auto w = (*aio)->Write(*f, 0, buf.get(), bytes);
    ASSERT_TRUE(w.ok());
    const absl::Status st = (*aio)->Wait(*w);
    EXPECT_EQ(st.code(), fault.code) << st;
    EXPECT_NE(st.message().find(path), std::string::npos) << st;
    EXPECT_NE(st.message().find("at offset 327680"), std::string::npos) << st;
    EXPECT_NE(st.message().find(fault.text), std::string::npos) << st;
  }
  (*aio)->SetFaultInjector(nullptr);
  // Reading past the end of the file.
  auto w = (*aio)->Write(*f, 0, buf.get(), bytes);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*aio)->Wait(*w).ok());
  auto r = (*aio)->Read(*f, bytes, buf.get(), 64 << 10);
  ASSERT_TRUE(r.ok());
  const absl::Status eof = (*aio)->Wait(*r);
  EXPECT_EQ(eof.code(), absl::StatusCode::kOutOfRange) << eof;
  EXPECT_NE(eof.message().find("unexpected end of file"), std::string::npos) << eof;
  EXPECT_EQ((*aio)->Wait(*r).code(), absl::StatusCode::kFailedPrecondition) << "a request is waited for once";
}

TEST(Aio, MisuseIsRefusedSayingWhatIsWrong) {
  EXPECT_NE(AioEngine::Create({1000, 8, 1, true}).status().message().find("block_bytes = 1000"), std::string::npos);
  EXPECT_NE(AioEngine::Create({4096, 0, 1, true}).status().message().find("queue_depth = 0"), std::string::npos);
  EXPECT_NE(AioEngine::Create({4096, 8, 65, true}).status().message().find("threads = 65"), std::string::npos);
  auto aio = AioEngine::Create({64 << 10, 8, 1, true});
  ASSERT_TRUE(aio.ok());
  const auto missing = (*aio)->Open({TmpPath("no/such/dir/file")}, true);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("no/such/dir/file"), std::string::npos) << missing.status();
  EXPECT_EQ((*aio)->Read(42, 0, nullptr, 0).status().code(), absl::StatusCode::kNotFound);
  auto f = (*aio)->Open({TmpPath("misuse")}, true);
  ASSERT_TRUE(f.ok());
  if ((*aio)->direct(*f)) {
    auto buf = AllocateAligned(8192);
    const auto odd = (*aio)->Write(*f, 100, buf.get(), 4096);
    EXPECT_EQ(odd.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(odd.status().message().find("must be multiples of 4096"), std::string::npos) << odd.status();
    EXPECT_FALSE((*aio)->Write(*f, 0, buf.get() + 1, 4096).ok()) << "a misaligned buffer";
  }
}

// A swap file is allocated to its size, locked against a second holder
// (refused, and the holder's file untouched), moves with its SwapFile, and
// is removed by its holder only: a refused creator removes nothing.
TEST(Aio, ASwapFileIsLockedAndRemovedByItsHolderOnly) {
  auto aio = AioEngine::Create({});
  ASSERT_TRUE(aio.ok());
  const std::string path = TmpPath("held.swap");
  const int64_t bytes = 3 * kAioAlignment;
  absl::StatusOr<SwapFile> first = CreateSwapFile(**aio, path, bytes, "swap test", "test.nvme_path");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(int64_t(std::filesystem::file_size(path)), bytes);
  WriteThenReadBack(**aio, first->id(), bytes, 5);
  {
    absl::StatusOr<SwapFile> second = CreateSwapFile(**aio, path, kAioAlignment, "swap test", "test.nvme_path");
    ASSERT_FALSE(second.ok());
    EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(second.status().message().find("in use by another process"), std::string::npos) << second.status();
    EXPECT_NE(second.status().message().find("test.nvme_path"), std::string::npos) << second.status();
  }
  EXPECT_EQ(int64_t(std::filesystem::file_size(path)), bytes) << "the refused creator truncated the holder's file";
  {
    SwapFile moved = *std::move(first);
    first = absl::UnknownError("moved");  // the moved-from SwapFile goes: it holds nothing
    EXPECT_TRUE(std::filesystem::exists(path));
    WriteThenReadBack(**aio, moved.id(), bytes, 6);
    ASSERT_TRUE((*aio)->Close(moved.id()).ok());
  }
  EXPECT_FALSE(std::filesystem::exists(path)) << "the holder removes its file";
  absl::StatusOr<SwapFile> again = CreateSwapFile(**aio, path, bytes, "swap test", "test.nvme_path");
  EXPECT_TRUE(again.ok()) << "the lock went with the holder: " << again.status();
}

TEST(Aio, AFileSystemWithoutODirectFallsBackToBufferedIo) {
  // tmpfs refuses O_DIRECT.
  const std::string dir = "/dev/shm";
  if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << "no /dev/shm here";
  auto aio = AioEngine::Create({64 << 10, 8, 1, true});
  ASSERT_TRUE(aio.ok());
  const std::string path = dir + "/memwall_aio_test_" + std::to_string(::getpid());
  auto f = (*aio)->Open({path}, true);
  ASSERT_TRUE(f.ok()) << f.status();
  // Direct exactly where the file system takes O_DIRECT (runtime/io_probe.h;
  // tmpfs refuses it before Linux 6.6).
  EXPECT_EQ((*aio)->direct(*f), ProbeDirectIo(dir).ok());
  const int64_t bytes = 256 << 10;
  WriteThenReadBack(**aio, *f, bytes, 11);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace memwall::infinity
