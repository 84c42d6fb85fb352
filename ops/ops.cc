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

absl::Status Embedding(const Tensor& ids, const Tensor& table, const Tensor& y, Stream& stream) {
  constexpr absl::string_view op = "Embedding";
  MEMWALL_RETURN_IF_ERROR(CheckTensors(
      op, stream, {{"ids", &ids, DType::kI32}, {"table", &table}, {"y", &y}}));
  if (table.shape().size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": table ", ShapeString(table), " must be (vocabulary, d)"));
  }
  const int64_t v = table.shape()[0], d = table.shape()[1], rows = ids.numel();
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"y", &y}, rows * d, "ids x d"));
  const int32_t* pi = ids.data_as<int32_t>();
  const float* pt = table.data_as<float>();
  float* py = y.data_as<float>();
  if (OnCpu(stream)) {
    return stream.EnqueueHost([=]() -> absl::Status {
      const int64_t bad = kernels::EmbeddingForward(pi, pt, py, rows, v, d);
      if (bad < 0) return absl::OkStatus();
      return absl::InvalidArgumentError(absl::StrCat(op, ": id ", pi[bad], " at row ", bad,
                                                     " is outside the table [0, ", v, ")"));
    });
  }
  return CudaResult(cuda::EmbeddingForward(pi, pt, py, rows, v, d, stream.native_handle()), op);
}

absl::Status EmbeddingBackward(const Tensor& ids, const Tensor& dy, const Tensor& dtable,
                               Stream& stream) {
  constexpr absl::string_view op = "EmbeddingBackward";
  MEMWALL_RETURN_IF_ERROR(CheckTensors(
      op, stream, {{"ids", &ids, DType::kI32}, {"dy", &dy}, {"dtable", &dtable}}));
  if (dtable.shape().size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": dtable ", ShapeString(dtable), " must be (vocabulary, d)"));
  }
  const int64_t v = dtable.shape()[0], d = dtable.shape()[1], rows = ids.numel();
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"dy", &dy}, rows * d, "ids x d"));
  const int32_t* pi = ids.data_as<int32_t>();
  const float* pdy = dy.data_as<float>();
  float* pdt = dtable.data_as<float>();
  return Dispatch(
      stream, op, [=] { kernels::EmbeddingBackward(pi, pdy, pdt, rows, v, d); },
      [=](void* s) { return cuda::EmbeddingBackward(pi, pdy, pdt, rows, v, d, s); });
}

absl::Status AddBias(const Tensor& y, const Tensor& bias, Stream& stream) {
  constexpr absl::string_view op = "AddBias";
  MEMWALL_RETURN_IF_ERROR(CheckTensors(op, stream, {{"y", &y}, {"bias", &bias}}));
  MEMWALL_ASSIGN_OR_RETURN(const auto rows_n, RowsAndWidth(op, y));
  const auto [rows, n] = rows_n;
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"bias", &bias}, n, "y's last dimension"));
  float* py = y.data_as<float>();
  const float* pb = bias.data_as<float>();
  return Dispatch(
      stream, op, [=] { kernels::AddBias(py, pb, rows, n); },
      [=](void* s) { return cuda::AddBias(py, pb, rows, n, s); });
}

absl::Status BiasBackward(const Tensor& dy, const Tensor& dbias, Stream& stream) {
  constexpr absl::string_view op = "BiasBackward";
  MEMWALL_RETURN_IF_ERROR(CheckTensors(op, stream, {{"dy", &dy}, {"dbias", &dbias}}));
  MEMWALL_ASSIGN_OR_RETURN(const auto rows_n, RowsAndWidth(op, dy));
  const auto [rows, n] = rows_n;
  MEMWALL_RETURN_IF_ERROR(HasElements(op, {"dbias", &dbias}, n, "dy's last dimension"));
  const float* pdy = dy.data_as<float>();
  float* pdb = dbias.data_as<float>();
  return Dispatch(
      stream, op, [=] { kernels::BiasBackward(pdy, pdb, rows, n); },
      [=](void* s) { return cuda::BiasBackward(pdy, pdb, rows, n, s); });
}

namespace {
struct AttentionShape {
  int64_t batch, t, heads, hd;
};

absl::StatusOr<AttentionShape> CheckAttentionShape(absl::string_view op, const Tensor& qkv,
                                                   int64_t heads, Stream& stream) {
  if (qkv.shape().size() != 3 || qkv.shape()[2] % 3 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": qkv ", ShapeString(qkv), " must be (batch, t, 3 * hidden)"));
  }
  const int64_t c = qkv.shape()[2] / 3;
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
  MEMWALL_RETURN_IF_ERROR(CheckTensors(op, stream, {{"qkv", &qkv}, {"out", &out}, {"lse", &lse}}));
  MEMWALL_ASSIGN_OR_RETURN(const AttentionShape sh, CheckAttentionShape(op, qkv, heads, stream));
  MEMWALL_RETURN_IF_ERROR(
      HasElements(op, {"out", &out}, sh.batch * sh.t * sh.heads * sh.hd, "batch x t x hidden"));
  MEMWALL_RETURN_IF_ERROR(
      HasElements(op, {"lse", &lse}, sh.batch * sh.heads * sh.t, "batch x heads x t"));
  const float* pq = qkv.data_as<float>();
  float* po = out.data_as<float>();
  float* pl = lse.data_as<float>();
  return Dispatch(
      stream, op, [=] { kernels::AttentionForward(pq, po, pl, sh.batch, sh.t, sh.heads, sh.hd); },
      [=](void* s) {
        return cuda::AttentionForward(pq, po, pl, sh.batch, sh.t, sh.heads, sh.hd, s);
      });
}

absl::Status AttentionBackward(const Tensor& qkv, const Tensor& out, const Tensor& dout,
                               const Tensor& lse, int64_t heads, const Tensor& delta,
                               const Tensor& dqkv, Stream& stream) {
  constexpr absl::string_view op = "AttentionBackward";
  MEMWALL_RETURN_IF_ERROR(CheckTensors(op, stream,
                                       {{"qkv", &qkv}, {"out", &out}, {"dout", &dout},
                                        {"lse", &lse}, {"delta", &delta}, {"dqkv", &dqkv}}));
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
  const float* pq = qkv.data_as<float>();
  const float* po = out.data_as<float>();
  const float* pdo = dout.data_as<float>();
  const float* pl = lse.data_as<float>();
  float* pdelta = delta.data_as<float>();
  float* pdq = dqkv.data_as<float>();
  return Dispatch(
      stream, op,
      [=] { kernels::AttentionBackward(pq, po, pdo, pl, pdq, sh.batch, sh.t, sh.heads, sh.hd); },
      [=](void* s) {
        return cuda::AttentionBackward(pq, po, pdo, pl, pdelta, pdq, sh.batch, sh.t, sh.heads,
                                       sh.hd, s);
      });
}

absl::Status SquaredNorm(const Tensor& x, const Tensor& result, bool accumulate, Stream& stream) {
  constexpr absl::string_view op = "SquaredNorm";
  MEMWALL_RETURN_IF_ERROR(CheckTensors(op, stream, {{"x", &x}, {"result", &result}}));
  MEMWALL_RETURN_IF_ERROR(
      HasElements(op, {"result", &result}, 2, "sum of squares and the inf/NaN flag"));
  const float* px = x.data_as<float>();
  float* pr = result.data_as<float>();
  const int64_t n = x.numel();
  return Dispatch(
      stream, op,
      [=] {
        const kernels::SquaredNormResult r = kernels::SquaredNorm(px, n);
        const double previous = accumulate ? pr[0] : 0.0;
        const bool previous_flag = accumulate && pr[1] != 0.0f;
        pr[0] = static_cast<float>(previous + r.sum_of_squares);
        pr[1] = (r.nonfinite || previous_flag) ? 1.0f : 0.0f;
      },
      [=](void* s) { return cuda::SquaredNorm(px, n, pr, accumulate, s); });
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
  a.bias_correction2_sqrt =
      static_cast<float>(std::sqrt(1.0 - std::pow(double{o.beta2}, double(step))));
  return a;
}

absl::Status AdamStep(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                      const AdamOptions& options, int64_t step, float grad_scale,
                      Stream& stream) {
  constexpr absl::string_view op = "AdamStep";
  MEMWALL_RETURN_IF_ERROR(CheckTensors(
      op, stream, {{"param", &param}, {"grad", &grad}, {"m", &m}, {"v", &v}}));
  const int64_t n = param.numel();
  for (const NamedTensor& t : {NamedTensor{"grad", &grad}, NamedTensor{"m", &m},
                               NamedTensor{"v", &v}}) {
    MEMWALL_RETURN_IF_ERROR(HasElements(op, t, n, "as many as param"));
  }
  if (step < 1) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": step is 1-based, got ", step));
  }
  if (!(options.lr >= 0) || !(options.beta1 >= 0 && options.beta1 < 1) ||
      !(options.beta2 >= 0 && options.beta2 < 1) || !(options.eps > 0) ||
      !(options.weight_decay >= 0) || !std::isfinite(grad_scale)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": need lr >= 0, 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= 0 and a finite "
            "grad_scale; got lr=", options.lr, " beta1=", options.beta1, " beta2=", options.beta2,
        " eps=", options.eps, " weight_decay=", options.weight_decay, " grad_scale=", grad_scale));
  }
  const kernels::AdamScalars a = AdamStepScalars(options, step, grad_scale);
  float* pp = param.data_as<float>();
  const float* pg = grad.data_as<float>();
  float* pm = m.data_as<float>();
  float* pv = v.data_as<float>();
  const cuda::AdamKernelScalars ka{a.lr,         a.beta1,      a.beta2,
                                   a.eps,        a.weight_decay, a.decoupled_weight_decay,
                                   a.grad_scale, a.bias_correction1, a.bias_correction2_sqrt};
  return Dispatch(
      stream, op, [=] { kernels::AdamStep(pp, pg, pm, pv, a, n); },
      [=](void* s) { return cuda::AdamStep(pp, pg, pm, pv, ka, n, s); });
}

}  // namespace memwall::ops
