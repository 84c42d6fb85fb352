// Each CUDA op of a GPT step, alone, at the 1.3B GPT's shapes (micro-batch
// 8, sequence 1024: 8192 rows, hidden 2048, 16 heads of 128; the 125M
// GPT's 12 heads of 64 for attention too), bf16 activations and parameters
// as the trainer runs them. Every row carries its bound, measured in the
// same run, and the fraction of it reached:
//
//   compute-bound rows (GEMMs, attention): tflops beside gemm_tflops, the
//     rate of the plain (8192, 2048) x (2048, 8192) bf16 GEMM;
//   memory-bound rows (LayerNorm, the fused residual add + LayerNorm, GELU,
//     residual add, column sums, cross-entropy, embedding): gb_per_s, the
//     bytes the op must move at least (each input read once, each output
//     written once) over its time, beside copy_gb_per_s, a 1 GiB
//     device-to-device copy counted the same way (read + write).
//
// FLOPs: a GEMM is 2mnk; causal attention's forward is two (t, t, hd)
// products per head with half the scores masked, 2 b h t^2 hd, and its
// backward five such products, 2.5 x the forward (recomputation counted
// as neither, as flash-attention papers count it).
//
// Skipped without a GPU.   ./bazelw run //ops:ops_benchmark
//
// BM_CpuGelu (runs everywhere): the CpuDevice's fp32 GELU kernel on one
// thread over 4 Mi values of [-6, 6], the fastest path against, in the
// same interleaved rounds, its scalar path (vs_scalar) and the tanh form
// computed with libm's tanhf (vs_tanh_reference: kernels.h's template in
// fp32, the kernel the CpuDevice ran before).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "ops/kernels.h"
#include "ops/ops.h"
#include "runtime/cuda_device.h"
#include "tools/bench_timing.h"

namespace memwall::ops {
namespace {

using bench::Median;
using bench::Seconds;

constexpr int64_t kRows = 8 * 1024, kHidden = 2048, kVocab = 50257, kPaddedVocab = 50304;

// Device buffers for one row, filled with small finite values (every byte
// 0x3c: 0.0115 in bf16 and in fp32; id 0 after SetInts).
class Bench {
 public:
  explicit Bench(Device& device) : device_(device) {}
  // The tensor starts offset_bytes into its allocation (4: off the 16-byte
  // boundary that 128-bit accesses need).
  Tensor Make(std::vector<int64_t> shape, DType dtype, int64_t offset_bytes = 0) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    auto b = device_.Allocate(static_cast<size_t>(n) * SizeOf(dtype) + offset_bytes, MemoryTag::kWorkspace);
    if (!b.ok()) {
      status_ = b.status();
      return Tensor();
    }
    buffers_.push_back(std::move(*b));
    status_.Update(stream().Memset(buffers_.back().data(), dtype == DType::kI32 ? 0 : 0x3c,
                                   buffers_.back().bytes()));
    return Tensor(static_cast<char*>(buffers_.back().data()) + offset_bytes, dtype, std::move(shape), &device_);
  }
  Stream& stream() { return device_.compute_stream(); }
  const absl::Status& status() const { return status_; }

  // Seconds per call of `op`: one warm-up, then the median of 5 rounds of
  // 10 calls each, the stream drained at the end of a round.
  double Time(const std::function<absl::Status()>& op) {
    status_.Update(op());
    status_.Update(stream().Synchronize());
    std::vector<double> rounds;
    for (int round = 0; round < 5 && status_.ok(); ++round) {
      rounds.push_back(Seconds([&] {
                         for (int i = 0; i < 10; ++i) status_.Update(op());
                         status_.Update(stream().Synchronize());
                       }) / 10);
    }
    return rounds.empty() ? 0.0 : Median(rounds);
  }

 private:
  Device& device_;
  std::vector<Buffer> buffers_;
  absl::Status status_;
};

// The bounds of this run: the plain bf16 GEMM's TFLOPS, and the copy rate.
double GemmTflops(Device& device) {
  Bench b(device);
  const Tensor x = b.Make({kRows, kHidden}, DType::kBF16), w = b.Make({kHidden, 4 * kHidden}, DType::kBF16);
  const Tensor y = b.Make({kRows, 4 * kHidden}, DType::kBF16);
  const double t = b.Time([&] { return Matmul(x, false, w, false, y, 1.0f, 0.0f, b.stream()); });
  return b.status().ok() ? 2.0 * kRows * kHidden * 4 * kHidden / t / 1e12 : 0.0;
}

double CopyGbPerSecond(Device& device) {
  Bench b(device);
  const int64_t bytes = int64_t{1} << 30;
  const Tensor src = b.Make({bytes / 4}, DType::kF32), dst = b.Make({bytes / 4}, DType::kF32);
  const double t = b.Time([&] { return b.stream().Copy(dst.data(), src.data(), bytes); });
  return b.status().ok() ? 2.0 * bytes / t / 1e9 : 0.0;
}

// Runs `body` (which sets the row's counters from a Bench) on GPU 0, or
// skips the row.
void OnGpu(benchmark::State& state, const std::function<absl::Status(Device&, Bench&)>& body) {
  std::string reason;
  if (CudaDeviceCount(&reason) == 0) return state.SkipWithError(("needs a GPU: " + reason).c_str());
  auto device = CreateCudaDevice();
  if (!device.ok()) return state.SkipWithError(std::string(device.status().message()).c_str());
  for (auto _ : state) {
    Bench b(**device);
    absl::Status st = body(**device, b);
    st.Update(b.status());
    if (!st.ok()) return state.SkipWithError(std::string(st.message()).c_str());
  }
  state.SetLabel((*device)->name());
}

void ComputeCounters(benchmark::State& state, Device& device, double flops, double seconds) {
  const double gemm = GemmTflops(device);
  state.counters["tflops"] = flops / seconds / 1e12;
  state.counters["gemm_tflops"] = gemm;
  state.counters["fraction_of_gemm"] = gemm > 0 ? flops / seconds / 1e12 / gemm : 0.0;
}

void MemoryCounters(benchmark::State& state, Device& device, double bytes, double seconds) {
  const double copy = CopyGbPerSecond(device);
  state.counters["gb_per_s"] = bytes / seconds / 1e9;
  state.counters["copy_gb_per_s"] = copy;
  state.counters["fraction_of_copy"] = copy > 0 ? bytes / seconds / 1e9 / copy : 0.0;
}

// ---- GEMMs: a linear layer's forward, with and without the fused bias --------

void BM_CudaLinear(benchmark::State& state, bool fused_bias) {
  OnGpu(state, [&](Device& device, Bench& b) {
    const Tensor x = b.Make({kRows, kHidden}, DType::kBF16), w = b.Make({kHidden, 4 * kHidden}, DType::kBF16);
    const Tensor bias = b.Make({4 * kHidden}, DType::kBF16), y = b.Make({kRows, 4 * kHidden}, DType::kBF16);
    const double t = b.Time([&]() -> absl::Status {
      if (fused_bias) return MatmulBias(x, false, w, false, bias, y, b.stream());
      if (absl::Status st = Matmul(x, false, w, false, y, 1.0f, 0.0f, b.stream()); !st.ok()) return st;
      return AddBias(y, bias, b.stream());
    });
    ComputeCounters(state, device, 2.0 * kRows * kHidden * 4 * kHidden, t);
    return absl::OkStatus();
  });
}
BENCHMARK_CAPTURE(BM_CudaLinear, c_fc_matmul_bias, true)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK_CAPTURE(BM_CudaLinear, c_fc_matmul_then_add_bias, false)->Unit(benchmark::kMillisecond)->Iterations(1);

// The tied LM head's three GEMMs at GPT-2's vocabulary of 50257 (wte is
// (50257, 2048); the bf16 logits' rows are `ld` long, 50304 as the model
// stores them, padded to a multiple of 128 by models/gpt.h):
//   forward   logits = x wte^T         n = 50257 ([Note: a GEMM in aligned parts])
//   dx        dx = dlogits wte         k = 50257, into bf16 C (k unsplit)
//   dx fp32   the model's dx: into fp32 C (k in aligned parts), then a
//             cast to bf16 ([Note: the head's input gradient in fp32])
//   dwte      dwte = dlogits^T x       m = 50257
// and, for the bound, the forward over an aligned vocabulary of 50304.
enum class HeadGemm { kForward, kInputGrad, kInputGradViaFp32, kWeightGrad };
void BM_CudaLmHead(benchmark::State& state, HeadGemm which, int64_t vocab, int64_t ld) {
  OnGpu(state, [&](Device& device, Bench& b) {
    const Tensor x = b.Make({kRows, kHidden}, DType::kBF16), wte = b.Make({vocab, kHidden}, DType::kBF16);
    const Tensor dx = b.Make({kRows, kHidden}, DType::kBF16), dwte = b.Make({vocab, kHidden}, DType::kBF16);
    const Tensor dx32 = b.Make({kRows, kHidden}, DType::kF32);
    const MatrixView logits(b.Make({kRows, ld}, DType::kBF16), vocab);
    const double t = b.Time([&] {
      switch (which) {
        case HeadGemm::kForward: return Matmul(x, false, wte, true, logits, 1.0f, 0.0f, b.stream());
        case HeadGemm::kInputGrad: return Matmul(logits, false, wte, false, dx, 1.0f, 0.0f, b.stream());
        case HeadGemm::kInputGradViaFp32:
          if (absl::Status st = Matmul(logits, false, wte, false, dx32, 1.0f, 0.0f, b.stream()); !st.ok()) return st;
          return Cast(dx32, dx, b.stream());
        case HeadGemm::kWeightGrad: return Matmul(logits, true, x, false, dwte, 1.0f, 0.0f, b.stream());
      }
      return absl::OkStatus();
    });
    ComputeCounters(state, device, 2.0 * kRows * kHidden * vocab, t);
    return absl::OkStatus();
  });
}
BENCHMARK_CAPTURE(BM_CudaLmHead, padded_rows, HeadGemm::kForward, kVocab, kPaddedVocab)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);
BENCHMARK_CAPTURE(BM_CudaLmHead, unpadded_rows, HeadGemm::kForward, kVocab, kVocab)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);
BENCHMARK_CAPTURE(BM_CudaLmHead, input_grad, HeadGemm::kInputGrad, kVocab, kPaddedVocab)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);
BENCHMARK_CAPTURE(BM_CudaLmHead, input_grad_via_fp32, HeadGemm::kInputGradViaFp32, kVocab, kPaddedVocab)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);
BENCHMARK_CAPTURE(BM_CudaLmHead, weight_grad, HeadGemm::kWeightGrad, kVocab, kPaddedVocab)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);
BENCHMARK_CAPTURE(BM_CudaLmHead, aligned_vocab, HeadGemm::kForward, kPaddedVocab, kPaddedVocab)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);

// ---- Attention ---------------------------------------------------------------

void BM_CudaAttention(benchmark::State& state, int64_t heads, int64_t head_dim, bool backward) {
  OnGpu(state, [&](Device& device, Bench& b) {
    const int64_t batch = 8, t = 1024, c = heads * head_dim;
    const Tensor qkv = b.Make({batch, t, 3 * c}, DType::kBF16), out = b.Make({batch, t, c}, DType::kBF16);
    const Tensor lse = b.Make({batch, heads, t}, DType::kF32), delta = b.Make({batch, heads, t}, DType::kF32);
    const Tensor dout = b.Make({batch, t, c}, DType::kBF16), dqkv = b.Make({batch, t, 3 * c}, DType::kBF16);
    if (absl::Status st = Attention(qkv, heads, out, lse, b.stream()); !st.ok()) return st;
    const double seconds = b.Time([&] {
      return backward ? AttentionBackward(qkv, out, dout, lse, heads, delta, dqkv, b.stream())
                      : Attention(qkv, heads, out, lse, b.stream());
    });
    const double forward = 2.0 * batch * heads * double(t) * t * head_dim;
    ComputeCounters(state, device, backward ? 2.5 * forward : forward, seconds);
    return absl::OkStatus();
  });
}
BENCHMARK_CAPTURE(BM_CudaAttention, forward_h16_hd128, 16, 128, false)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK_CAPTURE(BM_CudaAttention, backward_h16_hd128, 16, 128, true)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK_CAPTURE(BM_CudaAttention, forward_h12_hd64, 12, 64, false)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK_CAPTURE(BM_CudaAttention, backward_h12_hd64, 12, 64, true)->Unit(benchmark::kMillisecond)->Iterations(1);

// ---- Memory-bound ops ----------------------------------------------------------

void BM_CudaLayerNorm(benchmark::State& state, bool backward) {
  OnGpu(state, [&](Device& device, Bench& b) {
    const Tensor x = b.Make({kRows, kHidden}, DType::kBF16), y = b.Make({kRows, kHidden}, DType::kBF16);
    const Tensor dy = b.Make({kRows, kHidden}, DType::kBF16), dx = b.Make({kRows, kHidden}, DType::kBF16);
    const Tensor gamma = b.Make({kHidden}, DType::kBF16), beta = b.Make({kHidden}, DType::kBF16);
    const Tensor dgamma = b.Make({kHidden}, DType::kBF16), dbeta = b.Make({kHidden}, DType::kBF16);
    const Tensor mean = b.Make({kRows}, DType::kF32), rstd = b.Make({kRows}, DType::kF32);
    if (absl::Status st = LayerNorm(x, gamma, beta, 1e-5f, y, mean, rstd, b.stream()); !st.ok()) return st;
    const double t = b.Time([&] {
      return backward ? LayerNormBackward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, b.stream())
                      : LayerNorm(x, gamma, beta, 1e-5f, y, mean, rstd, b.stream());
    });
    // Forward: x in, y out; backward: dy and x in, dx out (plus the row statistics).
    const double elements = double(kRows) * kHidden;
    MemoryCounters(state, device, (backward ? 6.0 : 4.0) * elements + 8.0 * kRows, t);
    return absl::OkStatus();
  });
}
BENCHMARK_CAPTURE(BM_CudaLayerNorm, forward, false)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK_CAPTURE(BM_CudaLayerNorm, backward, true)->Unit(benchmark::kMillisecond)->Iterations(1);

// The residual add and ln_2 of a block: AddLayerNorm (one kernel) against
// Add then LayerNorm. Both are charged the fused op's least traffic: a and
// b in, sum and y out, and the row statistics.
void BM_CudaAddLayerNorm(benchmark::State& state, bool fused) {
  OnGpu(state, [&](Device& device, Bench& b) {
    const Tensor x = b.Make({kRows, kHidden}, DType::kBF16), r = b.Make({kRows, kHidden}, DType::kBF16);
    const Tensor sum = b.Make({kRows, kHidden}, DType::kBF16), y = b.Make({kRows, kHidden}, DType::kBF16);
    const Tensor gamma = b.Make({kHidden}, DType::kBF16), beta = b.Make({kHidden}, DType::kBF16);
    const Tensor mean = b.Make({kRows}, DType::kF32), rstd = b.Make({kRows}, DType::kF32);
    const double t = b.Time([&]() -> absl::Status {
      if (fused) return AddLayerNorm(x, r, gamma, beta, 1e-5f, sum, y, mean, rstd, b.stream());
      if (absl::Status st = Add(x, r, sum, b.stream()); !st.ok()) return st;
      return LayerNorm(sum, gamma, beta, 1e-5f, y, mean, rstd, b.stream());
    });
    MemoryCounters(state, device, 8.0 * kRows * kHidden + 8.0 * kRows, t);
    return absl::OkStatus();
  });
}
BENCHMARK_CAPTURE(BM_CudaAddLayerNorm, fused, true)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK_CAPTURE(BM_CudaAddLayerNorm, add_then_layernorm, false)->Unit(benchmark::kMillisecond)->Iterations(1);

// GELU over c_fc's output. The _unaligned rows start every tensor 4 bytes
// off 16, so each thread's 16 bytes move element by element instead of in
// one 128-bit access: the vectorized loads' gain, measured in the same run.
void BM_CudaGelu(benchmark::State& state, bool backward, int64_t offset_bytes) {
  OnGpu(state, [&](Device& device, Bench& b) {
    const Tensor x = b.Make({kRows, 4 * kHidden}, DType::kBF16, offset_bytes);
    const Tensor y = b.Make({kRows, 4 * kHidden}, DType::kBF16, offset_bytes);
    const Tensor dy = b.Make({kRows, 4 * kHidden}, DType::kBF16, offset_bytes);
    const double t = b.Time([&] {
      return backward ? GeluBackward(x, dy, y, b.stream()) : Gelu(x, y, b.stream());
    });
    MemoryCounters(state, device, (backward ? 6.0 : 4.0) * kRows * 4 * kHidden, t);
    return absl::OkStatus();
  });
}
BENCHMARK_CAPTURE(BM_CudaGelu, forward, false, 0)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK_CAPTURE(BM_CudaGelu, backward, true, 0)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK_CAPTURE(BM_CudaGelu, forward_unaligned, false, 4)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK_CAPTURE(BM_CudaGelu, backward_unaligned, true, 4)->Unit(benchmark::kMillisecond)->Iterations(1);

void BM_CudaResidualAdd(benchmark::State& state) {
  OnGpu(state, [&](Device& device, Bench& b) {
    const Tensor x = b.Make({kRows, kHidden}, DType::kBF16), r = b.Make({kRows, kHidden}, DType::kBF16);
    const Tensor y = b.Make({kRows, kHidden}, DType::kBF16);
    const double t = b.Time([&] { return Add(x, r, y, b.stream()); });
    MemoryCounters(state, device, 6.0 * kRows * kHidden, t);
    return absl::OkStatus();
  });
}
BENCHMARK(BM_CudaResidualAdd)->Unit(benchmark::kMillisecond)->Iterations(1);

// The bias gradient of c_fc: a column sum of (8192, 8192) bf16.
void BM_CudaBiasBackward(benchmark::State& state) {
  OnGpu(state, [&](Device& device, Bench& b) {
    const Tensor dy = b.Make({kRows, 4 * kHidden}, DType::kBF16), dbias = b.Make({4 * kHidden}, DType::kBF16);
    const double t = b.Time([&] { return BiasBackward(dy, dbias, b.stream()); });
    MemoryCounters(state, device, 2.0 * kRows * 4 * kHidden, t);
    return absl::OkStatus();
  });
}
BENCHMARK(BM_CudaBiasBackward)->Unit(benchmark::kMillisecond)->Iterations(1);

// The fused classifier: softmax, loss and gradient over bf16 logits in place.
void BM_CudaCrossEntropy(benchmark::State& state) {
  OnGpu(state, [&](Device& device, Bench& b) {
    const MatrixView logits(b.Make({kRows, kPaddedVocab}, DType::kBF16), kVocab);
    const Tensor targets = b.Make({kRows}, DType::kI32);
    const Tensor losses = b.Make({kRows}, DType::kF32);
    const double t = b.Time([&] { return SoftmaxCrossEntropy(logits, targets, losses, 1.0f, b.stream()); });
    MemoryCounters(state, device, 4.0 * kRows * kVocab, t);
    return absl::OkStatus();
  });
}
BENCHMARK(BM_CudaCrossEntropy)->Unit(benchmark::kMillisecond)->Iterations(1);

void BM_CudaEmbedding(benchmark::State& state) {
  OnGpu(state, [&](Device& device, Bench& b) {
    const Tensor ids = b.Make({kRows}, DType::kI32), table = b.Make({kVocab, kHidden}, DType::kBF16);
    const Tensor y = b.Make({kRows, kHidden}, DType::kBF16);
    const double t = b.Time([&] { return Embedding(ids, table, y, b.stream()); });
    MemoryCounters(state, device, 4.0 * kRows * kHidden, t);
    return absl::OkStatus();
  });
}
BENCHMARK(BM_CudaEmbedding)->Unit(benchmark::kMillisecond)->Iterations(1);

// ---- The CpuDevice's GELU ------------------------------------------------------

void BM_CpuGelu(benchmark::State& state, bool backward) {
  const int64_t n = int64_t{1} << 22;
  std::vector<float> x(n), dy(n), out(n);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = -6.0f + 12.0f * static_cast<float>((i * 7919) % n) / static_cast<float>(n);
    dy[i] = 0.5f;
  }
  auto run = [&](ConvertPath path) {
    absl::Status st = backward ? kernels::GeluBackwardOnPath(x.data(), dy.data(), out.data(), n, path)
                               : kernels::GeluForwardOnPath(x.data(), out.data(), n, path);
    benchmark::DoNotOptimize(out.data());
    return st;
  };
  auto tanh_reference = [&] {
    if (backward) {
      kernels::GeluBackward<float>(x.data(), dy.data(), out.data(), n);
    } else {
      kernels::GeluForward<float>(x.data(), out.data(), n);
    }
    benchmark::DoNotOptimize(out.data());
  };
  absl::Status st;
  std::vector<double> t_best, t_scalar, t_tanh;
  for (auto _ : state) {
    t_best.push_back(Seconds([&] { st.Update(run(ConvertPath::kBest)); }));
    t_scalar.push_back(Seconds([&] { st.Update(run(ConvertPath::kScalar)); }));
    t_tanh.push_back(Seconds(tanh_reference));
  }
  if (!st.ok()) return state.SkipWithError(std::string(st.message()).c_str());
  state.counters["elements_per_second"] = n / Median(t_best);
  state.counters["vs_scalar"] = Median(t_scalar) / Median(t_best);
  state.counters["vs_tanh_reference"] = Median(t_tanh) / Median(t_best);
  state.SetLabel(std::string(ConvertPathName(BestConvertPath())));
}
BENCHMARK_CAPTURE(BM_CpuGelu, forward, false)->Iterations(7)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CpuGelu, backward, true)->Iterations(7)->UseRealTime()->Unit(benchmark::kMillisecond);

// ---- The CpuDevice's attention -------------------------------------------------

// One head of one sequence (GPT-2 350M's: t 1024, hd 64) on one thread: the
// fp32 head kernel against the template in fp32 (a dot product a score,
// as the CpuDevice ran before) in the same run. FLOPs as the CUDA rows
// count them: 4 t^2 hd forward, 10 t^2 hd backward, halved for causality.
void BM_CpuAttention(benchmark::State& state, bool backward) {
  const int64_t t = 1024, hd = 64;
  std::vector<float> qkv(t * 3 * hd), dout(t * hd), out(t * hd), lse(t), dqkv(t * 3 * hd);
  for (int64_t i = 0; i < t * 3 * hd; ++i) qkv[i] = static_cast<float>((i * 7919) % 4001) / 2000.0f - 1.0f;
  for (int64_t i = 0; i < t * hd; ++i) dout[i] = static_cast<float>((i * 104729) % 2003) / 1001.0f - 1.0f;
  const kernels::HeadQkv x{{qkv.data(), 3 * hd}, {qkv.data() + hd, 3 * hd}, {qkv.data() + 2 * hd, 3 * hd}};
  auto run = [&](ConvertPath path) {
    absl::Status st = kernels::AttentionHeadForwardOnPath(x, t, hd, {out.data(), hd}, lse.data(), path);
    if (backward && st.ok()) {
      st = kernels::AttentionHeadBackwardOnPath(x, {out.data(), hd}, {dout.data(), hd}, lse.data(), t, hd,
                                                {dqkv.data(), 3 * hd}, {dqkv.data() + hd, 3 * hd},
                                                {dqkv.data() + 2 * hd, 3 * hd}, path);
    }
    benchmark::DoNotOptimize(dqkv.data());
    return st;
  };
  auto template_kernels = [&] {
    kernels::AttentionForward<float>(qkv.data(), out.data(), lse.data(), 1, t, 1, hd);
    if (backward) {
      kernels::AttentionBackward<float>(qkv.data(), out.data(), dout.data(), lse.data(), dqkv.data(), 1, t, 1, hd);
    }
    benchmark::DoNotOptimize(dqkv.data());
  };
  absl::Status st;
  std::vector<double> t_best, t_scalar, t_template;
  for (auto _ : state) {
    t_best.push_back(Seconds([&] { st.Update(run(ConvertPath::kBest)); }));
    t_scalar.push_back(Seconds([&] { st.Update(run(ConvertPath::kScalar)); }));
    t_template.push_back(Seconds(template_kernels));
  }
  if (!st.ok()) return state.SkipWithError(std::string(st.message()).c_str());
  const double flops = (backward ? 14.0 : 4.0) * t * t * hd / 2;  // forward and backward both run for backward
  state.counters["gflops"] = flops / Median(t_best) / 1e9;
  state.counters["vs_scalar"] = Median(t_scalar) / Median(t_best);
  state.counters["vs_template"] = Median(t_template) / Median(t_best);
  state.SetLabel(std::string(ConvertPathName(BestConvertPath())));
}
BENCHMARK_CAPTURE(BM_CpuAttention, forward, false)->Iterations(5)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CpuAttention, forward_backward, true)->Iterations(5)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace memwall::ops
