// Element types (fp32, fp16, bf16) and conversions between them.
//
// Contract of every conversion, scalar and bulk, on every path:
//   - fp32 -> fp16/bf16 rounds to nearest, ties to even; values beyond the
//     target's largest finite value (after rounding) become +-Inf; fp16
//     subnormals are produced exactly (no flush to zero).
//   - fp16/bf16 -> fp32 is exact.
//   - NaN stays NaN with its sign; the target keeps the top bits of the
//     payload (quiet bit included, so a signalling NaN stays signalling), and
//     a payload that would truncate to zero becomes the quiet bit alone.
//     Hence every fp16 and bf16 bit pattern round-trips through fp32 exactly.
//
// Bulk conversions pick a SIMD path at run time from the CPU's features
// (AVX-512F, else AVX2+F16C, else portable scalar), never from -march, so a
// binary built here runs on any x86-64. All paths give bit-identical results.
// Note: the AVX-512 BF16 instruction VCVTNEPS2BF16 is not used because it
// flushes subnormal inputs and outputs to zero, which would break the
// contract above; the AVX-512F integer rounding is as fast at memory speed.
#ifndef MEMWALL_RUNTIME_DTYPE_H_
#define MEMWALL_RUNTIME_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/dtype_bits.h"

namespace memwall {

// kI32 holds integers (token ids, targets); it moves through collectives and
// copies but is not a floating type: Convert refuses it.
enum class DType : uint8_t { kF32, kF16, kBF16, kI32 };

constexpr size_t SizeOf(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kI32 ? 4 : 2;
}
constexpr bool IsFloating(DType dtype) { return dtype != DType::kI32; }
absl::string_view DTypeName(DType dtype);  // "fp32", "fp16", "bf16", "int32"
absl::StatusOr<DType> ParseDType(absl::string_view name);

// Bulk conversion paths. kBest resolves to the fastest one this CPU has.
enum class ConvertPath { kBest, kScalar, kAvx2, kAvx512 };

absl::string_view ConvertPathName(ConvertPath path);
bool ConvertPathSupported(ConvertPath path);
// The instruction sets a path's kernels are compiled for, as function
// attributes (ConvertPathSupported checks the same ones at run time).
#define MEMWALL_TARGET_AVX2 __attribute__((target("avx2,f16c")))
#define MEMWALL_TARGET_AVX512 __attribute__((target("avx512f,avx2,f16c")))
ConvertPath BestConvertPath();
// `path` for a kernel that has these paths: kBest resolved to
// BestConvertPath(), or a FailedPrecondition naming `op` and the path where
// this CPU lacks its instructions.
absl::StatusOr<ConvertPath> ResolveConvertPath(ConvertPath path, absl::string_view op);

// Bulk conversions that touch more than this many bytes (source plus
// destination) use non-temporal stores, which skip the write-allocate read of
// each destination line: the bound for a DRAM-resident conversion. Default:
// 3/4 of the L3 cache (glibc's memcpy rule). Results are identical either
// way; `bytes` == 0 streams every SIMD-sized conversion (for tests).
size_t StreamingStoreThreshold();
void SetStreamingStoreThreshold(size_t bytes);

// Converts n elements. src and dst must not overlap unless the dtypes are
// equal and src == dst. An unsupported path is a FailedPrecondition.
absl::Status Convert(const void* src, DType src_dtype, void* dst,
                     DType dst_dtype, size_t n,
                     ConvertPath path = ConvertPath::kBest);

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_DTYPE_H_
