// An asynchronous file I/O engine on io_uring (ZeRO-Infinity §6.3: the
// states offloaded to NVMe move through it at the drive's bandwidth).
// Submit now, wait later:
//
//   MEMWALL_ASSIGN_OR_RETURN(auto aio, AioEngine::Create({.block_bytes = 1 << 20, .queue_depth = 32}));
//   MEMWALL_ASSIGN_OR_RETURN(AioFileId f, aio->Open({"/nvme0/swap", "/nvme1/swap"}, /*create=*/true));
//   MEMWALL_ASSIGN_OR_RETURN(AioRequest r, aio->Write(f, 0, pinned, bytes));
//   ... the CPU works meanwhile ...
//   MEMWALL_RETURN_IF_ERROR(aio->Wait(r));
//
// A request is split into blocks of block_bytes; the blocks are spread over
// `threads` submitting threads, each with its own ring and at most
// queue_depth blocks in flight. A file opened with several paths is striped:
// block b of the file lives in path b mod P, at offset (b div P) ·
// block_bytes there (P paths). Short reads and writes are continued where
// they stopped; a failure (EIO, ENOSPC, an unexpected end of file) becomes the
// request's Status, naming the path, the offset and the errno.
//
// With O_DIRECT (the default) the buffer's address, the offset and the size
// must be multiples of kAioAlignment. A file system that refuses O_DIRECT
// (tmpfs) and a kernel without io_uring are not errors: the engine falls
// back to buffered I/O, or to pread/pwrite on its threads, and says so once
// on stderr; direct() and uses_io_uring() tell which.
#ifndef MEMWALL_INFINITY_AIO_H_
#define MEMWALL_INFINITY_AIO_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/files.h"
#include "zero/zero_config.pb.h"

namespace memwall::infinity {

inline constexpr int64_t kAioAlignment = kDirectIoAlignment;

// `bytes` rounded up to a multiple of kAioAlignment: what an O_DIRECT
// transfer of them moves.
inline constexpr int64_t AioAligned(int64_t bytes) {
  return (bytes + kAioAlignment - 1) / kAioAlignment * kAioAlignment;
}

struct AioOptions {
  int64_t block_bytes = int64_t{1} << 20;  // a multiple of kAioAlignment
  int queue_depth = 32;                    // blocks in flight per thread, 1-4096
  int threads = 1;                         // submitting threads (rings), 1-64
  bool direct = true;                      // O_DIRECT
  // false: pread/pwrite on the threads, as where the kernel has no io_uring
  // (or a sandbox forbids it).
  bool io_uring = true;
};
// Each value in range; the message names the field.
absl::Status ValidateAioOptions(const AioOptions& options);
// The engine's defaults above, with each field `config` sets (a run's
// zero.aio, checked by zero/config.h) in its place.
AioOptions AioOptionsFor(const zero::AioConfig& config);

// One block as the kernel would run it, for a fault injector (tests).
struct AioBlockOp {
  bool write = false;
  std::string path;
  int64_t offset = 0;  // in that path
  int64_t bytes = 0;
  int64_t index = 0;   // the engine's count of blocks submitted, from 0
};
// Returns the result to report instead of the kernel's (a negative errno,
// or a byte count below `bytes` for a short transfer), or nullopt.
using AioFaultInjector = std::function<std::optional<int64_t>(const AioBlockOp&)>;

using AioFileId = int;

// A submitted request; Wait on it once.
class AioRequest {
 public:
  struct State;  // the engine's (aio.cc)
  AioRequest() = default;
  bool valid() const { return state_ != nullptr; }
  // After Wait: when it was submitted and when its last block completed,
  // in steady-clock nanoseconds (the timeline's clock, TimelineNowNs).
  int64_t submitted_ns() const;
  int64_t completed_ns() const;

 private:
  friend class AioEngine;
  std::shared_ptr<State> state_;
};

class AioEngine {
 public:
  static absl::StatusOr<std::unique_ptr<AioEngine>> Create(const AioOptions& options);
  ~AioEngine();  // waits for every request in flight

  // Opens `paths` as one (striped) file, read-write; `create`: created if
  // missing (never truncated).
  absl::StatusOr<AioFileId> Open(const std::vector<std::string>& paths, bool create);
  // Closes it; its requests must have been waited for.
  absl::Status Close(AioFileId file);
  // Whether the file is open with O_DIRECT (false where it was refused).
  bool direct(AioFileId file) const;
  // The file's size: the sum of its paths' sizes.
  absl::StatusOr<int64_t> Size(AioFileId file) const;

  // Bytes [offset, offset + bytes) of the file from / into `buffer`.
  absl::StatusOr<AioRequest> Read(AioFileId file, int64_t offset, void* buffer, int64_t bytes);
  absl::StatusOr<AioRequest> Write(AioFileId file, int64_t offset, const void* buffer, int64_t bytes);
  // Blocks until every block of `request` completed; its Status.
  absl::Status Wait(AioRequest& request);

  const AioOptions& options() const;
  bool uses_io_uring() const;
  // Tests: consulted for every block as it completes.
  void SetFaultInjector(AioFaultInjector injector);

 private:
  struct Impl;
  explicit AioEngine(std::unique_ptr<Impl> impl);
  absl::StatusOr<AioRequest> Submit(bool write, AioFileId file, int64_t offset, void* buffer, int64_t bytes);
  std::unique_ptr<Impl> impl_;
};

// A swap file this process holds: its id on the engine, and an exclusive
// flock on it, held until destruction, so that a second process given the
// same directory (two jobs on one machine, one nvme_path) is refused
// instead of truncating the first one's states. Destruction removes the
// file, then releases the lock: only ever a file this process holds, never
// another job's. Transfers still in flight on it are harmless (the engine
// keeps it open until they end). Move-only.
class SwapFile {
 public:
  SwapFile() = default;
  SwapFile(AioFileId id, int lock_fd, std::string path) : id_(id), lock_fd_(lock_fd), path_(std::move(path)) {}
  SwapFile(SwapFile&& other) noexcept { *this = std::move(other); }
  SwapFile& operator=(SwapFile&& other) noexcept;
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;
  ~SwapFile() { Remove(); }

  AioFileId id() const { return id_; }

 private:
  void Remove();

  AioFileId id_ = -1;
  int lock_fd_ = -1;  // -1: holds nothing
  std::string path_;
};

// A fresh swap file: `path` locked (FailedPrecondition when another process
// holds it), truncated and allocated to `bytes` zero bytes (not sparse: a
// disk that is too small is refused here, ResourceExhausted, not in a
// swap-out later), then opened on `aio`. Errors start with `what` ("NVMe
// offload") and point at `dir_field`, the config field of its directory.
absl::StatusOr<SwapFile> CreateSwapFile(AioEngine& aio, const std::string& path, int64_t bytes,
                                        const std::string& what, const std::string& dir_field);

// Memory aligned for O_DIRECT (kAioAlignment), freed with std::free.
struct AlignedFree {
  void operator()(void* p) const;
};
std::unique_ptr<char, AlignedFree> AllocateAligned(int64_t bytes);

}  // namespace memwall::infinity

#endif  // MEMWALL_INFINITY_AIO_H_
