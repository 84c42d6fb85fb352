// Files that are whole or absent, and text protos read with a message that
// says where they are wrong. For checkpoints, results and exported weights.
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
}

namespace memwall {

// Writes `path` through "<path>.tmp": Write() appends, Commit() fsyncs,
// renames into place and fsyncs the directory, so a file under its real
// name is always whole. Destroyed before Commit(), it removes the
// temporary file and leaves `path` as it was.
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

// The whole of `contents`, atomically (AtomicFile).
absl::Status WriteFileAtomically(const std::string& path, const std::string& contents);

// `value` as a JSON string literal, quotes included ("a\"b").
std::string JsonString(absl::string_view value);

// Parses a text proto into `out`. A syntax error or unknown field is an
// InvalidArgument: "<origin>: not a <Type> text proto: line L column C: ...".
absl::Status ParseTextProto(const std::string& text, const std::string& origin,
                            google::protobuf::Message* out);

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_FILES_H_
