// The host side of ZeRO-Offload's gradient path (ZeRO-Offload §4.2, Fig. 4):
// each reduced gradient piece this rank owns arrives in pinned host memory
// (copied from the reduce bucket during backward) and is added into the
// rank's host gradient shard, 16-bit as on the device (2Ψ/N bytes).
//
// AccumulateGradient is that add, with the arithmetic of the device path
// (ops::Add: widen both to fp32, add, round once to nearest even), so an
// offloaded run accumulates exactly the gradients stage 2 does. On the last
// micro-batch the same pass also sums the squares (in double) and notes
// inf/NaN of the result: the global norm for clipping and the fp16 overflow
// check cost no extra pass over host memory, and the whole step can be
// skipped before Adam touches anything (ZeRO-Offload §5.1).
#ifndef MEMWALL_OFFLOAD_HOST_GRADIENTS_H_
#define MEMWALL_OFFLOAD_HOST_GRADIENTS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/dtype.h"
#include "runtime/thread_pool.h"

namespace memwall::offload {

struct GradientNorm {
  double sum_of_squares = 0;
  bool nonfinite = false;
  void Merge(const GradientNorm& other) {
    sum_of_squares += other.sum_of_squares;
    nonfinite |= other.nonfinite;
  }
};

// shard[i] = first ? piece[i] : round(float(shard[i]) + float(piece[i])),
// for n elements of `dtype` (fp32, fp16 or bf16) in host memory. With
// `norm`, the squares of the results are added to it (and inf/NaN noted).
// `pool` (may be null) splits large pieces; partial sums are combined in a
// fixed order, so the result does not depend on the thread count.
absl::Status AccumulateGradient(const void* piece, void* shard, DType dtype, int64_t n, bool first,
                                GradientNorm* norm, ThreadPool* pool);

// Sum of squares (double) and inf/NaN of n values of `dtype`, in the same
// fixed chunk order.
absl::StatusOr<GradientNorm> SquaredNorm(const void* x, DType dtype, int64_t n, ThreadPool* pool);

}  // namespace memwall::offload

#endif  // MEMWALL_OFFLOAD_HOST_GRADIENTS_H_
