// Files that are whole or absent, and text protos read with a message that
// says where they are wrong (JSON objects too). For checkpoints, results and
// exported weights.
#ifndef MEMWALL_RUNTIME_FILES_H_
#define MEMWALL_RUNTIME_FILES_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace google::protobuf {
class Message;
class Struct;
class Value;
}

namespace memwall {

// Writes `path` through "<path>.tmp": Write() appends, Commit() fsyncs,
// renames into place and fsyncs the directory, so a file under its real
// name is always whole. Destroyed before Commit(), it removes the
// temporary file and leaves `path` as it was. A `path` that is a directory
// is refused at Open (InvalidArgument); a file that cannot be created or
// renamed is PermissionDenied; each carries the system's errno (ErrnoOf).
class AtomicFile {
 public:
  static absl::StatusOr<std::unique_ptr<AtomicFile>> Open(const std::string& path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  absl::Status Write(const void* data, size_t bytes);
  absl::Status Commit();
  uint64_t bytes_written() const { return bytes_; }
  const std::string& path() const { return path_; }

 private:
  explicit AtomicFile(std::string path);
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
  uint64_t bytes_ = 0;
};

// O_DIRECT's alignment of file offsets, transfer sizes and buffers (the
// logical block of the drives memwall swaps to).
inline constexpr int64_t kDirectIoAlignment = 4096;

// Files read whole (configs, text, metadata, weights) are at most this.
inline constexpr int64_t kMaxTextFileBytes = int64_t{1} << 26;  // 64 MiB: configs, metadata, experiments

// The size of `path` if it is a regular file (symbolic links followed).
// Anything else is refused naming `what` (the file's role: "model config",
// "--config"), the path and what it is instead: NotFound for no such path,
// PermissionDenied, and InvalidArgument for a directory, a FIFO, a device,
// a socket, a symbolic link loop or a name too long. Never blocks (a FIFO
// is opened without waiting for a writer).
absl::StatusOr<int64_t> RegularFileSize(const std::string& path, absl::string_view what);

// The whole contents of the regular file `path` (as RegularFileSize checks
// it), refused with InvalidArgument when it holds more than `max_bytes`:
// its size is checked before anything is allocated.
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, absl::string_view what,
                                            int64_t max_bytes = kMaxTextFileBytes);

// Bytes an unprivileged writer may still allocate on the file system that
// holds `dir` (statvfs: f_bavail x f_frsize); -1 when it cannot be read.
int64_t FileSystemAvailableBytes(const std::string& dir);

// Creates `dir` and its parents where missing, and checks that this
// process may create files in it. Refused naming `what` (its role:
// "--export", "--save_dir") and the path: PermissionDenied when it cannot
// be created or written (a read-only file system included), with the
// system's errno (WithErrno); InvalidArgument when the path or a parent is
// not a directory.
absl::Status CreateWritableDirectory(const std::string& dir, absl::string_view what);

// The whole of `contents`, atomically (AtomicFile).
absl::Status WriteFileAtomically(const std::string& path, const std::string& contents);

// `value` as a JSON string literal, quotes included ("a\"b").
std::string JsonString(absl::string_view value);

// `json` as a JSON object, into `out`. Anything else is InvalidArgument in
// the parser's own words (what it met where), or "the top level is not an
// object"; the caller names the file. Arrays and objects nested deeper than
// kMaxJsonDepth (the outer object is level 1) are refused before the parser
// sees them: its time grows with the square of the depth of nested arrays
// (12 s at 20000 levels), and past about 50 it fails in its own terms.
inline constexpr int kMaxJsonDepth = 32;
absl::Status ParseJsonObject(absl::string_view json, google::protobuf::Struct& out);

// `v` as a message shows it: numbers as written when whole (1e9 as
// 1000000000), strings quoted, lists item by item, an object as {...}.
std::string JsonValueText(const google::protobuf::Value& v);

// Parses a text proto into `out`. A syntax error or unknown field is an
// InvalidArgument: "<origin>: not a <Type> text proto: line L column C: ...";
// so is a field its message reserved (a field the schema removed, which
// protobuf's parser would skip silently).
absl::Status ParseTextProto(const std::string& text, const std::string& origin,
                            google::protobuf::Message* out);

// Whether a parsed binary message, or any message inside it, holds fields
// this schema does not know (written by a newer writer).
bool HasUnknownFields(const google::protobuf::Message& message);

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_FILES_H_
