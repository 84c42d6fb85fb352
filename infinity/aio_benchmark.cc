// //infinity:aio_benchmark: the aio engine's read and write bandwidth on one
// file, and fio's (io_uring, O_DIRECT) on the same file with the same block
// size, queue depth and threads, measured in the same run; the counter
// vs_fio = ours / fio is the figure (>= 0.95 is the target at the best
// setting; infinity/README.md has the table).
//
//   ./bazelw run //infinity:aio_benchmark -- --aio_dir=/nvme/scratch --aio_file_gib=4
//
// The file is written once (aio_file_gib GiB, default 2) in --aio_dir
// (default $TMPDIR or /tmp; it must be on the disk to be measured, not
// tmpfs), read and rewritten by both engines, and removed at the end. Each
// (block, depth, threads) runs ours and fio alternately, best of
// --aio_rounds rounds each (default 2). Without fio on PATH the fio side is
// skipped and vs_fio is absent.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "infinity/aio.h"

ABSL_FLAG(std::string, aio_dir, "", "directory of the benchmark file (default: $TMPDIR or /tmp)");
ABSL_FLAG(int64_t, aio_file_gib, 2, "size of the benchmark file, GiB");
ABSL_FLAG(int, aio_rounds, 2, "rounds per engine and setting; the best counts");

namespace memwall::infinity {
namespace {

std::string BenchFile() {
  std::string dir = absl::GetFlag(FLAGS_aio_dir);
  if (dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    dir = tmp != nullptr ? tmp : "/tmp";
  }
  return dir + "/memwall_aio_benchmark.bin";
}

int64_t FileBytes() { return absl::GetFlag(FLAGS_aio_file_gib) << 30; }

// Ours: the file in blocks of `block`, at most threads x depth of them in
// flight, each completed one replaced by the next (fio's model).
absl::StatusOr<double> OursSeconds(bool write, int64_t block, int depth, int threads) {
  AioOptions options;
  options.block_bytes = block;
  options.queue_depth = depth;
  options.threads = threads;
  auto aio = AioEngine::Create(options);
  if (!aio.ok()) return aio.status();
  auto file = (*aio)->Open({BenchFile()}, /*create=*/true);
  if (!file.ok()) return file.status();
  const int slots = depth * threads;
  auto buffers = AllocateAligned(block * slots);
  std::memset(buffers.get(), 0x5a, block * slots);
  const int64_t blocks = FileBytes() / block;
  std::deque<std::pair<AioRequest, int>> inflight;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t b = 0; b < blocks || !inflight.empty();) {
    if (b < blocks && static_cast<int>(inflight.size()) < slots) {
      const int slot = static_cast<int>(b % slots);
      char* buffer = buffers.get() + slot * block;
      auto r = write ? (*aio)->Write(*file, b * block, buffer, block) : (*aio)->Read(*file, b * block, buffer, block);
      if (!r.ok()) return r.status();
      inflight.emplace_back(*r, slot);
      ++b;
      continue;
    }
    if (absl::Status st = (*aio)->Wait(inflight.front().first); !st.ok()) return st;
    inflight.pop_front();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  (void)(*aio)->Close(*file);
  return seconds;
}

bool HaveFio() { return std::system("command -v fio > /dev/null 2>&1") == 0; }

// fio's bandwidth (bytes/s) for the same job: `threads` jobs over disjoint
// parts of the file, each at `depth`.
absl::StatusOr<double> FioBytesPerSecond(bool write, int64_t block, int depth, int threads) {
  const int64_t part = FileBytes() / threads / block * block;
  const std::string cmd = absl::StrCat(
      "fio --name=memwall --filename=", BenchFile(), " --rw=", write ? "write" : "read", " --bs=", block,
      " --iodepth=", depth, " --numjobs=", threads, " --size=", part, " --offset_increment=", part,
      " --ioengine=io_uring --direct=1 --group_reporting --output-format=terse --terse-version=3 2>&1");
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError("cannot run fio");
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof(buf), pipe)) out.append(buf, n);
  const int rc = ::pclose(pipe);
  if (rc != 0) return absl::InternalError(absl::StrCat("fio exited ", rc, ": ", out));
  // Terse v3 (the line that starts "3;"): field 7 is read bandwidth (KiB/s),
  // field 48 write bandwidth.
  const size_t line = out.find("3;fio-");
  if (line == std::string::npos || (line > 0 && out[line - 1] != '\n')) {
    return absl::InternalError(absl::StrCat("no terse line in fio's output: ", out));
  }
  out = out.substr(line, out.find('\n', line) - line);
  std::vector<std::string> fields;
  size_t at = 0;
  while (at <= out.size()) {
    const size_t semi = out.find(';', at);
    fields.push_back(out.substr(at, semi == std::string::npos ? std::string::npos : semi - at));
    if (semi == std::string::npos) break;
    at = semi + 1;
  }
  const size_t field = write ? 47 : 6;
  double kib = 0;
  if (fields.size() <= field || !absl::SimpleAtod(fields[field], &kib) || kib <= 0) {
    return absl::InternalError(absl::StrCat("cannot read fio's bandwidth from: ", out));
  }
  return kib * 1024;
}

void BM_Aio(benchmark::State& state) {
  const bool write = state.range(0) != 0;
  const int64_t block = state.range(1) << 10;
  const int depth = static_cast<int>(state.range(2));
  const int threads = static_cast<int>(state.range(3));
  const int rounds = std::max(1, absl::GetFlag(FLAGS_aio_rounds));
  const bool fio = HaveFio();
  for (auto _ : state) {
    double ours = 0, theirs = 0, seconds = 0;
    for (int round = 0; round < rounds; ++round) {
      auto s = OursSeconds(write, block, depth, threads);
      if (!s.ok()) {
        state.SkipWithError(std::string(s.status().message()).c_str());
        return;
      }
      seconds = *s;
      ours = std::max(ours, double(FileBytes()) / *s);
      if (fio) {
        auto f = FioBytesPerSecond(write, block, depth, threads);
        if (!f.ok()) {
          state.SkipWithError(std::string(f.status().message()).c_str());
          return;
        }
        theirs = std::max(theirs, *f);
      }
    }
    state.SetIterationTime(seconds);
    state.counters["GBps"] = ours / 1e9;
    if (fio) {
      state.counters["fio_GBps"] = theirs / 1e9;
      state.counters["vs_fio"] = ours / theirs;
    }
  }
}

// The settings users tune: 256 KiB to 8 MiB blocks, depth 1 to 64, 1 to 4
// threads (the 8 MiB x 64 x 4 corner would pin 2 GiB of buffers: left out).
void Settings(benchmark::internal::Benchmark* b) {
  for (int write : {0, 1}) {
    for (int64_t kib : {256, 1024, 8192}) {
      for (int depth : {1, 8, 32, 64}) {
        for (int threads : {1, 2, 4}) {
          if (kib == 8192 && depth * threads > 64) continue;
          if (depth == 1 && threads > 1) continue;
          b->Args({write, kib, depth, threads});
        }
      }
    }
  }
}
BENCHMARK(BM_Aio)->Apply(Settings)->ArgNames({"write", "block_kib", "depth", "threads"})->Iterations(1)->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// Writes the file once, so that reads have something to read.
absl::Status Prepare() {
  std::filesystem::remove(BenchFile());
  std::printf("aio_benchmark: %s, %lld GiB%s\n", BenchFile().c_str(), (long long)absl::GetFlag(FLAGS_aio_file_gib),
              HaveFio() ? "" : " (fio not found: no comparison)");
  auto s = OursSeconds(/*write=*/true, int64_t{1} << 20, 32, 1);
  return s.ok() ? absl::OkStatus() : s.status();
}

}  // namespace
}  // namespace memwall::infinity

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  absl::ParseCommandLine(argc, argv);
  if (absl::Status st = memwall::infinity::Prepare(); !st.ok()) {
    std::fprintf(stderr, "aio_benchmark: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  std::filesystem::remove(memwall::infinity::BenchFile());
  return 0;
}
