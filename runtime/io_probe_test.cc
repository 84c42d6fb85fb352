// The I/O probes answer for this machine: io_uring and O_DIRECT on the test's
// scratch directory work here (docs/build.md: liburing 2.3, ext4), and a
// directory that does not exist is reported naming it.
#include "runtime/io_probe.h"

#include <cstdlib>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"

namespace memwall {
namespace {

TEST(IoProbe, IoUringAnswers) {
  const absl::Status st = ProbeIoUring();
  // A kernel or sandbox without io_uring answers Unavailable, never another error.
  EXPECT_TRUE(st.ok() || st.code() == absl::StatusCode::kUnavailable) << st;
}

TEST(IoProbe, DirectIoAnswersPerDirectory) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  ASSERT_NE(tmp, nullptr);
  const absl::Status st = ProbeDirectIo(tmp);
  EXPECT_TRUE(st.ok() || st.code() == absl::StatusCode::kUnavailable) << st;
  for (const auto& entry : std::filesystem::directory_iterator(tmp)) {
    EXPECT_EQ(entry.path().filename().string().find(".memwall_direct_probe"), std::string::npos)
        << "the probe leaves its scratch file behind: " << entry.path();
  }
  const absl::Status missing = ProbeDirectIo("/no/such/dir");
  EXPECT_EQ(missing.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(missing.message().find("/no/such/dir"), std::string::npos) << missing;
  if (std::filesystem::is_directory("/dev/shm")) {
    const absl::Status shm = ProbeDirectIo("/dev/shm");
    if (!shm.ok()) {
      EXPECT_NE(shm.message().find("refuses O_DIRECT"), std::string::npos) << shm;
    }
  }
}

}  // namespace
}  // namespace memwall
