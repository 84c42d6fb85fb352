// AtomicFile: a file appears whole on Commit() or not at all; text protos
// report where they are wrong.
#include "runtime/files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "google/protobuf/duration.pb.h"
#include "google/protobuf/struct.pb.h"
#include "gtest/gtest.h"
#include "runtime/status.h"

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
  EXPECT_EQ(ErrnoOf(missing.status()), ENOENT) << "Python raises FileNotFoundError";
  // A directory where the file should go is refused before anything is
  // written, not after the whole file (at the rename).
  const std::string dir = Tmp("a_directory");
  std::filesystem::create_directories(dir);
  const auto is_dir = AtomicFile::Open(dir);
  EXPECT_EQ(is_dir.status().code(), absl::StatusCode::kInvalidArgument) << is_dir.status();
  EXPECT_EQ(ErrnoOf(is_dir.status()), EISDIR);
  EXPECT_NE(is_dir.status().message().find(dir + ": it is a directory"), std::string::npos) << is_dir.status();
  EXPECT_FALSE(std::filesystem::exists(dir + ".tmp"));
  EXPECT_TRUE(std::filesystem::is_directory(dir));
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

TEST(ParseTextProto, AValueOutOfRangeNamesItsField) {
  google::protobuf::Duration d;
  const absl::Status st = ParseTextProto("nanos: 3\n  seconds:  99999999999999999999", "d.textproto", &d);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("line 2 column 13: Integer out of range (99999999999999999999) (the value of seconds)"),
            std::string::npos)
      << st;
  EXPECT_NE(ParseTextProto("nanos: 1e99", "d", &d).message().find("(the value of nanos)"), std::string::npos);
}

// A JSON object or InvalidArgument in the parser's words, never its status
// code's name or its internal message paths.
TEST(ParseJsonObject, ParsesAnObjectAndSaysWhatElseItMet) {
  google::protobuf::Struct s;
  ASSERT_TRUE(ParseJsonObject(R"({"a": {"b": [1, "x", null, true]}})", s).ok());
  EXPECT_EQ(JsonValueText(s.fields().at("a").struct_value().fields().at("b")), R"([1, "x", null, true])");
  google::protobuf::Value big;
  big.set_number_value(1e9);
  EXPECT_EQ(JsonValueText(big), "1000000000");
  big.set_number_value(2.5);
  EXPECT_EQ(JsonValueText(big), "2.5");
  EXPECT_EQ(JsonValueText(s.fields().at("a")), "{...}");

  const absl::Status list = ParseJsonObject("[1, 2]", s);
  EXPECT_EQ(list.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(list.message(), "the top level is not an object");
  const absl::Status twice = ParseJsonObject(R"({"z": {"stage": 3, "stage": 1}})", s);
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(twice.message(), "the key \"stage\" appears twice in one object");
  const absl::Status cut = ParseJsonObject(R"({"a": [1, 2)", s);
  EXPECT_EQ(cut.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(cut.message().empty());
  EXPECT_EQ(cut.message().find("INVALID_ARGUMENT"), std::string::npos) << cut;
  EXPECT_NE(cut.message()[0], ':') << cut;

  // Nesting: the parser's time grows with the square of an array's depth,
  // so a config nested past kMaxJsonDepth is refused before it, at once;
  // brackets inside strings (escaped quotes too) are not nesting.
  auto nested = [](int levels, char open) {
    std::string inner = "1";
    for (int i = 0; i < levels; ++i) inner = open == '[' ? "[" + inner + "]" : "{\"k\": " + inner + "}";
    return "{\"a\": " + inner + "}";
  };
  EXPECT_TRUE(ParseJsonObject(nested(kMaxJsonDepth - 1, '['), s).ok());
  EXPECT_TRUE(ParseJsonObject(nested(kMaxJsonDepth - 1, '{'), s).ok());
  for (const char open : {'[', '{'}) {
    const absl::Status deep = ParseJsonObject(nested(kMaxJsonDepth, open), s);
    EXPECT_EQ(deep.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(deep.message(), absl::StrCat("arrays and objects nested deeper than ", kMaxJsonDepth, " levels (at byte ",
                                           open == '[' ? 5 + kMaxJsonDepth : 6 + 6 * (kMaxJsonDepth - 1), ")"))
        << deep;
  }
  // 200000 levels: the parser would take about 20 minutes.
  const std::string hostile = "{\"a\": " + std::string(200000, '[') + std::string(200000, ']') + "}";
  EXPECT_EQ(ParseJsonObject(hostile, s).message(), absl::StrCat("arrays and objects nested deeper than ",
                                                                kMaxJsonDepth, " levels (at byte ", 5 + kMaxJsonDepth, ")"));
  ASSERT_TRUE(ParseJsonObject(R"({"a": "[[[[{{{{\"[[[\\", "b": ["]]]]"]})", s).ok());
  EXPECT_EQ(s.fields().at("a").string_value(), "[[[[{{{{\"[[[\\");
}

// Everything that is not a regular file is refused by kind, naming the
// path and its role, without blocking and before any allocation.
TEST(ReadRegularFile, RefusesWhatIsNotAFileByKind) {
  const std::string dir = Tmp("kinds");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string file = dir + "/config.textproto";
  ASSERT_TRUE(WriteFileAtomically(file, "seconds: 5").ok());
  auto read = ReadRegularFile(file, "--config");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "seconds: 5");
  EXPECT_EQ(*RegularFileSize(file, "x"), 10);

  auto expect = [](const std::string& path, absl::StatusCode code, const std::string& says) {
    const absl::Status st = ReadRegularFile(path, "--config").status();
    EXPECT_EQ(st.code(), code) << path << ": " << st;
    EXPECT_NE(st.message().find("--config " + path.substr(0, 40)), std::string::npos) << st;
    EXPECT_NE(st.message().find(says), std::string::npos) << st;
    EXPECT_EQ(RegularFileSize(path, "--config").status(), st);
  };
  expect(dir + "/missing", absl::StatusCode::kNotFound, "does not exist");
  (void)expect(file + "/below", absl::StatusCode::kNotFound, "a part of it is not a directory");
  expect(dir, absl::StatusCode::kInvalidArgument, "is a directory, not a regular file");
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect(fifo, absl::StatusCode::kInvalidArgument, "is a FIFO (named pipe), not a regular file");
  expect("/dev/zero", absl::StatusCode::kInvalidArgument, "is a character device, not a regular file");
  std::filesystem::create_symlink(dir + "/loop_b", dir + "/loop_a");
  std::filesystem::create_symlink(dir + "/loop_a", dir + "/loop_b");
  expect(dir + "/loop_a", absl::StatusCode::kInvalidArgument, "is a loop of symbolic links");
  expect(dir + "/" + std::string(300, 'n'), absl::StatusCode::kInvalidArgument, "has a name too long");
  // A link to a regular file is that file.
  std::filesystem::create_symlink(file, dir + "/link");
  EXPECT_EQ(*ReadRegularFile(dir + "/link", "x"), "seconds: 5");
  // Size before allocation.
  const absl::Status big = ReadRegularFile(file, "--config", 9).status();
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(big.message().find("is 10 bytes, more than the 9"), std::string::npos) << big;
}

TEST(CreateWritableDirectory, CreatesParentsAndRefusesWhatCannotHoldFiles) {
  const std::string root = Tmp("writable");
  std::filesystem::remove_all(root);
  const std::string nested = root + "/a/b/c";
  ASSERT_TRUE(CreateWritableDirectory(nested, "--export").ok());
  EXPECT_TRUE(std::filesystem::is_directory(nested));
  EXPECT_TRUE(CreateWritableDirectory(nested, "--export").ok()) << "an existing directory is fine";

  auto expect = [](const std::string& path, absl::StatusCode code, const std::string& says) {
    const absl::Status st = CreateWritableDirectory(path, "--save_dir");
    EXPECT_EQ(st.code(), code) << path << ": " << st;
    EXPECT_NE(st.message().find("--save_dir " + path), std::string::npos) << st;
    EXPECT_NE(st.message().find(says), std::string::npos) << st;
    return st;
  };
  const std::string file = root + "/a_file";
  ASSERT_TRUE(WriteFileAtomically(file, "x").ok());
  (void)expect(file, absl::StatusCode::kInvalidArgument, "it or a parent is a file, not a directory");
  (void)expect(file + "/below", absl::StatusCode::kInvalidArgument, "it or a parent is a file, not a directory");
  // The system's errno comes along (Python raises OSError with it).
  EXPECT_GT(ErrnoOf(expect("/proc/memwall_cannot_be_here", absl::StatusCode::kPermissionDenied, "cannot create it")),
            0);
  const std::string too_long = root + "/" + std::string(NAME_MAX + 1, 'x');
  EXPECT_EQ(ErrnoOf(expect(too_long, absl::StatusCode::kPermissionDenied, "cannot create it")), ENAMETOOLONG);
  // Permission bits do not bind root, so only an unprivileged run sees this.
  if (::geteuid() != 0) {
    const std::string locked = root + "/locked";
    std::filesystem::create_directories(locked);
    ASSERT_EQ(::chmod(locked.c_str(), 0555), 0);
    (void)expect(locked, absl::StatusCode::kPermissionDenied, "cannot write in it");
    ::chmod(locked.c_str(), 0755);
  }
}

}  // namespace
}  // namespace memwall
