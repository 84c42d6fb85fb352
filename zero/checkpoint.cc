// Trainer::Save and Trainer::Load, and consolidation: see checkpoint.h.
#include "zero/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"
#include "models/gpt_io.h"
#include "models/safetensors.h"
#include "runtime/agreement.h"
#include "runtime/bounds.h"
#include "runtime/files.h"
#include "runtime/memory.h"
#include "runtime/status.h"
#include "zero/rank_zero_reads.h"
#include "zero/trainer.h"

namespace memwall::zero {
namespace {

constexpr char kMagic[8] = {'M', 'W', 'S', 'H', 'A', 'R', 'D', '1'};
constexpr int64_t kHeaderBytes = 24;
constexpr char kMarker[] = "COMPLETE";
constexpr char kMetadata[] = "metadata.pb";
constexpr int64_t kChunk = 1 << 20;  // elements per staged read or write
// Shard sections: the three states (in OptimizerState's order), then the
// pending update's gradients when the metadata has one.
constexpr int kPendingGradients = 3;
int Sections(bool pending_update) { return pending_update ? 4 : 3; }
int Sections(const CheckpointMetadata& meta) { return Sections(meta.has_pending_update()); }

std::string Errno() { return std::strerror(errno); }

// An AtomicFile (runtime/files.h) that keeps the CRC-32 of what it wrote.
class ChecksummedFile {
 public:
  static absl::StatusOr<ChecksummedFile> Open(const std::string& path) {
    MEMWALL_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFile> file, AtomicFile::Open(path));
    return ChecksummedFile(std::move(file));
  }
  absl::Status Write(const void* data, size_t bytes) {
    crc_ = crc32_z(crc_, static_cast<const Bytef*>(data), bytes);
    return file_->Write(data, bytes);
  }
  absl::Status Commit() { return file_->Commit(); }
  uint32_t crc() const { return static_cast<uint32_t>(crc_); }
  uint64_t size() const { return file_->bytes_written(); }

 private:
  explicit ChecksummedFile(std::unique_ptr<AtomicFile> file) : file_(std::move(file)) {}
  std::unique_ptr<AtomicFile> file_;
  uLong crc_ = crc32_z(0, nullptr, 0);
};

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  return ReadRegularFile(path, "checkpoint file");
}

std::string Join(const std::string& dir, const std::string& name) {
  return (std::filesystem::path(dir) / name).string();
}

// A run of a shard file: flat elements [flat_begin, flat_begin + count),
// stored from element `at` of each of the file's sections.
struct StoredRun {
  int64_t flat_begin = 0;
  int64_t count = 0;
  int64_t at = 0;
  int shard = 0;  // the shard's index in the metadata
};

// The non-empty runs of shard `index`, in the order its sections store
// them: its pieces, or its one range when it lists none. Its numbers must
// have passed ValidateCheckpointMetadata's per-shard checks.
std::vector<StoredRun> RunsOf(const CheckpointShard& sh, int index) {
  std::vector<StoredRun> runs;
  if (sh.pieces().empty()) {
    if (sh.count() > 0) runs.push_back({sh.flat_begin(), sh.count(), 0, index});
    return runs;
  }
  int64_t at = 0;
  for (const CheckpointPiece& piece : sh.pieces()) {
    runs.push_back({piece.flat_begin(), piece.count(), at, index});
    at += piece.count();
  }
  return runs;
}

// Every shard's runs in flat order: where each flat element is stored.
// Validated metadata tiles [0, numel) with them exactly once.
class StoredRuns {
 public:
  explicit StoredRuns(const CheckpointMetadata& meta) {
    for (int i = 0; i < meta.shards_size(); ++i) {
      for (const StoredRun& run : RunsOf(meta.shards(i), i)) runs_.push_back(run);
    }
    std::sort(runs_.begin(), runs_.end(),
              [](const StoredRun& a, const StoredRun& b) { return a.flat_begin < b.flat_begin; });
  }
  const std::vector<StoredRun>& all() const { return runs_; }
  // The runs that hold elements of [begin, end), in flat order.
  std::span<const StoredRun> Overlapping(int64_t begin, int64_t end) const {
    auto by_begin = [](int64_t x, const StoredRun& r) { return x < r.flat_begin; };
    auto first = std::upper_bound(runs_.begin(), runs_.end(), begin, by_begin);
    if (first != runs_.begin() && std::prev(first)->flat_begin + std::prev(first)->count > begin) --first;
    auto last = std::upper_bound(first, runs_.end(), end - 1, by_begin);
    return {first, last};
  }

 private:
  std::vector<StoredRun> runs_;
};

// A shard file opened for reading, its size and CRC checked against the
// metadata before any of it is used.
class ShardReader {
 public:
  static absl::StatusOr<std::unique_ptr<ShardReader>> Open(const std::string& dir,
                                                           const CheckpointShard& shard,
                                                           bool verify_crc) {
    const std::string path = Join(dir, shard.file());
    std::unique_ptr<ShardReader> r(new ShardReader(path, shard, RunsOf(shard, 0)));
    r->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (r->fd_ < 0) {
      return absl::NotFoundError(absl::StrCat("checkpoint ", dir, " is missing shard ", shard.file(),
                                              " (rank ", shard.rank(), " of the saving run)"));
    }
    struct stat st;
    if (::fstat(r->fd_, &st) != 0 || uint64_t(st.st_size) != shard.bytes()) {
      return absl::DataLossError(absl::StrCat("shard ", path, " is ", st.st_size,
                                              " bytes but the metadata says ", shard.bytes(),
                                              ": the file is truncated or was replaced"));
    }
    if (verify_crc) MEMWALL_RETURN_IF_ERROR(r->VerifyCrc());
    char header[kHeaderBytes];
    MEMWALL_RETURN_IF_ERROR(r->Read(0, header, kHeaderBytes));
    MEMWALL_RETURN_IF_ERROR(CheckShardHeader(absl::string_view(header, kHeaderBytes), shard, path));
    return r;
  }
  ~ShardReader() {
    if (fd_ >= 0) ::close(fd_);
  }
  // Elements [at, at + n) of section 0 (master), 1 (m), 2 (v) or 3 (the
  // pending gradients) into out; `at` counts from the section's start.
  absl::Status ReadSection(int section, int64_t at, int64_t n, float* out) {
    return Read(kHeaderBytes + 4 * (int64_t(section) * shard_.count() + at), out, 4 * n);
  }

 private:
  ShardReader(std::string path, CheckpointShard shard, std::vector<StoredRun> runs)
      : path_(std::move(path)), shard_(std::move(shard)), runs_(std::move(runs)) {}
  // The flat index of a section's element `at`.
  int64_t FlatIndex(int64_t at) const {
    auto run = std::upper_bound(runs_.begin(), runs_.end(), at,
                                [](int64_t x, const StoredRun& r) { return x < r.at; });
    return run == runs_.begin() ? -1 : std::prev(run)->flat_begin + (at - std::prev(run)->at);
  }
  absl::Status Read(int64_t offset, void* out, int64_t bytes) {
    char* p = static_cast<char*>(out);
    while (bytes > 0) {
      const ssize_t n = ::pread(fd_, p, bytes, offset);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return absl::DataLossError(absl::StrCat("cannot read ", path_, ": ", n == 0 ? "short file" : Errno()));
      p += n;
      offset += n;
      bytes -= n;
    }
    return absl::OkStatus();
  }
  absl::Status VerifyCrc() {
    std::vector<char> buffer(4 << 20);
    uLong crc = crc32_z(0, nullptr, 0);
    for (uint64_t at = 0; at < shard_.bytes();) {
      const int64_t n = std::min<uint64_t>(buffer.size(), shard_.bytes() - at);
      MEMWALL_RETURN_IF_ERROR(Read(at, buffer.data(), n));
      crc = crc32_z(crc, reinterpret_cast<const Bytef*>(buffer.data()), n);
      // The master weights (section 0) must be finite; m and v are
      // finite whenever they are (Adam's moments of finite gradients).
      const int64_t lo = std::max<int64_t>(at, kHeaderBytes);
      const int64_t hi = std::min<int64_t>(at + n, kHeaderBytes + 4 * shard_.count());
      for (int64_t b = lo; b < hi && first_non_finite_ < 0; b += 4) {
        float v;
        std::memcpy(&v, buffer.data() + (b - int64_t(at)), 4);
        if (!std::isfinite(v)) first_non_finite_ = FlatIndex((b - kHeaderBytes) / 4);
      }
      at += n;
    }
    if (uint32_t(crc) != shard_.crc32()) {
      return absl::DataLossError(absl::StrFormat(
          "shard %s fails its checksum (CRC-32 %08x, metadata says %08x): the file is corrupt",
          path_, uint32_t(crc), shard_.crc32()));
    }
    return absl::OkStatus();
  }

 public:
  // After a verified Open: the flat index of the first master weight that
  // is NaN or infinite, or -1.
  int64_t first_non_finite() const { return first_non_finite_; }

 private:
  std::string path_;
  CheckpointShard shard_;
  std::vector<StoredRun> runs_;
  int fd_ = -1;
  int64_t first_non_finite_ = -1;
};

// DataLoss naming the tensor and element of the first non-finite master
// weight in `reader`'s shard: such a checkpoint neither loads nor exports.
absl::Status CheckFinite(const CheckpointMetadata& meta, const ShardReader& reader, const std::string& step_dir) {
  const int64_t at = reader.first_non_finite();
  if (at < 0) return absl::OkStatus();
  std::string where = absl::StrCat("flat element ", at);
  for (const CheckpointTensor& t : meta.tensors()) {
    int64_t numel = 1;
    for (int64_t d : t.shape()) numel *= d;
    if (at >= t.offset() && at < t.offset() + numel) where = absl::StrCat("tensor ", t.name(), " element ", at - t.offset());
  }
  return absl::DataLossError(absl::StrCat("checkpoint ", step_dir, " holds a non-finite master weight (", where,
                                          "): the run diverged before this save; resume from an earlier checkpoint"));
}

// Reads flat elements [begin, end) of `section` from the shards that hold
// them (`runs`: meta's). Shards opened here are CRC-checked first when
// `verify_crc`.
absl::Status ReadRange(const std::string& dir, const CheckpointMetadata& meta, const StoredRuns& runs,
                       std::vector<std::unique_ptr<ShardReader>>& readers, int section,
                       int64_t begin, int64_t end, float* out, bool verify_crc = true) {
  for (const StoredRun& run : runs.Overlapping(begin, end)) {
    const int64_t lo = std::max(begin, run.flat_begin);
    const int64_t hi = std::min(end, run.flat_begin + run.count);
    if (lo >= hi) continue;
    if (readers[run.shard] == nullptr) {
      MEMWALL_ASSIGN_OR_RETURN(readers[run.shard], ShardReader::Open(dir, meta.shards(run.shard), verify_crc));
    }
    MEMWALL_RETURN_IF_ERROR(
        readers[run.shard]->ReadSection(section, run.at + (lo - run.flat_begin), hi - lo, out + (lo - begin)));
  }
  return absl::OkStatus();
}

}  // namespace

std::string CheckpointMarker(const std::string& metadata) {
  const uint32_t crc = uint32_t(crc32_z(0, reinterpret_cast<const Bytef*>(metadata.data()), metadata.size()));
  return absl::StrFormat("crc32 %08x\n", crc);
}

absl::StatusOr<CheckpointMetadata> ParseCheckpointMetadata(const std::string& marker, const std::string& metadata,
                                                           const std::string& step_dir) {
  if (CheckpointMarker(metadata) != marker) {
    return absl::DataLossError(absl::StrCat("checkpoint ", step_dir, ": ", kMetadata,
                                            " does not match the checksum in ", kMarker,
                                            " (corrupt metadata)"));
  }
  CheckpointMetadata meta;
  if (!meta.ParseFromString(metadata) || meta.format_version() != 1) {
    return absl::DataLossError(absl::StrCat("checkpoint ", step_dir, ": cannot parse ", kMetadata));
  }
  // A field this version does not know could change what the shards mean.
  if (HasUnknownFields(meta)) {
    return absl::DataLossError(absl::StrCat("checkpoint ", step_dir, ": ", kMetadata,
                                            " holds fields this memwall does not know: it is damaged, or a newer "
                                            "version wrote it (load it with that version)"));
  }
  MEMWALL_RETURN_IF_ERROR(ValidateCheckpointMetadata(meta, step_dir));
  return meta;
}

absl::Status ValidateCheckpointMetadata(const CheckpointMetadata& meta, const std::string& step_dir) {
  auto bad = [&](auto&&... what) {
    return absl::DataLossError(absl::StrCat("checkpoint ", step_dir, ": ", kMetadata, " ", what...));
  };
  if (meta.world_size() < 1 || meta.world_size() > kMaxRanks) return bad("has world_size ", meta.world_size());
  if (meta.stage() < 0 || meta.stage() > 3) return bad("has stage ", meta.stage());
  if (meta.precision() != "fp32" && meta.precision() != "bf16" && meta.precision() != "fp16") {
    return bad("has precision \"", meta.precision(), "\"");
  }
  if (meta.numel() < 1 || meta.numel() >= kMaxParameters) return bad("has numel ", meta.numel());
  if (meta.step() < 0 || meta.step() > kMaxSteps || meta.adam_step() < 0 || meta.adam_step() > meta.step() ||
      meta.clean_steps() < 0) {
    return bad("has step ", meta.step(), ", adam_step ", meta.adam_step(), ", clean_steps ", meta.clean_steps());
  }
  if (meta.global_batch() < 1 || meta.global_batch() > kMaxRanks * kMaxCount || meta.seq() < 1 ||
      meta.seq() > kMaxCount) {
    return bad("has global_batch ", meta.global_batch(), " and seq ", meta.seq());
  }
  if (!(meta.loss_scale() > 0) || !std::isfinite(meta.loss_scale())) return bad("has loss_scale ", meta.loss_scale());
  if (meta.hysteresis_left() < 0 || meta.hysteresis_left() > kMaxSteps) {
    return bad("has hysteresis_left ", meta.hysteresis_left());
  }
  if (meta.has_pending_update()) {
    const PendingUpdate& u = meta.pending_update();
    if (u.step() != meta.adam_step() || u.step() < 1 || !(u.lr() >= 0) || !std::isfinite(u.lr()) ||
        !(u.grad_scale() > 0) || !std::isfinite(u.grad_scale())) {
      return bad("has a pending update with lr ", u.lr(), ", step ", u.step(), ", grad_scale ", u.grad_scale(),
                 " (adam_step ", meta.adam_step(), ")");
    }
  }
  // One file a shard, named inside the directory (a name is never a path:
  // a checkpoint cannot point elsewhere), its runs inside [0, numel).
  const int64_t psi = meta.numel();
  for (const CheckpointShard& sh : meta.shards()) {
    const std::string& f = sh.file();
    if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos || f.find('\0') != std::string::npos) {
      return bad("names a shard file \"", f, "\" (a file name in the checkpoint directory is expected)");
    }
    if (sh.rank() < 0 || sh.rank() >= meta.world_size()) return bad("gives shard ", f, " rank ", sh.rank());
    if (sh.count() < 0 || sh.count() > psi || sh.flat_begin() < 0 || sh.flat_begin() > psi - sh.count()) {
      return bad("gives shard ", f, " elements [", sh.flat_begin(), ", +", sh.count(), ") outside [0, ", psi, ")");
    }
    // Listed pieces: non-empty, in flat order, adding up to the shard's count.
    int64_t sum = 0, end = 0;
    for (int k = 0; k < sh.pieces_size(); ++k) {
      const CheckpointPiece& piece = sh.pieces(k);
      if (piece.count() < 1 || piece.count() > sh.count() - sum || piece.flat_begin() < end ||
          piece.flat_begin() > psi - piece.count()) {
        return bad("gives shard ", f, " piece ", k, " elements [", piece.flat_begin(), ", +", piece.count(),
                   ") (pieces are non-empty, in flat order, inside [0, ", psi, ") and add up to the shard's ",
                   sh.count(), ")");
      }
      sum += piece.count();
      end = piece.flat_begin() + piece.count();
    }
    if (sh.pieces_size() > 0 && (sum != sh.count() || sh.flat_begin() != sh.pieces(0).flat_begin())) {
      return bad("gives shard ", f, " pieces of ", sum, " elements from ", sh.pieces(0).flat_begin(),
                 " but elements [", sh.flat_begin(), ", +", sh.count(), ")");
    }
    const uint64_t expected = ShardFileBytes(sh.count(), meta.has_pending_update());
    if (sh.bytes() != expected) {
      return bad("gives shard ", f, " ", sh.bytes(), " bytes for ", sh.count(), " elements (expected ", expected, ")");
    }
  }
  // Together the shards' runs hold every element once.
  int64_t at = 0;
  const StoredRuns runs(meta);
  for (const StoredRun& run : runs.all()) {
    if (run.flat_begin != at) {
      return run.flat_begin > at
                 ? bad("has no shard holding elements [", at, ", ", run.flat_begin, ")")
                 : bad("has elements [", run.flat_begin, ", ", std::min(at, run.flat_begin + run.count),
                       ") in two shards (", meta.shards(run.shard).file(), " and another)");
    }
    at += run.count;
  }
  if (at != psi) return bad("has no shard holding elements [", at, ", ", psi, ")");
  // Tensors: each inside [0, numel).
  for (const CheckpointTensor& t : meta.tensors()) {
    int64_t numel = 1;
    for (int64_t d : t.shape()) {
      if (d < 1 || numel > meta.numel() / d) return bad("gives tensor ", t.name(), " a shape beyond its ", meta.numel(), " elements");
      numel *= d;
    }
    if (t.name().empty() || t.offset() < 0 || t.offset() > meta.numel() - numel) {
      return bad("places tensor \"", t.name(), "\" at ", t.offset(), " (", numel, " elements) outside [0, ",
                 meta.numel(), ")");
    }
    if (!t.logical_name().empty() &&
        (t.shape().empty() || t.column_begin() < 0 || t.logical_width() < 1 ||
         t.column_begin() > t.logical_width() - t.shape(t.shape_size() - 1))) {
      return bad("places tile \"", t.name(), "\" at columns [", t.column_begin(), ", +",
                 t.shape().empty() ? 0 : t.shape(t.shape_size() - 1), ") of \"", t.logical_name(), "\" (width ",
                 t.logical_width(), ")");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckShardHeader(absl::string_view header, const CheckpointShard& shard, const std::string& path) {
  int64_t begin = 0, count = 0;
  if (header.size() >= size_t(kHeaderBytes)) {
    std::memcpy(&begin, header.data() + 8, 8);
    std::memcpy(&count, header.data() + 16, 8);
  }
  if (header.size() != size_t(kHeaderBytes) || std::memcmp(header.data(), kMagic, 8) != 0 ||
      begin != shard.flat_begin() || count != shard.count()) {
    return absl::DataLossError(absl::StrCat("shard ", path, " has a bad header (expected MWSHARD1, elements [",
                                            shard.flat_begin(), ", +", shard.count(), "))"));
  }
  return absl::OkStatus();
}

uint64_t ShardFileBytes(uint64_t count, bool pending_update) {
  return uint64_t(kHeaderBytes) + 4 * uint64_t(Sections(pending_update)) * count;
}

std::string CheckpointPath(const std::string& dir, int64_t step) {
  return Join(dir, absl::StrFormat("step_%08d", step));
}

namespace {
// "step_N" with N all digits (no sign, no suffix) and at most 18 of them
// (fits int64): the step, else -1.
int64_t StepOfName(const std::string& name) {
  constexpr absl::string_view kPrefix = "step_";
  if (name.size() <= kPrefix.size() || name.size() > kPrefix.size() + 18 ||
      !absl::StartsWith(name, kPrefix)) {
    return -1;
  }
  int64_t step = 0;
  for (size_t i = kPrefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

// Why `step_dir`, which has no marker, is not a checkpoint, in the words
// of what it does hold.
absl::Status WhyNotACheckpoint(const std::string& step_dir) {
  std::error_code ec;
  if (!std::filesystem::exists(step_dir, ec)) {
    // A step typed without its padding ("step_4"), or a run's other steps.
    const std::filesystem::path given(step_dir);
    const std::string parent = given.parent_path().empty() ? "." : given.parent_path().string();
    std::string hint;
    if (const int64_t step = StepOfName(given.filename().string());
        step >= 0 && std::filesystem::exists(Join(CheckpointPath(parent, step), kMarker), ec)) {
      hint = absl::StrCat("; step ", step, "'s checkpoint is ", CheckpointPath(parent, step));
    } else if (absl::StatusOr<std::string> latest = LatestCheckpoint(parent); latest.ok()) {
      hint = absl::StrCat("; the latest complete checkpoint under ", parent, " is ", *latest);
    }
    return absl::NotFoundError(absl::StrCat("no checkpoint at ", step_dir, ": no such path", hint));
  }
  if (!std::filesystem::is_directory(step_dir, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("no checkpoint at ", step_dir, ": it is a file, not a step directory"));
  }
  bool any = false, steps = false;
  for (const auto& entry : std::filesystem::directory_iterator(step_dir, ec)) {
    any = true;
    steps = steps || StepOfName(entry.path().filename().string()) >= 0;
  }
  // An empty step_N directory is a save killed before its first file.
  const bool step_named = StepOfName(std::filesystem::path(step_dir).filename().string()) >= 0;
  if (!any && !step_named) {
    return absl::NotFoundError(absl::StrCat("no checkpoint at ", step_dir, ": the directory is empty"));
  }
  if (steps) {
    auto latest = LatestCheckpoint(step_dir);
    return absl::InvalidArgumentError(absl::StrCat(
        step_dir, " is a run directory (it holds step_N directories), not one checkpoint: ",
        latest.ok() ? absl::StrCat("its latest complete checkpoint is ", *latest)
                    : std::string(latest.status().message())));
  }
  // What the save left: its shard files, partial ones, and (when the
  // metadata was written) the shards it lists that are not there.
  std::vector<std::string> shards, partial;
  for (const auto& entry : std::filesystem::directory_iterator(step_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (absl::EndsWith(name, ".shard")) shards.push_back(name);
    if (absl::EndsWith(name, ".tmp")) partial.push_back(name);
  }
  std::sort(shards.begin(), shards.end());
  std::sort(partial.begin(), partial.end());
  const auto list = [](const std::vector<std::string>& names) {
    constexpr size_t kShown = 8;
    std::vector<std::string> shown(names.begin(), names.begin() + std::min(names.size(), kShown));
    if (names.size() > kShown) shown.push_back(absl::StrCat("and ", names.size() - kShown, " more"));
    return absl::StrJoin(shown, ", ");
  };
  std::vector<std::string> missing;
  const bool has_metadata = std::filesystem::exists(Join(step_dir, kMetadata), ec);
  // Nothing a save writes, in a directory not named for a step: another
  // directory, such as a training run's --out, whose checkpoints (when it
  // has any) are in a subdirectory.
  if (!step_named && !has_metadata && shards.empty() && partial.empty()) {
    for (const auto& entry : std::filesystem::directory_iterator(step_dir, ec)) {
      if (!entry.is_directory(ec)) continue;
      if (absl::StatusOr<std::string> latest = LatestCheckpoint(entry.path().string()); latest.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            step_dir, " is not a checkpoint; its subdirectory ", entry.path().string(),
            " holds checkpoints, the latest complete one ", *latest));
      }
    }
    return absl::NotFoundError(absl::StrCat("no checkpoint at ", step_dir, ": it holds no ", kMarker, ", ",
                                            kMetadata, " or shard file (a checkpoint is a step_N directory "
                                            "that a save wrote)"));
  }
  if (has_metadata) {
    CheckpointMetadata meta;
    auto bytes = ReadFile(Join(step_dir, kMetadata));
    if (bytes.ok() && meta.ParseFromString(*bytes)) {
      for (const CheckpointShard& sh : meta.shards()) {
        if (!std::binary_search(shards.begin(), shards.end(), sh.file())) missing.push_back(sh.file());
      }
    }
  }
  std::string holds = shards.empty() ? "no shard file"
                                     : absl::StrCat(shards.size(), " shard file", shards.size() == 1 ? "" : "s",
                                                    " (", list(shards), ")");
  if (!missing.empty()) absl::StrAppend(&holds, "; its metadata lists ", missing.size(), " more that are missing (",
                                        list(missing), ")");
  if (!partial.empty()) absl::StrAppend(&holds, "; partly written: ", list(partial));
  return absl::FailedPreconditionError(absl::StrCat(
      "checkpoint ", step_dir, " is incomplete: it has no ", kMarker, " marker",
      has_metadata ? "" : absl::StrCat(" and no ", kMetadata), ", which a save writes last, and holds ", holds,
      ": that save did not finish; use an earlier checkpoint"));
}
}  // namespace

absl::StatusOr<CheckpointMetadata> ReadCheckpointMetadata(const std::string& step_dir) {
  auto marker = ReadFile(Join(step_dir, kMarker));
  if (!marker.ok()) {
    // A marker that is there but not a readable file says what it is (a
    // FIFO, a device, a link loop); an absent one, what the directory holds.
    if (marker.status().code() != absl::StatusCode::kNotFound) return marker.status();
    return WhyNotACheckpoint(step_dir);
  }
  MEMWALL_ASSIGN_OR_RETURN(const std::string bytes, ReadFile(Join(step_dir, kMetadata)));
  return ParseCheckpointMetadata(*marker, bytes, step_dir);
}


namespace {
// The step directories under a run directory: the complete ones (marker
// present) by step number, and the names of those without a marker.
struct StepDirectories {
  std::vector<std::pair<int64_t, std::string>> complete;  // ascending steps
  std::vector<std::string> incomplete;
};

absl::StatusOr<StepDirectories> ListStepDirectories(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("no checkpoint directory at ", dir,
                                            std::filesystem::exists(dir, ec) ? " (not a directory)" : ""));
  }
  StepDirectories steps;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const int64_t step = StepOfName(name);  // skips step_N.tmp (a save in progress) too
    std::error_code missing;  // a missing marker is an answer, not a listing error
    if (step < 0 || !entry.is_directory(missing)) continue;
    if (std::filesystem::is_regular_file(entry.path() / kMarker, missing)) {
      steps.complete.emplace_back(step, name);
    } else {
      steps.incomplete.push_back(name);
    }
  }
  if (ec) return WithErrno(absl::NotFoundError(absl::StrCat("cannot list ", dir, ": ", ec.message())), ec.value());
  // Numbers, not names: step_100000000 is after step_99999999.
  std::sort(steps.complete.begin(), steps.complete.end());
  std::sort(steps.incomplete.begin(), steps.incomplete.end());
  return steps;
}
}  // namespace

absl::StatusOr<std::string> LatestCheckpoint(const std::string& dir) {
  MEMWALL_ASSIGN_OR_RETURN(const StepDirectories steps, ListStepDirectories(dir));
  if (steps.complete.empty()) {
    const std::vector<std::string>& incomplete = steps.incomplete;
    if (incomplete.empty()) {
      return absl::NotFoundError(
          absl::StrCat("no checkpoint under ", dir, ": it holds no step_N directory"));
    }
    return absl::NotFoundError(absl::StrCat(
        "no complete checkpoint under ", dir, ": ", incomplete.size(), " step director",
        incomplete.size() == 1 ? "y lacks" : "ies lack", " the completion marker ", kMarker, " (",
        absl::StrJoin(incomplete, ", "), "): their saves did not finish"));
  }
  return Join(dir, steps.complete.back().second);
}

absl::StatusOr<std::vector<std::string>> PruneCheckpoints(const std::string& dir, int64_t keep) {
  if (keep < 1) {
    return absl::InvalidArgumentError(absl::StrCat("keeping ", keep, " checkpoints: keep at least the newest one"));
  }
  MEMWALL_ASSIGN_OR_RETURN(const StepDirectories steps, ListStepDirectories(dir));
  std::vector<std::string> deleted;
  const int64_t excess = static_cast<int64_t>(steps.complete.size()) - keep;
  for (int64_t i = 0; i < excess; ++i) {
    const std::string step_dir = Join(dir, steps.complete[i].second);
    // The marker first: a deletion cut short leaves an incomplete
    // checkpoint, never a complete-looking one with shards missing.
    std::error_code ec;
    std::filesystem::remove(Join(step_dir, kMarker), ec);
    if (!ec) std::filesystem::remove_all(step_dir, ec);
    if (ec) {
      return WithErrno(absl::PermissionDeniedError(absl::StrCat("cannot delete ", step_dir, ": ", ec.message())),
                       ec.value());
    }
    deleted.push_back(step_dir);
  }
  return deleted;
}

absl::Status Trainer::Agree(const absl::Status& local, absl::string_view what) {
  return AgreeAcrossRanks(comm_, device_, local, what, &agreement_);
}

namespace {
// The runs of flat elements rank `rank`'s shard file holds, in the order
// it stores them: the real elements the rank owns (the partition's
// Owned), pieces adjacent both in the flat order and in the shard joined,
// so ZeRO's contiguous partition gives one run and bandwidth-centric
// partitioning one a parameter.
std::vector<Piece> StoredPieces(const FlatLayout& layout, int rank) {
  std::vector<Piece> runs;
  for (const Piece& p : layout.Owned(rank)) {
    if (p.size == 0) continue;
    if (!runs.empty()) {
      Piece& last = runs.back();
      if (last.begin + last.size == p.begin && last.shard_offset + last.size == p.shard_offset) {
        last.size += p.size;
        continue;
      }
    }
    runs.push_back(p);
  }
  return runs;
}

int64_t Elements(const std::vector<Piece>& pieces) {
  int64_t n = 0;
  for (const Piece& p : pieces) n += p.size;
  return n;
}
}  // namespace

absl::StatusOr<std::string> Trainer::Save(const std::string& dir,
                                          const std::function<void(int)>& after_shard_written) {
  const std::vector<Piece> pieces = StoredPieces(layout_, layout_.rank());
  // One directory: a shard written elsewhere than rank 0's metadata would
  // leave a complete-looking checkpoint that cannot load.
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::absolute(dir, ec);
  MEMWALL_RETURN_IF_ERROR(AgreeOnFingerprint(comm_, device_,
                                             Fingerprint().Add("checkpoint directory", ec ? dir : absolute.string()),
                                             absl::StrCat("saving to ", dir), &agreement_));
  // Saving never changes the run: a deferred update stays pending, and the
  // checkpoint holds it with its gradients (a fourth section).
  MEMWALL_RETURN_IF_ERROR(device_.Synchronize());
  const std::optional<StepUpdate> pending = optimizer_->pending_update();
  const std::string path = CheckpointPath(dir, step_);
  const int rank = comm_.rank(), world = comm_.world_size();
  // Rank 0 prepares the directory: a complete checkpoint is never replaced;
  // a partial one (an interrupted save) is cleared.
  absl::Status prepared;
  if (rank == 0) {
    std::error_code ec;
    if (std::filesystem::exists(Join(path, kMarker), ec)) {
      prepared = absl::AlreadyExistsError(absl::StrCat("checkpoint ", path, " already exists"));
    } else {
      std::filesystem::remove_all(path, ec);
      std::filesystem::create_directories(path, ec);
      if (ec) {
        prepared =
            WithErrno(absl::PermissionDeniedError(absl::StrCat("cannot create ", path, ": ", ec.message())), ec.value());
      }
    }
  }
  MEMWALL_RETURN_IF_ERROR(Agree(prepared, "preparing the checkpoint directory"));

  // This rank's shard file: master, m, v of its real range (and the pending
  // gradients), staged to the host.
  // With one owner (stage 0) every rank holds the same states: rank 0 writes.
  const bool writes = layout_.world() > 1 || rank == 0;
  uint32_t crc = 0;
  uint64_t bytes = 0;
  absl::Status written;
  if (writes) {
    written = [&]() -> absl::Status {
      const std::string shard = Join(path, absl::StrFormat("rank_%05d.shard", rank));
      const int64_t begin = pieces.empty() ? layout_.numel() : pieces.front().begin, count = Elements(pieces);
      // A shard that cannot fit is refused before anything is written.
      const int64_t need = static_cast<int64_t>(ShardFileBytes(count, pending.has_value()));
      if (const int64_t available = FileSystemAvailableBytes(path); available >= 0 && need > available) {
        return WithErrno(absl::ResourceExhaustedError(absl::StrCat("checkpoint shard ", shard, " needs ",
                                                                   FormatBytes(need), " (", need,
                                                                   " bytes) but its file system has ",
                                                                   FormatBytes(available), " available")),
                         ENOSPC);
      }
      MEMWALL_ASSIGN_OR_RETURN(ChecksummedFile file, ChecksummedFile::Open(shard));
      char header[kHeaderBytes];
      std::memcpy(header, kMagic, 8);
      std::memcpy(header + 8, &begin, 8);
      std::memcpy(header + 16, &count, 8);
      MEMWALL_RETURN_IF_ERROR(file.Write(header, kHeaderBytes));
      std::vector<float> host(std::min<int64_t>(count, kChunk));
      for (int section = 0; section < Sections(pending.has_value()); ++section) {
        for (const Piece& piece : pieces) {
          for (int64_t at = 0; at < piece.size; at += kChunk) {
            const int64_t n = std::min(kChunk, piece.size - at), from = piece.shard_offset + at;
            MEMWALL_RETURN_IF_ERROR(
                section == kPendingGradients
                    ? optimizer_->ReadPendingGradients(from, n, host.data())
                    : optimizer_->ReadState(static_cast<OptimizerState>(section), from, n, host.data()));
            if (section == static_cast<int>(OptimizerState::kMaster)) {
              MEMWALL_RETURN_IF_ERROR(CheckFiniteMaster(host.data(), n, piece.begin + at));
            }
            MEMWALL_RETURN_IF_ERROR(file.Write(host.data(), n * sizeof(float)));
          }
        }
      }
      MEMWALL_RETURN_IF_ERROR(file.Commit());
      crc = file.crc();
      bytes = file.size();
      return absl::OkStatus();
    }();
  }
  if (written.ok() && after_shard_written) after_shard_written(rank);
  MEMWALL_RETURN_IF_ERROR(Agree(written, "writing a checkpoint shard"));

  // Every shard is in place: gather their sizes and checksums on rank 0.
  const int32_t mine[4] = {static_cast<int32_t>(crc), static_cast<int32_t>(bytes & 0xffffffffu),
                           static_cast<int32_t>(bytes >> 32), writes ? 1 : 0};
  MEMWALL_ASSIGN_OR_RETURN(const std::vector<char> gathered,
                           AllGatherRecords(comm_, device_, absl::string_view(reinterpret_cast<const char*>(mine),
                                                                              sizeof(mine)), &agreement_));
  std::vector<int32_t> infos(4 * world);
  std::memcpy(infos.data(), gathered.data(), gathered.size());

  absl::Status finished;
  if (rank == 0) {
    CheckpointMetadata meta;
    meta.set_format_version(1);
    meta.set_world_size(world);
    meta.set_stage(training_->zero().stage());
    meta.set_precision(std::string(PrecisionName(training_->precision())));
    meta.set_numel(layout_.numel());
    for (models::Parameter* p : layout_.params()) {
      CheckpointTensor* t = meta.add_tensors();
      t->set_name(p->name);
      for (int64_t d : p->shape) t->add_shape(d);
      t->set_offset(layout_.offset(p));
      if (p->slice.has_value()) {
        t->set_logical_name(p->slice->name);
        t->set_logical_width(p->slice->width);
        t->set_column_begin(p->slice->begin);
      }
    }
    for (int r = 0; r < world; ++r) {
      if (infos[4 * r + 3] == 0) continue;
      CheckpointShard* sh = meta.add_shards();
      sh->set_rank(r);
      sh->set_file(absl::StrFormat("rank_%05d.shard", r));
      const std::vector<Piece> theirs = StoredPieces(layout_, layout_.world() > 1 ? r : 0);
      sh->set_flat_begin(theirs.empty() ? layout_.numel() : theirs.front().begin);
      sh->set_count(Elements(theirs));
      if (theirs.size() > 1) {  // one run is [flat_begin, + count): a checkpoint older readers know
        for (const Piece& p : theirs) {
          CheckpointPiece* piece = sh->add_pieces();
          piece->set_flat_begin(p.begin);
          piece->set_count(p.size);
        }
      }
      sh->set_bytes(uint64_t(uint32_t(infos[4 * r + 1])) | (uint64_t(uint32_t(infos[4 * r + 2])) << 32));
      sh->set_crc32(uint32_t(infos[4 * r]));
    }
    meta.set_step(step_);
    meta.set_adam_step(adam_step_);
    meta.set_loss_scale(loss_scaler_.scale());
    meta.set_clean_steps(loss_scaler_.state().clean_steps);
    // fp16 only: the checkpoints of other precisions stay readable by a
    // memwall that predates the field.
    if (training_->precision() == FP16) meta.set_hysteresis_left(loss_scaler_.state().hysteresis_left);
    meta.set_seed(training_->seed());
    meta.set_global_batch(int64_t{world} * training_->accumulation() * training_->micro_batch());
    meta.set_seq(training_->seq());
    *meta.mutable_model() = model_.config();
    if (pending.has_value()) {
      meta.mutable_pending_update()->set_lr(pending->lr);
      meta.mutable_pending_update()->set_step(pending->step);
      meta.mutable_pending_update()->set_grad_scale(pending->grad_scale);
    }
    const std::string bytes_out = meta.SerializeAsString();
    finished = WriteFileAtomically(Join(path, kMetadata), bytes_out);
    if (finished.ok()) {
      finished = WriteFileAtomically(Join(path, kMarker), CheckpointMarker(bytes_out));
    }
  }
  MEMWALL_RETURN_IF_ERROR(Agree(finished, "writing the checkpoint metadata"));
  return path;
}

absl::Status Trainer::CheckFiniteMaster(const float* values, int64_t n, int64_t flat_begin) const {
  const float* bad = std::find_if(values, values + n, [](float v) { return !std::isfinite(v); });
  if (bad == values + n) return absl::OkStatus();
  const int64_t at = flat_begin + (bad - values);
  std::string where = absl::StrCat("flat element ", at);
  for (const models::Parameter* p : layout_.params()) {
    if (at >= layout_.offset(p) && at < layout_.offset(p) + p->numel()) {
      where = absl::StrCat("tensor ", p->name, " element ", at - layout_.offset(p));
    }
  }
  return absl::FailedPreconditionError(absl::StrCat("not saving step ", step_, ": the master weights hold ", *bad,
                                                    " (", where, "): the run diverged; resume from an earlier "
                                                    "checkpoint"));
}

absl::Status Trainer::Export(const std::string& path) {
  // Rank 0 writes the file a logical tensor at a time and asks the owners
  // for each range ([Note: serving flat ranges to rank 0]): no rank holds
  // the 4 bytes a parameter of the whole beside its planned memory.
  MEMWALL_RETURN_IF_ERROR(device_.Synchronize());
  const ShardValueReader master = [&](int64_t shard_offset, int64_t n, float* out) {
    return optimizer_->ReadState(OptimizerState::kMaster, shard_offset, n, out);
  };
  const absl::Status exported =
      ReadOnRankZero(comm_, device_, layout_.partition(), master,
                     [&](const models::FlatValueReader& read) { return models::ExportGpt(model_, read, path); });
  return Agree(exported, absl::StrCat("exporting to ", path));
}

absl::Status Trainer::VerifyCheckpoint(const std::string& step_dir, CheckpointMetadata& meta) {
  MEMWALL_ASSIGN_OR_RETURN(meta, ReadCheckpointMetadata(step_dir));
  // The model must be this one: the same shapes can hold another model
  // (8 heads of 64 against 4 of 128).
  if (meta.has_model()) {
    const models::GptConfig& saved = meta.model();
    const models::GptConfig& mine = model_.config();
    for (const auto& [field, was, is] :
         {std::tuple<absl::string_view, int64_t, int64_t>{"layers", saved.layers(), mine.layers()},
          {"hidden", saved.hidden(), mine.hidden()},
          {"heads", saved.heads(), mine.heads()},
          {"vocab", saved.vocab(), mine.vocab()},
          {"positions", saved.positions(), mine.positions()},
          {"tiling", std::max<int64_t>(1, saved.tiling()), std::max<int64_t>(1, mine.tiling())}}) {
      if (was != is) {
        return absl::InvalidArgumentError(absl::StrCat("checkpoint ", step_dir, " holds a model with ", field,
                                                       " = ", was, "; this model has ", field, " = ", is,
                                                       " (GptConfig '", mine.name(), "')"));
      }
    }
  }
  // The tensor table must be this model's.
  const auto& params = layout_.params();
  if (meta.numel() != layout_.numel() || meta.tensors_size() != static_cast<int>(params.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", step_dir, " holds ", meta.tensors_size(), " tensors, ", meta.numel(),
        " parameters; this model has ", params.size(), " tensors, ", layout_.numel()));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const CheckpointTensor& t = meta.tensors(i);
    const std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
    if (t.name() != params[i]->name || shape != params[i]->shape || t.offset() != layout_.offset(params[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint ", step_dir, ": tensor ", i, " is ", t.name(), " (", absl::StrJoin(shape, "x"),
          ") but the model's is ", params[i]->name, " (", absl::StrJoin(params[i]->shape, "x"), ")"));
    }
  }
  // Every shard present and whole (cheap), whichever this rank reads.
  for (const CheckpointShard& sh : meta.shards()) {
    struct stat st;
    const std::string file = Join(step_dir, sh.file());
    if (::stat(file.c_str(), &st) != 0) {
      return absl::NotFoundError(absl::StrCat("checkpoint ", step_dir, " is missing shard ", sh.file(),
                                              " (rank ", sh.rank(), " of the saving run)"));
    }
    if (uint64_t(st.st_size) != sh.bytes()) {
      return absl::DataLossError(absl::StrCat("shard ", file, " is ", st.st_size, " bytes but the metadata says ",
                                              sh.bytes(), ": the file is truncated or was replaced"));
    }
  }
  // A pending delayed update continues only in a run that delays its updates.
  if (meta.has_pending_update() && !optimizer_->defers_updates()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", step_dir, " was saved under the delayed parameter update with step ", meta.adam_step(),
        "'s update still pending; load it with zero.offload_optimizer.delayed_update_after_steps > 0 (and "
        "offload_optimizer.device = CPU or NVME) to continue that run exactly"));
  }
  // The data position is step · global batch (models/data.h), so the
  // stream continues only with the same global batch and sequence length.
  const int64_t global_batch = int64_t{comm_.world_size()} * training_->accumulation() * training_->micro_batch();
  if (meta.global_batch() != global_batch || meta.seq() != training_->seq()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", step_dir, " was saved with a global batch of ", meta.global_batch(),
        " sequences of ", meta.seq(), " tokens; this run has ", global_batch, " of ", training_->seq(),
        " (ranks x accumulation x micro_batch), so the data would not continue where it stopped"));
  }
  if (meta.world_size() != comm_.world_size() && comm_.rank() == 0) {
    std::fprintf(stderr, "loading %s: re-partitioning from %d to %d ranks\n", step_dir.c_str(),
                 meta.world_size(), comm_.world_size());
  }
  // The shards that hold this rank's elements (whichever old ranks wrote
  // them, under whichever partitioning), CRC-checked: read through once,
  // in 4 MiB pieces.
  const StoredRuns runs(meta);
  std::vector<bool> needed(meta.shards_size(), false);
  for (const Piece& piece : StoredPieces(layout_, layout_.rank())) {
    for (const StoredRun& run : runs.Overlapping(piece.begin, piece.begin + piece.size)) needed[run.shard] = true;
  }
  for (int i = 0; i < meta.shards_size(); ++i) {
    if (!needed[i]) continue;
    MEMWALL_ASSIGN_OR_RETURN(const std::unique_ptr<ShardReader> reader,
                             ShardReader::Open(step_dir, meta.shards(i), /*verify_crc=*/true));
    MEMWALL_RETURN_IF_ERROR(CheckFinite(meta, *reader, step_dir));
  }
  return absl::OkStatus();
}

absl::Status Trainer::Load(const std::string& step_dir) {
  MEMWALL_RETURN_IF_ERROR(device_.Synchronize());
  // Every rank verifies what it needs first; only when all succeeded does
  // any rank change its state.
  CheckpointMetadata meta;
  MEMWALL_RETURN_IF_ERROR(Agree(VerifyCheckpoint(step_dir, meta), absl::StrCat("loading ", step_dir)));
  // The same checkpoint on every rank (its path may differ, its metadata not).
  Fingerprint loaded;
  loaded.Add("checkpoint step", absl::StrCat(meta.step()))
      .Add("checkpoint metadata", CheckpointMarker(meta.SerializeAsString()));
  MEMWALL_RETURN_IF_ERROR(AgreeOnFingerprint(comm_, device_, loaded, absl::StrCat("loading ", step_dir), &agreement_));
  // A delayed step left running by a failed step finishes before the states
  // change (the pending update it replaces is applied, then overwritten).
  MEMWALL_RETURN_IF_ERROR(ApplyPendingUpdate());
  // Then streamed, kChunk elements of one state at a time, from the shards
  // into the optimizer's store (an NVMe store swaps its sub-groups through
  // its buffers): never the whole shard in memory. A pending update's
  // gradients go where the next step's delayed update reads them.
  const std::vector<Piece> pieces = StoredPieces(layout_, layout_.rank());
  absl::Status streamed = [&]() -> absl::Status {
    const StoredRuns runs(meta);
    std::vector<std::unique_ptr<ShardReader>> readers(meta.shards_size());
    std::vector<float> host(std::min<int64_t>(Elements(pieces), kChunk));
    for (int section = 0; section < Sections(meta); ++section) {
      for (const Piece& piece : pieces) {
        for (int64_t at = 0; at < piece.size; at += kChunk) {
          const int64_t n = std::min(kChunk, piece.size - at), to = piece.shard_offset + at;
          MEMWALL_RETURN_IF_ERROR(ReadRange(step_dir, meta, runs, readers, section, piece.begin + at,
                                            piece.begin + at + n, host.data(), /*verify_crc=*/false));
          MEMWALL_RETURN_IF_ERROR(
              section == kPendingGradients
                  ? optimizer_->WritePendingGradients(to, n, host.data())
                  : optimizer_->WriteState(static_cast<OptimizerState>(section), to, n, host.data()));
        }
      }
    }
    std::optional<StepUpdate> pending;
    if (meta.has_pending_update()) {
      const PendingUpdate& u = meta.pending_update();
      pending = StepUpdate{u.lr(), u.step(), u.grad_scale()};
    }
    return optimizer_->SetPendingUpdate(pending);
  }();
  if (!streamed.ok()) {
    // Verified, then failed while streaming (the file changed or the drive
    // failed since): say that the states are half loaded.
    streamed = WithErrno(absl::Status(streamed.code(),
                                      absl::StrCat(streamed.message(), " (after verifying ", step_dir,
                                                   "; this trainer's states are now partly loaded: load a "
                                                   "checkpoint again before training)")),
                         ErrnoOf(streamed));
  }
  MEMWALL_RETURN_IF_ERROR(Agree(streamed, absl::StrCat("streaming ", step_dir)));
  step_ = meta.step();
  adam_step_ = meta.adam_step();
  // A loss scale carries over only between fp16 runs.
  if (training_->precision() == FP16 && meta.precision() == "fp16") {
    loss_scaler_.Restore({meta.loss_scale(), meta.clean_steps(), meta.hysteresis_left()});
  } else {
    loss_scaler_ = LossScaler(LossScalingOf(training_.config()));
  }
  MEMWALL_RETURN_IF_ERROR(RefreshComputeCopy());
  MEMWALL_RETURN_IF_ERROR(coll().Synchronize());
  return device_.compute_stream().Synchronize();
}

namespace {

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// A tensor of the Hugging Face file: an untiled parameter, or the tiles of
// one projection joined (their columns cover [0, width) once, in order).
struct HfTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<const CheckpointTensor*> parts;
};

absl::StatusOr<std::vector<HfTensor>> HfTensors(const CheckpointMetadata& meta, const std::string& step_dir) {
  std::vector<HfTensor> out;  // in order of first appearance: the untiled model's order
  std::map<std::string, size_t> index;
  for (const CheckpointTensor& t : meta.tensors()) {
    std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
    const std::string& name = t.logical_name().empty() ? t.name() : t.logical_name();
    if (!t.logical_name().empty()) shape.back() = t.logical_width();
    auto [it, added] = index.try_emplace(name, out.size());
    if (added) out.push_back({name, shape, {}});
    HfTensor& h = out[it->second];
    const int64_t covered = h.parts.empty() ? 0 : h.parts.back()->column_begin() + h.parts.back()->shape(h.parts.back()->shape_size() - 1);
    if (h.shape != shape || (!added && t.logical_name().empty()) || t.column_begin() != covered) {
      return absl::DataLossError(absl::StrCat("checkpoint ", step_dir, ": ", kMetadata, " gives tensor \"", t.name(),
                                              "\" a place in \"", name, "\" that does not follow its other tiles"));
    }
    h.parts.push_back(&t);
  }
  for (const HfTensor& h : out) {
    const CheckpointTensor& last = *h.parts.back();
    if (last.column_begin() + last.shape(last.shape_size() - 1) != h.shape.back()) {
      return absl::DataLossError(absl::StrCat("checkpoint ", step_dir, ": ", kMetadata, " gives the tiles of \"",
                                              h.name, "\" fewer columns than its width ", h.shape.back()));
    }
  }
  return out;
}

// Refuses an output path inside a checkpoint directory (one holding a
// marker or metadata): writing there could replace a shard or the metadata
// that the consolidation reads or that another resume needs.
absl::Status CheckOutsideCheckpoints(const std::string& out) {
  std::error_code ec;
  const std::filesystem::path full = std::filesystem::weakly_canonical(std::filesystem::absolute(out, ec), ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("output ", out, ": ", ec.message()));
  if (std::filesystem::is_directory(full, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("output ", out, " is a directory; give a file name"));
  }
  for (std::filesystem::path dir = full.parent_path(); !dir.empty(); dir = dir.parent_path()) {
    if (std::filesystem::exists(dir / kMarker, ec) || std::filesystem::exists(dir / kMetadata, ec)) {
      return absl::InvalidArgumentError(absl::StrCat("output ", out, " is inside the checkpoint ", dir.string(),
                                                     ": writing there could replace its shards or metadata; write "
                                                     "the consolidated file elsewhere"));
    }
    if (dir == dir.root_path()) break;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ConsolidateCheckpoint(const std::string& path, const std::string& out) {
  std::string step_dir = path;
  std::error_code ec;  // a path that cannot be examined is explained by ReadCheckpointMetadata
  if (!std::filesystem::exists(Join(path, kMetadata), ec) && !std::filesystem::exists(Join(path, kMarker), ec)) {
    auto latest = LatestCheckpoint(path);
    if (latest.ok()) step_dir = *latest;
  }
  MEMWALL_ASSIGN_OR_RETURN(const CheckpointMetadata meta, ReadCheckpointMetadata(step_dir));
  MEMWALL_RETURN_IF_ERROR(CheckOutsideCheckpoints(out));
  // Every shard verified before anything is written.
  std::vector<std::unique_ptr<ShardReader>> readers(meta.shards_size());
  for (int i = 0; i < meta.shards_size(); ++i) {
    MEMWALL_ASSIGN_OR_RETURN(readers[i], ShardReader::Open(step_dir, meta.shards(i), true));
    MEMWALL_RETURN_IF_ERROR(CheckFinite(meta, *readers[i], step_dir));
  }
  MEMWALL_ASSIGN_OR_RETURN(const std::vector<HfTensor> hf, HfTensors(meta, step_dir));
  const StoredRuns runs(meta);
  std::vector<models::SafetensorsTensor> tensors;
  for (const HfTensor& t : hf) tensors.push_back({t.name, DType::kF32, t.shape, nullptr});
  // A checkpoint that records its model exports as ExportGpt does.
  const std::map<std::string, std::string> metadata =
      meta.has_model() ? models::ExportMetadata(meta.model()) : std::map<std::string, std::string>{{"format", "pt"}};
  MEMWALL_ASSIGN_OR_RETURN(auto writer, models::SafetensorsWriter::Create(out, tensors, metadata));
  std::vector<float> one, tile;  // the one tensor in memory, and one of its tiles
  for (const HfTensor& t : hf) {
    const int64_t width = t.shape.back(), rows = Numel(t.shape) / width;
    one.assign(Numel(t.shape), 0.0f);
    for (const CheckpointTensor* part : t.parts) {
      // Row r of a tile of w columns is columns [begin, begin + w) of row r.
      const int64_t w = part->shape(part->shape_size() - 1), begin = part->column_begin();
      tile.assign(rows * w, 0.0f);
      MEMWALL_RETURN_IF_ERROR(
          ReadRange(step_dir, meta, runs, readers, 0, part->offset(), part->offset() + rows * w, tile.data()));
      for (int64_t r = 0; r < rows; ++r) std::copy_n(tile.data() + r * w, w, one.data() + r * width + begin);
    }
    MEMWALL_RETURN_IF_ERROR(writer->Append(one.data(), one.size() * sizeof(float)));
  }
  MEMWALL_RETURN_IF_ERROR(writer->Finish());
  if (meta.has_model()) MEMWALL_RETURN_IF_ERROR(models::WriteHfConfig(meta.model(), out));
  return step_dir;
}

}  // namespace memwall::zero
