#include "runtime/io_probe.h"

#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace memwall {

absl::Status ProbeIoUring() {
  io_uring ring;
  const int r = io_uring_queue_init(2, &ring, 0);
  if (r < 0) return absl::UnavailableError(absl::StrCat("io_uring_queue_init: ", std::strerror(-r)));
  io_uring_sqe* sqe = io_uring_get_sqe(&ring);
  io_uring_prep_nop(sqe);
  absl::Status status;
  if (const int s = io_uring_submit(&ring); s != 1) {
    status = absl::UnavailableError(absl::StrCat("io_uring_submit: ", s < 0 ? std::strerror(-s) : "nothing submitted"));
  } else {
    io_uring_cqe* cqe = nullptr;
    if (const int w = io_uring_wait_cqe(&ring, &cqe); w < 0) {
      status = absl::UnavailableError(absl::StrCat("io_uring_wait_cqe: ", std::strerror(-w)));
    } else {
      if (cqe->res < 0) status = absl::UnavailableError(absl::StrCat("a no-op failed: ", std::strerror(-cqe->res)));
      io_uring_cqe_seen(&ring, cqe);
    }
  }
  io_uring_queue_exit(&ring);
  return status;
}

absl::Status ProbeDirectIo(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/.memwall_direct_probe_", ::getpid());
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    return absl::UnavailableError(absl::StrCat(dir, ": O_DIRECT open: ", std::strerror(err),
                                               err == EINVAL ? " (the file system refuses O_DIRECT)" : ""));
  }
  constexpr size_t kBytes = 4096;
  std::unique_ptr<char, decltype(&std::free)> out(static_cast<char*>(std::aligned_alloc(kBytes, kBytes)), &std::free);
  std::unique_ptr<char, decltype(&std::free)> in(static_cast<char*>(std::aligned_alloc(kBytes, kBytes)), &std::free);
  for (size_t i = 0; i < kBytes; ++i) out.get()[i] = static_cast<char>(i * 31 + 7);
  absl::Status status;
  if (::pwrite(fd, out.get(), kBytes, 0) != static_cast<ssize_t>(kBytes)) {
    status = absl::UnavailableError(absl::StrCat(dir, ": O_DIRECT write: ", std::strerror(errno)));
  } else if (::pread(fd, in.get(), kBytes, 0) != static_cast<ssize_t>(kBytes)) {
    status = absl::UnavailableError(absl::StrCat(dir, ": O_DIRECT read: ", std::strerror(errno)));
  } else if (std::memcmp(in.get(), out.get(), kBytes) != 0) {
    status = absl::DataLossError(absl::StrCat(dir, ": O_DIRECT read back other bytes than were written"));
  }
  ::close(fd);
  ::unlink(path.c_str());
  return status;
}

}  // namespace memwall
