// What this machine's kernel and file systems offer asynchronous file I/O
// (the aio engine, infinity/aio.h): //runtime:selfcheck reports both, and
// the engine falls back (pread/pwrite; buffered I/O) where either is
// missing.
#ifndef MEMWALL_RUNTIME_IO_PROBE_H_
#define MEMWALL_RUNTIME_IO_PROBE_H_

#include <string>

#include "absl/status/status.h"

namespace memwall {

// A ring is set up and a no-op request completes through it.
absl::Status ProbeIoUring();
// A 4 KiB O_DIRECT write and read of a scratch file in `dir` (removed
// after) return what was written.
absl::Status ProbeDirectIo(const std::string& dir);

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_IO_PROBE_H_
