#include "models/data.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/files.h"
#include "runtime/splitmix.h"
#include "runtime/status.h"

namespace memwall::models {
namespace {

class BytesSource : public TokenSource {
 public:
  BytesSource(std::string bytes, std::string description)
      : bytes_(std::move(bytes)), description_(std::move(description)) {}
  int64_t size() const override { return static_cast<int64_t>(bytes_.size()); }
  int64_t vocab() const override { return 256; }
  int32_t token(int64_t i) const override { return static_cast<uint8_t>(bytes_[i]); }
  std::string description() const override { return description_; }

 private:
  std::string bytes_;
  std::string description_;
};

class Uint16Source : public TokenSource {
 public:
  Uint16Source(std::vector<uint16_t> ids, std::string description)
      : ids_(std::move(ids)),
        vocab_(ids_.empty() ? 0 : int64_t{*std::max_element(ids_.begin(), ids_.end())} + 1),
        description_(std::move(description)) {}
  int64_t size() const override { return static_cast<int64_t>(ids_.size()); }
  int64_t vocab() const override { return vocab_; }
  int32_t token(int64_t i) const override { return ids_[i]; }
  std::string description() const override { return description_; }

 private:
  std::vector<uint16_t> ids_;
  int64_t vocab_;
  std::string description_;
};

class Synthetic : public TokenSource {
 public:
  Synthetic(int64_t size, int64_t vocab, uint64_t seed) : size_(size), vocab_(vocab), seed_(seed) {}
  int64_t size() const override { return size_; }
  int64_t vocab() const override { return vocab_; }
  int32_t token(int64_t i) const override {
    return static_cast<int32_t>(SplitMix64(seed_ + kSplitMix64Gamma * uint64_t(i)) % uint64_t(vocab_));
  }
  std::string description() const override {
    return absl::StrCat("synthetic(", size_, " tokens, vocab ", vocab_, ", seed ", seed_, ")");
  }

 private:
  int64_t size_, vocab_;
  uint64_t seed_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TokenSource>> ByteTextSource(const std::string& path) {
  MEMWALL_ASSIGN_OR_RETURN(std::string text, ReadRegularFile(path, "text file", kMaxTextBytes));
  return ByteStringSource(std::move(text), path);
}

absl::StatusOr<std::unique_ptr<TokenSource>> Uint16TokenSource(const std::string& path) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string bytes, ReadRegularFile(path, "token file", kMaxTextBytes));
  if (bytes.size() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is ", bytes.size(),
                                                   " bytes, not a whole number of uint16 token ids"));
  }
  std::vector<uint16_t> ids(bytes.size() / 2);
  for (size_t i = 0; i < ids.size(); ++i) {  // little-endian on any host
    ids[i] = uint16_t(uint8_t(bytes[2 * i]) | uint8_t(bytes[2 * i + 1]) << 8);
  }
  return std::make_unique<Uint16Source>(std::move(ids), path);
}

absl::StatusOr<DataFormat> ParseDataFormat(absl::string_view name) {
  if (name == "auto") return DataFormat::kAuto;
  if (name == "text") return DataFormat::kText;
  if (name == "uint16") return DataFormat::kUint16;
  return absl::InvalidArgumentError(absl::StrCat("data format '", name, "' is not one of auto, text, uint16"));
}

absl::StatusOr<std::unique_ptr<TokenSource>> OpenTokenSource(const std::string& path, DataFormat format) {
  if (format == DataFormat::kAuto) format = absl::EndsWith(path, ".bin") ? DataFormat::kUint16 : DataFormat::kText;
  return format == DataFormat::kUint16 ? Uint16TokenSource(path) : ByteTextSource(path);
}

std::unique_ptr<TokenSource> ByteStringSource(std::string text, std::string description) {
  return std::make_unique<BytesSource>(std::move(text), std::move(description));
}

std::unique_ptr<TokenSource> SyntheticSource(int64_t size, int64_t vocab, uint64_t seed) {
  return std::make_unique<Synthetic>(size, vocab, seed);
}

absl::Status ValidateLayout(const TokenSource& source, const BatchLayout& l) {
  if (l.seq <= 0 || l.micro_batch <= 0 || l.accumulation <= 0 || l.world <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch layout: seq (", l.seq, "), micro_batch (", l.micro_batch, "), accumulation (",
        l.accumulation, ") and world (", l.world, ") must all be > 0"));
  }
  if (source.size() < l.seq + 1) {
    return absl::InvalidArgumentError(absl::StrCat(source.description(), " has ", source.size(),
                                                   " tokens; a sequence of ", l.seq,
                                                   " needs at least ", l.seq + 1));
  }
  return absl::OkStatus();
}

absl::Status FillMicroBatch(const TokenSource& source, const BatchLayout& l, int64_t step, int rank,
                            int64_t micro, int32_t* ids, int32_t* targets) {
  if (absl::Status st = ValidateLayout(source, l); !st.ok()) return st;
  if (step < 0 || rank < 0 || rank >= l.world || micro < 0 || micro >= l.accumulation) {
    return absl::InvalidArgumentError(absl::StrCat("FillMicroBatch: step ", step, ", rank ", rank,
                                                   " of ", l.world, ", micro-batch ", micro, " of ",
                                                   l.accumulation, " is out of range"));
  }
  const int64_t starts = source.size() - l.seq;  // windows [s, s + seq] fit for s < starts
  // Sequence number first + i, taken mod starts in 128 bits: any step
  // (a checkpoint's up to 2^53) and any layout give a window inside the data.
  using Wide = unsigned __int128;
  const Wide first = Wide(step) * Wide(l.global_batch()) + Wide(rank * l.accumulation + micro) * Wide(l.micro_batch);
  for (int64_t i = 0; i < l.micro_batch; ++i) {
    const auto start = int64_t(Wide((first + Wide(i)) % Wide(starts)) * Wide(l.seq) % Wide(starts));
    for (int64_t j = 0; j < l.seq; ++j) {
      ids[i * l.seq + j] = source.token(start + j);
      targets[i * l.seq + j] = source.token(start + j + 1);
    }
  }
  return absl::OkStatus();
}

}  // namespace memwall::models
