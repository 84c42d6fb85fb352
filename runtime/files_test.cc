// AtomicFile: a file appears whole on Commit() or not at all; text protos
// report where they are wrong.
#include "runtime/files.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "google/protobuf/duration.pb.h"
#include "gtest/gtest.h"

namespace memwall {
namespace {

std::string Tmp(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(AtomicFile, AppearsOnlyWhenCommitted) {
  const std::string path = Tmp("atomic.txt");
  ASSERT_TRUE(WriteFileAtomically(path, "old").ok());
  {
    auto f = AtomicFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status();
    ASSERT_TRUE((*f)->Write("new ", 4).ok());
    ASSERT_TRUE((*f)->Write("contents", 8).ok());
    EXPECT_EQ((*f)->bytes_written(), 12u);
    EXPECT_EQ(Read(path), "old") << "nothing changes before Commit()";
    EXPECT_TRUE(std::filesystem::exists(path + ".tmp"));
    ASSERT_TRUE((*f)->Commit().ok());
    EXPECT_EQ((*f)->Commit().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ((*f)->Write("x", 1).code(), absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_EQ(Read(path), "new contents");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  {
    auto f = AtomicFile::Open(path);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE((*f)->Write("abandoned", 9).ok());
  }  // dropped without Commit()
  EXPECT_EQ(Read(path), "new contents");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  const auto missing = AtomicFile::Open(Tmp("no/such/dir/file"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(missing.status().message().find("no/such/dir/file.tmp"), std::string::npos) << missing.status();
}

TEST(ParseTextProto, SaysWhereTheTextIsWrong) {
  google::protobuf::Duration d;
  ASSERT_TRUE(ParseTextProto("seconds: 5 nanos: 3", "d.textproto", &d).ok());
  EXPECT_EQ(d.seconds(), 5);
  EXPECT_EQ(d.nanos(), 3);
  // protobuf points just past the unknown name.
  const absl::Status st = ParseTextProto("seconds: 5\nsekonds: 1", "d.textproto", &d);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "d.textproto: not a Duration text proto: line 2 column 8: Message type "
            "\"google.protobuf.Duration\" has no field named \"sekonds\".")
      << st;
}

}  // namespace
}  // namespace memwall
