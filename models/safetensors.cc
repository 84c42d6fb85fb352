#include "models/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "runtime/files.h"
#include "runtime/status.h"

namespace memwall::models {
namespace {

// Headers larger than this are refused before allocation (the format's own
// reference implementation uses the same limit).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// True when `s` is well-formed UTF-8 (JSON text must be).
bool IsUtf8(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t extra = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : 4;
    if (extra == 4 || s.size() - i < 1 + extra) return false;
    for (size_t k = 1; k <= extra; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += 1 + extra;
  }
  return true;
}

// A JSON value: just what a safetensors header holds.
struct Json {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  bool boolean = false;
  std::string text;      // kString; kNumber keeps its literal
  std::vector<Json> items;  // kArray
  struct Member;
  std::vector<Member> members;  // kObject, in file order
};

// (Not a std::pair: a pair needs Json complete where Json declares it.)
struct Json::Member {
  std::string name;
  Json value;
};

class JsonParser {
 public:
  explicit JsonParser(absl::string_view s) : s_(s) {}

  absl::StatusOr<Json> ParseDocument() {
    MEMWALL_ASSIGN_OR_RETURN(Json v, Value(0));
    SkipSpace();
    if (pos_ != s_.size()) return Error("trailing characters after the JSON value");
    return v;
  }

 private:
  absl::Status Error(absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("header JSON: ", what, " at byte ", pos_));
  }
  // Four hex digits after "\\u" (pos_ on the 'u'), leaving pos_ past them.
  absl::StatusOr<uint32_t> Hex4() {
    if (pos_ + 4 >= s_.size()) return Error("truncated \\u escape");
    uint32_t code = 0;
    for (int i = 1; i <= 4; ++i) {
      const char h = s_[pos_ + i];
      const int digit = h >= '0' && h <= '9' ? h - '0'
                        : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (digit < 0) return Error("invalid \\u escape");
      code = code * 16 + digit;
    }
    pos_ += 5;
    return code;
  }
  // "\\uXXXX" (a surrogate pair as two) appended to `out` as UTF-8.
  absl::Status UnicodeEscape(std::string& out) {
    MEMWALL_ASSIGN_OR_RETURN(uint32_t code, Hex4());
    if (code >= 0xDC00 && code <= 0xDFFF) return Error("unpaired low surrogate in \\u escape");
    if (code >= 0xD800 && code <= 0xDBFF) {
      if (pos_ + 1 >= s_.size() || s_[pos_] != '\\' || s_[pos_ + 1] != 'u') {
        return Error("unpaired high surrogate in \\u escape");
      }
      ++pos_;
      MEMWALL_ASSIGN_OR_RETURN(const uint32_t low, Hex4());
      if (low < 0xDC00 || low > 0xDFFF) return Error("unpaired high surrogate in \\u escape");
      code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
    }
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
    return absl::OkStatus();
  }
  void SkipSpace() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t')) ++pos_;
  }
  absl::StatusOr<Json> Value(int depth) {
    if (depth > 8) return Error("nesting deeper than a safetensors header has");
    SkipSpace();
    if (pos_ >= s_.size()) return Error("unexpected end");
    const char c = s_[pos_];
    Json v;
    if (c == '{') {
      v.kind = Json::kObject;
      ++pos_;
      SkipSpace();
      if (pos_ < s_.size() && s_[pos_] == '}') { ++pos_; return v; }
      while (true) {
        SkipSpace();
        MEMWALL_ASSIGN_OR_RETURN(Json key, Value(depth + 1));
        if (key.kind != Json::kString) return Error("object key is not a string");
        SkipSpace();
        if (pos_ >= s_.size() || s_[pos_] != ':') return Error("expected ':'");
        ++pos_;
        MEMWALL_ASSIGN_OR_RETURN(Json item, Value(depth + 1));
        v.members.push_back({std::move(key.text), std::move(item)});
        SkipSpace();
        if (pos_ < s_.size() && s_[pos_] == ',') { ++pos_; continue; }
        if (pos_ < s_.size() && s_[pos_] == '}') { ++pos_; return v; }
        return Error("expected ',' or '}'");
      }
    }
    if (c == '[') {
      v.kind = Json::kArray;
      ++pos_;
      SkipSpace();
      if (pos_ < s_.size() && s_[pos_] == ']') { ++pos_; return v; }
      while (true) {
        MEMWALL_ASSIGN_OR_RETURN(Json item, Value(depth + 1));
        v.items.push_back(std::move(item));
        SkipSpace();
        if (pos_ < s_.size() && s_[pos_] == ',') { ++pos_; continue; }
        if (pos_ < s_.size() && s_[pos_] == ']') { ++pos_; return v; }
        return Error("expected ',' or ']'");
      }
    }
    if (c == '"') {
      v.kind = Json::kString;
      ++pos_;
      while (pos_ < s_.size() && s_[pos_] != '"') {
        if (s_[pos_] == '\\') {
          if (++pos_ >= s_.size()) break;
          const char e = s_[pos_];
          if (e == 'u') {
            MEMWALL_RETURN_IF_ERROR(UnicodeEscape(v.text));
            continue;
          }
          switch (e) {
            case 'n': v.text += '\n'; break;
            case 't': v.text += '\t'; break;
            case 'r': v.text += '\r'; break;
            case 'b': v.text += '\b'; break;
            case 'f': v.text += '\f'; break;
            case '"': case '\\': case '/': v.text += e; break;
            default: return Error(absl::StrCat("invalid escape '\\", std::string(1, e), "'"));
          }
        } else {
          v.text += s_[pos_];
        }
        ++pos_;
      }
      if (pos_ >= s_.size()) return Error("unterminated string");
      ++pos_;
      return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = Json::kNumber;
      while (pos_ < s_.size() && (s_[pos_] == '-' || s_[pos_] == '+' || s_[pos_] == '.' ||
                                  s_[pos_] == 'e' || s_[pos_] == 'E' ||
                                  (s_[pos_] >= '0' && s_[pos_] <= '9'))) {
        v.text += s_[pos_++];
      }
      return v;
    }
    for (const char* word : {"true", "false", "null"}) {
      if (s_.substr(pos_, std::strlen(word)) == word) {
        pos_ += std::strlen(word);
        v.kind = word[0] == 'n' ? Json::kNull : Json::kBool;
        v.boolean = word[0] == 't';
        return v;
      }
    }
    return Error(absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }

  absl::string_view s_;
  size_t pos_ = 0;
};

// A non-negative integer literal that fits in 53 bits (what JSON numbers
// hold exactly), or nothing.
bool AsIndex(const Json& j, uint64_t* out) {
  if (j.kind != Json::kNumber || j.text.empty() || j.text.size() > 16) return false;
  uint64_t v = 0;
  for (char c : j.text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + uint64_t(c - '0');
  }
  *out = v;
  return true;
}

struct DTypeCode {
  const char* code;
  DType dtype;
};
constexpr DTypeCode kDTypes[] = {{"F32", DType::kF32}, {"F16", DType::kF16},
                                 {"BF16", DType::kBF16}, {"I32", DType::kI32}};

const char* CodeOf(DType dtype) {
  for (const auto& d : kDTypes) {
    if (d.dtype == dtype) return d.code;
  }
  return "?";
}

}  // namespace

absl::StatusOr<SafetensorsFile> SafetensorsFile::Read(const std::string& path) {
  MEMWALL_ASSIGN_OR_RETURN(std::string bytes,
                           ReadRegularFile(path, "safetensors file", std::numeric_limits<int64_t>::max()));
  return Parse(std::move(bytes), path);
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Parse(std::string bytes, const std::string& path) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors file ", path, ": ", what));
  };
  if (bytes.size() < 8) {
    return bad(absl::StrCat("is ", bytes.size(), " bytes; even the 8-byte header length is missing"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
  if (header_len > kMaxHeaderBytes) {
    return bad(absl::StrCat("header length ", header_len, " exceeds the ", kMaxHeaderBytes,
                            "-byte limit (not a safetensors file?)"));
  }
  if (header_len > bytes.size() - 8) {
    return bad(absl::StrCat("header length ", header_len, " runs past the end of the ",
                            bytes.size(), "-byte file (truncated?)"));
  }
  SafetensorsFile file;
  file.path_ = path;
  file.data_start_ = 8 + header_len;
  const uint64_t data_size = bytes.size() - file.data_start_;
  auto parsed = JsonParser(absl::string_view(bytes).substr(8, header_len)).ParseDocument();
  if (!parsed.ok()) return bad(parsed.status().message());
  if (parsed->kind != Json::kObject) return bad("header is not a JSON object");
  for (Json::Member& member : parsed->members) {
    const std::string& name = member.name;  // (captured below: not a structured binding)
    const Json& value = member.value;
    if (name == "__metadata__") {
      if (value.kind != Json::kObject) return bad("__metadata__ is not an object");
      for (auto& [k, v] : value.members) {
        if (v.kind != Json::kString) return bad(absl::StrCat("__metadata__ value of '", k, "' is not a string"));
        if (!IsUtf8(k) || !IsUtf8(v.text)) return bad(absl::StrCat("__metadata__ '", absl::CEscape(k), "' is not valid UTF-8"));
        file.metadata_[k] = v.text;
      }
      continue;
    }
    auto bad_tensor = [&](absl::string_view what) {
      return bad(absl::StrCat("tensor '", name, "': ", what));
    };
    if (name.empty()) return bad("a tensor has an empty name");
    if (!IsUtf8(name)) return bad(absl::StrCat("tensor name '", absl::CEscape(name), "' is not valid UTF-8"));
    if (value.kind != Json::kObject) return bad_tensor("entry is not an object");
    SafetensorsEntry e;
    e.name = name;
    const Json* dtype = nullptr;
    const Json* shape = nullptr;
    const Json* offsets = nullptr;
    for (auto& [k, v] : value.members) {
      if (k == "dtype") dtype = &v;
      else if (k == "shape") shape = &v;
      else if (k == "data_offsets") offsets = &v;
    }
    if (dtype == nullptr || shape == nullptr || offsets == nullptr) {
      return bad_tensor("needs dtype, shape and data_offsets");
    }
    bool known = false;
    for (const auto& d : kDTypes) {
      if (dtype->kind == Json::kString && dtype->text == d.code) {
        e.dtype = d.dtype;
        known = true;
      }
    }
    if (!known) {
      return bad_tensor(absl::StrCat("dtype '", dtype->text, "' is not one memwall reads (F32, F16, BF16, I32)"));
    }
    if (shape->kind != Json::kArray) return bad_tensor("shape is not an array");
    uint64_t numel = 1;
    for (const Json& dim : shape->items) {
      uint64_t d = 0;
      if (!AsIndex(dim, &d)) return bad_tensor(absl::StrCat("shape has a bad dimension '", dim.text, "'"));
      if (d != 0 && numel > (uint64_t{1} << 53) / d) return bad_tensor("shape overflows");
      numel *= d;
      e.shape.push_back(static_cast<int64_t>(d));
    }
    if (offsets->kind != Json::kArray || offsets->items.size() != 2 ||
        !AsIndex(offsets->items[0], &e.begin) || !AsIndex(offsets->items[1], &e.end)) {
      return bad_tensor("data_offsets must be [begin, end] with non-negative integers");
    }
    if (e.begin > e.end || e.end > data_size) {
      return bad_tensor(absl::StrCat("data_offsets [", e.begin, ", ", e.end,
                                     "] are outside the ", data_size, " data bytes"));
    }
    if (e.end - e.begin != numel * SizeOf(e.dtype)) {
      return bad_tensor(absl::StrCat("data_offsets span ", e.end - e.begin, " bytes but shape and ",
                                     dtype->text, " need ", numel * SizeOf(e.dtype)));
    }
    for (const SafetensorsEntry& other : file.entries_) {
      if (other.name == e.name) return bad_tensor("appears twice");
    }
    file.entries_.push_back(std::move(e));
  }
  // No two tensors may share bytes.
  std::vector<const SafetensorsEntry*> sorted;
  for (const auto& e : file.entries_) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i]->begin < sorted[i - 1]->end) {
      return bad(absl::StrCat("tensors '", sorted[i - 1]->name, "' and '", sorted[i]->name,
                              "' overlap"));
    }
  }
  file.bytes_ = std::move(bytes);
  return file;
}

const SafetensorsEntry* SafetensorsFile::Find(const std::string& name) const {
  for (const auto& e : entries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

namespace {

// `s` as a JSON string literal: quotes, backslashes and control characters
// escaped (RFC 8259 section 7); other bytes as they are (checked UTF-8).
std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          absl::StrAppend(&out, "\\u00", std::string(1, "0123456789abcdef"[c >> 4]),
                          std::string(1, "0123456789abcdef"[c & 15]));
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

// What no writer may write: names a reader cannot tell apart or parse.
absl::Status ValidateForWriting(const std::vector<SafetensorsTensor>& tensors,
                                const std::map<std::string, std::string>& metadata) {
  std::set<absl::string_view> seen;
  for (const auto& t : tensors) {
    if (t.name.empty()) return absl::InvalidArgumentError("safetensors: a tensor has an empty name");
    if (t.name == "__metadata__") {
      return absl::InvalidArgumentError(
          "safetensors: '__metadata__' is the format's reserved key and cannot name a tensor");
    }
    if (!IsUtf8(t.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: tensor name '", absl::CEscape(t.name), "' is not valid UTF-8"));
    }
    if (!seen.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: two tensors are named '", t.name, "'"));
    }
    for (int64_t d : t.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("safetensors: tensor '", t.name, "' has a negative dimension ", d));
      }
    }
  }
  for (const auto& [k, v] : metadata) {
    if (!IsUtf8(k) || !IsUtf8(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: metadata '", absl::CEscape(k), "' is not valid UTF-8"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> SafetensorsHeader(const std::vector<SafetensorsTensor>& tensors,
                                              const std::map<std::string, std::string>& metadata) {
  MEMWALL_RETURN_IF_ERROR(ValidateForWriting(tensors, metadata));
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      absl::StrAppend(&header, first ? "" : ",", JsonString(k), ":", JsonString(v));
      first = false;
    }
    header += "}";
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    int64_t numel = 1;
    std::string shape;
    for (size_t j = 0; j < t.shape.size(); ++j) {
      numel *= t.shape[j];
      absl::StrAppend(&shape, j ? "," : "", t.shape[j]);
    }
    const uint64_t bytes = uint64_t(numel) * SizeOf(t.dtype);
    absl::StrAppend(&header, (i || !metadata.empty()) ? "," : "", JsonString(t.name), ":{\"dtype\":\"",
                    CodeOf(t.dtype), "\",\"shape\":[", shape, "],\"data_offsets\":[", offset, ",",
                    offset + bytes, "]}");
    offset += bytes;
  }
  header += "}";
  // Pad with spaces so the data starts 8-byte aligned (the format allows it).
  while ((header.size() + 8) % 8 != 0) header += ' ';
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += header;
  return out;
}

absl::StatusOr<std::string> SerializeSafetensors(const std::vector<SafetensorsTensor>& tensors,
                                                 const std::map<std::string, std::string>& metadata) {
  MEMWALL_ASSIGN_OR_RETURN(std::string out, SafetensorsHeader(tensors, metadata));
  for (const auto& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    out.append(static_cast<const char*>(t.data), numel * SizeOf(t.dtype));
  }
  return out;
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<SafetensorsTensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string bytes, SerializeSafetensors(tensors, metadata));
  return WriteFileAtomically(path, bytes);
}

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const std::string& path, std::vector<SafetensorsTensor> tensors,
    const std::map<std::string, std::string>& metadata) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string header, SafetensorsHeader(tensors, metadata));
  std::unique_ptr<SafetensorsWriter> w(new SafetensorsWriter);
  MEMWALL_ASSIGN_OR_RETURN(w->file_, AtomicFile::Open(path));
  for (const auto& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    w->sizes_.push_back(static_cast<size_t>(numel) * SizeOf(t.dtype));
    w->names_.push_back(t.name);
  }
  MEMWALL_RETURN_IF_ERROR(w->file_->Write(header.data(), header.size()));
  return w;
}

SafetensorsWriter::~SafetensorsWriter() = default;

absl::Status SafetensorsWriter::Append(const void* data, size_t bytes) {
  if (next_ >= sizes_.size() || bytes != sizes_[next_]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SafetensorsWriter ", file_->path(), ": appended ", bytes, " bytes but ",
        next_ < sizes_.size() ? absl::StrCat("tensor ", names_[next_], " has ", sizes_[next_])
                              : std::string("every tensor is written")));
  }
  ++next_;
  return file_->Write(data, bytes);
}

absl::Status SafetensorsWriter::Finish() {
  if (next_ != sizes_.size()) {
    return absl::FailedPreconditionError(absl::StrCat("SafetensorsWriter ", file_->path(), ": ",
                                                      sizes_.size() - next_, " tensors not written"));
  }
  return file_->Commit();
}

}  // namespace memwall::models
