// Fuzz target: what a checkpoint directory's small files say, before any
// shard is read (zero/checkpoint.h): the COMPLETE marker and metadata.pb
// (ParseCheckpointMetadata), and a shard's 24-byte header
// (CheckShardHeader). A checkpoint may come from another run, another
// version or a damaged disk.
// The first input byte picks what the rest is:
//   0    metadata.pb's bytes, with the marker that matches them (so the
//        fuzzer gets past the CRC to the parse and the validation);
//   1    marker and metadata as given (split at the second byte's value);
//   else a shard header (24 bytes) and the metadata entry to check it
//        against (flat begin and count, 8 bytes each).
// Promises checked on every input:
//   - a refusal is DataLoss naming the directory (or the shard's path);
//   - accepted metadata lets a reader use its numbers directly: the
//     shards' runs (their pieces, when listed) tile [0, numel) once, files
//     have plain names, tensors lie inside, and the
//     sizes computed from them do not overflow (UBSan reports one).
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "tools/fuzz.h"
#include "zero/checkpoint.h"

namespace memwall::zero {
namespace {

constexpr char kDir[] = "fuzz-ckpt/step_00000007";

void CheckMetadata(const std::string& marker, const std::string& metadata) {
  auto meta = ParseCheckpointMetadata(marker, metadata, kDir);
  if (!meta.ok()) {
    fuzz::CheckRefusal(meta.status(), absl::StatusCode::kDataLoss, kDir);
    return;
  }
  // Every shard's runs (its pieces, or its one range), sorted, tile
  // [0, numel); a shard's pieces are in flat order and add up to its count.
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (const CheckpointShard& sh : meta->shards()) {
    FUZZ_CHECK(sh.file().find('/') == std::string::npos && sh.file() != "..", "shard file ", sh.file());
    FUZZ_CHECK(sh.count() >= 0, "shard ", sh.file(), " count ", sh.count());
    if (sh.pieces().empty()) {
      if (sh.count() > 0) runs.emplace_back(sh.flat_begin(), sh.count());
      continue;
    }
    int64_t sum = 0, end = 0;
    for (const CheckpointPiece& piece : sh.pieces()) {
      FUZZ_CHECK(piece.count() >= 1 && piece.flat_begin() >= end, "shard ", sh.file(), " pieces out of order");
      runs.emplace_back(piece.flat_begin(), piece.count());
      end = piece.flat_begin() + piece.count();
      sum += piece.count();
    }
    FUZZ_CHECK(sum == sh.count() && sh.flat_begin() == sh.pieces(0).flat_begin(), "shard ", sh.file(),
               " pieces disagree with its range");
  }
  std::sort(runs.begin(), runs.end());
  int64_t at = 0;
  for (const auto& [begin, count] : runs) {
    FUZZ_CHECK(begin == at, "a run at ", begin, " where ", at, " was expected");
    at += count;
  }
  FUZZ_CHECK(at == meta->numel(), "shards hold ", at, " of ", meta->numel());
  for (const CheckpointTensor& t : meta->tensors()) {
    int64_t numel = 1;
    for (int64_t d : t.shape()) numel *= d;
    FUZZ_CHECK(numel >= 1 && t.offset() >= 0 && t.offset() + numel <= meta->numel(), t.name());
  }
}

void CheckHeader(const std::string& bytes) {
  std::string header = bytes.substr(0, 24);
  CheckpointShard shard;
  int64_t begin = 0, count = 0;
  if (bytes.size() >= 40) {
    std::memcpy(&begin, bytes.data() + 24, 8);
    std::memcpy(&count, bytes.data() + 32, 8);
  }
  shard.set_flat_begin(begin);
  shard.set_count(count);
  const absl::Status st = CheckShardHeader(header, shard, "fuzz-ckpt/rank_00003.shard");
  if (!st.ok()) {
    fuzz::CheckRefusal(st, absl::StatusCode::kDataLoss, "rank_00003.shard");
    return;
  }
  FUZZ_CHECK(header.size() == 24 && header.compare(0, 8, "MWSHARD1") == 0, "a header without the magic passed");
}

void Check(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const std::string rest = fuzz::AsString(data + 1, size - 1);
  switch (data[0]) {
    case 0:
      CheckMetadata(CheckpointMarker(rest), rest);
      break;
    case 1: {
      if (rest.empty()) break;
      const size_t split = std::min<size_t>(uint8_t(rest[0]), rest.size() - 1);
      CheckMetadata(rest.substr(1, split), rest.substr(1 + split));
      break;
    }
    default:
      CheckHeader(rest);
  }
}

}  // namespace
}  // namespace memwall::zero

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  memwall::zero::Check(data, size);
  return 0;
}
