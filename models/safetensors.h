// The safetensors format (Hugging Face): an 8-byte little-endian header
// length N, N bytes of JSON
//   {"__metadata__": {"format": "pt"},
//    "<name>": {"dtype": "F32", "shape": [d0, d1], "data_offsets": [begin, end]}, ...}
// then the tensors' bytes; offsets are relative to the end of the header.
//
// Reading validates everything before any tensor is used: the header length
// against the file size, the JSON, each entry's dtype, shape and offsets
// (inside the data, of exactly numel * itemsize bytes, not overlapping
// another tensor). A violation is an InvalidArgument naming the file and the
// tensor. Writing goes to "<path>.tmp" and is renamed into place, so an
// interrupted export never leaves a truncated file under the real name.
#ifndef MEMWALL_MODELS_SAFETENSORS_H_
#define MEMWALL_MODELS_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/dtype.h"
#include "runtime/files.h"

namespace memwall::models {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into data()
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

class SafetensorsFile {
 public:
  // The whole file is read into memory and validated.
  static absl::StatusOr<SafetensorsFile> Read(const std::string& path);
  // Parses and validates bytes already in memory (`path` only names them).
  static absl::StatusOr<SafetensorsFile> Parse(std::string bytes, const std::string& path);

  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* Find(const std::string& name) const;
  const uint8_t* data(const SafetensorsEntry& e) const {
    return reinterpret_cast<const uint8_t*>(bytes_.data()) + data_start_ + e.begin;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string bytes_;
  size_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write: raw bytes in `dtype` (host memory).
struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// The 8-byte length and JSON header of `tensors` (their data is not read).
// Names and metadata are escaped as JSON strings; InvalidArgument for what
// no reader could take back: an empty, duplicate, non-UTF-8 or reserved
// ("__metadata__") tensor name, a negative dimension, non-UTF-8 metadata.
// Every writer below goes through it.
absl::StatusOr<std::string> SafetensorsHeader(const std::vector<SafetensorsTensor>& tensors,
                                              const std::map<std::string, std::string>& metadata);
// Serializes to bytes (header + data), tensors in the given order.
absl::StatusOr<std::string> SerializeSafetensors(const std::vector<SafetensorsTensor>& tensors,
                                                 const std::map<std::string, std::string>& metadata);
absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<SafetensorsTensor>& tensors,
                              const std::map<std::string, std::string>& metadata);

// Writes a file one tensor at a time, so a tool holds at most one tensor in
// memory (checkpoint consolidation): the header comes from the tensors'
// names, dtypes and shapes (`data` unused), then Append() each tensor's
// bytes in order, then Finish() commits the file (runtime/files.h's
// AtomicFile: it appears whole or not at all).
class SafetensorsWriter {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Create(
      const std::string& path, std::vector<SafetensorsTensor> tensors,
      const std::map<std::string, std::string>& metadata);
  ~SafetensorsWriter();
  absl::Status Append(const void* data, size_t bytes);
  absl::Status Finish();

 private:
  SafetensorsWriter() = default;
  std::unique_ptr<AtomicFile> file_;
  std::vector<size_t> sizes_;
  std::vector<std::string> names_;
  size_t next_ = 0;
};

}  // namespace memwall::models

#endif  // MEMWALL_MODELS_SAFETENSORS_H_
