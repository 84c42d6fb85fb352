#include "models/layers.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ops/ops.h"
#include "runtime/status.h"

namespace memwall::models {

absl::StatusOr<Tensor> Scratch::Make(std::vector<int64_t> shape, MemoryTag tag, DType dtype) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const int64_t bytes = n * static_cast<int64_t>(SizeOf(dtype));
  if (plan != nullptr) {
    plan->Grow(group, MemorySpace::kDevice, tag, bytes);
    return Tensor(nullptr, dtype, std::move(shape), nullptr);
  }
  MEMWALL_ASSIGN_OR_RETURN(Buffer b, device->Allocate(static_cast<size_t>(bytes), tag, &device->compute_stream()));
  buffers.push_back(std::move(b));
  return Tensor(buffers.back().data(), dtype, std::move(shape), device);
}

absl::StatusOr<Tensor> Scratch::MakePinned(std::vector<int64_t> shape, MemoryTag tag, DType dtype) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const int64_t bytes = n * static_cast<int64_t>(SizeOf(dtype));
  if (plan != nullptr) {
    plan->Grow(group, MemorySpace::kPinnedHost, tag, bytes);
    return Tensor(nullptr, dtype, std::move(shape), nullptr);
  }
  MEMWALL_ASSIGN_OR_RETURN(Buffer b, device->AllocatePinnedHost(static_cast<size_t>(bytes), tag));
  buffers.push_back(std::move(b));
  return Tensor(buffers.back().data(), dtype, std::move(shape), nullptr);
}

DType ActivationDType(DType params) { return params == DType::kBF16 ? DType::kBF16 : DType::kF32; }

Tensor As2D(const Tensor& t, int64_t rows, int64_t cols) {
  return Tensor(t.data(), t.dtype(), {rows, cols}, t.device());
}

Tensor Rows(const Tensor& t, int64_t first, int64_t count, int64_t cols) {
  return Tensor(static_cast<char*>(t.data()) + first * cols * SizeOf(t.dtype()), t.dtype(),
                {count, cols}, t.device());
}

absl::StatusOr<Tensor> ToStorage(const Tensor& x, DType dtype, const Tensor& scratch, int64_t rows,
                                 int64_t cols, Stream& s) {
  if (x.dtype() == dtype) return As2D(x, rows, cols);
  const Tensor y(scratch.data(), dtype, {rows, cols}, scratch.device());
  MEMWALL_RETURN_IF_ERROR(ops::Cast(As2D(x, rows, cols), y, s));
  return y;
}

// ---- Leaf modules ---------------------------------------------------------

Linear::Linear(std::string name, int64_t in, int64_t out, const LinearScratch* scratch)
    : LinearLayer(std::move(name)), in_(in), out_(out), scratch_(scratch) {
  weight_ = &AddParameter("weight", {in, out});
  bias_ = &AddParameter("bias", {out});
}

// With fp16 parameters (fp32 activations), x and dy are rounded to fp16
// for the matmuls (fp32 accumulation) and y and dx stay fp32; otherwise the
// matmuls read x and dy as they are and write y and dx in their type.
absl::Status Linear::Forward(const Tensor& x, const Tensor& y, int64_t rows, Stream& s) {
  MEMWALL_ASSIGN_OR_RETURN(HookScope scope, HookScope::Forward(*this));
  MEMWALL_ASSIGN_OR_RETURN(const Tensor x_in, ToStorage(x, scratch_->dtype, scratch_->in, rows, in_, s));
  MEMWALL_RETURN_IF_ERROR(ops::MatmulBias(x_in, false, W(), false, bias_->value, As2D(y, rows, out_), s));
  return scope.Finish();
}

absl::Status Linear::Backward(const Tensor& x, const Tensor& dy, const Tensor& dx, int64_t rows, Stream& s) {
  MEMWALL_ASSIGN_OR_RETURN(HookScope scope, HookScope::Backward(*this));
  const DType dtype = scratch_->dtype;
  MEMWALL_ASSIGN_OR_RETURN(const Tensor x_in, ToStorage(x, dtype, scratch_->in, rows, in_, s));
  MEMWALL_ASSIGN_OR_RETURN(const Tensor dy_in, ToStorage(dy, dtype, scratch_->out, rows, out_, s));
  MEMWALL_RETURN_IF_ERROR(ops::Matmul(x_in, true, dy_in, false, As2D(weight_->grad, in_, out_),
                                      1.0f, 1.0f, s));
  MEMWALL_RETURN_IF_ERROR(ops::BiasBackward(As2D(dy, rows, out_), bias_->grad, s));
  if (dx.data() != nullptr) {
    MEMWALL_RETURN_IF_ERROR(ops::Matmul(dy_in, false, W(), true, As2D(dx, rows, in_), 1.0f, 0.0f, s));
  }
  return scope.Finish();
}

namespace {
// A tile's parameters, owned by its own module so hooks see it alone.
class LinearTile : public Module {
 public:
  LinearTile(int64_t index, int64_t in, int64_t width, int64_t out) : Module(absl::StrCat("tile", index)) {
    weight = &AddTileParameter("weight", {in, width}, "weight", out, index * width);
    bias = &AddTileParameter("bias", {width}, "bias", out, index * width);
  }
  Parameter* weight;
  Parameter* bias;
};
}  // namespace

TiledLinear::TiledLinear(std::string name, int64_t in, int64_t out, int64_t tiles, const LinearScratch* scratch)
    : LinearLayer(std::move(name)), in_(in), out_(out), width_(out / tiles), scratch_(scratch) {
  for (int64_t t = 0; t < tiles; ++t) {
    LinearTile& tile = AddChild(std::make_unique<LinearTile>(t, in, width_, out));
    tiles_.push_back({&tile, tile.weight, tile.bias});
  }
}

absl::Status TiledLinear::Forward(const Tensor& x, const Tensor& y, int64_t rows, Stream& s) {
  MEMWALL_ASSIGN_OR_RETURN(HookScope scope, HookScope::Forward(*this));
  MEMWALL_ASSIGN_OR_RETURN(const Tensor x_in, ToStorage(x, scratch_->dtype, scratch_->in, rows, in_, s));
  const Tensor y_t = As2D(scratch_->tile, rows, width_);
  for (int64_t t = 0; t < tiles(); ++t) {
    const Tile& tile = tiles_[t];
    MEMWALL_ASSIGN_OR_RETURN(HookScope tile_scope, HookScope::Forward(*tile.module));
    MEMWALL_RETURN_IF_ERROR(ops::MatmulBias(x_in, false, As2D(tile.weight->value, in_, width_), false,
                                            tile.bias->value, y_t, s));
    MEMWALL_RETURN_IF_ERROR(ops::CopyColumns(y_t, 0, As2D(y, rows, out_), t * width_, width_, s));
    MEMWALL_RETURN_IF_ERROR(tile_scope.Finish());
  }
  return scope.Finish();
}

absl::Status TiledLinear::Backward(const Tensor& x, const Tensor& dy, const Tensor& dx, int64_t rows, Stream& s) {
  MEMWALL_ASSIGN_OR_RETURN(HookScope scope, HookScope::Backward(*this));
  const DType dtype = scratch_->dtype;
  MEMWALL_ASSIGN_OR_RETURN(const Tensor x_in, ToStorage(x, dtype, scratch_->in, rows, in_, s));
  const Tensor dy_t = As2D(scratch_->tile, rows, width_);
  for (int64_t t = 0; t < tiles(); ++t) {
    const Tile& tile = tiles_[t];
    MEMWALL_ASSIGN_OR_RETURN(HookScope tile_scope, HookScope::Backward(*tile.module));
    MEMWALL_RETURN_IF_ERROR(ops::CopyColumns(As2D(dy, rows, out_), t * width_, dy_t, 0, width_, s));
    MEMWALL_ASSIGN_OR_RETURN(const Tensor dy_in, ToStorage(dy_t, dtype, scratch_->out, rows, width_, s));
    MEMWALL_RETURN_IF_ERROR(ops::Matmul(x_in, true, dy_in, false, As2D(tile.weight->grad, in_, width_), 1.0f,
                                        1.0f, s));
    MEMWALL_RETURN_IF_ERROR(ops::BiasBackward(dy_t, tile.bias->grad, s));
    if (dx.data() != nullptr) {
      MEMWALL_RETURN_IF_ERROR(ops::Matmul(dy_in, false, As2D(tile.weight->value, in_, width_), true,
                                          As2D(dx, rows, in_), 1.0f, t == 0 ? 0.0f : 1.0f, s));
    }
    MEMWALL_RETURN_IF_ERROR(tile_scope.Finish());
  }
  return scope.Finish();
}

std::unique_ptr<LinearLayer> MakeLinear(std::string name, int64_t in, int64_t out, int64_t tiles,
                                        const LinearScratch* scratch) {
  if (tiles <= 1) return std::make_unique<Linear>(std::move(name), in, out, scratch);
  return std::make_unique<TiledLinear>(std::move(name), in, out, tiles, scratch);
}

LayerNormModule::LayerNormModule(std::string name, int64_t d) : Module(std::move(name)) {
  weight_ = &AddParameter("weight", {d});
  bias_ = &AddParameter("bias", {d});
}

absl::Status LayerNormModule::Forward(const Tensor& x, const Tensor& y, const Tensor& mean, const Tensor& rstd,
                                      Stream& s) {
  MEMWALL_ASSIGN_OR_RETURN(HookScope scope, HookScope::Forward(*this));
  MEMWALL_RETURN_IF_ERROR(ops::LayerNorm(x, weight_->value, bias_->value, kLayerNormEps, y, mean, rstd, s));
  return scope.Finish();
}

absl::Status LayerNormModule::ForwardAfterAdd(const Tensor& a, const Tensor& b, const Tensor& x, const Tensor& y,
                                              const Tensor& mean, const Tensor& rstd, Stream& s) {
  MEMWALL_ASSIGN_OR_RETURN(HookScope scope, HookScope::Forward(*this));
  MEMWALL_RETURN_IF_ERROR(
      ops::AddLayerNorm(a, b, weight_->value, bias_->value, kLayerNormEps, x, y, mean, rstd, s));
  return scope.Finish();
}

absl::Status LayerNormModule::Backward(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                       const Tensor& rstd, const Tensor& dx, Stream& s) {
  MEMWALL_ASSIGN_OR_RETURN(HookScope scope, HookScope::Backward(*this));
  MEMWALL_RETURN_IF_ERROR(ops::LayerNormBackward(dy, x, weight_->value, mean, rstd, dx, weight_->grad,
                                                 bias_->grad, s));
  return scope.Finish();
}

EmbeddingModule::EmbeddingModule(std::string name, int64_t rows, int64_t d) : Module(std::move(name)) {
  weight_ = &AddParameter("weight", {rows, d});
}

// ---- A transformer block --------------------------------------------------

absl::StatusOr<BlockActivations> BlockActivations::Allocate(Scratch& s, int64_t batch, int64_t t, int64_t d,
                                                            int64_t heads, DType at) {
  const int64_t rows = batch * t;
  constexpr MemoryTag kTag = MemoryTag::kActivations;
  BlockActivations a;
  for (Tensor* x : {&a.ln1, &a.att, &a.mid, &a.ln2}) {
    MEMWALL_ASSIGN_OR_RETURN(*x, s.Make({rows, d}, kTag, at));
  }
  for (Tensor* x : {&a.mean1, &a.rstd1, &a.mean2, &a.rstd2}) {
    MEMWALL_ASSIGN_OR_RETURN(*x, s.Make({rows}));
  }
  MEMWALL_ASSIGN_OR_RETURN(a.qkv, s.Make({batch, t, 3 * d}, kTag, at));
  MEMWALL_ASSIGN_OR_RETURN(a.lse, s.Make({batch, heads, t}));
  MEMWALL_ASSIGN_OR_RETURN(a.fc, s.Make({rows, 4 * d}, kTag, at));
  MEMWALL_ASSIGN_OR_RETURN(a.gelu, s.Make({rows, 4 * d}, kTag, at));
  return a;
}

AttentionModule::AttentionModule(int64_t d, int64_t heads, int64_t tiles, const LinearScratch* scratch)
    : Module("attn"), heads_(heads) {
  c_attn_ = &AddChild(MakeLinear("c_attn", d, 3 * d, tiles, scratch));
  c_proj_ = &AddChild(MakeLinear("c_proj", d, d, tiles, scratch));
}

absl::Status AttentionModule::Forward(const Tensor& x, BlockActivations& a, const Tensor& proj, int64_t batch,
                                      int64_t t, Stream& s) {
  MEMWALL_ASSIGN_OR_RETURN(HookScope scope, HookScope::Forward(*this));
  MEMWALL_RETURN_IF_ERROR(c_attn_->Forward(x, a.qkv, batch * t, s));
  MEMWALL_RETURN_IF_ERROR(ops::Attention(a.qkv, heads_, a.att, a.lse, s));
  MEMWALL_RETURN_IF_ERROR(c_proj_->Forward(a.att, proj, batch * t, s));
  return scope.Finish();
}

absl::Status AttentionModule::Backward(const Tensor& x, BlockActivations& a, const Tensor& dproj,
                                       const Tensor& dx, BlockGradScratch& g, int64_t batch, int64_t t,
                                       Stream& s) {
  MEMWALL_ASSIGN_OR_RETURN(HookScope scope, HookScope::Backward(*this));
  const int64_t rows = batch * t;
  MEMWALL_RETURN_IF_ERROR(c_proj_->Backward(a.att, dproj, g.c1, rows, s));
  MEMWALL_RETURN_IF_ERROR(ops::AttentionBackward(a.qkv, a.att, g.c1, a.lse, heads_, g.delta, g.qkv, s));
  MEMWALL_RETURN_IF_ERROR(c_attn_->Backward(x, g.qkv, dx, rows, s));
  return scope.Finish();
}

MlpModule::MlpModule(int64_t d, int64_t tiles, const LinearScratch* scratch) : Module("mlp") {
  c_fc_ = &AddChild(MakeLinear("c_fc", d, 4 * d, tiles, scratch));
  c_proj_ = &AddChild(MakeLinear("c_proj", 4 * d, d, tiles, scratch));
}

absl::Status MlpModule::Forward(const Tensor& x, BlockActivations& a, const Tensor& y, int64_t rows, Stream& s) {
  MEMWALL_ASSIGN_OR_RETURN(HookScope scope, HookScope::Forward(*this));
  MEMWALL_RETURN_IF_ERROR(c_fc_->Forward(x, a.fc, rows, s));
  MEMWALL_RETURN_IF_ERROR(ops::Gelu(a.fc, a.gelu, s));
  MEMWALL_RETURN_IF_ERROR(c_proj_->Forward(a.gelu, y, rows, s));
  return scope.Finish();
}

absl::Status MlpModule::Backward(const Tensor& x, BlockActivations& a, const Tensor& dy, const Tensor& dx,
                                 BlockGradScratch& g, int64_t rows, Stream& s) {
  MEMWALL_ASSIGN_OR_RETURN(HookScope scope, HookScope::Backward(*this));
  MEMWALL_RETURN_IF_ERROR(c_proj_->Backward(a.gelu, dy, g.big, rows, s));
  MEMWALL_RETURN_IF_ERROR(ops::GeluBackward(a.fc, g.big, g.big, s));
  MEMWALL_RETURN_IF_ERROR(c_fc_->Backward(x, g.big, dx, rows, s));
  return scope.Finish();
}

Block::Block(int64_t index, int64_t d, int64_t heads, int64_t tiles, const LinearScratch* scratch)
    : Module(absl::StrCat(index)) {
  ln_1_ = &AddChild(std::make_unique<LayerNormModule>("ln_1", d));
  attn_ = &AddChild(std::make_unique<AttentionModule>(d, heads, tiles, scratch));
  ln_2_ = &AddChild(std::make_unique<LayerNormModule>("ln_2", d));
  mlp_ = &AddChild(std::make_unique<MlpModule>(d, tiles, scratch));
}

absl::Status Block::Forward(const Tensor& x, BlockActivations& a, const Tensor& x_out, int64_t batch, int64_t t,
                            Stream& s) {
  MEMWALL_ASSIGN_OR_RETURN(HookScope scope, HookScope::Forward(*this));
  const int64_t rows = batch * t;
  MEMWALL_RETURN_IF_ERROR(ln_1_->Forward(x, a.ln1, a.mean1, a.rstd1, s));
  MEMWALL_RETURN_IF_ERROR(attn_->Forward(a.ln1, a, a.mid, batch, t, s));
  // mid = x + attn(ln_1(x)); ln2 = ln_2(mid), in one pass.
  MEMWALL_RETURN_IF_ERROR(ln_2_->ForwardAfterAdd(x, a.mid, a.mid, a.ln2, a.mean2, a.rstd2, s));
  MEMWALL_RETURN_IF_ERROR(mlp_->Forward(a.ln2, a, x_out, rows, s));
  MEMWALL_RETURN_IF_ERROR(ops::Add(a.mid, x_out, x_out, s));
  return scope.Finish();
}

absl::Status Block::Backward(const Tensor& x, BlockActivations& a, const Tensor& dresid, BlockGradScratch& g,
                             int64_t batch, int64_t t, Stream& s) {
  MEMWALL_ASSIGN_OR_RETURN(HookScope scope, HookScope::Backward(*this));
  const int64_t rows = batch * t;
  // MLP branch, then the residual: d_mid = dresid + ln_2'(mlp'(dresid)).
  MEMWALL_RETURN_IF_ERROR(mlp_->Backward(a.ln2, a, dresid, g.c1, g, rows, s));
  MEMWALL_RETURN_IF_ERROR(ln_2_->Backward(g.c1, a.mid, a.mean2, a.rstd2, g.c2, s));
  MEMWALL_RETURN_IF_ERROR(ops::Add(g.c2, dresid, g.mid, s));
  // Attention branch: dx = d_mid + ln_1'(attn'(d_mid)).
  MEMWALL_RETURN_IF_ERROR(attn_->Backward(a.ln1, a, g.mid, g.c2, g, batch, t, s));
  MEMWALL_RETURN_IF_ERROR(ln_1_->Backward(g.c2, x, a.mean1, a.rstd1, g.c1, s));
  MEMWALL_RETURN_IF_ERROR(ops::Add(g.c1, g.mid, dresid, s));
  return scope.Finish();
}

}  // namespace memwall::models
