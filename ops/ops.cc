#include "ops/ops.h"

#include <initializer_list>
#include <utility>

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ops/cuda_kernels.h"
#include "ops/host_accumulate.h"
#include "ops/kernels.h"
#include "runtime/cuda_convert.h"
#include "runtime/thread_pool.h"
#include "runtime/status.h"

namespace memwall::ops {
namespace {

// An argument: its name in messages, the tensor, and the dtype it must have.
struct NamedTensor {
  const char* first;
  const Tensor* second;
  DType dtype = DType::kF32;
};

std::string ShapeString(const Tensor& t) { return absl::StrCat("[", absl::StrJoin(t.shape(), ", "), "]"); }

// Every tensor has its expected dtype and lives where `stream` can reach it.
absl::Status CheckTensors(absl::string_view op, Stream& stream,
                          std::initializer_list<NamedTensor> tensors) {
  Device& device = stream.device();
  for (const auto& [name, t, dtype] : tensors) {
    if (t->dtype() != dtype) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " is ", DTypeName(t->dtype()),
                                                     "; this op takes ", DTypeName(dtype),
                                                     " here for now"));
    }
    const bool reachable = t->device() == &device ||
                           (t->device() == nullptr && device.kind() == DeviceKind::kCpu);
    if (!reachable) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " is ", t->DebugString(),
                                                     " but the stream runs on ", device.name()));
    }
    if (t->data() == nullptr && t->numel() > 0) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " has no data"));
    }
  }
  return absl::OkStatus();
}

absl::Status SameShape(absl::string_view op, const NamedTensor& a, const NamedTensor& b) {
  if (a.second->shape() == b.second->shape()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", a.first, " ", ShapeString(*a.second),
                                                 " and ", b.first, " ", ShapeString(*b.second),
                                                 " must have the same shape"));
}

absl::Status HasElements(absl::string_view op, const NamedTensor& t, int64_t n,
                         absl::string_view why) {
  if (t.second->numel() == n) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", t.first, " ",
                                                 ShapeString(*t.second), " must have ", n,
                                                 " elements (", why, ")"));
}

bool OnCpu(Stream& stream) { return stream.device().kind() == DeviceKind::kCpu; }

absl::Status CudaResult(int error, absl::string_view op) {
  if (error == 0) return absl::OkStatus();
  return MEMWALL_ERROR(absl::StatusCode::kInternal, op, ": CUDA kernel launch failed: ",
                       cuda::ErrorString(error));
}

// Runs `cpu()` (returning void or a Status) in stream order on the
// CpuDevice, or `cuda(cudaStream_t)` (a kernel launcher returning a
// cudaError_t) on a CUDA stream.
template <typename CpuFn, typename CudaFn>
absl::Status Dispatch(Stream& stream, absl::string_view op, CpuFn cpu, CudaFn cuda) {
  if (OnCpu(stream)) {
    return stream.EnqueueHost([cpu]() -> absl::Status {
      if constexpr (std::is_void_v<decltype(cpu())>) {
        cpu();
        return absl::OkStatus();
      } else {
        return cpu();
      }
    });
  }
  return CudaResult(cuda(stream.native_handle()), op);
}

static_assert(static_cast<int>(DType::kF32) == static_cast<int>(cuda::Elem::kF32) &&
              static_cast<int>(DType::kF16) == static_cast<int>(cuda::Elem::kF16) &&
              static_cast<int>(DType::kBF16) == static_cast<int>(cuda::Elem::kBF16));
cuda::Elem ElemOf(DType dtype) { return static_cast<cuda::Elem>(static_cast<int>(dtype)); }

// The CpuDevice's element-wise and attention kernels run on every core: one
// pool for the process, made on first use. Work is split so that each
// output element is computed by exactly one thread with the serial code, so
// results do not depend on the thread count.
ThreadPool& CpuPool() {
  static ThreadPool* pool = new ThreadPool(0);
  return *pool;
}

// The CpuDevice's GEMMs (OpenBLAS's sgemm) take as many threads as the pool
// above: this rank's share of the CPUs (runtime/host_cpus.h). OpenBLAS's own
// default is every CPU the process may run on, and its threads spin for a
// while after each call: two ranks on two cores ran four GEMM threads that
// kept each rank's ops from its core (a 2-rank training run took 1.5x as
// long). OPENBLAS_NUM_THREADS, when set, is left to OpenBLAS.
void ShareCpusWithBlas() {
  static const bool once = [] {
    if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr) openblas_set_num_threads(CpuPool().threads());
    return true;
  }();
  (void)once;
}
constexpr int64_t kCpuChunk = 1 << 15;
template <typename Fn>
void CpuChunks(int64_t n, Fn fn) {  // fn(begin, count) over [0, n)
  CpuPool().ParallelFor((n + kCpuChunk - 1) / kCpuChunk, [&](int64_t c) {
    fn(c * kCpuChunk, std::min(kCpuChunk, n - c * kCpuChunk));
  });
}

// The storage type shared by an op's parameter-like tensors (parameters,
// their gradients, GEMM operands): fp32, fp16 or bf16, the same for all.
absl::StatusOr<DType> StorageType(absl::string_view op, std::initializer_list<NamedTensor> tensors) {
  const DType dtype = tensors.begin()->second->dtype();
  for (const auto& [name, t, unused] : tensors) {
    if (!IsFloating(t->dtype()) || t->dtype() != dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": ", name, " is ", DTypeName(t->dtype()), " but ", tensors.begin()->first, " is ",
          DTypeName(dtype), "; parameters and their gradients share one of fp32, fp16, bf16"));
    }
  }
  return dtype;
}

// The CPU path's fp32 view of memory stored as `dtype`: the memory itself
// for fp32, else an exact fp32 copy; Store() rounds the copy back once.
class HostF32 {
 public:
  HostF32(const void* p, DType dtype, int64_t n)
      : p_(const_cast<void*>(p)), dtype_(dtype), n_(n) {
    if (dtype == DType::kF32) {
      data_ = static_cast<float*>(p_);
      return;
    }
    copy_.resize(n);
    status_ = Convert(p, dtype, copy_.data(), DType::kF32, n);
    data_ = copy_.data();
  }
  float* data() const { return data_; }
  // The widening's status (Store returns it too).
  const absl::Status& status() const { return status_; }
  absl::Status Store() {
    if (!status_.ok() || dtype_ == DType::kF32) return status_;
    return Convert(copy_.data(), DType::kF32, p_, dtype_, n_);
  }

 private:
  void* p_;
  DType dtype_;
  int64_t n_;
  std::vector<float> copy_;
  float* data_ = nullptr;
  absl::Status status_;
};

// The most fp32 values the CpuDevice widens one 16-bit operand into at a
// time (16 MiB) in its blocked ops: see [Note: row blocks] and the GEMM's
// [Note: the CpuDevice's 16-bit GEMM in blocks].
constexpr int64_t kWideBlockElements = int64_t{1} << 22;  // 4 Mi

// Runs fn(const float* chunk, int64_t offset, int64_t count) over x stored
// as `dtype`, widened to fp32 a cache-sized chunk at a time.
template <typename Fn>
absl::Status ForEachF32Chunk(const void* x, DType dtype, int64_t n, Fn fn) {
  if (dtype == DType::kF32) {
    fn(static_cast<const float*>(x), 0, n);
    return absl::OkStatus();
  }
  constexpr int64_t kChunk = 1 << 14;
  std::vector<float> buffer(std::min(n, kChunk));
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t count = std::min(kChunk, n - i);
    MEMWALL_RETURN_IF_ERROR(Convert(static_cast<const char*>(x) + i * SizeOf(dtype), dtype,
                                    buffer.data(), DType::kF32, count));
    fn(buffer.data(), i, count);
  }
  return absl::OkStatus();
}

// [Note: row blocks]
// The CpuDevice's GELU and its backward, AddBias and BiasBackward, LayerNorm
// (and AddLayerNorm) and its backward, and the classifier's softmax
// cross-entropy widen bf16 storage a block of at most kWideBlockElements
// values at a time, not the whole tensor (a micro-batch's logits took 4
// bytes a vocabulary entry a token beside the plan). Rows are independent,
// and the parameter gradients that sum over rows take the blocks in order,
// so blocks give the same bits; fp32 storage is used in place, in one
// block. Attention widens one head of one sequence at a time, inside the
// task that computes it (its unit of work), so what it holds in fp32 is a
// head's worth a thread, not the micro-batch's.

// fn(r0, r1) over [0, rows) in blocks of whole rows of `width` values, at
// most kWideBlockElements values a block (one row when a row is longer);
// one block for fp32 storage, which is used in place.
template <typename Fn>
absl::Status ForEachRowBlock(int64_t rows, int64_t width, DType dtype, Fn fn) {
  const int64_t block = dtype == DType::kF32 ? std::max<int64_t>(rows, 1)
                                             : std::max<int64_t>(1, kWideBlockElements / std::max<int64_t>(width, 1));
  for (int64_t r0 = 0; r0 < rows; r0 += block) MEMWALL_RETURN_IF_ERROR(fn(r0, std::min(rows, r0 + block)));
  return absl::OkStatus();
}

// Element i of storage p of type dtype.
inline void* ElementAt(const void* p, DType dtype, int64_t i) {
  return static_cast<char*>(const_cast<void*>(p)) + i * static_cast<int64_t>(SizeOf(dtype));
}

// The last dimension of a LayerNorm input, and how many rows it has.
absl::StatusOr<std::pair<int64_t, int64_t>> RowsAndWidth(absl::string_view op, const Tensor& x) {
  if (x.shape().empty() || x.shape().back() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": x ", ShapeString(x), " needs a non-empty last dimension"));
  }
  const int64_t d = x.shape().back();
  return std::make_pair(x.numel() / d, d);
}

// The activations' type of an op: fp32 or bf16, `name`'s, which the op's
// other activations and activation gradients must share.
absl::StatusOr<DType> ActivationType(absl::string_view op, absl::string_view name, const Tensor& x) {
  if (x.dtype() == DType::kF32 || x.dtype() == DType::kBF16) return x.dtype();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " is ", DTypeName(x.dtype()),
                                                 "; activations are fp32 or bf16"));
}

}  // namespace

namespace {
// One GEMM's checked operands: row-major C (m, n) = op(A) (m, k) op(B) (k, n).
struct GemmArgs {
  bool transpose_a, transpose_b;
  int64_t m, n, k, lda, ldb, ldc;
  DType ab, ct;
};

// A view's rows and leading dimension, after checking that it is one.
absl::Status CheckView(absl::string_view op, absl::string_view name, const MatrixView& v) {
  const Tensor& t = v.tensor;
  if (t.shape().size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " ", ShapeString(t), " must be 2-D"));
  }
  if (v.cols < 0 || v.cols > t.shape()[1]) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " uses ", v.cols, " columns of ",
                                                   ShapeString(t), "; a view has 0 to ", t.shape()[1]));
  }
  return absl::OkStatus();
}

absl::StatusOr<GemmArgs> CheckGemm(absl::string_view op, const MatrixView& av, bool transpose_a,
                                   const MatrixView& bv, bool transpose_b, const MatrixView& cv,
                                   Stream& stream) {
  const Tensor &a = av.tensor, &b = bv.tensor, &c = cv.tensor;
  MEMWALL_ASSIGN_OR_RETURN(const DType ab, StorageType(op, {{"a", &a}, {"b", &b}}));
  if (c.dtype() != DType::kF32 && c.dtype() != ab) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": c is ", DTypeName(c.dtype()),
                                                   "; it must be fp32 or a's ", DTypeName(ab)));
  }
  const DType ct = c.dtype();
  MEMWALL_RETURN_IF_ERROR(
      CheckTensors(op, stream, {{"a", &a, ab}, {"b", &b, ab}, {"c", &c, ct}}));
  MEMWALL_RETURN_IF_ERROR(CheckView(op, "a", av));
  MEMWALL_RETURN_IF_ERROR(CheckView(op, "b", bv));
  MEMWALL_RETURN_IF_ERROR(CheckView(op, "c", cv));
  // Row-major storage: a is (rows_a, cols_a); op(a) swaps them if transposed.
  const int64_t m = transpose_a ? av.cols : a.shape()[0];
  const int64_t k = transpose_a ? a.shape()[0] : av.cols;
  const int64_t kb = transpose_b ? bv.cols : b.shape()[0];
  const int64_t n = transpose_b ? b.shape()[0] : bv.cols;
  if (k != kb || c.shape()[0] != m || cv.cols != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": op(a) is (", m, ", ", k, "), op(b) is (", kb, ", ", n, ") and c is (", c.shape()[0],
        ", ", cv.cols, "); need op(a) (M, K), op(b) (K, N), c (M, N)"));
  }
  for (int64_t dim : {m, n, k, a.shape()[1], b.shape()[1], c.shape()[1]}) {
    if (dim > INT_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": dimension ", dim, " exceeds the BLAS int limit"));
    }
  }
  // Leading dimensions are the stored row lengths; BLAS wants them >= 1 even
  // for an empty K (then C = beta * C).
  return GemmArgs{transpose_a, transpose_b, m, n, k,
                  std::max<int64_t>(a.shape()[1], 1), std::max<int64_t>(b.shape()[1], 1),
                  std::max<int64_t>(c.shape()[1], 1), ab, ct};
}

// Rows [r0, r1) x columns [c0, c1) of the row-major matrix at p (dtype,
// leading dimension ld), widened into `out` as a dense block (c1 - c0 a row);
// and a dense fp32 block rounded back into such a matrix.
absl::Status WidenBlock(const void* p, DType dtype, int64_t ld, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                        float* out) {
  const size_t elem = SizeOf(dtype);
  const int64_t w = c1 - c0;
  if (c0 == 0 && w == ld) {
    return Convert(static_cast<const char*>(p) + r0 * ld * elem, dtype, out, DType::kF32, (r1 - r0) * w);
  }
  for (int64_t r = r0; r < r1; ++r) {
    MEMWALL_RETURN_IF_ERROR(
        Convert(static_cast<const char*>(p) + (r * ld + c0) * elem, dtype, out + (r - r0) * w, DType::kF32, w));
  }
  return absl::OkStatus();
}
absl::Status NarrowBlock(const float* block, void* p, DType dtype, int64_t ld, int64_t r0, int64_t r1, int64_t c0,
                         int64_t c1) {
  const size_t elem = SizeOf(dtype);
  const int64_t w = c1 - c0;
  for (int64_t r = r0; r < r1; ++r) {
    MEMWALL_RETURN_IF_ERROR(
        Convert(block + (r - r0) * w, DType::kF32, static_cast<char*>(p) + (r * ld + c0) * elem, dtype, w));
  }
  return absl::OkStatus();
}

// WidenBlock and NarrowBlock of a GEMM's block on the CPU pool's threads, a
// piece of rows each (conversions are element-wise: the same values).
// Never from inside a pool task: the attention's tasks call the serial forms.
template <typename Fn>  // fn(first_row, end_row)
absl::Status ForRowPieces(int64_t r0, int64_t r1, int64_t width, Fn fn) {
  const int64_t rows = r1 - r0;
  const int64_t most = std::min<int64_t>(rows, 4 * CpuPool().threads());
  const int64_t pieces = std::clamp<int64_t>(rows * width / kCpuChunk, 1, std::max<int64_t>(most, 1));
  if (pieces == 1) return fn(r0, r1);
  std::vector<absl::Status> status(pieces);
  CpuPool().ParallelFor(pieces, [&](int64_t i) {
    status[i] = fn(r0 + rows * i / pieces, r0 + rows * (i + 1) / pieces);
  });
  for (absl::Status& st : status) MEMWALL_RETURN_IF_ERROR(st);
  return absl::OkStatus();
}
absl::Status WidenBlockOnPool(const void* p, DType dtype, int64_t ld, int64_t r0, int64_t r1, int64_t c0,
                              int64_t c1, float* out) {
  return ForRowPieces(r0, r1, c1 - c0, [&](int64_t a, int64_t b) {
    return WidenBlock(p, dtype, ld, a, b, c0, c1, out + (a - r0) * (c1 - c0));
  });
}
absl::Status NarrowBlockOnPool(const float* block, void* p, DType dtype, int64_t ld, int64_t r0, int64_t r1,
                               int64_t c0, int64_t c1) {
  return ForRowPieces(r0, r1, c1 - c0, [&](int64_t a, int64_t b) {
    return NarrowBlock(block + (a - r0) * (c1 - c0), p, dtype, ld, a, b, c0, c1);
  });
}

// C block = alpha op(A) op(B) + beta C over all of K, then + bias (the
// block's columns), all fp32 in place.
void Fp32GemmBlock(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
                   const float* bias) {
  if (k == 0) {  // C = beta * C; beta = 0 overwrites (even NaN)
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        float& x = c[i * ldc + j];
        x = beta == 0.0f ? 0.0f : beta * x;
      }
    }
  } else {
    ShareCpusWithBlas();
    cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans,
                static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
                static_cast<int>(std::max<int64_t>(lda, 1)), b, static_cast<int>(std::max<int64_t>(ldb, 1)), beta, c,
                static_cast<int>(std::max<int64_t>(ldc, 1)));
  }
  if (bias != nullptr) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] += bias[j];
    }
  }
}

// [Note: the CpuDevice's 16-bit GEMM in blocks]
// fp32 accumulation (sgemm) of exact fp32 copies of the 16-bit operands,
// then `bias` (n values, may be null) added in fp32 and a 16-bit C rounded
// once. The copies are made a block of C at a time: rows [m0, m1) of op(A),
// columns [n0, n1) of op(B) and that block of C, each at most
// kWideBlockElements fp32 values, so they stay near 48 MiB whatever the
// shapes (whole copies of the classifier's operands took 4 bytes for each
// of wte's elements, twice in its backward, which no plan counts). Every
// element of C is still one sgemm over all of K. fp32 operands are used in
// place. The copies are made on the pool's threads, into storage that is
// not zero-filled first.

absl::Status CpuGemm(const GemmArgs& g, float alpha, const void* pa, const void* pb, float beta, void* pc,
                     const void* bias, DType bias_type) {
  if (g.m == 0 || g.n == 0) return absl::OkStatus();
  const HostF32 fbias(bias, bias_type, bias != nullptr ? g.n : 0);
  const float* bias32 = bias != nullptr ? fbias.data() : nullptr;
  if (g.ab == DType::kF32) {  // C is fp32 too: no copies
    Fp32GemmBlock(g.transpose_a, g.transpose_b, g.m, g.n, g.k, alpha, static_cast<const float*>(pa), g.lda,
                  static_cast<const float*>(pb), g.ldb, beta, static_cast<float*>(pc), g.ldc, bias32);
    return absl::OkStatus();
  }
  const int64_t k = std::max<int64_t>(g.k, 1);
  const int64_t mt = std::clamp<int64_t>(kWideBlockElements / k, 1, g.m);
  const int64_t nt = std::clamp<int64_t>(std::min(kWideBlockElements / k, kWideBlockElements / mt), 1, g.n);
  // Left unset: each block's copy is written whole before it is read (a
  // zero fill of up to 16 MiB a copy, on every GEMM, was wasted).
  const auto a_copy = std::make_unique_for_overwrite<float[]>(mt * g.k);
  const auto b_copy = std::make_unique_for_overwrite<float[]>(g.k * nt);
  const auto c_copy = std::make_unique_for_overwrite<float[]>(g.ct == DType::kF32 ? 0 : mt * nt);
  float* a32 = a_copy.get();
  float* b32 = b_copy.get();
  float* c32 = c_copy.get();
  for (int64_t m0 = 0; m0 < g.m; m0 += mt) {
    const int64_t m1 = std::min(g.m, m0 + mt);
    // op(A)'s rows [m0, m1): stored rows, or stored columns when transposed.
    MEMWALL_RETURN_IF_ERROR(g.transpose_a ? WidenBlockOnPool(pa, g.ab, g.lda, 0, g.k, m0, m1, a32)
                                          : WidenBlockOnPool(pa, g.ab, g.lda, m0, m1, 0, g.k, a32));
    const int64_t lda = g.transpose_a ? m1 - m0 : g.k;
    for (int64_t n0 = 0; n0 < g.n; n0 += nt) {
      const int64_t n1 = std::min(g.n, n0 + nt);
      // op(B)'s columns [n0, n1): stored columns, or stored rows when transposed.
      MEMWALL_RETURN_IF_ERROR(g.transpose_b ? WidenBlockOnPool(pb, g.ab, g.ldb, n0, n1, 0, g.k, b32)
                                            : WidenBlockOnPool(pb, g.ab, g.ldb, 0, g.k, n0, n1, b32));
      const int64_t ldb = g.transpose_b ? g.k : n1 - n0;
      const float* block_bias = bias32 != nullptr ? bias32 + n0 : nullptr;
      if (g.ct == DType::kF32) {  // in C itself
        Fp32GemmBlock(g.transpose_a, g.transpose_b, m1 - m0, n1 - n0, g.k, alpha, a32, lda, b32, ldb, beta,
                      static_cast<float*>(pc) + m0 * g.ldc + n0, g.ldc, block_bias);
        continue;
      }
      // With beta = 0 the block's old values are not read: sgemm overwrites
      // C (BLAS's rule, NaN included), and so does K = 0.
      if (beta != 0.0f) MEMWALL_RETURN_IF_ERROR(WidenBlockOnPool(pc, g.ct, g.ldc, m0, m1, n0, n1, c32));
      Fp32GemmBlock(g.transpose_a, g.transpose_b, m1 - m0, n1 - n0, g.k, alpha, a32, lda, b32, ldb, beta, c32,
                    n1 - n0, block_bias);
      MEMWALL_RETURN_IF_ERROR(NarrowBlockOnPool(c32, pc, g.ct, g.ldc, m0, m1, n0, n1));
    }
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status Matmul(const MatrixView& a, bool transpose_a, const MatrixView& b, bool transpose_b,
                    const MatrixView& c, float alpha, float beta, Stream& stream) {
  MEMWALL_ASSIGN_OR_RETURN(const GemmArgs g,
                           CheckGemm("Matmul", a, transpose_a, b, transpose_b, c, stream));
  const void* pa = a.tensor.data();
  const void* pb = b.tensor.data();
  void* pc = c.tensor.data();
  return Dispatch(
      stream, "Matmul",
      [=] { return CpuGemm(g, alpha, pa, pb, beta, pc, nullptr, DType::kF32); },
      [=](void* s) {
        return cuda::Gemm(g.transpose_a, g.transpose_b, g.m, g.n, g.k, alpha, pa, g.lda, pb, g.ldb,
                          ElemOf(g.ab), beta, pc, g.ldc, ElemOf(g.ct), nullptr, cuda::Elem::kF32, s);
      });
}

absl::Status MatmulBias(const MatrixView& a, bool transpose_a, const MatrixView& b, bool transpose_b,
                        const Tensor& bias, const MatrixView& c, Stream& stream) {
  constexpr absl::string_view op = "MatmulBias";
  MEMWALL_ASSIGN_OR_RETURN(const GemmArgs g,
                           CheckGemm(op, a, transpose_a, b, transpose_b, c, stream));
  MEMWALL_ASSIGN_OR_RETURN(const DType bt, StorageType(op, {{"bias", &bias}}));
  if (g.ct != DType::kF32 && bt != g.ct) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": bias is ", DTypeName(bt), " and c is ",
                                                   DTypeName(g.ct),
                                                   "; a 16-bit c needs a bias of its type"));
  }
  MEMWALL_RETURN_IF_ERROR(CheckTensors(op, stream, {{"bias", &bias, bt}}));
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"bias", &bias}, g.n, "c's columns"));
  const void* pa = a.tensor.data();
  const void* pb = b.tensor.data();
  const void* pbias = bias.data();
  void* pc = c.tensor.data();
  return Dispatch(
      stream, op,
      [=] { return CpuGemm(g, 1.0f, pa, pb, 0.0f, pc, pbias, bt); },
      [=](void* s) {
        return cuda::Gemm(g.transpose_a, g.transpose_b, g.m, g.n, g.k, 1.0f, pa, g.lda, pb, g.ldb,
                          ElemOf(g.ab), 0.0f, pc, g.ldc, ElemOf(g.ct), pbias, ElemOf(bt), s);
      });
}

absl::Status Gelu(const Tensor& x, const Tensor& y, Stream& stream) {
  constexpr absl::string_view op = "Gelu";
  MEMWALL_ASSIGN_OR_RETURN(const DType at, ActivationType(op, "x", x));
  MEMWALL_RETURN_IF_ERROR(CheckTensors(op, stream, {{"x", &x, at}, {"y", &y, at}}));
  MEMWALL_RETURN_IF_ERROR(SameShape(op, {"x", &x}, {"y", &y}));
  const void* px = x.data();
  void* py = y.data();
  const int64_t n = x.numel();
  return Dispatch(
      stream, op,
      [=]() -> absl::Status {
        return ForEachRowBlock(n, 1, at, [&](int64_t i0, int64_t i1) {  // see [Note: row blocks]
          const HostF32 fx(ElementAt(px, at, i0), at, i1 - i0);
          HostF32 fy(ElementAt(py, at, i0), at, i1 - i0);
          const float* x32 = fx.data();
          float* y32 = fy.data();
          CpuChunks(i1 - i0, [&](int64_t i, int64_t k) { kernels::GeluForward(x32 + i, y32 + i, k); });
          return fy.Store();
        });
      },
      [=](void* s) { return cuda::GeluForward(px, py, ElemOf(at), n, s); });
}

absl::Status GeluBackward(const Tensor& x, const Tensor& dy, const Tensor& dx, Stream& stream) {
  constexpr absl::string_view op = "GeluBackward";
  MEMWALL_ASSIGN_OR_RETURN(const DType at, ActivationType(op, "x", x));
  MEMWALL_RETURN_IF_ERROR(CheckTensors(op, stream, {{"x", &x, at}, {"dy", &dy, at}, {"dx", &dx, at}}));
  MEMWALL_RETURN_IF_ERROR(SameShape(op, {"x", &x}, {"dy", &dy}));
  MEMWALL_RETURN_IF_ERROR(SameShape(op, {"x", &x}, {"dx", &dx}));
  const void* px = x.data();
  const void* pdy = dy.data();
  void* pdx = dx.data();
  const int64_t n = x.numel();
  return Dispatch(
      stream, op,
      [=]() -> absl::Status {
        return ForEachRowBlock(n, 1, at, [&](int64_t i0, int64_t i1) {  // see [Note: row blocks]
          const HostF32 fx(ElementAt(px, at, i0), at, i1 - i0), fdy(ElementAt(pdy, at, i0), at, i1 - i0);
          HostF32 fdx(ElementAt(pdx, at, i0), at, i1 - i0);
          const float *x32 = fx.data(), *dy32 = fdy.data();
          float* dx32 = fdx.data();
          CpuChunks(i1 - i0, [&](int64_t i, int64_t k) { kernels::GeluBackward(x32 + i, dy32 + i, dx32 + i, k); });
          return fdx.Store();
        });
      },
      [=](void* s) { return cuda::GeluBackward(px, pdy, pdx, ElemOf(at), n, s); });
}

absl::Status Add(const Tensor& a, const Tensor& b, const Tensor& y, Stream& stream) {
  constexpr absl::string_view op = "Add";
  MEMWALL_ASSIGN_OR_RETURN(const DType t, StorageType(op, {{"a", &a}, {"b", &b}, {"y", &y}}));
  MEMWALL_RETURN_IF_ERROR(CheckTensors(op, stream, {{"a", &a, t}, {"b", &b, t}, {"y", &y, t}}));
  MEMWALL_RETURN_IF_ERROR(SameShape(op, {"a", &a}, {"b", &b}));
  MEMWALL_RETURN_IF_ERROR(SameShape(op, {"a", &a}, {"y", &y}));
  const void* pa = a.data();
  const void* pb = b.data();
  void* py = y.data();
  const int64_t n = a.numel();
  return Dispatch(
      stream, op,
      // fp32 sum, one rounding (y may alias a or b), on every core.
      [=] { return HostAdd(pa, pb, py, t, n, nullptr, &CpuPool()); },
      [=](void* s) { return cuda::Add(pa, pb, py, ElemOf(t), n, s); });
}

namespace {
// LayerNorm, or with a residual (`add`: a and b, else null) AddLayerNorm,
// whose x is written as round(a + b) first.
absl::Status LayerNormWithResidual(absl::string_view op, const std::pair<const Tensor*, const Tensor*>* add,
                                   const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                                   const Tensor& y, const Tensor& mean, const Tensor& rstd, Stream& stream) {
  MEMWALL_ASSIGN_OR_RETURN(const DType pt, StorageType(op, {{"gamma", &gamma}, {"beta", &beta}}));
  const char* x_name = add != nullptr ? "sum" : "x";
  MEMWALL_ASSIGN_OR_RETURN(const DType at, ActivationType(op, x_name, x));
  MEMWALL_RETURN_IF_ERROR(CheckTensors(op, stream,
                                       {{x_name, &x, at}, {"gamma", &gamma, pt}, {"beta", &beta, pt},
                                        {"y", &y, at}, {"mean", &mean}, {"rstd", &rstd}}));
  if (add != nullptr) {
    MEMWALL_RETURN_IF_ERROR(CheckTensors(op, stream, {{"a", add->first, at}, {"b", add->second, at}}));
    MEMWALL_RETURN_IF_ERROR(SameShape(op, {"a", add->first}, {x_name, &x}));
    MEMWALL_RETURN_IF_ERROR(SameShape(op, {"b", add->second}, {x_name, &x}));
  }
  MEMWALL_ASSIGN_OR_RETURN(const auto rows_d, RowsAndWidth(op, x));
  // Named copies, not a structured binding: lambdas below capture them
  // (clang before 16 cannot capture bindings).
  const int64_t rows = rows_d.first, d = rows_d.second;
  MEMWALL_RETURN_IF_ERROR(SameShape(op, {x_name, &x}, {"y", &y}));
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"gamma", &gamma}, d, "x's last dimension"));
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"beta", &beta}, d, "x's last dimension"));
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"mean", &mean}, rows, "one per row of x"));
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"rstd", &rstd}, rows, "one per row of x"));
  if (!(eps > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": eps must be > 0, got ", eps));
  }
  const void* pa = add != nullptr ? add->first->data() : nullptr;
  const void* pb_add = add != nullptr ? add->second->data() : nullptr;
  void* px = x.data();
  const void* pg = gamma.data();
  const void* pb = beta.data();
  void* py = y.data();
  float* pm = mean.data_as<float>();
  float* pr = rstd.data_as<float>();
  return Dispatch(
      stream, op,
      [=]() -> absl::Status {
        // The residual sum exactly as Add computes it, then LayerNorm of it.
        if (pa != nullptr) MEMWALL_RETURN_IF_ERROR(HostAdd(pa, pb_add, px, at, rows * d, nullptr, &CpuPool()));
        const HostF32 g(pg, pt, d), b(pb, pt, d);
        return ForEachRowBlock(rows, d, at, [&](int64_t r0, int64_t r1) {  // see [Note: row blocks]
          const HostF32 fx(ElementAt(px, at, r0 * d), at, (r1 - r0) * d);
          HostF32 fy(ElementAt(py, at, r0 * d), at, (r1 - r0) * d);
          kernels::LayerNormForward(fx.data(), g.data(), b.data(), eps, fy.data(), pm + r0, pr + r0, r1 - r0, d);
          return fy.Store();
        });
      },
      [=](void* s) {
        return cuda::LayerNormForward(pa, pb_add, px, pg, pb, ElemOf(at), ElemOf(pt), eps, py, pm, pr, rows,
                                      d, s);
      });
}
}  // namespace

absl::Status LayerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                       const Tensor& y, const Tensor& mean, const Tensor& rstd, Stream& stream) {
  return LayerNormWithResidual("LayerNorm", nullptr, x, gamma, beta, eps, y, mean, rstd, stream);
}

absl::Status AddLayerNorm(const Tensor& a, const Tensor& b, const Tensor& gamma, const Tensor& beta,
                          float eps, const Tensor& sum, const Tensor& y, const Tensor& mean,
                          const Tensor& rstd, Stream& stream) {
  const std::pair<const Tensor*, const Tensor*> add{&a, &b};
  return LayerNormWithResidual("AddLayerNorm", &add, sum, gamma, beta, eps, y, mean, rstd, stream);
}

absl::Status LayerNormBackward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                               const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                               const Tensor& dgamma, const Tensor& dbeta, Stream& stream) {
  constexpr absl::string_view op = "LayerNormBackward";
  MEMWALL_ASSIGN_OR_RETURN(
      const DType pt,
      StorageType(op, {{"gamma", &gamma}, {"dgamma", &dgamma}, {"dbeta", &dbeta}}));
  MEMWALL_ASSIGN_OR_RETURN(const DType at, ActivationType(op, "x", x));
  MEMWALL_RETURN_IF_ERROR(CheckTensors(op, stream,
                                       {{"dy", &dy, at}, {"x", &x, at}, {"gamma", &gamma, pt},
                                        {"mean", &mean}, {"rstd", &rstd}, {"dx", &dx, at},
                                        {"dgamma", &dgamma, pt}, {"dbeta", &dbeta, pt}}));
  MEMWALL_ASSIGN_OR_RETURN(const auto rows_d, RowsAndWidth(op, x));
  // Named copies, not a structured binding: lambdas below capture them
  // (clang before 16 cannot capture bindings).
  const int64_t rows = rows_d.first, d = rows_d.second;
  MEMWALL_RETURN_IF_ERROR(SameShape(op, {"x", &x}, {"dy", &dy}));
  MEMWALL_RETURN_IF_ERROR(SameShape(op, {"x", &x}, {"dx", &dx}));
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"gamma", &gamma}, d, "x's last dimension"));
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"dgamma", &dgamma}, d, "x's last dimension"));
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"dbeta", &dbeta}, d, "x's last dimension"));
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"mean", &mean}, rows, "one per row of x"));
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"rstd", &rstd}, rows, "one per row of x"));
  if (dx.data() == dy.data() && rows > 0) {
    return absl::InvalidArgumentError(
        "LayerNormBackward: dx must not alias dy (dgamma and dbeta read dy after dx is written)");
  }
  const void* pdy = dy.data();
  const void* px = x.data();
  const void* pg = gamma.data();
  const float* pm = mean.data_as<float>();
  const float* pr = rstd.data_as<float>();
  void* pdx = dx.data();
  void* pdg = dgamma.data();
  void* pdb = dbeta.data();
  return Dispatch(
      stream, op,
      [=]() -> absl::Status {
        HostF32 g(pg, pt, d), dg(pdg, pt, d), db(pdb, pt, d);
        // Row blocks in order: dgamma and dbeta accumulate the rows in the
        // same order as in one call. See [Note: row blocks].
        MEMWALL_RETURN_IF_ERROR(ForEachRowBlock(rows, d, at, [&](int64_t r0, int64_t r1) {
          const int64_t n = (r1 - r0) * d;
          const HostF32 fdy(ElementAt(pdy, at, r0 * d), at, n), fx(ElementAt(px, at, r0 * d), at, n);
          HostF32 fdx(ElementAt(pdx, at, r0 * d), at, n);
          kernels::LayerNormBackward(fdy.data(), fx.data(), g.data(), pm + r0, pr + r0, fdx.data(), dg.data(),
                                     db.data(), r1 - r0, d);
          return fdx.Store();
        }));
        MEMWALL_RETURN_IF_ERROR(dg.Store());
        return db.Store();
      },
      [=](void* s) {
        return cuda::LayerNormBackward(pdy, px, pg, pm, pr, pdx, pdg, pdb, ElemOf(at), ElemOf(pt),
                                       rows, d, s);
      });
}

absl::Status SoftmaxCrossEntropy(const MatrixView& view, const Tensor& targets,
                                 const Tensor& losses, float grad_scale, Stream& stream) {
  constexpr absl::string_view op = "SoftmaxCrossEntropy";
  const Tensor& logits = view.tensor;
  MEMWALL_ASSIGN_OR_RETURN(const DType at, ActivationType(op, "logits", logits));
  MEMWALL_RETURN_IF_ERROR(CheckTensors(op, stream,
                                       {{"logits", &logits, at},
                                        {"targets", &targets, DType::kI32},
                                        {"losses", &losses}}));
  if (logits.shape().size() != 2 || view.cols <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": logits ", ShapeString(logits), " must be (rows, vocabulary) with vocabulary > 0"));
  }
  MEMWALL_RETURN_IF_ERROR(CheckView(op, "logits", view));
  const int64_t rows = logits.shape()[0], v = view.cols, ld = logits.shape()[1];
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"targets", &targets}, rows, "one per row of logits"));
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"losses", &losses}, rows, "one per row of logits"));
  if (!std::isfinite(grad_scale)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": grad_scale ", grad_scale, " is not finite"));
  }
  void* pl = logits.data();
  const int32_t* pt = targets.data_as<int32_t>();
  float* ploss = losses.data_as<float>();
  if (OnCpu(stream)) {
    // Not Dispatch: the CPU path can report a bad target precisely.
    return stream.EnqueueHost([=]() -> absl::Status {
      int64_t bad = -1;  // the first row whose target is outside the vocabulary
      // See [Note: row blocks].
      MEMWALL_RETURN_IF_ERROR(ForEachRowBlock(rows, ld, at, [&](int64_t r0, int64_t r1) {
        HostF32 l(ElementAt(pl, at, r0 * ld), at, (r1 - r0) * ld);
        const int64_t bad_here =
            kernels::SoftmaxCrossEntropy(l.data(), pt + r0, ploss + r0, grad_scale, r1 - r0, v, ld);
        if (bad < 0 && bad_here >= 0) bad = r0 + bad_here;
        return l.Store();
      }));
      if (bad < 0) return absl::OkStatus();
      return absl::InvalidArgumentError(absl::StrCat(op, ": target ", pt[bad], " at row ", bad,
                                                     " is outside the vocabulary [0, ", v, ")"));
    });
  }
  return CudaResult(cuda::SoftmaxCrossEntropy(pl, pt, ploss, grad_scale, ElemOf(at), rows, v, ld,
                                              stream.native_handle()),
                    op);
}

absl::Status Cast(const Tensor& src, const Tensor& dst, Stream& stream) {
  constexpr absl::string_view op = "Cast";
  if (!IsFloating(src.dtype()) || !IsFloating(dst.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", DTypeName(src.dtype()), " -> ",
                                                   DTypeName(dst.dtype()),
                                                   ": only fp32, fp16 and bf16 cast"));
  }
  MEMWALL_RETURN_IF_ERROR(CheckTensors(
      op, stream, {{"src", &src, src.dtype()}, {"dst", &dst, dst.dtype()}}));
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"dst", &dst}, src.numel(), "as many as src"));
  const int64_t n = src.numel();
  if (n == 0 || (src.dtype() == dst.dtype() && src.data() == dst.data())) {
    return absl::OkStatus();
  }
  if (src.dtype() == dst.dtype()) return stream.Copy(dst.data(), src.data(), src.bytes());
  const void* ps = src.data();
  void* pd = dst.data();
  const DType from = src.dtype(), to = dst.dtype();
  if (OnCpu(stream)) {
    return stream.EnqueueHost([=] { return Convert(ps, from, pd, to, n); });
  }
  const auto* s16 = static_cast<const uint16_t*>(ps);
  auto* d16 = static_cast<uint16_t*>(pd);
  void* native = stream.native_handle();
  int error = 0;
  if (from == DType::kF32) {
    error = to == DType::kF16 ? memwall::cuda::F32ToF16(static_cast<const float*>(ps), d16, n, native)
                              : memwall::cuda::F32ToBF16(static_cast<const float*>(ps), d16, n, native);
  } else if (to == DType::kF32) {
    error = from == DType::kF16 ? memwall::cuda::F16ToF32(s16, static_cast<float*>(pd), n, native)
                                : memwall::cuda::BF16ToF32(s16, static_cast<float*>(pd), n, native);
  } else {
    error = from == DType::kF16 ? memwall::cuda::F16ToBF16(s16, d16, n, native)
                                : memwall::cuda::BF16ToF16(s16, d16, n, native);
  }
  return CudaResult(error, op);
}

absl::Status Embedding(const Tensor& ids, const Tensor& table, const Tensor& y, Stream& stream) {
  constexpr absl::string_view op = "Embedding";
  MEMWALL_ASSIGN_OR_RETURN(const DType pt, StorageType(op, {{"table", &table}}));
  MEMWALL_ASSIGN_OR_RETURN(const DType at, ActivationType(op, "y", y));
  MEMWALL_RETURN_IF_ERROR(CheckTensors(
      op, stream, {{"ids", &ids, DType::kI32}, {"table", &table, pt}, {"y", &y, at}}));
  if (table.shape().size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": table ", ShapeString(table), " must be (vocabulary, d)"));
  }
  const int64_t v = table.shape()[0], d = table.shape()[1], rows = ids.numel();
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"y", &y}, rows * d, "ids x d"));
  const int32_t* pi = ids.data_as<int32_t>();
  const void* ptable = table.data();
  char* py = static_cast<char*>(y.data());
  const size_t y_row = d * SizeOf(at);
  if (OnCpu(stream)) {
    return stream.EnqueueHost([=]() -> absl::Status {
      for (int64_t r = 0; r < rows; ++r) {
        if (pi[r] < 0 || pi[r] >= v) {
          return absl::InvalidArgumentError(absl::StrCat(op, ": id ", pi[r], " at row ", r,
                                                         " is outside the table [0, ", v, ")"));
        }
        // One rounding from the table's type to the activations' (none when equal).
        MEMWALL_RETURN_IF_ERROR(Convert(static_cast<const char*>(ptable) + pi[r] * d * SizeOf(pt),
                                        pt, py + r * y_row, at, d));
      }
      return absl::OkStatus();
    });
  }
  return CudaResult(
      cuda::EmbeddingForward(pi, ptable, ElemOf(pt), py, ElemOf(at), rows, v, d, stream.native_handle()),
      op);
}

absl::Status EmbeddingBackward(const Tensor& ids, const Tensor& dy, const Tensor& dtable,
                               Stream& stream) {
  constexpr absl::string_view op = "EmbeddingBackward";
  MEMWALL_ASSIGN_OR_RETURN(const DType pt, StorageType(op, {{"dtable", &dtable}}));
  MEMWALL_ASSIGN_OR_RETURN(const DType at, ActivationType(op, "dy", dy));
  MEMWALL_RETURN_IF_ERROR(CheckTensors(
      op, stream, {{"ids", &ids, DType::kI32}, {"dy", &dy, at}, {"dtable", &dtable, pt}}));
  if (dtable.shape().size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": dtable ", ShapeString(dtable), " must be (vocabulary, d)"));
  }
  const int64_t v = dtable.shape()[0], d = dtable.shape()[1], rows = ids.numel();
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"dy", &dy}, rows * d, "ids x d"));
  const int32_t* pi = ids.data_as<int32_t>();
  const void* pdy_stored = dy.data();
  void* pdt = dtable.data();
  return Dispatch(
      stream, op,
      [=]() -> absl::Status {
        const HostF32 fdy(pdy_stored, at, rows * d);
        const float* pdy = fdy.data();
        if (pt == DType::kF32) {
          kernels::EmbeddingBackward(pi, pdy, static_cast<float*>(pdt), rows, v, d);
          return absl::OkStatus();
        }
        // 16-bit: each touched row widened once, its rows added in order,
        // rounded back once.
        absl::flat_hash_map<int32_t, int64_t> slot;
        std::vector<int32_t> touched;
        for (int64_t r = 0; r < rows; ++r) {
          if (pi[r] >= 0 && pi[r] < v && slot.try_emplace(pi[r], touched.size()).second) {
            touched.push_back(pi[r]);
          }
        }
        std::vector<float> acc(touched.size() * d);
        char* table = static_cast<char*>(pdt);
        const size_t row_bytes = d * SizeOf(pt);
        for (size_t i = 0; i < touched.size(); ++i) {
          MEMWALL_RETURN_IF_ERROR(
              Convert(table + touched[i] * row_bytes, pt, acc.data() + i * d, DType::kF32, d));
        }
        for (int64_t r = 0; r < rows; ++r) {
          if (pi[r] < 0 || pi[r] >= v) continue;
          float* a = acc.data() + slot[pi[r]] * d;
          for (int64_t j = 0; j < d; ++j) a[j] += pdy[r * d + j];
        }
        for (size_t i = 0; i < touched.size(); ++i) {
          MEMWALL_RETURN_IF_ERROR(
              Convert(acc.data() + i * d, DType::kF32, table + touched[i] * row_bytes, pt, d));
        }
        return absl::OkStatus();
      },
      [=](void* s) {
        return cuda::EmbeddingBackward(pi, pdy_stored, ElemOf(at), pdt, ElemOf(pt), rows, v, d, s);
      });
}

absl::Status CopyColumns(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col,
                         int64_t width, Stream& stream) {
  constexpr absl::string_view op = "CopyColumns";
  MEMWALL_RETURN_IF_ERROR(CheckTensors(op, stream, {{"src", &src, src.dtype()}, {"dst", &dst, src.dtype()}}));
  if (src.shape().size() != 2 || dst.shape().size() != 2 || src.shape()[0] != dst.shape()[0]) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": src ", ShapeString(src), " and dst ",
                                                   ShapeString(dst), " must be 2-D with one row count"));
  }
  const int64_t rows = src.shape()[0], src_width = src.shape()[1], dst_width = dst.shape()[1];
  if (width < 0 || src_col < 0 || dst_col < 0 || src_col + width > src_width || dst_col + width > dst_width) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": columns [", src_col, ", ", src_col + width,
                                                   ") of src ", ShapeString(src), " to [", dst_col, ", ",
                                                   dst_col + width, ") of dst ", ShapeString(dst),
                                                   " are out of range"));
  }
  if (rows == 0 || width == 0) return absl::OkStatus();
  const int64_t elem = static_cast<int64_t>(SizeOf(src.dtype()));
  const char* ps = static_cast<const char*>(src.data()) + src_col * elem;
  char* pd = static_cast<char*>(dst.data()) + dst_col * elem;
  const int64_t src_pitch = src_width * elem, dst_pitch = dst_width * elem, row_bytes = width * elem;
  return Dispatch(
      stream, op,
      [=] {
        CpuChunks(rows, [&](int64_t r, int64_t k) {
          for (int64_t i = r; i < r + k; ++i) std::memcpy(pd + i * dst_pitch, ps + i * src_pitch, row_bytes);
        });
      },
      [=](void* s) { return cuda::CopyColumns(ps, src_pitch, pd, dst_pitch, row_bytes, rows, s); });
}

absl::Status AddBias(const Tensor& y, const Tensor& bias, Stream& stream) {
  constexpr absl::string_view op = "AddBias";
  MEMWALL_ASSIGN_OR_RETURN(const DType pt, StorageType(op, {{"bias", &bias}}));
  MEMWALL_ASSIGN_OR_RETURN(const DType at, ActivationType(op, "y", y));
  MEMWALL_RETURN_IF_ERROR(CheckTensors(op, stream, {{"y", &y, at}, {"bias", &bias, pt}}));
  MEMWALL_ASSIGN_OR_RETURN(const auto rows_n, RowsAndWidth(op, y));
  const int64_t rows = rows_n.first, n = rows_n.second;  // captured below, as in LayerNorm
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"bias", &bias}, n, "y's last dimension"));
  void* py = y.data();
  const void* pb = bias.data();
  return Dispatch(
      stream, op,
      [=]() -> absl::Status {
        const HostF32 b(pb, pt, n);
        return ForEachRowBlock(rows, n, at, [&](int64_t r0, int64_t r1) {  // see [Note: row blocks]
          HostF32 fy(ElementAt(py, at, r0 * n), at, (r1 - r0) * n);
          kernels::AddBias(fy.data(), b.data(), r1 - r0, n);
          return fy.Store();
        });
      },
      [=](void* s) { return cuda::AddBias(py, ElemOf(at), pb, ElemOf(pt), rows, n, s); });
}

absl::Status BiasBackward(const Tensor& dy, const Tensor& dbias, Stream& stream) {
  constexpr absl::string_view op = "BiasBackward";
  MEMWALL_ASSIGN_OR_RETURN(const DType pt, StorageType(op, {{"dbias", &dbias}}));
  MEMWALL_ASSIGN_OR_RETURN(const DType at, ActivationType(op, "dy", dy));
  MEMWALL_RETURN_IF_ERROR(CheckTensors(op, stream, {{"dy", &dy, at}, {"dbias", &dbias, pt}}));
  MEMWALL_ASSIGN_OR_RETURN(const auto rows_n, RowsAndWidth(op, dy));
  const int64_t rows = rows_n.first, n = rows_n.second;  // captured below, as in LayerNorm
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"dbias", &dbias}, n, "dy's last dimension"));
  const void* pdy = dy.data();
  void* pdb = dbias.data();
  return Dispatch(
      stream, op,
      [=] {
        HostF32 db(pdb, pt, n);
        // Row blocks in order: the same sums as one call. See [Note: row blocks].
        MEMWALL_RETURN_IF_ERROR(ForEachRowBlock(rows, n, at, [&](int64_t r0, int64_t r1) {
          const HostF32 fdy(ElementAt(pdy, at, r0 * n), at, (r1 - r0) * n);
          kernels::BiasBackward(fdy.data(), db.data(), r1 - r0, n);
          return absl::OkStatus();
        }));
        return db.Store();
      },
      [=](void* s) { return cuda::BiasBackward(pdy, ElemOf(at), pdb, ElemOf(pt), rows, n, s); });
}

namespace {
struct AttentionShape {
  int64_t batch, t, heads, hd;
};

// fn(b, h) for every head h of every sequence b of a micro-batch, one
// task each on the CPU pool; the first failure in that order.
absl::Status ForEachHead(const AttentionShape& sh, const std::function<absl::Status(int64_t, int64_t)>& fn) {
  std::vector<absl::Status> status(sh.batch * sh.heads);
  CpuPool().ParallelFor(sh.batch * sh.heads, [&](int64_t i) { status[i] = fn(i / sh.heads, i % sh.heads); });
  for (absl::Status& st : status) MEMWALL_RETURN_IF_ERROR(st);
  return absl::OkStatus();
}

// Columns [col, col + hd) of the t rows of a (t, ld) activation stored as
// `at` at p: one head's part of a sequence.
struct HeadSlice {
  void* p;
  DType at;
  int64_t t, ld, col, hd;

  // The same columns `offset` further along (k and v after q).
  HeadSlice Shifted(int64_t offset) const { return {p, at, t, ld, col + offset, hd}; }
  // In fp32: the storage itself for fp32, else an exact copy in `copy`.
  absl::StatusOr<kernels::HeadRows> Widen(std::vector<float>& copy) const {
    if (at == DType::kF32) return kernels::HeadRows{static_cast<const float*>(p) + col, ld};
    copy.resize(t * hd);
    MEMWALL_RETURN_IF_ERROR(WidenBlock(p, at, ld, 0, t, col, col + hd, copy.data()));
    return kernels::HeadRows{copy.data(), hd};
  }
  // Where a kernel writes them: the storage for fp32, else `copy`, which
  // Narrow then rounds into the storage once.
  kernels::MutableHeadRows Output(std::vector<float>& copy) const {
    if (at == DType::kF32) return {static_cast<float*>(p) + col, ld};
    copy.resize(t * hd);
    return {copy.data(), hd};
  }
  absl::Status Narrow(const std::vector<float>& copy) const {
    return at == DType::kF32 ? absl::OkStatus() : NarrowBlock(copy.data(), p, at, ld, 0, t, col, col + hd);
  }
};

absl::StatusOr<AttentionShape> CheckAttentionShape(absl::string_view op, const Tensor& qkv,
                                                   int64_t heads, Stream& stream) {
  if (qkv.shape().size() != 3 || qkv.shape()[2] % 3 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": qkv ", ShapeString(qkv), " must be (batch, t, 3 * hidden)"));
  }
  const int64_t c = qkv.shape()[2] / 3;
  if (c == 0) {  // a head of no dimension has no scale 1/sqrt(hd)
    return absl::InvalidArgumentError(absl::StrCat(op, ": qkv ", ShapeString(qkv), " has a hidden size of 0"));
  }
  if (heads <= 0 || c % heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": hidden size ", c, " is not divisible into ", heads, " heads"));
  }
  const int64_t hd = c / heads;
  if (!OnCpu(stream) && hd > cuda::kMaxAttentionHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": head dimension ", hd,
                                                   " exceeds the CUDA kernel's limit of ",
                                                   cuda::kMaxAttentionHeadDim));
  }
  return AttentionShape{qkv.shape()[0], qkv.shape()[1], heads, hd};
}
}  // namespace

absl::Status Attention(const Tensor& qkv, int64_t heads, const Tensor& out, const Tensor& lse,
                       Stream& stream) {
  constexpr absl::string_view op = "Attention";
  MEMWALL_ASSIGN_OR_RETURN(const DType at, ActivationType(op, "qkv", qkv));
  MEMWALL_RETURN_IF_ERROR(
      CheckTensors(op, stream, {{"qkv", &qkv, at}, {"out", &out, at}, {"lse", &lse}}));
  MEMWALL_ASSIGN_OR_RETURN(const AttentionShape sh, CheckAttentionShape(op, qkv, heads, stream));
  const int64_t tokens = sh.batch * sh.t, c = sh.heads * sh.hd;
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"out", &out}, tokens * c, "batch x t x hidden"));
  MEMWALL_RETURN_IF_ERROR(
      HasElements(op, {"lse", &lse}, sh.batch * sh.heads * sh.t, "batch x heads x t"));
  const void* pq = qkv.data();
  void* po = out.data();
  float* pl = lse.data_as<float>();
  return Dispatch(
      stream, op,
      [=]() -> absl::Status {  // heads are independent: one per task
        return ForEachHead(sh, [&](int64_t b, int64_t h) -> absl::Status {  // see [Note: row blocks]
          const HeadSlice x{ElementAt(pq, at, b * sh.t * 3 * c), at, sh.t, 3 * c, h * sh.hd, sh.hd};
          const HeadSlice o{ElementAt(po, at, b * sh.t * c), at, sh.t, c, h * sh.hd, sh.hd};
          std::vector<float> cq, ck, cv, co;
          MEMWALL_ASSIGN_OR_RETURN(const kernels::HeadRows q, x.Widen(cq));
          MEMWALL_ASSIGN_OR_RETURN(const kernels::HeadRows k, x.Shifted(c).Widen(ck));
          MEMWALL_ASSIGN_OR_RETURN(const kernels::HeadRows v, x.Shifted(2 * c).Widen(cv));
          kernels::AttentionHeadForward({q, k, v}, sh.t, sh.hd, o.Output(co), pl + (b * sh.heads + h) * sh.t);
          return o.Narrow(co);
        });
      },
      [=](void* s) {
        if (at == DType::kBF16) {
          return cuda::AttentionForwardBF16(pq, po, pl, sh.batch, sh.t, sh.heads, sh.hd, s);
        }
        return cuda::AttentionForward(static_cast<const float*>(pq), static_cast<float*>(po), pl,
                                      sh.batch, sh.t, sh.heads, sh.hd, s);
      });
}

absl::Status AttentionBackward(const Tensor& qkv, const Tensor& out, const Tensor& dout,
                               const Tensor& lse, int64_t heads, const Tensor& delta,
                               const Tensor& dqkv, Stream& stream) {
  constexpr absl::string_view op = "AttentionBackward";
  MEMWALL_ASSIGN_OR_RETURN(const DType at, ActivationType(op, "qkv", qkv));
  MEMWALL_RETURN_IF_ERROR(CheckTensors(op, stream,
                                       {{"qkv", &qkv, at}, {"out", &out, at}, {"dout", &dout, at},
                                        {"lse", &lse}, {"delta", &delta}, {"dqkv", &dqkv, at}}));
  MEMWALL_ASSIGN_OR_RETURN(const AttentionShape sh, CheckAttentionShape(op, qkv, heads, stream));
  const int64_t tokens = sh.batch * sh.t, c = sh.heads * sh.hd;
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"out", &out}, tokens * c, "batch x t x hidden"));
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"dout", &dout}, tokens * c, "batch x t x hidden"));
  MEMWALL_RETURN_IF_ERROR(SameShape(op, {"qkv", &qkv}, {"dqkv", &dqkv}));
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"lse", &lse}, tokens * sh.heads, "batch x heads x t"));
  MEMWALL_RETURN_IF_ERROR(
      HasElements(op, {"delta", &delta}, tokens * sh.heads, "batch x heads x t"));
  if (dqkv.data() == qkv.data() && tokens > 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": dqkv must not alias qkv"));
  }
  const void* pq = qkv.data();
  const void* po = out.data();
  const void* pdo = dout.data();
  const float* pl = lse.data_as<float>();
  float* pdelta = delta.data_as<float>();
  void* pdq = dqkv.data();
  return Dispatch(
      stream, op,
      [=]() -> absl::Status {  // heads are independent: one per task
        return ForEachHead(sh, [&](int64_t b, int64_t h) -> absl::Status {  // see [Note: row blocks]
          const HeadSlice x{ElementAt(pq, at, b * sh.t * 3 * c), at, sh.t, 3 * c, h * sh.hd, sh.hd};
          const HeadSlice o{ElementAt(po, at, b * sh.t * c), at, sh.t, c, h * sh.hd, sh.hd};
          const HeadSlice g{ElementAt(pdo, at, b * sh.t * c), at, sh.t, c, h * sh.hd, sh.hd};
          const HeadSlice dx{ElementAt(pdq, at, b * sh.t * 3 * c), at, sh.t, 3 * c, h * sh.hd, sh.hd};
          std::vector<float> cq, ck, cv, co, cg, cdq, cdk, cdv;
          MEMWALL_ASSIGN_OR_RETURN(const kernels::HeadRows q, x.Widen(cq));
          MEMWALL_ASSIGN_OR_RETURN(const kernels::HeadRows k, x.Shifted(c).Widen(ck));
          MEMWALL_ASSIGN_OR_RETURN(const kernels::HeadRows v, x.Shifted(2 * c).Widen(cv));
          MEMWALL_ASSIGN_OR_RETURN(const kernels::HeadRows out, o.Widen(co));
          MEMWALL_ASSIGN_OR_RETURN(const kernels::HeadRows dout, g.Widen(cg));
          kernels::AttentionHeadBackward({q, k, v}, out, dout, pl + (b * sh.heads + h) * sh.t, sh.t, sh.hd,
                                         dx.Output(cdq), dx.Shifted(c).Output(cdk), dx.Shifted(2 * c).Output(cdv));
          MEMWALL_RETURN_IF_ERROR(dx.Narrow(cdq));
          MEMWALL_RETURN_IF_ERROR(dx.Shifted(c).Narrow(cdk));
          return dx.Shifted(2 * c).Narrow(cdv);
        });
      },
      [=](void* s) {
        if (at == DType::kBF16) {
          return cuda::AttentionBackwardBF16(pq, po, pdo, pl, pdelta, pdq, sh.batch, sh.t,
                                             sh.heads, sh.hd, s);
        }
        return cuda::AttentionBackward(static_cast<const float*>(pq), static_cast<const float*>(po),
                                       static_cast<const float*>(pdo), pl, pdelta,
                                       static_cast<float*>(pdq), sh.batch, sh.t, sh.heads, sh.hd,
                                       s);
      });
}

absl::Status SquaredNorm(const Tensor& x, const Tensor& result, bool accumulate, Stream& stream) {
  constexpr absl::string_view op = "SquaredNorm";
  MEMWALL_ASSIGN_OR_RETURN(const DType xt, StorageType(op, {{"x", &x}}));
  MEMWALL_RETURN_IF_ERROR(CheckTensors(op, stream, {{"x", &x, xt}, {"result", &result}}));
  MEMWALL_RETURN_IF_ERROR(
      HasElements(op, {"result", &result}, 2, "sum of squares and the inf/NaN flag"));
  const void* px = x.data();
  float* pr = result.data_as<float>();
  const int64_t n = x.numel();
  return Dispatch(
      stream, op,
      [=]() -> absl::Status {
        kernels::SquaredNormResult r;
        MEMWALL_RETURN_IF_ERROR(ForEachF32Chunk(px, xt, n, [&](const float* c, int64_t, int64_t count) {
          const kernels::SquaredNormResult part = kernels::SquaredNorm(c, count);
          r.sum_of_squares += part.sum_of_squares;
          r.nonfinite |= part.nonfinite;
        }));
        const double previous = accumulate ? pr[0] : 0.0;
        const bool previous_flag = accumulate && pr[1] != 0.0f;
        pr[0] = static_cast<float>(previous + r.sum_of_squares);
        pr[1] = (r.nonfinite || previous_flag) ? 1.0f : 0.0f;
        return absl::OkStatus();
      },
      [=](void* s) { return cuda::SquaredNorm(px, ElemOf(xt), n, pr, accumulate, s); });
}

kernels::AdamScalars AdamStepScalars(const AdamOptions& o, int64_t step, float grad_scale) {
  kernels::AdamScalars a;
  a.lr = o.lr;
  a.beta1 = o.beta1;
  a.beta2 = o.beta2;
  a.eps = o.eps;
  a.weight_decay = o.weight_decay;
  a.decoupled_weight_decay = o.adamw;
  a.grad_scale = grad_scale;
  a.bias_correction1 = static_cast<float>(1.0 - std::pow(double{o.beta1}, double(step)));
  a.inv_bias_correction2_sqrt =
      static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(double{o.beta2}, double(step))));
  return a;
}

absl::Status AdamStep(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                      const AdamOptions& options, int64_t step, float grad_scale,
                      Stream& stream) {
  constexpr absl::string_view op = "AdamStep";
  MEMWALL_ASSIGN_OR_RETURN(const DType gt, StorageType(op, {{"grad", &grad}}));
  MEMWALL_RETURN_IF_ERROR(CheckTensors(
      op, stream, {{"param", &param}, {"grad", &grad, gt}, {"m", &m}, {"v", &v}}));
  const int64_t n = param.numel();
  for (const NamedTensor& t : {NamedTensor{"grad", &grad}, NamedTensor{"m", &m},
                               NamedTensor{"v", &v}}) {
    MEMWALL_RETURN_IF_ERROR(HasElements(op, t, n, "as many as param"));
  }
  if (step < 1) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": step is 1-based, got ", step));
  }
  MEMWALL_RETURN_IF_ERROR(ValidateAdamOptions(options, "AdamStep: "));
  if (!std::isfinite(grad_scale)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": grad_scale = ", grad_scale, " must be finite"));
  }
  const kernels::AdamScalars a = AdamStepScalars(options, step, grad_scale);
  float* pp = param.data_as<float>();
  const void* pg = grad.data();
  float* pm = m.data_as<float>();
  float* pv = v.data_as<float>();
  const cuda::AdamKernelScalars ka{a.lr,         a.beta1,      a.beta2,
                                   a.eps,        a.weight_decay, a.decoupled_weight_decay,
                                   a.grad_scale, a.bias_correction1, a.inv_bias_correction2_sqrt};
  return Dispatch(
      stream, op,
      [=] {
        return ForEachF32Chunk(pg, gt, n, [&](const float* g, int64_t at, int64_t count) {
          kernels::AdamStep(pp + at, g, pm + at, pv + at, a, count);
        });
      },
      [=](void* s) { return cuda::AdamStep(pp, pg, ElemOf(gt), pm, pv, ka, n, s); });
}

}  // namespace memwall::ops
