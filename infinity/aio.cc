#include "infinity/aio.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"
#include "zero/config.h"

namespace memwall::infinity {

void AlignedFree::operator()(void* p) const { std::free(p); }

std::unique_ptr<char, AlignedFree> AllocateAligned(int64_t bytes) {
  const size_t rounded = static_cast<size_t>(AioAligned(bytes));
  return std::unique_ptr<char, AlignedFree>(static_cast<char*>(std::aligned_alloc(kAioAlignment, rounded)));
}

absl::Status ValidateAioOptions(const AioOptions& o) {
  auto bad = [](absl::string_view field, int64_t value, absl::string_view need) {
    return absl::InvalidArgumentError(absl::StrCat("AioOptions ", field, " = ", value, " ", need));
  };
  if (o.block_bytes <= 0 || o.block_bytes % kAioAlignment != 0) {
    return bad("block_bytes", o.block_bytes, absl::StrCat("must be a positive multiple of ", kAioAlignment));
  }
  if (o.queue_depth < 1 || o.queue_depth > zero::kMaxAioQueueDepth) {
    return bad("queue_depth", o.queue_depth, absl::StrCat("must be in [1, ", zero::kMaxAioQueueDepth, "]"));
  }
  if (o.threads < 1 || o.threads > zero::kMaxAioThreads) {
    return bad("threads", o.threads, absl::StrCat("must be in [1, ", zero::kMaxAioThreads, "]"));
  }
  return absl::OkStatus();
}

AioOptions AioOptionsFor(const zero::AioConfig& config) {
  AioOptions o;
  if (config.has_block_bytes()) o.block_bytes = config.block_bytes();
  if (config.has_queue_depth()) o.queue_depth = static_cast<int>(config.queue_depth());
  if (config.has_threads()) o.threads = static_cast<int>(config.threads());
  return o;
}

namespace {

// The status of a failed transfer, by errno (which it carries: WithErrno).
absl::Status IoError(int err, const std::string& what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(err), " (errno ", err, ")");
  auto code = [&] {
    switch (err) {
      case ENOSPC:
      case EDQUOT: return absl::StatusCode::kResourceExhausted;
      case EIO: return absl::StatusCode::kDataLoss;
      case ENOENT: return absl::StatusCode::kNotFound;
      case EACCES:
      case EPERM: return absl::StatusCode::kPermissionDenied;
      case EINVAL: return absl::StatusCode::kInvalidArgument;
      default: return absl::StatusCode::kInternal;
    }
  };
  return WithErrno(absl::Status(code(), message), err);
}

struct File {
  std::vector<std::string> paths;
  std::vector<int> fds;
  bool direct = true;
};

}  // namespace

struct AioRequest::State {
  std::mutex mu;
  std::condition_variable done;
  int64_t remaining = 0;  // blocks not yet completed
  absl::Status status;    // the first failure
  bool waited = false;
  int64_t submitted_ns = 0, completed_ns = 0;
};

namespace {
int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

int64_t AioRequest::submitted_ns() const { return state_ ? state_->submitted_ns : 0; }
int64_t AioRequest::completed_ns() const { return state_ ? state_->completed_ns : 0; }

namespace {

// One block of a request: `bytes` at `offset` of one path; `done` of them
// transferred so far.
struct Block {
  bool write = false;
  int fd = -1;
  const std::string* path = nullptr;
  int64_t offset = 0;
  char* buffer = nullptr;
  int64_t bytes = 0;
  int64_t done = 0;
  int64_t index = 0;
  std::shared_ptr<AioRequest::State> request;
};

void Finish(Block* b, const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(b->request->mu);
    if (!status.ok() && b->request->status.ok()) b->request->status = status;
    if (--b->request->remaining == 0) {
      b->request->completed_ns = SteadyNowNs();
      b->request->done.notify_all();
    }
  }
  delete b;
}

}  // namespace

struct AioEngine::Impl {
  // A submitting thread: its ring and the blocks queued for it.
  struct Worker {
    std::thread thread;
    std::mutex mu;
    std::condition_variable wake;
    std::deque<Block*> queue;
    bool stop = false;
    io_uring ring{};
    bool has_ring = false;
  };

  AioOptions options;
  bool uring = false;
  std::vector<std::unique_ptr<Worker>> workers;
  mutable std::mutex files_mu;
  std::map<AioFileId, File> files;
  AioFileId next_file = 0;
  std::atomic<int64_t> blocks{0};
  std::mutex fault_mu;
  AioFaultInjector fault;

  // The result of a completed transfer (the kernel's, or the injector's).
  int64_t Result(const Block& b, int64_t kernel) {
    std::lock_guard<std::mutex> lock(fault_mu);
    if (!fault) return kernel;
    AioBlockOp op{b.write, *b.path, b.offset + b.done, b.bytes - b.done, b.index};
    return fault(op).value_or(kernel);
  }

  // After a transfer of `res`: the block is finished (true) or has bytes
  // left to transfer (false).
  bool Advance(Block* b, int64_t res) {
    const std::string what = absl::StrCat("aio: ", b->write ? "write" : "read", " of ", b->bytes - b->done,
                                          " bytes at offset ", b->offset + b->done, " of ", *b->path);
    if (res < 0) {
      Finish(b, IoError(static_cast<int>(-res), what));
      return true;
    }
    if (res == 0) {
      Finish(b, b->write ? IoError(EIO, absl::StrCat(what, " made no progress"))
                         : absl::OutOfRangeError(absl::StrCat(what, ": unexpected end of file")));
      return true;
    }
    b->done += res;
    if (b->done >= b->bytes) {
      Finish(b, absl::OkStatus());
      return true;
    }
    return false;  // a short transfer: go on from where it stopped
  }

  void Prepare(io_uring_sqe* sqe, Block* b) {
    if (b->write) {
      io_uring_prep_write(sqe, b->fd, b->buffer + b->done, static_cast<unsigned>(b->bytes - b->done),
                          static_cast<uint64_t>(b->offset + b->done));
    } else {
      io_uring_prep_read(sqe, b->fd, b->buffer + b->done, static_cast<unsigned>(b->bytes - b->done),
                         static_cast<uint64_t>(b->offset + b->done));
    }
    io_uring_sqe_set_data(sqe, b);
  }

  void RunRing(Worker& w) {
    std::deque<Block*> ready;  // continuations first, then the queue
    int inflight = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(w.mu);
        if (inflight == 0 && ready.empty()) w.wake.wait(lock, [&] { return w.stop || !w.queue.empty(); });
        if (w.stop && w.queue.empty() && inflight == 0 && ready.empty()) return;
        while (static_cast<int>(ready.size()) + inflight < options.queue_depth && !w.queue.empty()) {
          ready.push_back(w.queue.front());
          w.queue.pop_front();
        }
      }
      int prepared = 0;
      while (!ready.empty() && inflight < options.queue_depth) {
        io_uring_sqe* sqe = io_uring_get_sqe(&w.ring);
        if (sqe == nullptr) break;
        Prepare(sqe, ready.front());
        ready.pop_front();
        ++inflight;
        ++prepared;
      }
      if (prepared > 0) {
        int submitted;
        while ((submitted = io_uring_submit(&w.ring)) == -EINTR || submitted == -EAGAIN || submitted == -EBUSY) {
          std::this_thread::yield();  // the kernel is short of resources for a moment: try again
        }
        if (submitted < 0) {
          // The ring itself is broken; its queued blocks cannot be taken back.
          std::fprintf(stderr, "aio: io_uring_submit failed: %s; aborting\n", std::strerror(-submitted));
          std::abort();
        }
      }
      if (inflight == 0) continue;
      io_uring_cqe* cqe = nullptr;
      const int waited = io_uring_wait_cqe(&w.ring, &cqe);
      if (waited == -EINTR) continue;
      if (waited < 0) {
        std::fprintf(stderr, "aio: io_uring_wait_cqe failed: %s\n", std::strerror(-waited));
        continue;
      }
      do {
        Block* b = static_cast<Block*>(io_uring_cqe_get_data(cqe));
        const int64_t kernel = cqe->res;
        io_uring_cqe_seen(&w.ring, cqe);
        --inflight;
        if (!Advance(b, Result(*b, kernel))) ready.push_front(b);
      } while (io_uring_peek_cqe(&w.ring, &cqe) == 0);
    }
  }

  // Without io_uring: one block at a time with pread / pwrite.
  void RunSync(Worker& w) {
    for (;;) {
      Block* b = nullptr;
      {
        std::unique_lock<std::mutex> lock(w.mu);
        w.wake.wait(lock, [&] { return w.stop || !w.queue.empty(); });
        if (w.queue.empty()) return;
        b = w.queue.front();
        w.queue.pop_front();
      }
      for (;;) {
        const ssize_t n = b->write ? ::pwrite(b->fd, b->buffer + b->done, b->bytes - b->done, b->offset + b->done)
                                   : ::pread(b->fd, b->buffer + b->done, b->bytes - b->done, b->offset + b->done);
        if (n < 0 && errno == EINTR) continue;
        if (Advance(b, Result(*b, n < 0 ? -errno : n))) break;
      }
    }
  }
};

AioEngine::AioEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<AioEngine>> AioEngine::Create(const AioOptions& options) {
  if (absl::Status st = ValidateAioOptions(options); !st.ok()) return st;
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->uring = options.io_uring;
  for (int t = 0; t < options.threads; ++t) {
    auto w = std::make_unique<Impl::Worker>();
    if (impl->uring) {
      const int r = io_uring_queue_init(static_cast<unsigned>(options.queue_depth), &w->ring, 0);
      if (r < 0) {
        impl->uring = false;
        std::fprintf(stderr, "aio: io_uring is not available (%s): using pread/pwrite on %d thread%s\n",
                     std::strerror(-r), options.threads, options.threads == 1 ? "" : "s");
        for (auto& earlier : impl->workers) {
          io_uring_queue_exit(&earlier->ring);
          earlier->has_ring = false;
        }
      } else {
        w->has_ring = true;
      }
    }
    impl->workers.push_back(std::move(w));
  }
  Impl* raw = impl.get();
  for (auto& w : impl->workers) {
    Impl::Worker* worker = w.get();
    w->thread = std::thread([raw, worker] { raw->uring ? raw->RunRing(*worker) : raw->RunSync(*worker); });
  }
  return std::unique_ptr<AioEngine>(new AioEngine(std::move(impl)));
}

AioEngine::~AioEngine() {
  for (auto& w : impl_->workers) {
    {
      std::lock_guard<std::mutex> lock(w->mu);
      w->stop = true;
    }
    w->wake.notify_all();
  }
  for (auto& w : impl_->workers) {
    w->thread.join();
    if (w->has_ring) io_uring_queue_exit(&w->ring);
  }
  for (auto& [id, file] : impl_->files) {
    for (int fd : file.fds) ::close(fd);
  }
}

const AioOptions& AioEngine::options() const { return impl_->options; }
bool AioEngine::uses_io_uring() const { return impl_->uring; }

void AioEngine::SetFaultInjector(AioFaultInjector injector) {
  std::lock_guard<std::mutex> lock(impl_->fault_mu);
  impl_->fault = std::move(injector);
}

SwapFile& SwapFile::operator=(SwapFile&& other) noexcept {
  if (this != &other) {
    Remove();
    id_ = std::exchange(other.id_, -1);
    lock_fd_ = std::exchange(other.lock_fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

void SwapFile::Remove() {
  if (lock_fd_ < 0) return;
  ::unlink(path_.c_str());  // still locked: ours
  ::close(lock_fd_);
  lock_fd_ = -1;
}

absl::StatusOr<SwapFile> CreateSwapFile(AioEngine& aio, const std::string& path, int64_t bytes,
                                        const std::string& what, const std::string& dir_field) {
  // Locked before it is truncated: never touch a file another process holds.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": cannot create the swap file ", path, ": ",
                                                      std::strerror(errno), " (check ", dir_field, ")"));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": the swap file ", path, " is in use by another process (",
        err == EWOULDBLOCK ? "another job with the same " : "cannot lock it; check ", dir_field,
        err == EWOULDBLOCK ? "?): give each job its own directory" : absl::StrCat(": ", std::strerror(err), ")")));
  }
  // Allocated now, not sparse: a disk too small fails here, before
  // training, rather than in a swap-out hours in (posix_fallocate returns
  // the error; file systems without fallocate get a sized sparse file).
  int err = ::ftruncate(fd, 0) == 0 ? 0 : errno;
  if (err == 0 && bytes > 0) err = ::posix_fallocate(fd, 0, bytes);
  if (err == EOPNOTSUPP || err == EINVAL) err = ::ftruncate(fd, bytes) == 0 ? 0 : errno;
  if (err != 0) {
    ::unlink(path.c_str());  // while still locked: nobody else's file
    ::close(fd);
    return absl::ResourceExhaustedError(absl::StrCat(what, ": cannot allocate the swap file ", path, " (", bytes,
                                                     " bytes): ", std::strerror(err), " (check ", dir_field, ")"));
  }
  absl::StatusOr<AioFileId> id = aio.Open({path}, /*create=*/false);
  if (!id.ok()) {
    ::close(fd);
    return id.status();
  }
  return SwapFile(*id, fd, path);
}

absl::StatusOr<AioFileId> AioEngine::Open(const std::vector<std::string>& paths, bool create) {
  if (paths.empty()) return absl::InvalidArgumentError("aio: Open needs at least one path");
  File file;
  file.direct = impl_->options.direct;
  for (const std::string& path : paths) {
    const int flags = O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0);
    int fd = ::open(path.c_str(), flags | (impl_->options.direct ? O_DIRECT : 0), 0644);
    if (fd < 0 && errno == EINVAL && impl_->options.direct) {
      std::fprintf(stderr, "aio: %s: the file system refuses O_DIRECT; using buffered I/O for it\n", path.c_str());
      file.direct = false;
      fd = ::open(path.c_str(), flags, 0644);
    }
    if (fd < 0) {
      const absl::Status st = IoError(errno, absl::StrCat("aio: cannot open ", path));
      for (int open_fd : file.fds) ::close(open_fd);
      return st;
    }
    file.paths.push_back(path);
    file.fds.push_back(fd);
  }
  std::lock_guard<std::mutex> lock(impl_->files_mu);
  const AioFileId id = impl_->next_file++;
  impl_->files.emplace(id, std::move(file));
  return id;
}

absl::Status AioEngine::Close(AioFileId id) {
  std::lock_guard<std::mutex> lock(impl_->files_mu);
  auto it = impl_->files.find(id);
  if (it == impl_->files.end()) return absl::NotFoundError(absl::StrCat("aio: no open file ", id));
  absl::Status status;
  for (size_t i = 0; i < it->second.fds.size(); ++i) {
    if (::close(it->second.fds[i]) != 0 && status.ok()) {
      status = IoError(errno, absl::StrCat("aio: closing ", it->second.paths[i]));
    }
  }
  impl_->files.erase(it);
  return status;
}

bool AioEngine::direct(AioFileId id) const {
  std::lock_guard<std::mutex> lock(impl_->files_mu);
  auto it = impl_->files.find(id);
  return it != impl_->files.end() && it->second.direct;
}

absl::StatusOr<int64_t> AioEngine::Size(AioFileId id) const {
  std::lock_guard<std::mutex> lock(impl_->files_mu);
  auto it = impl_->files.find(id);
  if (it == impl_->files.end()) return absl::NotFoundError(absl::StrCat("aio: no open file ", id));
  int64_t total = 0;
  for (size_t i = 0; i < it->second.fds.size(); ++i) {
    struct stat st;
    if (::fstat(it->second.fds[i], &st) != 0) return IoError(errno, absl::StrCat("aio: stat ", it->second.paths[i]));
    total += st.st_size;
  }
  return total;
}

absl::StatusOr<AioRequest> AioEngine::Read(AioFileId file, int64_t offset, void* buffer, int64_t bytes) {
  return Submit(false, file, offset, buffer, bytes);
}

absl::StatusOr<AioRequest> AioEngine::Write(AioFileId file, int64_t offset, const void* buffer, int64_t bytes) {
  return Submit(true, file, offset, const_cast<void*>(buffer), bytes);
}

absl::StatusOr<AioRequest> AioEngine::Submit(bool write, AioFileId id, int64_t offset, void* buffer,
                                             int64_t bytes) {
  const char* op = write ? "write" : "read";
  if (offset < 0 || bytes < 0 || (bytes > 0 && buffer == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("aio: ", op, " of ", bytes, " bytes at offset ", offset,
                                                   buffer == nullptr ? " into no buffer" : ""));
  }
  std::vector<Block*> blocks;
  auto request = std::make_shared<AioRequest::State>();
  {
    std::lock_guard<std::mutex> lock(impl_->files_mu);
    auto it = impl_->files.find(id);
    if (it == impl_->files.end()) return absl::NotFoundError(absl::StrCat("aio: no open file ", id));
    const File& file = it->second;
    if (file.direct) {
      const auto misaligned = [](int64_t v) { return v % kAioAlignment != 0; };
      if (misaligned(offset) || misaligned(bytes) || misaligned(reinterpret_cast<intptr_t>(buffer))) {
        return absl::InvalidArgumentError(absl::StrCat(
            "aio: O_DIRECT ", op, " of ", file.paths[0], ": offset ", offset, ", size ", bytes,
            " and the buffer's address must be multiples of ", kAioAlignment, " (AllocateAligned)"));
      }
    }
    const int64_t block = impl_->options.block_bytes;
    const int64_t paths = static_cast<int64_t>(file.paths.size());
    for (int64_t at = offset; at < offset + bytes;) {
      const int64_t file_block = at / block;
      const int64_t len = std::min(offset + bytes, (file_block + 1) * block) - at;
      Block* b = new Block;
      b->write = write;
      b->fd = file.fds[file_block % paths];
      b->path = &file.paths[file_block % paths];
      b->offset = (file_block / paths) * block + at % block;
      b->buffer = static_cast<char*>(buffer) + (at - offset);
      b->bytes = len;
      b->request = request;
      blocks.push_back(b);
      at += len;
    }
  }
  request->remaining = static_cast<int64_t>(blocks.size());
  request->submitted_ns = SteadyNowNs();
  if (blocks.empty()) request->completed_ns = request->submitted_ns;
  for (Block* b : blocks) {
    b->index = impl_->blocks.fetch_add(1);
    Impl::Worker& w = *impl_->workers[b->index % impl_->workers.size()];
    {
      std::lock_guard<std::mutex> lock(w.mu);
      w.queue.push_back(b);
    }
    w.wake.notify_one();
  }
  AioRequest r;
  r.state_ = std::move(request);
  return r;
}

absl::Status AioEngine::Wait(AioRequest& request) {
  if (!request.valid()) return absl::InvalidArgumentError("aio: Wait on a request that was never submitted");
  AioRequest::State& s = *request.state_;
  std::unique_lock<std::mutex> lock(s.mu);
  if (s.waited) return absl::FailedPreconditionError("aio: Wait twice on one request");
  s.done.wait(lock, [&] { return s.remaining == 0; });
  s.waited = true;
  return s.status;
}

}  // namespace memwall::infinity
