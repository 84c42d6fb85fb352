#include "runtime/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/message.h"
#include "google/protobuf/text_format.h"
#include "runtime/status.h"

namespace memwall {
namespace {

std::string Errno() { return std::strerror(errno); }

// A failed write or fsync of `tmp` (the file being replaced is `path`): a
// full disk is ResourceExhausted, anything else DataLoss; both name the
// file and say that what was there before is untouched.
absl::Status WriteError(absl::string_view what, const std::string& tmp, const std::string& path) {
  const int err = errno;
  const std::string message = absl::StrCat(what, " ", tmp, " failed: ", std::strerror(err), "; ", path,
                                           " is left as it was");
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(message);
  return absl::DataLossError(message);
}

// Keeps protobuf's first parse error (line, column, message) instead of
// letting it log them.
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (first.empty()) first = absl::StrCat("line ", line + 1, " column ", column + 1, ": ", message);
  }
  std::string first;
};

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {}

absl::StatusOr<std::unique_ptr<AtomicFile>> AtomicFile::Open(const std::string& path) {
  std::unique_ptr<AtomicFile> f(new AtomicFile(path));
  f->fd_ = ::open(f->tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f->fd_ < 0) return absl::PermissionDeniedError(absl::StrCat("cannot create ", f->tmp_, ": ", Errno()));
  return f;
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

absl::Status AtomicFile::Write(const void* data, size_t bytes) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": write after commit"));
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) errno = EIO;  // no progress
    if (n <= 0) return WriteError("write to", tmp_, path_);
    p += n;
    bytes -= static_cast<size_t>(n);
    bytes_ += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status AtomicFile::Commit() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": committed twice"));
  if (::fsync(fd_) != 0) return WriteError("fsync of", tmp_, path_);
  ::close(fd_);
  fd_ = -1;
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    return absl::PermissionDeniedError(absl::StrCat("cannot rename ", tmp_, " to ", path_, ": ", Errno()));
  }
  committed_ = true;
  const std::string dir = std::filesystem::path(path_).parent_path().string();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  MEMWALL_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFile> f, AtomicFile::Open(path));
  MEMWALL_RETURN_IF_ERROR(f->Write(contents.data(), contents.size()));
  return f->Commit();
}

std::string JsonString(absl::string_view value) {
  std::string out = "\"";
  for (char c : value) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

absl::Status ParseTextProto(const std::string& text, const std::string& origin,
                            google::protobuf::Message* out) {
  google::protobuf::TextFormat::Parser parser;
  FirstError errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, out)) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": not a ", out->GetDescriptor()->name(),
                                                   " text proto: ", errors.first));
  }
  return absl::OkStatus();
}

}  // namespace memwall
