// Gradient accumulation in host memory: the CpuDevice's ops::Add and
// ZeRO-Offload's host gradient shard (ZeRO-Offload §4) both run
// this one loop, so a gradient accumulated on the host is bit for bit the
// gradient stage 2 accumulates on the device.
//
//   y[i] = round(float(a[i]) + float(b[i]))      (fp32 sum, one rounding to
//                                                 nearest even; y may be a or b)
//
// for n elements of fp32, fp16 or bf16, in chunks of kAccumulateChunk on a
// ThreadPool (each element computed by exactly one thread, so the result
// does not depend on the thread count). With `norm`, the same pass also
// sums the squares of the results (in double, per chunk in four lanes by
// index mod 4, the chunks merged in order) and notes inf/NaN: ZeRO-Offload §5.1's norm and overflow check
// without an extra pass over memory. A pass with a norm completes a
// gradient, and stores a zero sum as +0 (HostAddChunkNorms).
#ifndef MEMWALL_OPS_HOST_ACCUMULATE_H_
#define MEMWALL_OPS_HOST_ACCUMULATE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/dtype.h"
#include "runtime/thread_pool.h"

namespace memwall::ops {

// Elements per task: large enough that a task is not dominated by dispatch,
// small enough that every core gets work on a 64 MiB bucket.
inline constexpr int64_t kAccumulateChunk = int64_t{1} << 16;

struct SquareSum {
  double sum_of_squares = 0;
  bool nonfinite = false;
  void Merge(const SquareSum& other) {
    sum_of_squares += other.sum_of_squares;
    nonfinite |= other.nonfinite;
  }
};

// y = a + b as above; `pool` may be null (one thread).
absl::Status HostAdd(const void* a, const void* b, void* y, DType dtype, int64_t n, SquareSum* norm,
                     ThreadPool* pool);
// HostAdd with the norm kept per chunk: (*chunk_norms)[c] is the squares of
// y[c kAccumulateChunk, min(n, (c + 1) kAccumulateChunk)). HostAdd's norm
// is these merged in chunk order. A gradient completes here, so a zero sum
// is stored as +0: a gradient summed from a zeroed buffer holds no -0
// (+0 + -0 = +0), and one that was copied in instead of added
// (HostCompleteChunkNorms) then reads the same bits.
absl::Status HostAddChunkNorms(const void* a, const void* b, void* y, DType dtype, int64_t n,
                               std::vector<SquareSum>* chunk_norms, ThreadPool* pool);

// Sum of squares (double) and inf/NaN of n values of `dtype`, in the same
// fixed chunk order: HostSquaredNormChunks's chunks merged in order into a
// zero sum. A range read in pieces of whole chunks (from NVMe) has the same
// chunk sums, so merging them in order gives the same bits.
// A gradient copied whole into x instead of added onto zeros, completed:
// its -0 elements made +0 (written only where there is one, so a read
// pass), and its squares per chunk, HostSquaredNormChunks's bits. x then
// holds what HostAddChunkNorms(zeros, x) would have stored.
absl::Status HostCompleteChunkNorms(void* x, DType dtype, int64_t n, std::vector<SquareSum>* chunk_norms,
                                    ThreadPool* pool);
absl::StatusOr<SquareSum> HostSquaredNorm(const void* x, DType dtype, int64_t n, ThreadPool* pool);
// One chunk's sum of squares, as every function here sums a chunk: in
// double, element i into lane i mod 4, each lane in index order, the lanes
// merged as (l0 + l1) + (l2 + l3). Every path gives the same bits (scalar:
// widen to fp32, then sum; avx2: the four lanes in one register, 16-bit
// values widened in it; avx512 runs it too, the four lanes being one
// 256-bit register). kBest is the fastest the CPU has. An unsupported path
// is a FailedPrecondition.
absl::StatusOr<SquareSum> ChunkSquares(const void* x, DType dtype, int64_t n,
                                       ConvertPath path = ConvertPath::kBest);
absl::Status HostSquaredNormChunks(const void* x, DType dtype, int64_t n, std::vector<SquareSum>* chunk_norms,
                                   ThreadPool* pool);

}  // namespace memwall::ops

#endif  // MEMWALL_OPS_HOST_ACCUMULATE_H_
