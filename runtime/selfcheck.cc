// memwall runtime self-check: what this machine offers memwall, and a quick
// proof that each piece works. Exits non-zero if any check fails.
//
//   ./bazelw run //runtime:selfcheck
//   mpirun -np 2 bazel-bin/runtime/selfcheck     (collectives across ranks)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/communicator.h"
#include "runtime/cpu_device.h"
#include "runtime/cuda_device.h"
#include "runtime/dtype.h"
#include "runtime/io_probe.h"
#include "runtime/launch.h"

namespace memwall {
namespace {

int failures = 0;

void Report(absl::string_view what, const absl::Status& status, absl::string_view detail = "") {
  if (!status.ok()) ++failures;
  std::printf("  %-28s %s%s%s\n", std::string(what).c_str(), status.ok() ? "ok" : "FAILED: ",
              status.ok() ? "" : std::string(status.message()).c_str(),
              detail.empty() ? "" : absl::StrCat("  (", detail, ")").c_str());
}

// Fills a device buffer through the stream, all-reduces it and checks the
// exact sum of ranks 0..W-1 plus the element index.
absl::Status CheckCollectives(Device& device, Communicator& comm) {
  const size_t n = 4099;
  Stream& s = device.compute_stream();
  std::vector<float> host(n), back(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(comm.rank() + i % 7);
  auto buf = device.Allocate(n * 4, MemoryTag::kCommBuffers);
  if (!buf.ok()) return buf.status();
  const Tensor t = Tensor::Flat(buf->data(), DType::kF32, n, &device);
  if (auto st = s.Copy(buf->data(), host.data(), n * 4); !st.ok()) return st;
  if (auto st = comm.AllReduce(t, t, ReduceOp::kSum, s); !st.ok()) return st;
  if (auto st = comm.Barrier(s); !st.ok()) return st;
  if (auto st = s.Copy(back.data(), buf->data(), n * 4); !st.ok()) return st;
  if (auto st = s.Synchronize(); !st.ok()) return st;
  const int w = comm.world_size();
  for (size_t i = 0; i < n; ++i) {
    const float expected = static_cast<float>(w * (w - 1) / 2 + w * static_cast<int>(i % 7));
    if (back[i] != expected) {
      return absl::InternalError(absl::StrCat("all-reduce element ", i, " is ", back[i],
                                              ", expected ", expected));
    }
  }
  return absl::OkStatus();
}

void CheckDevice(Device& device) {
  std::printf("device %s\n", device.name().c_str());
  Stream& s = device.compute_stream();
  absl::Status status = [&]() -> absl::Status {
    const size_t bytes = 8 << 20;
    auto host = device.AllocatePinnedHost(bytes, MemoryTag::kStaging);
    if (!host.ok()) return host.status();
    auto dev = device.Allocate(bytes, MemoryTag::kParams16);
    if (!dev.ok()) return dev.status();
    auto back = device.AllocatePinnedHost(bytes, MemoryTag::kStaging);
    if (!back.ok()) return back.status();
    for (size_t i = 0; i < bytes; ++i) host->as<uint8_t>()[i] = static_cast<uint8_t>(i * 31);
    if (auto st = s.Copy(dev->data(), host->data(), bytes); !st.ok()) return st;
    if (auto st = s.Copy(back->data(), dev->data(), bytes); !st.ok()) return st;
    if (auto st = s.Synchronize(); !st.ok()) return st;
    if (std::memcmp(host->data(), back->data(), bytes) != 0) {
      return absl::InternalError("host -> device -> host copy changed the data");
    }
    return absl::OkStatus();
  }();
  Report("memory and copies", status,
         device.memory().account().Snapshot().ToString());
  auto comm = CreateCommunicator(device);
  if (!comm.ok()) {
    Report("communicator", comm.status());
    return;
  }
  Report(absl::StrCat("all-reduce (", CommBackendName((*comm)->backend()), ", ",
                      (*comm)->world_size(), " rank", (*comm)->world_size() > 1 ? "s" : "", ")"),
         CheckCollectives(device, **comm));
}

int Main() {
  const LaunchInfo& launch = CurrentLaunch();
  std::printf("memwall runtime self-check: rank %d of %d on %s, launched by %s\n", launch.rank,
              launch.world_size, launch.host.c_str(),
              std::string(LauncherName(launch.launcher)).c_str());
  std::printf("cpu features:");
  const std::pair<const char*, bool> features[] = {
      {"avx2", __builtin_cpu_supports("avx2")},
      {"f16c", __builtin_cpu_supports("f16c")},
      {"fma", __builtin_cpu_supports("fma")},
      {"avx512f", __builtin_cpu_supports("avx512f")},
      {"avx512bw", __builtin_cpu_supports("avx512bw")},
      {"avx512bf16", __builtin_cpu_supports("avx512bf16")},
  };
  for (const auto& [name, has] : features) std::printf(" %s%s", has ? "+" : "-", name);
  std::printf("\ndtype conversion path: %s\n",
              std::string(ConvertPathName(BestConvertPath())).c_str());
  // dtype: every bf16 and fp16 pattern round-trips on the best path.
  {
    absl::Status st;
    std::vector<uint16_t> all(65536), back(65536);
    std::vector<float> wide(65536);
    for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
    for (DType d : {DType::kF16, DType::kBF16}) {
      if (st.ok()) st = Convert(all.data(), d, wide.data(), DType::kF32, 65536);
      if (st.ok()) st = Convert(wide.data(), DType::kF32, back.data(), d, 65536);
      if (st.ok() && back != all) {
        st = absl::InternalError(absl::StrCat(DTypeName(d), " round trip failed"));
      }
    }
    Report("fp16/bf16 round trip", st);
  }

  auto cpu = CreateCpuDevice();
  if (cpu.ok()) {
    CheckDevice(**cpu);
  } else {
    Report("cpu device", cpu.status());
  }

  std::string reason;
  const int gpus = CudaDeviceCount(&reason);
  if (!BuiltWithCuda()) {
    std::printf("cuda: not built in (no CUDA toolkit when this binary was built)\n");
  } else if (gpus == 0) {
    std::printf("cuda: built in; %s\n", reason.c_str());
  } else {
    CudaDeviceOptions options;
    options.ordinal = launch.local_rank % gpus;
    auto gpu = CreateCudaDevice(options);
    if (gpu.ok()) {
      CheckDevice(**gpu);
    } else {
      Report("cuda device", gpu.status());
    }
  }
  // Asynchronous file I/O for NVMe offload (infinity/aio.h): a capability,
  // not a check; the engine falls back where one is missing.
  const absl::Status uring = ProbeIoUring();
  std::printf("io_uring: %s\n", uring.ok() ? "available"
                                            : absl::StrCat("not available (", uring.message(),
                                                           "); the aio engine uses pread/pwrite").c_str());
  const char* tmp = std::getenv("TMPDIR");
  for (const std::string& dir : {std::string("."), std::string(tmp != nullptr ? tmp : "/tmp")}) {
    const absl::Status direct = ProbeDirectIo(dir);
    std::printf("O_DIRECT in %s: %s\n", dir.c_str(),
                direct.ok() ? "works" : absl::StrCat("no (", direct.message(), "); buffered I/O there").c_str());
  }
  std::printf("%s\n", failures == 0 ? "self-check passed" : "self-check FAILED");
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace memwall

int main() { return memwall::Main(); }
