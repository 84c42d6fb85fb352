// TCP backend: collectives over host memory for launches without MPI
// (torchrun-style RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT), run in
// stream order through Stream::EnqueueHost. See runtime/communicator.h.
//
// A star through rank 0: rank 0 listens at MASTER_PORT and every other rank
// connects to MASTER_ADDR:MASTER_PORT and says its rank. A collective is
// every rank sending its part to rank 0, which combines the parts in rank
// order (sums in fp32 for 16-bit types, rounded once: [Note: 16-bit
// reductions]) and sends each rank what it receives. Rank 0 carries
// 2 (W - 1) n bytes a collective: a launcher's rendezvous for CPU jobs and
// tests, not a fast interconnect. Every message starts with a header (the
// collective, its sequence number, its bytes), so ranks that issue
// different collectives get an error naming both, not a wrong result.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/time.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <algorithm>
#include <cstring>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/collective_watchdog.h"
#include "runtime/communicator.h"
#include "runtime/communicator_internal.h"
#include "runtime/launch.h"
#include "runtime/status.h"

namespace memwall::comm_internal {
namespace {

enum class Op : uint32_t { kAllReduce = 1, kReduceScatter, kAllGather, kReduce, kBroadcast, kBarrier, kBytes, kGoodbye };

absl::string_view OpName(uint32_t op) {
  constexpr absl::string_view kNames[] = {"?", "AllReduce", "ReduceScatter", "AllGather", "Reduce",
                                          "Broadcast", "Barrier", "Bytes", "Goodbye"};
  return op < 9 ? kNames[op] : "?";
}

struct Header {
  uint32_t op = 0;
  uint32_t pad = 0;
  uint64_t seq = 0;
  uint64_t bytes = 0;
};

// How long a rank keeps trying to reach rank 0 before giving up.
constexpr auto kConnectTimeout = std::chrono::seconds(120);
// How long a communicator's end waits for the other ranks to end theirs.
constexpr auto kGoodbyeTimeout = std::chrono::seconds(60);

class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }

  absl::Status SendAll(const void* data, size_t bytes, int peer) const {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::send(fd_, p, bytes, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return absl::UnavailableError(absl::StrCat("sending to rank ", peer, ": ", std::strerror(errno)));
      p += n;
      bytes -= size_t(n);
    }
    return absl::OkStatus();
  }
  absl::Status RecvAll(void* data, size_t bytes, int peer) const {
    char* p = static_cast<char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::recv(fd_, p, bytes, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) return absl::UnavailableError(absl::StrCat("rank ", peer, " closed its connection (did it exit?)"));
      if (n < 0) return absl::UnavailableError(absl::StrCat("receiving from rank ", peer, ": ", std::strerror(errno)));
      p += n;
      bytes -= size_t(n);
    }
    return absl::OkStatus();
  }

 private:
  int fd_;
};

void NoDelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

class TcpCommunicator final : public Communicator {
 public:
  // Rank 0: peers_[r] is rank r's connection (peers_[0] unused); others:
  // peers_[0] is the connection to rank 0.
  TcpCommunicator(int rank, int size, std::vector<Socket> peers)
      : rank_(rank), size_(size), peers_(std::move(peers)) {}
  // Every rank leaves together (rank 0 last), so a rank that goes on to a
  // new rendezvous at the same port cannot reach rank 0's old one. A peer
  // that is gone, or silent for kGoodbyeTimeout, is not waited for.
  ~TcpCommunicator() override {
    std::lock_guard<std::mutex> lock(mu_);
    const timeval limit{kGoodbyeTimeout.count(), 0};
    for (const Socket& s : peers_) {
      if (s.fd() >= 0) setsockopt(s.fd(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
    }
    char token = 0;
    if (rank_ != 0 && size_ > 1) {
      if (SendTo(0, Op::kGoodbye, &token, 1).ok()) (void)RecvFrom(0, Op::kGoodbye, &token, 1);
    } else if (rank_ == 0) {
      for (int r = 1; r < size_; ++r) (void)RecvFrom(r, Op::kGoodbye, &token, 1);
      for (int r = 1; r < size_; ++r) (void)SendTo(r, Op::kGoodbye, &token, 1);
    }
  }

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  CommBackend backend() const override { return CommBackend::kTcp; }

  // Rank 0's `bytes` bytes into every rank's `data`, now (the NCCL bootstrap).
  absl::Status BroadcastBytesNow(void* data, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    return BroadcastLocked(Op::kBytes, data, bytes, 0);
  }

 protected:
  absl::Status CheckMemory(const Tensor& t, absl::string_view what) const override {
    if (t.on_host()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        what, " is ", t.DebugString(), ": the TCP backend reads host memory only; use NCCL for CUDA memory"));
  }

  // Each collective below runs as chunks of at most kHostCallElements
  // elements ([Note: bounded host collectives]), each reduced on rank 0 on
  // its own.
  absl::Status DoAllReduce(const Tensor& send, const Tensor& recv, ReduceOp op, Stream& stream) override {
    return stream.EnqueueHost([this, send, recv, op]() -> absl::Status {
      const WatchedCollective watch("AllReduce", rank_);
      std::lock_guard<std::mutex> lock(mu_);
      std::vector<char> out;
      for (size_t j = 0; j < send.numel(); j += kHostCallElements) {
        const size_t c = std::min(kHostCallElements, send.numel() - j);
        MEMWALL_RETURN_IF_ERROR(ReduceToZero(Op::kAllReduce, send.Slice(j, c), op, &out));
        out.resize(c * SizeOf(recv.dtype()));  // every rank gets rank 0's bytes
        MEMWALL_RETURN_IF_ERROR(BroadcastLocked(Op::kAllReduce, out.data(), out.size(), 0));
        std::memcpy(recv.Slice(j, c).data(), out.data(), out.size());
      }
      return absl::OkStatus();
    });
  }

  // Chunk [j, j + c) of the whole is reduced on rank 0, which sends each
  // rank the part of it inside that rank's block.
  absl::Status DoReduceScatter(const Tensor& send, const Tensor& recv, ReduceOp op, Stream& stream) override {
    return stream.EnqueueHost([this, send, recv, op]() -> absl::Status {
      const WatchedCollective watch("ReduceScatter", rank_);
      std::lock_guard<std::mutex> lock(mu_);
      const size_t n = send.numel(), elem = SizeOf(recv.dtype());
      const ShardRange mine = BlockShard(n, size_, rank_);
      std::vector<char> out;
      for (size_t j = 0; j < n; j += kHostCallElements) {
        const size_t c = std::min(kHostCallElements, n - j);
        MEMWALL_RETURN_IF_ERROR(ReduceToZero(Op::kReduceScatter, send.Slice(j, c), op, &out));
        // Block b's elements inside [j, j + c), as [lo, hi) of the whole.
        auto inside = [&](const ShardRange& b) {
          return std::pair{std::max(j, b.offset), std::min(j + c, b.offset + b.size)};
        };
        if (rank_ != 0) {
          const auto [lo, hi] = inside(mine);
          if (lo < hi) {
            MEMWALL_RETURN_IF_ERROR(
                RecvFrom(0, Op::kReduceScatter, recv.Slice(lo - mine.offset, hi - lo).data(), (hi - lo) * elem));
          }
          Finish();
          continue;
        }
        for (int r = 1; r < size_; ++r) {
          const auto [lo, hi] = inside(BlockShard(n, size_, r));
          if (lo < hi) {
            MEMWALL_RETURN_IF_ERROR(SendTo(r, Op::kReduceScatter, out.data() + (lo - j) * elem, (hi - lo) * elem));
          }
        }
        const auto [lo, hi] = inside(mine);
        if (lo < hi) {
          std::memcpy(recv.Slice(lo - mine.offset, hi - lo).data(), out.data() + (lo - j) * elem, (hi - lo) * elem);
        }
        Finish();
      }
      return absl::OkStatus();
    });
  }

  absl::Status DoAllGather(const Tensor& send, const Tensor& recv, Stream& stream) override {
    return stream.EnqueueHost([this, send, recv]() -> absl::Status {
      const WatchedCollective watch("AllGather", rank_);
      std::lock_guard<std::mutex> lock(mu_);
      const size_t n = recv.numel(), elem = SizeOf(recv.dtype());
      char* all = static_cast<char*>(recv.data());
      if (rank_ != 0) {
        MEMWALL_RETURN_IF_ERROR(SendTo(0, Op::kAllGather, send.data(), send.bytes()));
      } else {
        std::memmove(all + BlockShard(n, size_, 0).offset * elem, send.data(), send.bytes());
        for (int r = 1; r < size_; ++r) {
          const ShardRange b = BlockShard(n, size_, r);
          MEMWALL_RETURN_IF_ERROR(RecvFrom(r, Op::kAllGather, all + b.offset * elem, b.size * elem));
        }
      }
      return BroadcastLocked(Op::kAllGather, all, recv.bytes(), 0);
    });
  }

  absl::Status DoReduce(const Tensor& send, const Tensor& recv, ReduceOp op, int root, Stream& stream) override {
    return stream.EnqueueHost([this, send, recv, op, root]() -> absl::Status {
      const WatchedCollective watch("Reduce", rank_);
      std::lock_guard<std::mutex> lock(mu_);
      std::vector<char> out;
      for (size_t j = 0; j < send.numel(); j += kHostCallElements) {
        const size_t c = std::min(kHostCallElements, send.numel() - j);
        const Tensor part = recv.Slice(j, c);
        MEMWALL_RETURN_IF_ERROR(ReduceToZero(Op::kReduce, send.Slice(j, c), op, &out));
        if (rank_ == 0) {
          if (root == 0) {
            std::memcpy(part.data(), out.data(), out.size());
          } else {
            MEMWALL_RETURN_IF_ERROR(SendTo(root, Op::kReduce, out.data(), out.size()));
          }
        } else if (rank_ == root) {
          MEMWALL_RETURN_IF_ERROR(RecvFrom(0, Op::kReduce, part.data(), part.bytes()));
        }
        Finish();
      }
      return absl::OkStatus();
    });
  }

  absl::Status DoBroadcast(const Tensor& buffer, int root, Stream& stream) override {
    return stream.EnqueueHost([this, buffer, root]() -> absl::Status {
      const WatchedCollective watch("Broadcast", rank_);
      std::lock_guard<std::mutex> lock(mu_);
      return BroadcastLocked(Op::kBroadcast, buffer.data(), buffer.bytes(), root);
    });
  }

  absl::Status DoBarrier(Stream& stream) override {
    return stream.EnqueueHost([this]() -> absl::Status {
      const WatchedCollective watch("Barrier", rank_);
      std::lock_guard<std::mutex> lock(mu_);
      char token = 0;
      if (rank_ != 0) {
        MEMWALL_RETURN_IF_ERROR(SendTo(0, Op::kBarrier, &token, 1));
      } else {
        for (int r = 1; r < size_; ++r) MEMWALL_RETURN_IF_ERROR(RecvFrom(r, Op::kBarrier, &token, 1));
      }
      return BroadcastLocked(Op::kBarrier, &token, 1, 0);
    });
  }

 private:
  // One message: header, then the bytes.
  absl::Status SendTo(int peer, Op op, const void* data, size_t bytes) {
    const Header h{static_cast<uint32_t>(op), 0, seq_, bytes};
    const Socket& s = peers_[rank_ == 0 ? peer : 0];
    MEMWALL_RETURN_IF_ERROR(s.SendAll(&h, sizeof(h), peer));
    return s.SendAll(data, bytes, peer);
  }
  absl::Status RecvFrom(int peer, Op op, void* data, size_t bytes) {
    Header h;
    const Socket& s = peers_[rank_ == 0 ? peer : 0];
    MEMWALL_RETURN_IF_ERROR(s.RecvAll(&h, sizeof(h), peer));
    if (h.op != static_cast<uint32_t>(op) || h.seq != seq_ || h.bytes != bytes) {
      return MEMWALL_ERROR(absl::StatusCode::kInternal, "rank ", rank_, " is in ", OpName(uint32_t(op)), " #", seq_,
                           " of ", bytes, " bytes but rank ", peer, " sent ", OpName(h.op), " #", h.seq, " of ",
                           h.bytes, " bytes: the ranks issue different collectives");
    }
    return s.RecvAll(data, bytes, peer);
  }

  // Ends a collective that did not end in BroadcastLocked.
  void Finish() { ++seq_; }

  // `root`'s bytes to every rank, through rank 0; ends the collective.
  absl::Status BroadcastLocked(Op op, void* data, size_t bytes, int root) {
    if (root != 0) {
      if (rank_ == root) MEMWALL_RETURN_IF_ERROR(SendTo(0, op, data, bytes));
      if (rank_ == 0) MEMWALL_RETURN_IF_ERROR(RecvFrom(root, op, data, bytes));
    }
    if (rank_ == 0) {
      for (int r = 1; r < size_; ++r) {
        if (r != root) MEMWALL_RETURN_IF_ERROR(SendTo(r, op, data, bytes));
      }
    } else if (rank_ != root) {
      MEMWALL_RETURN_IF_ERROR(RecvFrom(0, op, data, bytes));
    }
    ++seq_;
    return absl::OkStatus();
  }

  // Every rank's `send` to rank 0, combined there in rank order into `out`,
  // send's type and size: fp32 and 16-bit parts summed in fp32 and rounded
  // once, int32 parts in int64. On other ranks `out` is left empty.
  absl::Status ReduceToZero(Op op, const Tensor& send, ReduceOp reduce, std::vector<char>* out) {
    const size_t n = send.numel();
    if (rank_ != 0) return SendTo(0, op, send.data(), send.bytes());
    std::vector<char> part(send.bytes());
    out->resize(send.bytes());
    auto combine = [reduce](auto& acc, auto value) {
      using T = std::remove_reference_t<decltype(acc)>;
      acc = reduce == ReduceOp::kSum ? T(acc + T(value)) : std::max(acc, T(value));
    };
    if (send.dtype() == DType::kI32) {
      std::vector<int64_t> acc(n);
      const int32_t* mine = static_cast<const int32_t*>(send.data());
      for (size_t i = 0; i < n; ++i) acc[i] = mine[i];
      for (int r = 1; r < size_; ++r) {
        MEMWALL_RETURN_IF_ERROR(RecvFrom(r, op, part.data(), part.size()));
        const int32_t* theirs = reinterpret_cast<const int32_t*>(part.data());
        for (size_t i = 0; i < n; ++i) combine(acc[i], int64_t{theirs[i]});
      }
      int32_t* result = reinterpret_cast<int32_t*>(out->data());
      for (size_t i = 0; i < n; ++i) result[i] = static_cast<int32_t>(acc[i]);
      return absl::OkStatus();
    }
    std::vector<float> acc(n), part_wide(n);
    MEMWALL_RETURN_IF_ERROR(Convert(send.data(), send.dtype(), acc.data(), DType::kF32, n));
    for (int r = 1; r < size_; ++r) {
      MEMWALL_RETURN_IF_ERROR(RecvFrom(r, op, part.data(), part.size()));
      MEMWALL_RETURN_IF_ERROR(Convert(part.data(), send.dtype(), part_wide.data(), DType::kF32, n));
      for (size_t i = 0; i < n; ++i) combine(acc[i], part_wide[i]);
    }
    return Convert(acc.data(), DType::kF32, out->data(), send.dtype(), n);
  }

  const int rank_;
  const int size_;
  std::vector<Socket> peers_;
  std::mutex mu_;     // one collective at a time
  uint64_t seq_ = 0;  // collectives completed, the same on every rank
};

absl::StatusOr<Socket> Listen(int port) {
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (s.fd() < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  const int one = 1;
  setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(absl::StrCat("rank 0 cannot listen on MASTER_PORT=", port, ": ",
                                               std::strerror(errno), " (is another job using the port?)"));
  }
  if (::listen(s.fd(), 128) != 0) return absl::UnavailableError(absl::StrCat("listen: ", std::strerror(errno)));
  return s;
}

absl::StatusOr<Socket> Connect(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("MASTER_ADDR=", host, " does not resolve: ", gai_strerror(rc)));
  }
  const auto deadline = std::chrono::steady_clock::now() + kConnectTimeout;
  std::string last;
  for (;;) {  // rank 0 may not be listening yet
    Socket s(::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (s.fd() >= 0 && ::connect(s.fd(), found->ai_addr, found->ai_addrlen) == 0) {
      ::freeaddrinfo(found);
      return s;
    }
    last = std::strerror(errno);
    if (std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::freeaddrinfo(found);
  return absl::UnavailableError(absl::StrCat("cannot reach rank 0 at MASTER_ADDR=", host, " MASTER_PORT=", port,
                                             " within ", kConnectTimeout.count(), " s: ", last));
}

// The hello each rank sends rank 0, and rank 0's answer.
struct Hello {
  uint32_t magic = 0x4d57544b;  // "MWTK"
  int32_t rank = 0;
  int32_t world = 0;
};

absl::StatusOr<std::unique_ptr<TcpCommunicator>> Rendezvous(const LaunchInfo& launch) {
  const int size = launch.world_size, rank = launch.rank;
  std::vector<Socket> peers(size);
  if (size == 1) return std::make_unique<TcpCommunicator>(0, 1, std::move(peers));
  if (launch.master_addr.empty() || launch.master_port == 0) {
    return absl::InvalidArgumentError(absl::StrCat("the TCP backend needs MASTER_ADDR and MASTER_PORT (",
                                                   LauncherName(launch.launcher), " gave none)"));
  }
  if (rank == 0) {
    MEMWALL_ASSIGN_OR_RETURN(Socket listener, Listen(launch.master_port));
    for (int joined = 1; joined < size; ++joined) {
      Socket s(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
      if (s.fd() < 0) return absl::UnavailableError(absl::StrCat("accept: ", std::strerror(errno)));
      Hello hello;
      MEMWALL_RETURN_IF_ERROR(s.RecvAll(&hello, sizeof(hello), -1));
      if (hello.magic != Hello().magic || hello.world != size || hello.rank < 1 || hello.rank >= size ||
          peers[hello.rank].fd() >= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank 0 (WORLD_SIZE=", size, ") was joined by a process claiming rank ", hello.rank, " of ", hello.world,
            hello.magic != Hello().magic ? " that is not a memwall rank" : "",
            ": every rank must get the same WORLD_SIZE and its own RANK"));
      }
      NoDelay(s.fd());
      MEMWALL_RETURN_IF_ERROR(s.SendAll(&hello, sizeof(hello), hello.rank));
      peers[hello.rank] = std::move(s);
    }
  } else {
    MEMWALL_ASSIGN_OR_RETURN(Socket s, Connect(launch.master_addr, launch.master_port));
    NoDelay(s.fd());
    Hello hello;
    hello.rank = rank;
    hello.world = size;
    MEMWALL_RETURN_IF_ERROR(s.SendAll(&hello, sizeof(hello), 0));
    MEMWALL_RETURN_IF_ERROR(s.RecvAll(&hello, sizeof(hello), 0));
    peers[0] = std::move(s);
  }
  return std::make_unique<TcpCommunicator>(rank, size, std::move(peers));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateTcpCommunicator(Device& device) {
  (void)device;  // host memory only: CheckMemory refuses device tensors
  MEMWALL_ASSIGN_OR_RETURN(const LaunchInfo launch, DiscoverLaunch([](const char* n) { return std::getenv(n); }));
  MEMWALL_ASSIGN_OR_RETURN(std::unique_ptr<TcpCommunicator> comm, Rendezvous(launch));
  return std::unique_ptr<Communicator>(std::move(comm));
}

absl::Status TcpBroadcastBytes(const LaunchInfo& launch, void* data, size_t bytes) {
  MEMWALL_ASSIGN_OR_RETURN(std::unique_ptr<TcpCommunicator> comm, Rendezvous(launch));
  return comm->BroadcastBytesNow(data, bytes);
}

}  // namespace memwall::comm_internal
