// GPT-2's layers as modules with explicit forward and backward: Linear,
// LayerNorm, Embedding, causal self-attention, MLP and the pre-norm block
// (models/gpt.h assembles them). Public so that other models and ZeRO-Infinity's
// memory-centric tiling (a Linear split into tiles) reuse them.
//
// Conventions: activations are fp32, (rows, width) with rows = batch * t;
// parameters may be bound as fp32 or as 16-bit values (mixed precision),
// in which case each Linear rounds its input and output gradient into the
// StorageCasts scratch so every matmul has 16-bit operands (fp32
// accumulation). Each Forward / Backward runs its module's hooks (HookScope,
// models/module.h), so an engine can gather or bucket parameters around it.
// Backward accumulates (+=) into the bound gradients.
#ifndef MEMWALL_MODELS_LAYERS_H_
#define MEMWALL_MODELS_LAYERS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/module.h"
#include "runtime/device.h"
#include "runtime/memory.h"
#include "runtime/memory_plan.h"
#include "runtime/tensor.h"

namespace memwall::models {

inline constexpr float kLayerNormEps = 1e-5f;

// Device buffers for one pass, freed in compute-stream order. With `plan`
// set it allocates nothing: each Make adds its bytes to the plan's buffer
// `group` and returns a tensor without memory, so the code that sizes a
// pass's buffers also states its memory plan (models::ActivationPlan).
struct Scratch {
  Device* device = nullptr;
  std::vector<Buffer> buffers;
  MemoryPlan* plan = nullptr;
  std::string group;  // planning: the plan buffer Make adds to
  absl::StatusOr<Tensor> Make(std::vector<int64_t> shape, MemoryTag tag = MemoryTag::kActivations,
                              DType dtype = DType::kF32);
};

// (rows, cols) view of a tensor's memory; rows [first, first + count) of it.
Tensor As2D(const Tensor& t, int64_t rows, int64_t cols);
Tensor Rows(const Tensor& t, int64_t first, int64_t count, int64_t cols);

// Mixed precision: the 16-bit type of the bound parameters and two scratch
// buffers (rows x 4 hidden each) that hold a Linear's input and output
// gradient rounded to it. dtype kF32: no rounding.
struct StorageCasts {
  DType dtype = DType::kF32;
  Tensor in, out;
};

// x (rows, cols) fp32 in the parameters' storage type: x itself for fp32,
// else rounded into `scratch` (which holds at least rows * cols elements).
absl::StatusOr<Tensor> ToStorage(const Tensor& x, DType dtype, const Tensor& scratch, int64_t rows,
                                 int64_t cols, Stream& s);

// y = x W + b, W (in, out) "weight", b (out) "bias". x (rows, in), y (rows,
// out), fp32.
class Linear : public Module {
 public:
  Linear(std::string name, int64_t in, int64_t out, const StorageCasts* casts);
  Parameter& weight() { return *weight_; }
  Parameter& bias() { return *bias_; }
  absl::Status Forward(const Tensor& x, const Tensor& y, int64_t rows, Stream& s);
  // dW += x^T dy, db += sum dy, dx = dy W^T (skipped when dx is empty).
  absl::Status Backward(const Tensor& x, const Tensor& dy, const Tensor& dx, int64_t rows, Stream& s);

 private:
  Tensor W() const { return As2D(weight_->value, in_, out_); }
  int64_t in_, out_;
  const StorageCasts* casts_;
  Parameter* weight_;
  Parameter* bias_;
};

// y = (x - mean) rstd gamma + beta over the last dimension d ("weight" =
// gamma, "bias" = beta); mean and rstd (rows) are kept for backward.
class LayerNormModule : public Module {
 public:
  LayerNormModule(std::string name, int64_t d);
  absl::Status Forward(const Tensor& x, const Tensor& y, const Tensor& mean, const Tensor& rstd, Stream& s);
  absl::Status Backward(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                        const Tensor& dx, Stream& s);

 private:
  Parameter* weight_;
  Parameter* bias_;
};

// wte / wpe: a table (rows, d) named "<module>.weight".
class EmbeddingModule : public Module {
 public:
  EmbeddingModule(std::string name, int64_t rows, int64_t d);
  Parameter& weight() { return *weight_; }
  Tensor Table() const { return As2D(weight_->value, weight_->shape[0], weight_->shape[1]); }
  Tensor GradTable() const { return As2D(weight_->grad, weight_->shape[0], weight_->shape[1]); }

 private:
  Parameter* weight_;
};

// What a block's backward needs from its forward (rows = batch * t), fp32:
// ln1, att, mid, ln2 (rows, d); mean1, rstd1, mean2, rstd2 (rows); qkv
// (batch, t, 3d); lse (batch, heads, t); fc, gelu (rows, 4d).
struct BlockActivations {
  Tensor ln1, mean1, rstd1, qkv, att, lse, mid, ln2, mean2, rstd2, fc, gelu;
  static absl::StatusOr<BlockActivations> Allocate(Scratch& s, int64_t batch, int64_t t, int64_t d,
                                                   int64_t heads);
};

// Gradient scratch shared by all blocks' backward passes: c1, c2, mid
// (rows, d), big (rows, 4d), qkv (batch, t, 3d), delta (batch, heads, t).
struct BlockGradScratch {
  Tensor c1, c2, mid, big, qkv, delta;
};

// Causal multi-head self-attention "attn": proj = c_proj(attention(c_attn(x))).
class AttentionModule : public Module {
 public:
  AttentionModule(int64_t d, int64_t heads, const StorageCasts* casts);
  absl::Status Forward(const Tensor& x, BlockActivations& a, const Tensor& proj, int64_t batch, int64_t t,
                       Stream& s);
  // dproj -> dx (both (rows, d)); uses g.qkv, g.delta and g.c1.
  absl::Status Backward(const Tensor& x, BlockActivations& a, const Tensor& dproj, const Tensor& dx,
                        BlockGradScratch& g, int64_t batch, int64_t t, Stream& s);

 private:
  int64_t heads_;
  Linear* c_attn_;
  Linear* c_proj_;
};

// "mlp": y = c_proj(gelu(c_fc(x))), 4d wide inside.
class MlpModule : public Module {
 public:
  MlpModule(int64_t d, const StorageCasts* casts);
  absl::Status Forward(const Tensor& x, BlockActivations& a, const Tensor& y, int64_t rows, Stream& s);
  // dy -> dx; uses g.big.
  absl::Status Backward(const Tensor& x, BlockActivations& a, const Tensor& dy, const Tensor& dx,
                        BlockGradScratch& g, int64_t rows, Stream& s);

 private:
  Linear* c_fc_;
  Linear* c_proj_;
};

// A pre-norm transformer block "<index>": mid = x + attn(ln_1(x)),
// x_out = mid + mlp(ln_2(mid)).
class Block : public Module {
 public:
  Block(int64_t index, int64_t d, int64_t heads, const StorageCasts* casts);
  // x_out must not alias x.
  absl::Status Forward(const Tensor& x, BlockActivations& a, const Tensor& x_out, int64_t batch, int64_t t,
                       Stream& s);
  // dresid holds d(loss)/d(x_out) on entry and d(loss)/d(x) on return.
  absl::Status Backward(const Tensor& x, BlockActivations& a, const Tensor& dresid, BlockGradScratch& g,
                        int64_t batch, int64_t t, Stream& s);

 private:
  LayerNormModule* ln_1_;
  AttentionModule* attn_;
  LayerNormModule* ln_2_;
  MlpModule* mlp_;
};

}  // namespace memwall::models

#endif  // MEMWALL_MODELS_LAYERS_H_
