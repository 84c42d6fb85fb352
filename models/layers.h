// GPT-2's layers as modules with explicit forward and backward: Linear,
// LayerNorm, Embedding, causal self-attention, MLP and the pre-norm block
// (models/gpt.h assembles them). Public so that other models and ZeRO-Infinity's
// memory-centric tiling (a Linear split into tiles) reuse them.
//
// Conventions: activations are (rows, width) with rows = batch * t, stored
// as ActivationDType(the parameters' type): bf16 with bf16 parameters (end
// to end: every matmul reads them as they are), else fp32. Parameters may be
// bound as fp32 or as 16-bit values (mixed precision); with fp16 parameters
// each Linear rounds its fp32 input and output gradient into the
// LinearScratch so every matmul has 16-bit operands (fp32 accumulation). Each Forward / Backward runs its module's hooks (HookScope,
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

// The activations' type for parameters stored as `params`: bf16 for bf16
// (its fp32 exponent range holds any activation, and the tensor-core
// kernels read it directly), fp32 for fp16 (whose range an activation or
// its gradient can leave) and for fp32. Statistics (LayerNorm's mean and
// rstd, attention's lse) and losses are fp32 in every mode.
DType ActivationDType(DType params);

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
  // The same in the device's pinned host memory.
  absl::StatusOr<Tensor> MakePinned(std::vector<int64_t> shape, MemoryTag tag = MemoryTag::kActivations,
                                    DType dtype = DType::kF32);
};

// (rows, cols) view of a tensor's memory; rows [first, first + count) of it.
Tensor As2D(const Tensor& t, int64_t rows, int64_t cols);
Tensor Rows(const Tensor& t, int64_t first, int64_t count, int64_t cols);

// The scratch every linear layer of a pass shares, set by the model per
// pass. Mixed precision: the 16-bit type of the bound parameters and, when
// the activations are fp32 (fp16 parameters), two buffers (rows x 4 hidden
// each) that hold a Linear's input and output gradient rounded to it.
// Memory-centric tiling: `tile`, in the activations' type (rows x the
// widest tile), one tile's output or output gradient.
struct LinearScratch {
  DType dtype = DType::kF32;
  Tensor in, out;
  Tensor tile;
};

// x (rows, cols) in the parameters' storage type: x itself when it is
// stored so already, else rounded into `scratch` (which holds at least
// rows * cols elements).
absl::StatusOr<Tensor> ToStorage(const Tensor& x, DType dtype, const Tensor& scratch, int64_t rows,
                                 int64_t cols, Stream& s);

// y = x W + b with W (in, out) and b (out): x (rows, in), y (rows, out),
// in the activations' type. Backward: dW += x^T dy, db += sum dy, dx = dy W^T (skipped when dx
// is empty). Attention and MLP call their projections through this
// interface; MakeLinear picks the layer once, from the model's tiling.
class LinearLayer : public Module {
 public:
  using Module::Module;
  virtual absl::Status Forward(const Tensor& x, const Tensor& y, int64_t rows, Stream& s) = 0;
  virtual absl::Status Backward(const Tensor& x, const Tensor& dy, const Tensor& dx, int64_t rows,
                                Stream& s) = 0;
};

// One module owning W "weight" and b "bias".
class Linear : public LinearLayer {
 public:
  Linear(std::string name, int64_t in, int64_t out, const LinearScratch* scratch);
  Parameter& weight() { return *weight_; }
  Parameter& bias() { return *bias_; }
  absl::Status Forward(const Tensor& x, const Tensor& y, int64_t rows, Stream& s) override;
  absl::Status Backward(const Tensor& x, const Tensor& dy, const Tensor& dx, int64_t rows, Stream& s) override;

 private:
  Tensor W() const { return As2D(weight_->value, in_, out_); }
  int64_t in_, out_;
  const LinearScratch* scratch_;
  Parameter* weight_;
  Parameter* bias_;
};

// ZeRO-Infinity §5.1.3, memory-centric tiling: the same layer as `tiles`
// narrower Linears side by side. Tile t owns columns [t w, (t + 1) w) of W
// and b (w = out / tiles) as parameters "tile<t>.weight" (in, w) and
// "tile<t>.bias" (w) of a child module "tile<t>", so ZeRO-3 gathers,
// uses and releases one tile at a time: the layer's parameter working
// memory drops `tiles`-fold. Each tile parameter records its place in the
// untiled W and b (Parameter::slice), which initialization and the
// safetensors files read, so a tiled model starts from, and saves, the
// untiled model's values.
//   forward   y_t = x W_t + b_t into scratch.tile, copied to y's columns
//   backward  dy_t = dy's columns; dW_t += x^T dy_t; db_t += sum dy_t;
//             dx = dy_0 W_0^T, then dx += dy_t W_t^T for t = 1 ...
// Forward, dW and db are column blocks of Linear's products, elementwise
// the same sums; dx sums its `out` products as `tiles` partial sums added
// in tile order, so it differs from Linear's only by rounding: by at most
// 2 gamma_out sum_o |dy_o W_jo| per element (gamma_n = n u / (1 - n u),
// u = 2^-24), the bound models/layers_test.cc checks.
class TiledLinear : public LinearLayer {
 public:
  // `tiles` > 1 divides `out`; `scratch->tile` holds rows x out / tiles.
  TiledLinear(std::string name, int64_t in, int64_t out, int64_t tiles, const LinearScratch* scratch);
  int64_t tiles() const { return static_cast<int64_t>(tiles_.size()); }
  absl::Status Forward(const Tensor& x, const Tensor& y, int64_t rows, Stream& s) override;
  absl::Status Backward(const Tensor& x, const Tensor& dy, const Tensor& dx, int64_t rows, Stream& s) override;

 private:
  struct Tile {
    Module* module;
    Parameter* weight;  // (in, width)
    Parameter* bias;    // (width)
  };
  int64_t in_, out_, width_;
  const LinearScratch* scratch_;
  std::vector<Tile> tiles_;
};

// A Linear, or with tiles > 1 a TiledLinear.
std::unique_ptr<LinearLayer> MakeLinear(std::string name, int64_t in, int64_t out, int64_t tiles,
                                        const LinearScratch* scratch);

// y = (x - mean) rstd gamma + beta over the last dimension d ("weight" =
// gamma, "bias" = beta); mean and rstd (rows) are kept for backward.
class LayerNormModule : public Module {
 public:
  LayerNormModule(std::string name, int64_t d);
  absl::Status Forward(const Tensor& x, const Tensor& y, const Tensor& mean, const Tensor& rstd, Stream& s);
  // x = a + b (the residual connection before this LayerNorm; x may alias a
  // or b), then Forward(x) in the same pass (ops::AddLayerNorm).
  absl::Status ForwardAfterAdd(const Tensor& a, const Tensor& b, const Tensor& x, const Tensor& y,
                               const Tensor& mean, const Tensor& rstd, Stream& s);
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

// What a block's backward needs from its forward (rows = batch * t), in
// the activations' type `at`: ln1, att, mid, ln2 (rows, d); qkv (batch, t,
// 3d); fc, gelu (rows, 4d); fp32: mean1, rstd1, mean2, rstd2 (rows), lse
// (batch, heads, t).
struct BlockActivations {
  Tensor ln1, mean1, rstd1, qkv, att, lse, mid, ln2, mean2, rstd2, fc, gelu;
  static absl::StatusOr<BlockActivations> Allocate(Scratch& s, int64_t batch, int64_t t, int64_t d,
                                                   int64_t heads, DType at);
};

// Gradient scratch shared by all blocks' backward passes, in the
// activations' type: c1, c2, mid (rows, d), big (rows, 4d), qkv (batch, t,
// 3d); fp32: delta (batch, heads, t).
struct BlockGradScratch {
  Tensor c1, c2, mid, big, qkv, delta;
};

// Causal multi-head self-attention "attn": proj = c_proj(attention(c_attn(x))).
class AttentionModule : public Module {
 public:
  AttentionModule(int64_t d, int64_t heads, int64_t tiles, const LinearScratch* scratch);
  absl::Status Forward(const Tensor& x, BlockActivations& a, const Tensor& proj, int64_t batch, int64_t t,
                       Stream& s);
  // dproj -> dx (both (rows, d)); uses g.qkv, g.delta and g.c1.
  absl::Status Backward(const Tensor& x, BlockActivations& a, const Tensor& dproj, const Tensor& dx,
                        BlockGradScratch& g, int64_t batch, int64_t t, Stream& s);

 private:
  int64_t heads_;
  LinearLayer* c_attn_;
  LinearLayer* c_proj_;
};

// "mlp": y = c_proj(gelu(c_fc(x))), 4d wide inside.
class MlpModule : public Module {
 public:
  MlpModule(int64_t d, int64_t tiles, const LinearScratch* scratch);
  absl::Status Forward(const Tensor& x, BlockActivations& a, const Tensor& y, int64_t rows, Stream& s);
  // dy -> dx; uses g.big.
  absl::Status Backward(const Tensor& x, BlockActivations& a, const Tensor& dy, const Tensor& dx,
                        BlockGradScratch& g, int64_t rows, Stream& s);

 private:
  LinearLayer* c_fc_;
  LinearLayer* c_proj_;
};

// A pre-norm transformer block "<index>": mid = x + attn(ln_1(x)),
// x_out = mid + mlp(ln_2(mid)). Its four projections are tiled `tiles`
// ways (1: plain Linears).
class Block : public Module {
 public:
  Block(int64_t index, int64_t d, int64_t heads, int64_t tiles, const LinearScratch* scratch);
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
