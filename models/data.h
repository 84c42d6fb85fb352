// Token data for training and evaluation.
//
// A TokenSource is a sequence of token ids: the bytes of a text file
// (the byte-level tokenizer: token id = byte value, vocabulary 256), a
// token file (ids from any tokenizer, e.g. GPT-2's BPE, as little-endian
// uint16 with no header: nanoGPT's train.bin, or numpy's
// `np.array(ids, np.uint16).tofile(path)`), or a synthetic stream (a hash of
// the position, for throughput runs).
//
// Sampling is a pure function of the step, so it is deterministic, needs no
// state to resume (restart at step s and the data continues where it was)
// and does not depend on how the global batch is split. Each step consumes
// G = world * accumulation * micro_batch sequences; sequence number
//   n = step * G + (rank * accumulation + micro) * micro_batch + i
// is the window of seq + 1 tokens starting at (n * seq) mod (size - seq):
// ids are its first seq tokens, targets its last seq (shifted by one).
// Consecutive sequence numbers tile the text, cycling when it runs out.
#ifndef MEMWALL_MODELS_DATA_H_
#define MEMWALL_MODELS_DATA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace memwall::models {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual int64_t size() const = 0;
  virtual int64_t vocab() const = 0;
  virtual int32_t token(int64_t i) const = 0;
  virtual std::string description() const = 0;
};

// The largest text ByteTextSource reads (it holds the whole file).
inline constexpr int64_t kMaxTextBytes = int64_t{1} << 34;

// The bytes of a file as tokens: a regular file of at most kMaxTextBytes,
// else a Status naming the path and what it is (runtime/files.h).
absl::StatusOr<std::unique_ptr<TokenSource>> ByteTextSource(const std::string& path);
// The ids of a token file (above) of at most kMaxTextBytes; vocab() is the
// largest id + 1. A file of an odd number of bytes is refused.
absl::StatusOr<std::unique_ptr<TokenSource>> Uint16TokenSource(const std::string& path);

// How a training file's bytes are tokens. kAuto: a name ending in ".bin" is
// a token file, anything else text.
enum class DataFormat { kAuto, kText, kUint16 };
// "auto", "text" or "uint16"; anything else is InvalidArgument listing them.
absl::StatusOr<DataFormat> ParseDataFormat(absl::string_view name);
// The training data at `path`, read as `format` says.
absl::StatusOr<std::unique_ptr<TokenSource>> OpenTokenSource(const std::string& path, DataFormat format);

// Bytes already in memory (tests).
std::unique_ptr<TokenSource> ByteStringSource(std::string text, std::string description);
// `size` pseudo-random tokens in [0, vocab), a function of (seed, index).
std::unique_ptr<TokenSource> SyntheticSource(int64_t size, int64_t vocab, uint64_t seed);

// How one step's global batch is split.
struct BatchLayout {
  int64_t seq = 0;
  int64_t micro_batch = 0;   // sequences per micro-batch per rank
  int64_t accumulation = 1;  // micro-batches per step per rank
  int world = 1;
  int64_t global_batch() const { return int64_t{world} * accumulation * micro_batch; }
};

absl::Status ValidateLayout(const TokenSource& source, const BatchLayout& layout);

// Fills micro_batch * seq ids and targets for (step, rank, micro).
absl::Status FillMicroBatch(const TokenSource& source, const BatchLayout& layout, int64_t step,
                            int rank, int64_t micro, int32_t* ids, int32_t* targets);

}  // namespace memwall::models

#endif  // MEMWALL_MODELS_DATA_H_
