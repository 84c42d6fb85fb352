#include "models/gpt.h"

#include <fcntl.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/layers.h"
#include "models/normals.h"
#include "ops/ops.h"
#include "runtime/bounds.h"
#include "runtime/files.h"
#include "runtime/launch.h"
#include "runtime/splitmix.h"
#include "runtime/status.h"
#include "runtime/thread_pool.h"

namespace memwall::models {
namespace {

absl::Status Unbound(const Parameter& p) {
  return absl::FailedPreconditionError(absl::StrCat(
      "parameter ", p.name, " has no storage bound; the engine binds values (and gradients "
      "for training) before the model runs"));
}

// Every parameter bound (memory present, or deferred: see [Note: deferred
// binding] in module.h), all in one floating dtype, gradients too; returns it.
absl::StatusOr<DType> CheckBound(Module& m, bool need_grads) {
  const std::vector<Parameter*> params = m.Parameters();
  const DType dtype = params.front()->value.dtype();
  for (Parameter* p : params) {
    if (p->value.numel() != p->numel() || p->value.shape().empty()) return Unbound(*p);
    if (need_grads && (p->grad.numel() != p->numel() || p->grad.shape().empty())) {
      return Unbound(*p);
    }
    if (!IsFloating(p->value.dtype()) || p->value.dtype() != dtype ||
        (need_grads && p->grad.dtype() != dtype)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "parameter ", p->name, " is bound as ", DTypeName(p->value.dtype()),
          need_grads ? absl::StrCat(" with ", DTypeName(p->grad.dtype()), " gradients") : "",
          "; every parameter and gradient of the model must share ", DTypeName(dtype),
          " (of fp32, fp16, bf16)"));
    }
  }
  return dtype;
}

}  // namespace

// ---- Config ---------------------------------------------------------------

absl::Status ValidateConfig(const GptConfig& c) {
  auto bad = [&](absl::string_view field, auto value, absl::string_view need) {
    return absl::InvalidArgumentError(absl::StrCat("GptConfig '", c.name(), "': ", field, " = ",
                                                   value, " ", need));
  };
  if (c.layers() <= 0) return bad("layers", c.layers(), "must be > 0");
  if (c.hidden() <= 0) return bad("hidden", c.hidden(), "must be > 0");
  if (c.heads() <= 0) return bad("heads", c.heads(), "must be > 0");
  if (c.hidden() % c.heads() != 0) {
    return bad("heads", c.heads(), absl::StrCat("must divide hidden = ", c.hidden()));
  }
  if (c.vocab() <= 0 || c.vocab() > INT32_MAX) {
    return bad("vocab", c.vocab(), "must be in [1, 2^31) (token ids are int32)");
  }
  if (c.positions() <= 0) return bad("positions", c.positions(), "must be > 0");
  // Sizes are int64 everywhere (element counts, byte offsets): bound the
  // dimensions so that Ψ and every buffer the model plans fit, with room.
  for (auto [field, value] : {std::pair<absl::string_view, int64_t>{"layers", c.layers()},
                              {"hidden", c.hidden()}, {"heads", c.heads()}, {"positions", c.positions()}}) {
    if (value > INT32_MAX) return bad(field, value, "must be < 2^31");
  }
  const double d = double(c.hidden());
  if (double(c.vocab()) * d + double(c.positions()) * d + double(c.layers()) * (12 * d * d + 13 * d) > 0x1p53) {
    return bad("hidden", c.hidden(), absl::StrCat("with layers = ", c.layers(), " and vocab = ", c.vocab(),
                                                  " gives more than 2^53 parameters"));
  }
  if (c.paper_micro_batch() < 0) return bad("paper_micro_batch", c.paper_micro_batch(), "must be >= 0");
  if (c.offload_activations() && !c.activation_checkpointing()) {
    return bad("offload_activations", "true", "needs activation_checkpointing (the checkpoints are what moves to the host)");
  }
  if (c.tiling() < 0 || (c.tiling() > 1 && c.hidden() % c.tiling() != 0)) {
    return bad("tiling", c.tiling(),
               absl::StrCat("must be 0 or 1 (untiled) or divide hidden = ", c.hidden(),
                            " (each projection's output, d to 4d, splits into equal tiles)"));
  }
  return absl::OkStatus();
}

absl::Status CheckRunShape(const GptConfig& c, int64_t micro_batch, int64_t seq) {
  MEMWALL_ASSIGN_OR_RETURN(const int64_t rows, CheckedProduct("a micro-batch's tokens",
                                                              {{"micro_batch", micro_batch}, {"seq", seq}}, kMaxCount));
  const double r = double(rows), d = double(c.hidden());
  const double bytes = 8 * (double(c.layers()) + 3) * r * (32 * d + 2 * double(c.heads())) + 16 * r * double(c.vocab());
  if (bytes >= 0x1p53) {
    return absl::InvalidArgumentError(absl::StrCat(
        "micro_batch = ", micro_batch, " x seq = ", seq, " with GptConfig '", c.name(), "' (layers ", c.layers(),
        ", hidden ", c.hidden(), ", vocab ", c.vocab(), ") plans about 2^", int(std::log2(bytes)),
        " bytes of activations, beyond the 2^53 any buffer is sized to"));
  }
  return absl::OkStatus();
}

int64_t CountParameters(const GptConfig& c) {
  const int64_t d = c.hidden();
  return c.vocab() * d + c.positions() * d + c.layers() * (12 * d * d + 13 * d) + 2 * d;
}

namespace {

// Every buffer one pass allocates, held until it returns (so the peak is
// their sum), grouped as ActivationPlan names them. Shapes: rows = batch t.
// Offloaded activation checkpoints: device slots for x_l (l mod 3).
constexpr int64_t kOffloadSlots = 3;

// Activations are in the type a = ActivationDType(the parameters' type).
struct RunBuffers {
  Tensor cast_in, cast_out;        // fp16 parameters: (rows 4d) each, a Linear's operands
  Tensor tile;                     // tiling k > 1: (rows 4d / k), one tile's output
  Tensor ids, pos, targets;        // (rows) int32
  std::vector<Tensor> xs;          // L + 1 of (rows, d): the residual stream (3 slots when offloaded)
  Tensor host_xs;                  // offloaded, with backward: (L + 1, rows, d) in pinned host memory
  Tensor pos_rows;                 // (rows, d) position embeddings
  std::vector<BlockActivations> acts;  // one block when checkpointing, else L
  Tensor f, f_mean, f_rstd;        // ln_f: (rows, d), (rows), (rows)
  Tensor logits;                   // (chunk, Vp): V columns used, rows padded to Vp
  Tensor losses;                   // (rows) fp32
  Tensor f_storage;                // fp16 parameters: (rows, d), f as the head's operand
  Tensor dlogits_storage;          // fp16 parameters with backward: (chunk, Vp)
  Tensor df, dresid;               // backward: (rows, d) each
  BlockGradScratch g;              // backward
};

absl::StatusOr<RunBuffers> AllocateRunBuffers(Scratch& scratch, const GptConfig& config, int64_t batch,
                                              int64_t t, DType dtype, bool backward, bool checkpoint,
                                              bool offload, int64_t chunk) {
  const int64_t d = config.hidden(), vp = PaddedVocab(config), rows = batch * t;
  const int64_t layers = config.layers(), heads = config.heads();
  // Activations in the parameters' type need no rounded copies.
  const DType at = ActivationDType(dtype);
  constexpr MemoryTag kAct = MemoryTag::kActivations;
  RunBuffers b;
  scratch.group = "16-bit operands";
  if (at != dtype) {
    MEMWALL_ASSIGN_OR_RETURN(b.cast_in, scratch.Make({rows * 4 * d}, MemoryTag::kWorkspace, dtype));
    MEMWALL_ASSIGN_OR_RETURN(b.cast_out, scratch.Make({rows * 4 * d}, MemoryTag::kWorkspace, dtype));
    MEMWALL_ASSIGN_OR_RETURN(b.f_storage, scratch.Make({rows, d}, MemoryTag::kWorkspace, dtype));
    if (backward) {
      MEMWALL_ASSIGN_OR_RETURN(b.dlogits_storage, scratch.Make({chunk, vp}, MemoryTag::kWorkspace, dtype));
    }
  }
  if (config.tiling() > 1) {
    scratch.group = "tiled linear scratch";
    MEMWALL_ASSIGN_OR_RETURN(b.tile, scratch.Make({rows * 4 * d / config.tiling()}, MemoryTag::kWorkspace, at));
  }
  scratch.group = "embeddings, ln_f, losses, ids";
  MEMWALL_ASSIGN_OR_RETURN(b.ids, scratch.Make({rows}, MemoryTag::kActivations, DType::kI32));
  MEMWALL_ASSIGN_OR_RETURN(b.pos, scratch.Make({rows}, MemoryTag::kActivations, DType::kI32));
  MEMWALL_ASSIGN_OR_RETURN(b.targets, scratch.Make({rows}, MemoryTag::kActivations, DType::kI32));
  MEMWALL_ASSIGN_OR_RETURN(b.pos_rows, scratch.Make({rows, d}, kAct, at));
  MEMWALL_ASSIGN_OR_RETURN(b.f, scratch.Make({rows, d}, kAct, at));
  MEMWALL_ASSIGN_OR_RETURN(b.f_mean, scratch.Make({rows}));
  MEMWALL_ASSIGN_OR_RETURN(b.f_rstd, scratch.Make({rows}));
  MEMWALL_ASSIGN_OR_RETURN(b.losses, scratch.Make({rows}));
  scratch.group = "residual stream";
  b.xs.resize(offload ? std::min<int64_t>(layers + 1, kOffloadSlots) : layers + 1);
  for (Tensor& x : b.xs) {
    MEMWALL_ASSIGN_OR_RETURN(x, scratch.Make({rows, d}, kAct, at));
  }
  if (offload && backward && layers + 1 > kOffloadSlots) {
    scratch.group = "activation checkpoints (host)";
    MEMWALL_ASSIGN_OR_RETURN(b.host_xs, scratch.MakePinned({layers + 1, rows, d}, kAct, at));
  }
  scratch.group = "block activations";
  b.acts.resize(checkpoint ? 1 : layers);
  for (BlockActivations& a : b.acts) {
    MEMWALL_ASSIGN_OR_RETURN(a, BlockActivations::Allocate(scratch, batch, t, d, heads, at));
  }
  scratch.group = "logits chunk";
  MEMWALL_ASSIGN_OR_RETURN(b.logits, scratch.Make({chunk, vp}, MemoryTag::kWorkspace, at));
  if (backward) {
    scratch.group = "backward scratch";
    for (Tensor* x : {&b.df, &b.dresid, &b.g.c1, &b.g.c2, &b.g.mid}) {
      MEMWALL_ASSIGN_OR_RETURN(*x, scratch.Make({rows, d}, kAct, at));
    }
    MEMWALL_ASSIGN_OR_RETURN(b.g.big, scratch.Make({rows, 4 * d}, kAct, at));
    MEMWALL_ASSIGN_OR_RETURN(b.g.qkv, scratch.Make({batch, t, 3 * d}, kAct, at));
    MEMWALL_ASSIGN_OR_RETURN(b.g.delta, scratch.Make({batch, heads, t}));
  }
  return b;
}

// Where the block inputs x_0 ... x_L (the residual stream, the activation
// checkpoints when checkpointing) live during a pass: a policy chosen once
// per pass. Forward brackets each write of x_l with BeforeWrite / Written;
// backward brackets block l's recompute and backward with BeforeBlock /
// AfterBlock, from l = L - 1 down.
class ResidualStream {
 public:
  virtual ~ResidualStream() = default;
  virtual const Tensor& x(int64_t l) const = 0;
  virtual absl::Status BeforeWrite(int64_t l) = 0;
  virtual absl::Status Written(int64_t l) = 0;
  virtual absl::Status BeforeBlock(int64_t l) = 0;
  virtual absl::Status AfterBlock(int64_t l) = 0;
  // Every copy the policy started has completed.
  virtual absl::Status Finish() = 0;
};

// Every x_l in its own device buffer.
class ResidentStream : public ResidualStream {
 public:
  explicit ResidentStream(const std::vector<Tensor>& xs) : xs_(xs) {}
  const Tensor& x(int64_t l) const override { return xs_[l]; }
  absl::Status BeforeWrite(int64_t) override { return absl::OkStatus(); }
  absl::Status Written(int64_t) override { return absl::OkStatus(); }
  absl::Status BeforeBlock(int64_t) override { return absl::OkStatus(); }
  absl::Status AfterBlock(int64_t) override { return absl::OkStatus(); }
  absl::Status Finish() override { return absl::OkStatus(); }

 private:
  const std::vector<Tensor>& xs_;
};

// [Note: activation checkpoint offload] (ZeRO-Infinity §5.1.2)
// x_l lives in device slot l mod 3 and, once written, in host row l, copied
// there on a copy stream while the next block computes. Backward, at block
// l (from L - 1 down): x_l is in its slot (L - 1 and L - 2 never left it;
// the others were fetched one block ahead), the recompute writes x_{l+1}
// into slot (l + 1) mod 3, and x_{l-1} is fetched into slot (l - 1) mod 3
// = (l + 2) mod 3, which block l + 1 finished with. Events order the two
// streams per slot:
//   ready[s]     compute has written the slot (the swap-out may start)
//   copied[s]    the slot's last copy (out or in) is done
//   released[s]  compute is done reading or writing the slot
// Without backward (evaluation) no checkpoint is needed again: the slots
// are a ring and nothing is copied.
class OffloadedStream : public ResidualStream {
 public:
  static absl::StatusOr<std::unique_ptr<OffloadedStream>> Create(Device& device, const std::vector<Tensor>& slots,
                                                                 const Tensor& host, int64_t layers) {
    auto out = std::unique_ptr<OffloadedStream>(new OffloadedStream(device, slots, host, layers));
    if (!out->copies()) return out;
    MEMWALL_ASSIGN_OR_RETURN(out->copy_, device.CreateStream("activation offload"));
    for (auto* events : {&out->ready_, &out->copied_, &out->released_}) {
      for (auto& e : *events) {
        MEMWALL_ASSIGN_OR_RETURN(e, device.CreateEvent());
      }
    }
    return out;
  }
  const Tensor& x(int64_t l) const override { return slots_[l % slots_.size()]; }
  absl::Status BeforeWrite(int64_t l) override {
    return copies() ? compute_.Wait(*copied_[l % kOffloadSlots]) : absl::OkStatus();
  }
  absl::Status Written(int64_t l) override {
    if (!copies()) return absl::OkStatus();
    const int64_t s = l % kOffloadSlots;
    MEMWALL_RETURN_IF_ERROR(compute_.Record(*ready_[s]));
    MEMWALL_RETURN_IF_ERROR(copy_->Wait(*ready_[s]));
    MEMWALL_RETURN_IF_ERROR(copy_->Copy(Host(l), slots_[s].data(), slots_[s].bytes()));
    return copy_->Record(*copied_[s]);
  }
  absl::Status BeforeBlock(int64_t l) override {
    if (!copies()) return absl::OkStatus();
    if (l == layers_ - 1) {  // forward is done with every slot
      for (auto& e : released_) MEMWALL_RETURN_IF_ERROR(compute_.Record(*e));
    }
    if (l - 1 >= 0 && l - 1 < layers_ - 2) {  // fetch x_{l-1} one block ahead
      const int64_t s = (l - 1) % kOffloadSlots;
      MEMWALL_RETURN_IF_ERROR(copy_->Wait(*released_[s]));
      MEMWALL_RETURN_IF_ERROR(copy_->Copy(slots_[s].data(), Host(l - 1), slots_[s].bytes()));
      MEMWALL_RETURN_IF_ERROR(copy_->Record(*copied_[s]));
    }
    MEMWALL_RETURN_IF_ERROR(compute_.Wait(*copied_[l % kOffloadSlots]));
    return compute_.Wait(*copied_[(l + 1) % kOffloadSlots]);
  }
  absl::Status AfterBlock(int64_t l) override {
    if (!copies()) return absl::OkStatus();
    MEMWALL_RETURN_IF_ERROR(compute_.Record(*released_[l % kOffloadSlots]));
    return compute_.Record(*released_[(l + 1) % kOffloadSlots]);
  }
  absl::Status Finish() override { return copies() ? copy_->Synchronize() : absl::OkStatus(); }

 private:
  OffloadedStream(Device& device, const std::vector<Tensor>& slots, const Tensor& host, int64_t layers)
      : compute_(device.compute_stream()), slots_(slots), host_(host), layers_(layers) {}
  bool copies() const { return host_.data() != nullptr; }
  void* Host(int64_t l) const { return static_cast<char*>(host_.data()) + l * slots_[0].bytes(); }

  Stream& compute_;
  const std::vector<Tensor>& slots_;
  Tensor host_;
  int64_t layers_;
  std::unique_ptr<Stream> copy_;
  std::array<std::unique_ptr<Event>, kOffloadSlots> ready_, copied_, released_;
};

// df = dlogits wte, the head's input gradient: a sum over the V words.
// [Note: the head's input gradient in fp32]
// A 16-bit df over a vocabulary that is not a multiple of kVocabPadding
// is computed into fp32 and rounded once by a cast: a GEMM into an fp32 C
// may run in aligned parts along K ([Note: a GEMM in aligned parts],
// ops/cuda_gemm.cu), where one into a 16-bit C must take the whole odd K in
// slow kernels (GPT-2's 50257 words: 0.16 of the GEMM rate on an H100).
// The same fp32 sum rounded once, so the result's semantics are unchanged.
// The fp32 chunk borrows `scratch` (the blocks' backward scratch, rows x 4d
// in the activations' type, unused until the blocks' backward and at least
// the chunk's rows x d in fp32).
absl::Status HeadInputGradient(const ops::MatrixView& dlogits, const Tensor& wte, const Tensor& scratch,
                               const Tensor& df, Stream& s) {
  const int64_t v = dlogits.cols, n = df.shape()[0], d = df.shape()[1];
  if (df.dtype() == DType::kF32 || v % kVocabPadding == 0) {
    return ops::Matmul(dlogits, false, wte, false, df, 1.0f, 0.0f, s);
  }
  if (scratch.bytes() < n * d * SizeOf(DType::kF32)) {
    return absl::InternalError(absl::StrCat("Gpt: the head's fp32 input gradient needs ", n * d * 4,
                                            " bytes of scratch; it has ", scratch.bytes()));
  }
  const Tensor df32(scratch.data(), DType::kF32, {n, d}, scratch.device());
  MEMWALL_RETURN_IF_ERROR(ops::Matmul(dlogits, false, wte, false, df32, 1.0f, 0.0f, s));
  return ops::Cast(df32, df, s);
}

}  // namespace

int64_t PaddedVocab(const GptConfig& config) {
  return (config.vocab() + kVocabPadding - 1) / kVocabPadding * kVocabPadding;
}

int64_t LogitsChunkRows(const GptConfig& config, int64_t rows) {
  return std::max<int64_t>(1, std::min<int64_t>(rows, (int64_t{1} << 26) / PaddedVocab(config)));
}

MemoryPlan ActivationPlan(const GptConfig& config, int64_t micro_batch, int64_t seq, DType compute,
                          bool checkpointing) {
  MemoryPlan plan;
  Scratch planning;
  planning.plan = &plan;
  // Planning allocates nothing and cannot fail.
  (void)AllocateRunBuffers(planning, config, micro_batch, seq, compute, /*backward=*/true, checkpointing,
                           checkpointing && config.offload_activations(), LogitsChunkRows(config, micro_batch * seq));
  return plan;
}

double ForwardFlopsPerToken(const GptConfig& c, int64_t seq) {
  const double d = double(c.hidden()), l = double(c.layers());
  const double matmul_params = l * 12.0 * d * d + double(c.vocab()) * d;
  // Scores q k^T and the weighted sum p v: 2 * 2 * seq * d per layer,
  // counted over the full seq x seq square as Megatron-LM's formula does.
  return 2.0 * matmul_params + 4.0 * l * double(seq) * d;
}

absl::StatusOr<GptConfigList> LoadConfigs(const std::string& path) {
  MEMWALL_ASSIGN_OR_RETURN(const std::string text, ReadRegularFile(path, "model config file"));
  return ParseConfigs(text, path);
}

absl::StatusOr<GptConfigList> ParseConfigs(const std::string& text, const std::string& origin) {
  GptConfigList list;
  if (absl::Status st = ParseTextProto(text, origin, &list); !st.ok()) return st;
  for (const GptConfig& c : list.configs()) {
    if (absl::Status st = ValidateConfig(c); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(origin, ": ", st.message()));
    }
  }
  return list;
}

absl::StatusOr<GptConfig> FindConfig(const GptConfigList& list, absl::string_view name) {
  std::string names;
  for (const GptConfig& c : list.configs()) {
    if (c.name() == name) return c;
    absl::StrAppend(&names, names.empty() ? "" : ", ", c.name());
  }
  return absl::InvalidArgumentError(absl::StrCat("no model config named '", name, "'; have: ", names));
}

absl::StatusOr<GptConfig> ResolveModel(const std::string& given, const std::string& entry) {
  if (given.empty()) return absl::InvalidArgumentError("no model given: a config file or a model name");
  std::error_code ec;
  const std::string user_path = UserPath(given, std::getenv);
  const std::string model = std::filesystem::exists(user_path, ec) ? user_path : given;
  const bool looks_like_path = model.find('/') != std::string::npos || absl::EndsWith(model, ".textproto") ||
                               absl::EndsWith(model, ".pbtxt");
  if (looks_like_path || std::filesystem::exists(model, ec)) {
    MEMWALL_ASSIGN_OR_RETURN(const std::string text, ReadRegularFile(model, "model config file"));
    // A file that sets any field of one GptConfig is that model (named
    // after the file unless it names itself); otherwise it is a list.
    GptConfig one;
    const absl::Status as_one = ParseTextProto(text, model, &one);
    if (as_one.ok() && one.ByteSizeLong() > 0) {
      if (!entry.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(model, " holds one GptConfig, not a GptConfigList, so it ",
                                                       "has no entry '", entry, "' to pick; drop --model_name"));
      }
      if (one.name().empty()) one.set_name(std::filesystem::path(model).stem().string());
      if (absl::Status st = ValidateConfig(one); !st.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(model, ": ", st.message()));
      }
      return one;
    }
    absl::StatusOr<GptConfigList> parsed = ParseConfigs(text, model);
    // Neither: the error of the kind the file was meant to be.
    if (!parsed.ok()) return absl::StrContains(text, "configs") ? parsed.status() : as_one;
    const GptConfigList& list = *parsed;
    if (list.configs_size() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(model, " sets no model: neither a GptConfig's fields nor a GptConfigList's configs"));
    }
    if (!entry.empty()) return FindConfig(list, entry);
    if (list.configs_size() == 1) return list.configs(0);
    std::vector<std::string> names;
    for (const GptConfig& c : list.configs()) names.push_back(c.name());
    return absl::InvalidArgumentError(absl::StrCat(model, " lists ", list.configs_size(),
                                                   " models; pick one with --model_name (", absl::StrJoin(names, ", "), ")"));
  }
  if (!entry.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("model '", model, "' is not a file, so it cannot have an entry '",
                                                   entry, "'"));
  }
  std::vector<std::string> names;
  for (const char* path : kProjectModelLists) {
    absl::StatusOr<GptConfigList> list = LoadConfigs(ProjectFile(path));
    if (!list.ok()) continue;
    for (const GptConfig& c : list->configs()) {
      if (c.name() == model) return c;
      names.push_back(c.name());
    }
  }
  if (names.empty()) {
    return absl::NotFoundError(absl::StrCat("model '", model, "' is neither a file nor a name: the project's lists (",
                                            kProjectModelLists[0], ", ...) are not under ",
                                            std::filesystem::current_path(ec).string(),
                                            ", the binary's runfiles or the workspace; give a config file"));
  }
  return absl::NotFoundError(absl::StrCat("model '", model, "' is neither a file nor a model name; the names are: ",
                                          absl::StrJoin(names, ", ")));
}

// ---- Initialization -------------------------------------------------------

namespace {
uint64_t Fnv1a(absl::string_view s) {
  uint64_t h = 1469598103934665603ULL;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ULL;
  return h;
}

bool EndsWith(absl::string_view s, absl::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
}  // namespace

namespace {
// The container "h" that owns the blocks h.0 ... h.{L-1}.
class BlockList : public Module {
 public:
  BlockList(int64_t layers, int64_t d, int64_t heads, int64_t tiles, const LinearScratch* scratch,
            std::vector<Block*>& out)
      : Module("h") {
    for (int64_t i = 0; i < layers; ++i) {
      out.push_back(&AddChild(std::make_unique<Block>(i, d, heads, tiles, scratch)));
    }
  }
};
}  // namespace

Gpt::Gpt(const GptConfig& config)
    : Module(""), config_(config), linear_scratch_(std::make_unique<LinearScratch>()) {
  const int64_t d = config.hidden();
  wte_ = &AddChild(std::make_unique<EmbeddingModule>("wte", config.vocab(), d));
  wpe_ = &AddChild(std::make_unique<EmbeddingModule>("wpe", config.positions(), d));
  AddChild(std::make_unique<BlockList>(config.layers(), d, config.heads(), config.tiling(),
                                       linear_scratch_.get(), blocks_));
  ln_f_ = &AddChild(std::make_unique<LayerNormModule>("ln_f", d));
}

Gpt::~Gpt() = default;

absl::StatusOr<std::unique_ptr<Gpt>> Gpt::Create(const GptConfig& config) {
  MEMWALL_RETURN_IF_ERROR(ValidateConfig(config));
  return std::unique_ptr<Gpt>(new Gpt(config));
}

void Gpt::InitialValues(uint64_t seed, const Parameter& p, int64_t begin, int64_t count,
                        float* out) const {
  // A tile takes its logical parameter's values: element (r, c) of a tile
  // of width w is element (r, slice.begin + c) of the logical parameter.
  const std::string& name = p.slice.has_value() ? p.slice->name : p.name;
  if (EndsWith(name, ".bias")) {
    std::fill(out, out + count, 0.0f);
    return;
  }
  if (dynamic_cast<LayerNormModule*>(p.owner) != nullptr) {
    std::fill(out, out + count, 1.0f);
    return;
  }
  const float residual_std = 0.02f / std::sqrt(2.0f * float(config_.layers()));
  const float std = EndsWith(name, ".c_proj.weight") ? residual_std : 0.02f;
  const uint64_t key = SplitMix64(seed ^ Fnv1a(name));
  if (!p.slice.has_value()) {
    ScaledNormals(key, begin, count, std, out);
    return;
  }
  // Row r of the tile is one run of the logical row: element (r, c) for c
  // in [0, w) is logical element r * width + slice.begin + c.
  const int64_t w = p.shape.back();
  for (int64_t e = begin, end = begin + count; e < end;) {
    const int64_t r = e / w, c = e % w, run = std::min(w - c, end - e);
    ScaledNormals(key, r * p.slice->width + p.slice->begin + c, run, std, out + (e - begin));
    e += run;
  }
}

absl::Status Gpt::Initialize(uint64_t seed, Device& device) {
  MEMWALL_ASSIGN_OR_RETURN(const DType dtype, CheckBound(*this, false));
  Stream& s = device.compute_stream();
  std::vector<float> host;
  std::vector<uint16_t> half;
  ThreadPool pool(0);  // one thread per core of this rank's share
  constexpr int64_t kChunk = 1 << 16;
  for (Parameter* p : Parameters()) {
    if (p->value.data() == nullptr) return Unbound(*p);
    host.resize(p->numel());
    // Each element is a pure function of its index: any split into
    // threads gives the same values.
    const int64_t n = p->numel();
    pool.ParallelFor((n + kChunk - 1) / kChunk, [&](int64_t c) {
      const int64_t begin = c * kChunk;
      InitialValues(seed, *p, begin, std::min(n, begin + kChunk) - begin, host.data() + begin);
    });
    const void* src = host.data();
    if (dtype != DType::kF32) {
      half.resize(host.size());
      MEMWALL_RETURN_IF_ERROR(Convert(host.data(), DType::kF32, half.data(), dtype, host.size()));
      src = half.data();
    }
    MEMWALL_RETURN_IF_ERROR(s.Copy(p->value.data(), src, p->value.bytes()));
    MEMWALL_RETURN_IF_ERROR(s.Synchronize());  // `host` is reused
  }
  return absl::OkStatus();
}

absl::StatusOr<LossSum> Gpt::ForwardBackward(Device& device, const int32_t* ids,
                                              const int32_t* targets, int64_t batch, int64_t t,
                                              float grad_scale, bool backward) {
  return Run(device, ids, targets, batch, t, grad_scale, backward, nullptr);
}

absl::StatusOr<std::vector<float>> Gpt::Logits(Device& device, const int32_t* ids, int64_t batch,
                                               int64_t t) {
  std::vector<float> logits;
  MEMWALL_RETURN_IF_ERROR(Run(device, ids, nullptr, batch, t, 1.0f, false, &logits).status());
  return logits;
}

// The pass, on the compute stream:
//   x_0 = wte[ids] + wpe[pos];  x_{l+1} = block_l(x_l);  f = ln_f(x_L)
//   per chunk of rows: logits = f wte^T; fused cross-entropy writes
//   dlogits over them; with backward, df = dlogits wte and
//   dwte += dlogits^T f right away, so at most one chunk of logits exists.
//   Then ln_f, the blocks in reverse (recomputed from x_l when
//   checkpointing) and the two embeddings.
absl::StatusOr<LossSum> Gpt::Run(Device& device, const int32_t* ids, const int32_t* targets,
                                 int64_t batch, int64_t t, float grad_scale, bool backward,
                                 std::vector<float>* logits_out) {
  MEMWALL_ASSIGN_OR_RETURN(const DType dtype, CheckBound(*this, backward));
  if (batch <= 0 || t <= 0 || t > config_.positions()) {
    return absl::InvalidArgumentError(absl::StrCat("Gpt: batch ", batch, " x sequence ", t,
                                                   " needs batch > 0 and 0 < sequence <= ",
                                                   config_.positions(), " positions"));
  }
  const int64_t d = config_.hidden(), v = config_.vocab(), vp = PaddedVocab(config_), rows = batch * t;
  const int64_t layers = config_.layers();
  for (int64_t r = 0; r < rows; ++r) {
    if (ids[r] < 0 || ids[r] >= v) {
      return absl::InvalidArgumentError(absl::StrCat("Gpt: token id ", ids[r], " at position ", r,
                                                     " is outside the vocabulary [0, ", v, ")"));
    }
    if (targets != nullptr && targets[r] >= v) {
      return absl::InvalidArgumentError(absl::StrCat("Gpt: target ", targets[r], " at position ",
                                                     r, " is outside the vocabulary [0, ", v,
                                                     ")"));
    }
  }
  Stream& s = device.compute_stream();
  // Every buffer of the pass, first (ActivationPlan states the same ones).
  const bool checkpoint = config_.activation_checkpointing();
  const bool offload = checkpoint && config_.offload_activations();
  const int64_t chunk = logits_out != nullptr ? rows : LogitsChunkRows(config_, rows);
  Scratch scratch{&device};
  MEMWALL_ASSIGN_OR_RETURN(RunBuffers b, AllocateRunBuffers(scratch, config_, batch, t, dtype, backward,
                                                            checkpoint, offload, chunk));
  std::unique_ptr<ResidualStream> xs;
  if (offload) {
    MEMWALL_ASSIGN_OR_RETURN(xs, OffloadedStream::Create(device, b.xs, b.host_xs, layers));
  } else {
    xs = std::make_unique<ResidentStream>(b.xs);
  }
  std::vector<int32_t> positions(rows);
  for (int64_t r = 0; r < rows; ++r) positions[r] = static_cast<int32_t>(r % t);
  // Every exit, an error's too (a failing hook), first waits for the work
  // queued so far: it reads the caller's ids and targets and `positions`,
  // and writes the pass's buffers, all freed when this call returns (so
  // this is declared after them).
  absl::Cleanup drain = [&] {
    (void)s.Synchronize();
    (void)xs->Finish();
  };
  linear_scratch_->dtype = dtype;
  linear_scratch_->in = b.cast_in;
  linear_scratch_->out = b.cast_out;
  linear_scratch_->tile = b.tile;
  MEMWALL_RETURN_IF_ERROR(s.Copy(b.ids.data(), ids, rows * sizeof(int32_t)));
  MEMWALL_RETURN_IF_ERROR(s.Copy(b.pos.data(), positions.data(), rows * sizeof(int32_t)));
  if (targets != nullptr) {
    MEMWALL_RETURN_IF_ERROR(s.Copy(b.targets.data(), targets, rows * sizeof(int32_t)));
  } else {
    MEMWALL_RETURN_IF_ERROR(s.Memset(b.targets.data(), 0xff, rows * sizeof(int32_t)));  // -1: none
  }

  // Residual stream x_0 ... x_L (the block inputs are what checkpointing keeps).
  {
    MEMWALL_RETURN_IF_ERROR(xs->BeforeWrite(0));
    MEMWALL_ASSIGN_OR_RETURN(HookScope wte_scope, HookScope::Forward(*wte_));
    MEMWALL_RETURN_IF_ERROR(ops::Embedding(b.ids, wte_->Table(), xs->x(0), s));
    MEMWALL_RETURN_IF_ERROR(wte_scope.Finish());
    MEMWALL_ASSIGN_OR_RETURN(HookScope wpe_scope, HookScope::Forward(*wpe_));
    MEMWALL_RETURN_IF_ERROR(ops::Embedding(b.pos, wpe_->Table(), b.pos_rows, s));
    MEMWALL_RETURN_IF_ERROR(wpe_scope.Finish());
    MEMWALL_RETURN_IF_ERROR(ops::Add(xs->x(0), b.pos_rows, xs->x(0), s));
    MEMWALL_RETURN_IF_ERROR(xs->Written(0));
  }
  for (int64_t l = 0; l < layers; ++l) {
    MEMWALL_RETURN_IF_ERROR(xs->BeforeWrite(l + 1));
    MEMWALL_RETURN_IF_ERROR(
        blocks_[l]->Forward(xs->x(l), b.acts[checkpoint ? 0 : l], xs->x(l + 1), batch, t, s));
    MEMWALL_RETURN_IF_ERROR(xs->Written(l + 1));
  }
  MEMWALL_RETURN_IF_ERROR(ln_f_->Forward(xs->x(layers), b.f, b.f_mean, b.f_rstd, s));

  // The tied head, a chunk of rows at a time (<= 64 Mi logits per chunk).
  const Tensor& logits = b.logits;
  const Tensor& losses = b.losses;
  // No op reads the padding columns, but a copy of whole rows (a cast, the
  // CpuDevice's widening) passes over them: zeros, not stale memory.
  if (vp > v) MEMWALL_RETURN_IF_ERROR(s.Memset(logits.data(), 0, logits.bytes()));
  // The head's matmul operands in the parameters' type: f once, each
  // chunk's dlogits (rounded copies only for fp16 parameters).
  MEMWALL_ASSIGN_OR_RETURN(const Tensor f_in, ToStorage(b.f, dtype, b.f_storage, rows, d, s));
  std::vector<char> logits_chunk;  // a chunk as stored, for logits_out
  const Tensor& df = b.df;
  if (logits_out != nullptr) logits_out->resize(rows * v);
  {
    MEMWALL_ASSIGN_OR_RETURN(HookScope head_scope, HookScope::Forward(*wte_));
    // The head writes wte's gradient: a backward scope of wte, nested.
    std::optional<HookScope> head_grad_scope;
    if (backward && logits_out == nullptr) {
      MEMWALL_ASSIGN_OR_RETURN(head_grad_scope, HookScope::Backward(*wte_));
    }
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t n = std::min(chunk, rows - r0);
      const ops::MatrixView lg(Rows(logits, 0, n, vp), v);  // rows padded to Vp
      MEMWALL_RETURN_IF_ERROR(ops::Matmul(Rows(f_in, r0, n, d), false, wte_->Table(), true, lg,
                                          1.0f, 0.0f, s));
      if (logits_out != nullptr) {  // the first V columns of each row, widened exactly
        logits_chunk.resize(lg.tensor.bytes());
        MEMWALL_RETURN_IF_ERROR(s.Copy(logits_chunk.data(), lg.tensor.data(), lg.tensor.bytes()));
        MEMWALL_RETURN_IF_ERROR(s.Synchronize());
        for (int64_t r = 0; r < n; ++r) {
          MEMWALL_RETURN_IF_ERROR(Convert(logits_chunk.data() + r * vp * SizeOf(lg.tensor.dtype()), lg.tensor.dtype(),
                                          logits_out->data() + (r0 + r) * v, DType::kF32, v));
        }
        continue;
      }
      MEMWALL_RETURN_IF_ERROR(ops::SoftmaxCrossEntropy(lg, b.targets.Slice(r0, n),
                                                       losses.Slice(r0, n), grad_scale, s));
      if (!backward) continue;
      MEMWALL_ASSIGN_OR_RETURN(const Tensor dlogits_stored,
                               ToStorage(lg.tensor, dtype, b.dlogits_storage, n, vp, s));
      const ops::MatrixView dlogits(dlogits_stored, v);
      MEMWALL_RETURN_IF_ERROR(HeadInputGradient(dlogits, wte_->Table(), b.g.big, Rows(df, r0, n, d), s));
      MEMWALL_RETURN_IF_ERROR(ops::Matmul(dlogits, true, Rows(f_in, r0, n, d), false,
                                          wte_->GradTable(), 1.0f, 1.0f, s));
    }
    if (head_grad_scope.has_value()) MEMWALL_RETURN_IF_ERROR(head_grad_scope->Finish());
    MEMWALL_RETURN_IF_ERROR(head_scope.Finish());
  }

  if (backward) {
    const Tensor& dresid = b.dresid;
    BlockGradScratch& g = b.g;
    MEMWALL_RETURN_IF_ERROR(ln_f_->Backward(df, xs->x(layers), b.f_mean, b.f_rstd, dresid, s));
    for (int64_t l = layers - 1; l >= 0; --l) {
      BlockActivations& a = b.acts[checkpoint ? 0 : l];
      MEMWALL_RETURN_IF_ERROR(xs->BeforeBlock(l));
      if (checkpoint) {  // recompute block l from its saved input
        MEMWALL_RETURN_IF_ERROR(blocks_[l]->Forward(xs->x(l), a, xs->x(l + 1), batch, t, s));
      }
      MEMWALL_RETURN_IF_ERROR(blocks_[l]->Backward(xs->x(l), a, dresid, g, batch, t, s));
      MEMWALL_RETURN_IF_ERROR(xs->AfterBlock(l));
    }
    MEMWALL_ASSIGN_OR_RETURN(HookScope wpe_scope, HookScope::Backward(*wpe_));
    MEMWALL_RETURN_IF_ERROR(ops::EmbeddingBackward(b.pos, dresid, wpe_->GradTable(), s));
    MEMWALL_RETURN_IF_ERROR(wpe_scope.Finish());
    MEMWALL_ASSIGN_OR_RETURN(HookScope wte_scope, HookScope::Backward(*wte_));
    MEMWALL_RETURN_IF_ERROR(ops::EmbeddingBackward(b.ids, dresid, wte_->GradTable(), s));
    MEMWALL_RETURN_IF_ERROR(wte_scope.Finish());
  }

  std::vector<float> host_losses(rows);
  if (logits_out == nullptr) {
    MEMWALL_RETURN_IF_ERROR(s.Copy(host_losses.data(), losses.data(), rows * sizeof(float)));
  }
  MEMWALL_RETURN_IF_ERROR(s.Synchronize());
  MEMWALL_RETURN_IF_ERROR(xs->Finish());
  LossSum result;
  if (targets != nullptr) {
    for (int64_t r = 0; r < rows; ++r) {
      if (targets[r] < 0) continue;
      result.sum += host_losses[r];
      ++result.tokens;
    }
  }
  return result;
}

}  // namespace memwall::models
