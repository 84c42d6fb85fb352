#include "ops/ops.h"

#include <initializer_list>
#include <utility>

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ops/cuda_kernels.h"
#include "ops/kernels.h"
#include "runtime/cuda_convert.h"
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

// Runs `cpu()` in stream order on the CpuDevice, or `cuda(cudaStream_t)` (a
// kernel launcher returning a cudaError_t) on a CUDA stream.
template <typename CpuFn, typename CudaFn>
absl::Status Dispatch(Stream& stream, absl::string_view op, CpuFn cpu, CudaFn cuda) {
  if (OnCpu(stream)) {
    return stream.EnqueueHost([cpu] {
      cpu();
      return absl::OkStatus();
    });
  }
  return CudaResult(cuda(stream.native_handle()), op);
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

}  // namespace

absl::Status Matmul(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b,
                    const Tensor& c, float alpha, float beta, Stream& stream) {
  constexpr absl::string_view op = "Matmul";
  MEMWALL_RETURN_IF_ERROR(CheckTensors(op, stream, {{"a", &a}, {"b", &b}, {"c", &c}}));
  for (const auto& [name, t, dtype] :
       {NamedTensor{"a", &a}, NamedTensor{"b", &b}, NamedTensor{"c", &c}}) {
    if (t->shape().size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": ", name, " ", ShapeString(*t), " must be 2-D"));
    }
  }
  // Row-major storage: a is (rows_a, cols_a); op(a) swaps them if transposed.
  const int64_t m = transpose_a ? a.shape()[1] : a.shape()[0];
  const int64_t k = transpose_a ? a.shape()[0] : a.shape()[1];
  const int64_t kb = transpose_b ? b.shape()[1] : b.shape()[0];
  const int64_t n = transpose_b ? b.shape()[0] : b.shape()[1];
  if (k != kb || c.shape()[0] != m || c.shape()[1] != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": op(a) is (", m, ", ", k, "), op(b) is (", kb, ", ", n, ") and c is ",
        ShapeString(c), "; need op(a) (M, K), op(b) (K, N), c (M, N)"));
  }
  for (int64_t dim : {m, n, k}) {
    if (dim > INT_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": dimension ", dim, " exceeds the BLAS int limit"));
    }
  }
  // Leading dimensions are the row lengths; BLAS wants them >= 1 even for an
  // empty K (then C = beta * C).
  const int64_t lda = std::max<int64_t>(a.shape()[1], 1);
  const int64_t ldb = std::max<int64_t>(b.shape()[1], 1);
  const int64_t ldc = std::max<int64_t>(n, 1);
  const float* pa = a.data_as<float>();
  const float* pb = b.data_as<float>();
  float* pc = c.data_as<float>();
  return Dispatch(
      stream, op,
      [=] {
        if (m == 0 || n == 0) return;
        if (k == 0) {  // C = beta * C; beta = 0 overwrites (even NaN)
          for (int64_t i = 0; i < m * n; ++i) pc[i] = beta == 0.0f ? 0.0f : beta * pc[i];
          return;
        }
        cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
                    transpose_b ? CblasTrans : CblasNoTrans, static_cast<int>(m),
                    static_cast<int>(n), static_cast<int>(k), alpha, pa, static_cast<int>(lda), pb,
                    static_cast<int>(ldb), beta, pc, static_cast<int>(ldc));
      },
      [=](void* s) {
        return cuda::Sgemm(transpose_a, transpose_b, m, n, k, alpha, pa, lda, pb, ldb, beta, pc,
                           ldc, s);
      });
}

absl::Status Gelu(const Tensor& x, const Tensor& y, Stream& stream) {
  MEMWALL_RETURN_IF_ERROR(CheckTensors("Gelu", stream, {{"x", &x}, {"y", &y}}));
  MEMWALL_RETURN_IF_ERROR(SameShape("Gelu", {"x", &x}, {"y", &y}));
  const float* px = x.data_as<float>();
  float* py = y.data_as<float>();
  const int64_t n = x.numel();
  return Dispatch(
      stream, "Gelu", [=] { kernels::GeluForward(px, py, n); },
      [=](void* s) { return cuda::GeluForward(px, py, n, s); });
}

absl::Status GeluBackward(const Tensor& x, const Tensor& dy, const Tensor& dx, Stream& stream) {
  MEMWALL_RETURN_IF_ERROR(
      CheckTensors("GeluBackward", stream, {{"x", &x}, {"dy", &dy}, {"dx", &dx}}));
  MEMWALL_RETURN_IF_ERROR(SameShape("GeluBackward", {"x", &x}, {"dy", &dy}));
  MEMWALL_RETURN_IF_ERROR(SameShape("GeluBackward", {"x", &x}, {"dx", &dx}));
  const float* px = x.data_as<float>();
  const float* pdy = dy.data_as<float>();
  float* pdx = dx.data_as<float>();
  const int64_t n = x.numel();
  return Dispatch(
      stream, "GeluBackward", [=] { kernels::GeluBackward(px, pdy, pdx, n); },
      [=](void* s) { return cuda::GeluBackward(px, pdy, pdx, n, s); });
}

absl::Status Add(const Tensor& a, const Tensor& b, const Tensor& y, Stream& stream) {
  MEMWALL_RETURN_IF_ERROR(CheckTensors("Add", stream, {{"a", &a}, {"b", &b}, {"y", &y}}));
  MEMWALL_RETURN_IF_ERROR(SameShape("Add", {"a", &a}, {"b", &b}));
  MEMWALL_RETURN_IF_ERROR(SameShape("Add", {"a", &a}, {"y", &y}));
  const float* pa = a.data_as<float>();
  const float* pb = b.data_as<float>();
  float* py = y.data_as<float>();
  const int64_t n = a.numel();
  return Dispatch(
      stream, "Add", [=] { kernels::Add(pa, pb, py, n); },
      [=](void* s) { return cuda::Add(pa, pb, py, n, s); });
}

absl::Status LayerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                       const Tensor& y, const Tensor& mean, const Tensor& rstd, Stream& stream) {
  constexpr absl::string_view op = "LayerNorm";
  MEMWALL_RETURN_IF_ERROR(CheckTensors(op, stream,
                                       {{"x", &x}, {"gamma", &gamma}, {"beta", &beta},
                                        {"y", &y}, {"mean", &mean}, {"rstd", &rstd}}));
  MEMWALL_ASSIGN_OR_RETURN(const auto rows_d, RowsAndWidth(op, x));
  const auto [rows, d] = rows_d;
  MEMWALL_RETURN_IF_ERROR(SameShape(op, {"x", &x}, {"y", &y}));
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"gamma", &gamma}, d, "x's last dimension"));
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"beta", &beta}, d, "x's last dimension"));
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"mean", &mean}, rows, "one per row of x"));
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"rstd", &rstd}, rows, "one per row of x"));
  if (!(eps > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("LayerNorm: eps must be > 0, got ", eps));
  }
  const float* px = x.data_as<float>();
  const float* pg = gamma.data_as<float>();
  const float* pb = beta.data_as<float>();
  float* py = y.data_as<float>();
  float* pm = mean.data_as<float>();
  float* pr = rstd.data_as<float>();
  return Dispatch(
      stream, op, [=] { kernels::LayerNormForward(px, pg, pb, eps, py, pm, pr, rows, d); },
      [=](void* s) { return cuda::LayerNormForward(px, pg, pb, eps, py, pm, pr, rows, d, s); });
}

absl::Status LayerNormBackward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                               const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                               const Tensor& dgamma, const Tensor& dbeta, Stream& stream) {
  constexpr absl::string_view op = "LayerNormBackward";
  MEMWALL_RETURN_IF_ERROR(CheckTensors(op, stream,
                                       {{"dy", &dy}, {"x", &x}, {"gamma", &gamma},
                                        {"mean", &mean}, {"rstd", &rstd}, {"dx", &dx},
                                        {"dgamma", &dgamma}, {"dbeta", &dbeta}}));
  MEMWALL_ASSIGN_OR_RETURN(const auto rows_d, RowsAndWidth(op, x));
  const auto [rows, d] = rows_d;
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
  const float* pdy = dy.data_as<float>();
  const float* px = x.data_as<float>();
  const float* pg = gamma.data_as<float>();
  const float* pm = mean.data_as<float>();
  const float* pr = rstd.data_as<float>();
  float* pdx = dx.data_as<float>();
  float* pdg = dgamma.data_as<float>();
  float* pdb = dbeta.data_as<float>();
  return Dispatch(
      stream, op, [=] { kernels::LayerNormBackward(pdy, px, pg, pm, pr, pdx, pdg, pdb, rows, d); },
      [=](void* s) {
        return cuda::LayerNormBackward(pdy, px, pg, pm, pr, pdx, pdg, pdb, rows, d, s);
      });
}

absl::Status SoftmaxCrossEntropy(const Tensor& logits, const Tensor& targets,
                                 const Tensor& losses, float grad_scale, Stream& stream) {
  constexpr absl::string_view op = "SoftmaxCrossEntropy";
  MEMWALL_RETURN_IF_ERROR(CheckTensors(op, stream,
                                       {{"logits", &logits},
                                        {"targets", &targets, DType::kI32},
                                        {"losses", &losses}}));
  if (logits.shape().size() != 2 || logits.shape()[1] <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": logits ", ShapeString(logits), " must be (rows, vocabulary) with vocabulary > 0"));
  }
  const int64_t rows = logits.shape()[0], v = logits.shape()[1];
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"targets", &targets}, rows, "one per row of logits"));
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"losses", &losses}, rows, "one per row of logits"));
  if (!std::isfinite(grad_scale)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": grad_scale ", grad_scale, " is not finite"));
  }
  float* pl = logits.data_as<float>();
  const int32_t* pt = targets.data_as<int32_t>();
  float* ploss = losses.data_as<float>();
  if (OnCpu(stream)) {
    // Not Dispatch: the CPU path can report a bad target precisely.
    return stream.EnqueueHost([=]() -> absl::Status {
      const int64_t bad = kernels::SoftmaxCrossEntropy(pl, pt, ploss, grad_scale, rows, v);
      if (bad < 0) return absl::OkStatus();
      return absl::InvalidArgumentError(absl::StrCat(op, ": target ", pt[bad], " at row ", bad,
                                                     " is outside the vocabulary [0, ", v, ")"));
    });
  }
  return CudaResult(
      cuda::SoftmaxCrossEntropy(pl, pt, ploss, grad_scale, rows, v, stream.native_handle()), op);
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

}  // namespace memwall::ops
