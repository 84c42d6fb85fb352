#include "runtime/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/message.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "runtime/status.h"

namespace memwall {
namespace {

// A failed write or fsync of `tmp` (the file being replaced is `path`): a
// full disk is ResourceExhausted, anything else DataLoss; both name the
// file and say that what was there before is untouched.
absl::Status WriteError(absl::string_view what, const std::string& tmp, const std::string& path) {
  const int err = errno;
  const std::string message = absl::StrCat(what, " ", tmp, " failed: ", std::strerror(err), "; ", path,
                                           " is left as it was");
  if (err == ENOSPC || err == EDQUOT) return WithErrno(absl::ResourceExhaustedError(message), err);
  return WithErrno(absl::DataLossError(message), err);
}

// Keeps protobuf's first parse error (line, column, message) instead of
// letting it log them.
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (!first.empty()) return;
    first = absl::StrCat("line ", line + 1, " column ", column + 1, ": ", message);
    this->line = line;
    this->column = column;
  }
  std::string first;
  int line = -1, column = -1;
};

// The field whose value stands at (line, column) of `text`: the name before
// the ':' that precedes it ("accumulation" in "accumulation: 1e99"), or ""
// when none does. Protobuf's value errors ("Integer out of range") give
// only the position.
std::string FieldAt(const std::string& text, int line, int column) {
  size_t at = 0;
  for (int l = 0; l < line && at != std::string::npos; ++l) {
    at = text.find('\n', at);
    if (at != std::string::npos) ++at;
  }
  if (at == std::string::npos || column < 0) return "";
  size_t end = std::min(text.size(), at + size_t(column));
  auto space = [](char c) { return c == ' ' || c == '\t'; };
  while (end > at && space(text[end - 1])) --end;
  if (end == at || text[end - 1] != ':') return "";
  --end;
  while (end > at && space(text[end - 1])) --end;
  size_t begin = end;
  while (begin > at && (std::isalnum(static_cast<unsigned char>(text[begin - 1])) || text[begin - 1] == '_')) --begin;
  return text.substr(begin, end - begin);
}

// The file descriptor of `path` opened for reading, checked to be a
// regular file, and its size.
absl::StatusOr<std::pair<int, int64_t>> OpenRegular(const std::string& path, absl::string_view what) {
  auto bad = [&](absl::string_view is) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " ", is));
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    switch (err) {
      case ENOENT: return absl::NotFoundError(absl::StrCat(what, " ", path, " does not exist"));
      case EACCES: return absl::PermissionDeniedError(absl::StrCat(what, " ", path, " cannot be read: permission denied"));
      case ELOOP: return bad("is a loop of symbolic links, not a file");
      case ENAMETOOLONG: return bad("has a name too long for the file system (a component over 255 bytes, or over 4095 in all)");
      case ENOTDIR: return absl::NotFoundError(absl::StrCat(what, " ", path, " does not exist (a part of it is not a directory)"));
      default: return bad(absl::StrCat("cannot be opened: ", std::strerror(err)));
    }
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return bad(absl::StrCat("cannot be examined: ", std::strerror(err)));
  }
  const char* kind = S_ISREG(st.st_mode)    ? nullptr
                     : S_ISDIR(st.st_mode)  ? "is a directory"
                     : S_ISFIFO(st.st_mode) ? "is a FIFO (named pipe)"
                     : S_ISCHR(st.st_mode)  ? "is a character device"
                     : S_ISBLK(st.st_mode)  ? "is a block device"
                     : S_ISSOCK(st.st_mode) ? "is a socket"
                                            : "is not a regular file";
  if (kind != nullptr) {
    ::close(fd);
    return bad(absl::StrCat(kind, ", not a regular file"));
  }
  // Reads block from here on, as for any regular file.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return std::make_pair(fd, int64_t(st.st_size));
}

}  // namespace

absl::StatusOr<int64_t> RegularFileSize(const std::string& path, absl::string_view what) {
  MEMWALL_ASSIGN_OR_RETURN(const auto opened, OpenRegular(path, what));
  ::close(opened.first);
  return opened.second;
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, absl::string_view what, int64_t max_bytes) {
  MEMWALL_ASSIGN_OR_RETURN(const auto opened, OpenRegular(path, what));
  const auto [fd, size] = opened;
  if (size > max_bytes) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " is ", size, " bytes, more than the ",
                                                   max_bytes, " such a file may hold"));
  }
  std::string contents(size_t(size), '\0');
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::read(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return WithErrno(absl::DataLossError(absl::StrCat("reading ", what, " ", path, " failed: ", std::strerror(err))),
                       err);
    }
    if (n == 0) break;  // shrank since fstat: what is there
    done += size_t(n);
  }
  ::close(fd);
  contents.resize(done);
  return contents;
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {}

absl::StatusOr<std::unique_ptr<AtomicFile>> AtomicFile::Open(const std::string& path) {
  // Refused before anything is written: the rename would fail only after
  // the whole file (an export's gigabytes) had been.
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return WithErrno(absl::InvalidArgumentError(
                         absl::StrCat("cannot write ", path, ": it is a directory (name a file in it)")),
                     EISDIR);
  }
  std::unique_ptr<AtomicFile> f(new AtomicFile(path));
  f->fd_ = ::open(f->tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f->fd_ < 0) {
    const int err = errno;
    return WithErrno(absl::PermissionDeniedError(absl::StrCat("cannot create ", f->tmp_, ": ", std::strerror(err))),
                     err);
  }
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
    const int err = errno;
    return WithErrno(
        absl::PermissionDeniedError(absl::StrCat("cannot rename ", tmp_, " to ", path_, ": ", std::strerror(err))),
        err);
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

int64_t FileSystemAvailableBytes(const std::string& dir) {
  struct statvfs fs;
  if (::statvfs(dir.c_str(), &fs) != 0) return -1;
  return static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
}

absl::Status CreateWritableDirectory(const std::string& dir, absl::string_view what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec == std::errc::not_a_directory || ec == std::errc::file_exists) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", dir, ": it or a parent is a file, not a directory"));
  }
  if (ec) {
    return WithErrno(absl::PermissionDeniedError(absl::StrCat(what, " ", dir, ": cannot create it: ", ec.message())),
                     ec.value());
  }
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", dir, " is not a directory"));
  }
  // access() also answers EROFS for a read-only mount, which root's
  // permissions do not override.
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    const int err = errno;
    return WithErrno(absl::PermissionDeniedError(absl::StrCat(what, " ", dir, ": cannot write in it: ", std::strerror(err))),
                     err);
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  MEMWALL_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFile> f, AtomicFile::Open(path));
  MEMWALL_RETURN_IF_ERROR(f->Write(contents.data(), contents.size()));
  return f->Commit();
}

absl::Status ParseJsonObject(absl::string_view json, google::protobuf::Struct& out) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, a quote or a backslash among them
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        return absl::InvalidArgumentError(absl::StrCat("arrays and objects nested deeper than ", kMaxJsonDepth,
                                                       " levels (at byte ", i, ")"));
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  const auto st = google::protobuf::util::JsonStringToMessage(std::string(json), &out);
  if (st.ok()) return absl::OkStatus();
  // The parser's own words, without its status code's name.
  std::string why(st.message().data(), st.message().size());
  absl::StripLeadingAsciiWhitespace(&why);
  if (absl::StartsWith(why, ":")) why = std::string(absl::StripLeadingAsciiWhitespace(why.substr(1)));
  if (why == "Root element must be a message.") why = "the top level is not an object";
  // A duplicate key is named by the parser's path through its own message
  // types ("(fields[1].value.struct_value.fields[0]) ..."): say it plainly.
  const std::string repeated = "Repeated map key: '";
  if (const size_t at = why.find(repeated); at != std::string::npos) {
    const size_t begin = at + repeated.size(), end = why.find('\'', begin);
    if (end != std::string::npos) {
      why = absl::StrCat("the key \"", why.substr(begin, end - begin), "\" appears twice in one object");
    }
  }
  return absl::InvalidArgumentError(why);
}

std::string JsonValueText(const google::protobuf::Value& v) {
  using google::protobuf::Value;
  switch (v.kind_case()) {
    case Value::kNumberValue: {
      const double d = v.number_value();
      if (d == std::floor(d) && std::fabs(d) < 1e15) return absl::StrCat(static_cast<int64_t>(d));
      return absl::StrCat(d);
    }
    case Value::kStringValue: return absl::StrCat("\"", v.string_value(), "\"");
    case Value::kBoolValue: return v.bool_value() ? "true" : "false";
    case Value::kNullValue: return "null";
    case Value::kListValue: {
      std::vector<std::string> items;
      for (const Value& item : v.list_value().values()) items.push_back(JsonValueText(item));
      return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
    }
    default: return "{...}";
  }
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

namespace {

class IgnoreTokenizerErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int, google::protobuf::io::ColumnNumber, const std::string&) override {}
};

// The text format parser skips a field name its message reserved (one the
// schema removed) without a word, so a config that still sets one would run
// without the setting it asks for. Walks the tokens, following the messages
// that `name {` and `name: {` open, and names the first such field.
absl::Status CheckNoRemovedFields(const std::string& text, const std::string& origin,
                                  const google::protobuf::Descriptor* root) {
  using google::protobuf::io::Tokenizer;
  google::protobuf::io::ArrayInputStream input(text.data(), static_cast<int>(text.size()));
  IgnoreTokenizerErrors ignore;  // the parser has already accepted the text
  Tokenizer tokens(&input, &ignore);
  tokens.set_comment_style(Tokenizer::SH_COMMENT_STYLE);
  std::vector<const google::protobuf::Descriptor*> open{root};  // null: a message not followed
  const google::protobuf::FieldDescriptor* last = nullptr;     // the last field named
  bool more = tokens.Next();
  while (more) {
    const Tokenizer::Token token = tokens.current();
    more = tokens.Next();
    const bool names_field = token.type == Tokenizer::TYPE_IDENTIFIER && more &&
                             tokens.current().type == Tokenizer::TYPE_SYMBOL &&
                             (tokens.current().text == ":" || tokens.current().text == "{" ||
                              tokens.current().text == "<");
    if (names_field) {
      const google::protobuf::Descriptor* d = open.back();
      last = d != nullptr ? d->FindFieldByName(token.text) : nullptr;
      if (d != nullptr && last == nullptr && d->IsReservedName(token.text)) {
        return absl::InvalidArgumentError(absl::StrCat(
            origin, ": line ", token.line + 1, " column ", token.column + 1, ": ", d->name(),
            " no longer has a field \"", token.text, "\" (memwall removed it: see ", d->file()->name(),
            "); delete it"));
      }
    } else if (token.type == Tokenizer::TYPE_SYMBOL && (token.text == "{" || token.text == "<")) {
      open.push_back(last != nullptr ? last->message_type() : nullptr);
    } else if (token.type == Tokenizer::TYPE_SYMBOL && (token.text == "}" || token.text == ">") && open.size() > 1) {
      open.pop_back();
      last = nullptr;
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// The values of the enum field `name` in `message` or a message under it
// (the first found, breadth first), as "NONE, CPU, NVME"; "" when there is
// none.
std::string EnumValuesOf(const google::protobuf::Descriptor* message, const std::string& name) {
  std::vector<const google::protobuf::Descriptor*> queue = {message};
  for (size_t i = 0; i < queue.size() && i < 256; ++i) {
    for (int f = 0; f < queue[i]->field_count(); ++f) {
      const google::protobuf::FieldDescriptor* field = queue[i]->field(f);
      if (field->name() == name && field->enum_type() != nullptr) {
        std::vector<std::string> values;
        for (int v = 0; v < field->enum_type()->value_count(); ++v) values.push_back(field->enum_type()->value(v)->name());
        return absl::StrJoin(values, ", ");
      }
      if (field->message_type() != nullptr) queue.push_back(field->message_type());
    }
  }
  return "";
}

}  // namespace

absl::Status ParseTextProto(const std::string& text, const std::string& origin,
                            google::protobuf::Message* out) {
  google::protobuf::TextFormat::Parser parser;
  FirstError errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, out)) {
    const std::string field = FieldAt(text, errors.line, errors.column);
    // "Unknown enumeration value of "GPU" for field "device"": list the values.
    std::string enum_field;
    if (const size_t at = errors.first.find("enumeration value of"); at != std::string::npos) {
      const size_t begin = errors.first.find("for field \"", at);
      const size_t end = begin == std::string::npos ? begin : errors.first.find('"', begin + 11);
      if (end != std::string::npos) enum_field = errors.first.substr(begin + 11, end - begin - 11);
    }
    const std::string values = enum_field.empty() ? "" : EnumValuesOf(out->GetDescriptor(), enum_field);
    return absl::InvalidArgumentError(absl::StrCat(origin, ": not a ", out->GetDescriptor()->name(),
                                                   " text proto: ", errors.first,
                                                   field.empty() ? "" : absl::StrCat(" (the value of ", field, ")"),
                                                   values.empty() ? "" : absl::StrCat("; ", enum_field, " is one of ", values)));
  }
  return CheckNoRemovedFields(text, origin, out->GetDescriptor());
}

bool HasUnknownFields(const google::protobuf::Message& message) {
  const google::protobuf::Reflection* r = message.GetReflection();
  if (!r->GetUnknownFields(message).empty()) return true;
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  r->ListFields(message, &fields);
  for (const google::protobuf::FieldDescriptor* f : fields) {
    if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (f->is_repeated()) {
      for (int i = 0; i < r->FieldSize(message, f); ++i) {
        if (HasUnknownFields(r->GetRepeatedMessage(message, f, i))) return true;
      }
    } else if (HasUnknownFields(r->GetMessage(message, f))) {
      return true;
    }
  }
  return false;
}

}  // namespace memwall
