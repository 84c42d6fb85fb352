// GPT-2, exactly (Radford et al. 2019; Hugging Face GPT2LMHeadModel):
//   x = wte[ids] + wpe[positions]
//   per block h.N:  x = x + attn.c_proj(Attention(attn.c_attn(ln_1(x))))
//                   x = x + mlp.c_proj(gelu_tanh(mlp.c_fc(ln_2(x))))
//   logits = ln_f(x) wte^T            (LM head tied to the token embedding)
// LayerNorm eps 1e-5, attention scale 1/sqrt(head_dim), biases on every
// linear and LayerNorm, no dropout. Linear weights are stored (in, out) as
// in Hugging Face's Conv1D, so safetensors import/export is a plain copy.
//
// Initialization (GPT-2 / Megatron): weights N(0, 0.02), the two residual
// output projections (attn.c_proj, mlp.c_proj) N(0, 0.02 / sqrt(2 layers)),
// biases 0, LayerNorm weights 1. Every element is a pure function of (seed,
// parameter name, index), so any partition of the parameters initializes
// identically.
//
// The model computes on one Device's compute stream; parameter and gradient
// storage is bound by the engine (models/module.h). Parameters and
// gradients are bound as fp32 or, for mixed precision, all as fp16 or all
// as bf16; then every matmul takes 16-bit operands with fp32 accumulation,
// and each gradient accumulation rounds once. Activations follow the
// parameters (models/layers.h ActivationDType): bf16 end to end with bf16
// parameters (each op rounds its output once; LayerNorm statistics, the
// attention's lse and the losses stay fp32), fp32 with fp16 parameters
// (each Linear rounds its input, and in backward its output gradient, to
// fp16 first) and with fp32 ones.
#ifndef MEMWALL_MODELS_GPT_H_
#define MEMWALL_MODELS_GPT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/gpt_config.pb.h"
#include "models/layers.h"
#include "models/module.h"
#include "runtime/device.h"
#include "runtime/memory_plan.h"

namespace memwall::models {

inline constexpr int64_t kGpt2Vocab = 50257;

// Every field is checked; the message names the config and the field.
absl::Status ValidateConfig(const GptConfig& config);

// A micro-batch of `micro_batch` sequences of `seq` tokens whose buffers
// this config can size without overflow: rows = micro_batch * seq below
// 2^31, and a bound on the activation plan's bytes,
//   8 (L + 3) rows (32 d + 2 heads) + 16 rows V  <  2^53,
// which exceeds what ActivationPlan states by a wide margin. Refused with
// InvalidArgument naming micro_batch, seq and the model's dimensions.
absl::Status CheckRunShape(const GptConfig& config, int64_t micro_batch, int64_t seq);

// Exact parameter count (tied head counted once; tiling splits parameters,
// it does not add any):
//   V d + P d + L (12 d^2 + 13 d) + 2 d
// per block: ln_1, ln_2 4d; c_attn 3d^2 + 3d; attn.c_proj d^2 + d;
// c_fc 4d^2 + 4d; mlp.c_proj 4d^2 + d.
int64_t CountParameters(const GptConfig& config);

// Forward FLOPs of one token, as the papers count them (multiply-add = 2):
// 2 * (parameters in matmuls) + causal attention scores and values. The
// training step is 3x this (forward, backward = 2 forwards), plus one more
// forward per token when blocks are recomputed.
double ForwardFlopsPerToken(const GptConfig& config, int64_t seq);

// The stored row length of the logits: the vocabulary rounded up to a
// multiple of kVocabPadding, so every row starts aligned for the tensor-core
// GEMMs (50257 -> 50304). The padding columns are never computed, read or
// exported: the LM head's ops see the first V columns (ops::MatrixView).
inline constexpr int64_t kVocabPadding = 128;
int64_t PaddedVocab(const GptConfig& config);

// The rows of logits the LM head computes at a time in training: at most
// 2^26 stored logits (256 MiB of fp32) per chunk.
int64_t LogitsChunkRows(const GptConfig& config, int64_t rows);

// What Gpt::ForwardBackward allocates for one micro-batch of micro_batch x
// seq tokens on the device, at its peak (rows = micro_batch seq, hidden d,
// L layers, H heads, Vp = PaddedVocab, chunk = LogitsChunkRows; a = the bytes of
// an activation, ActivationDType(compute): 2 for bf16, else 4; statistics,
// losses and ids take 4; c = 2 for fp16's rounded operands):
//   "residual stream"        kActivations  a (L + 1) rows d; a min(L + 1, 3) rows d
//                                          with offload_activations
//   "activation checkpoints (host)"  pinned host kActivations  a (L + 1) rows d,
//                                          with offload_activations and L + 1 > 3
//   "block activations"      kActivations  a rows 15 d + 4 rows (H + 4) per block;
//                                          one block when checkpointing, else L
//   "embeddings, ln_f, losses, ids"  kActivations  a rows 2 d + 4 rows 6
//   "backward scratch"       kActivations  a rows 12 d + 4 rows H
//   "logits chunk"           kWorkspace    a chunk Vp
//   "16-bit operands"        kWorkspace    c (2 rows 4d + rows d + chunk Vp), fp16 only
//   "tiled linear scratch"   kWorkspace    a rows 4d / k, with tiling k > 1
// One function sizes them for both: ForwardBackward allocates its buffers
// through it, and this plan is that function run in planning mode (Scratch
// with a plan: nothing allocated).
MemoryPlan ActivationPlan(const GptConfig& config, int64_t micro_batch, int64_t seq, DType compute,
                          bool checkpointing);

// Reads a GptConfigList text proto; every entry is validated.
absl::StatusOr<GptConfigList> LoadConfigs(const std::string& path);
// The same for text already read (`origin` names it in errors).
absl::StatusOr<GptConfigList> ParseConfigs(const std::string& text, const std::string& origin);
// The entry called `name`; an unknown name is InvalidArgument listing them.
absl::StatusOr<GptConfig> FindConfig(const GptConfigList& list, absl::string_view name);

// The project's model lists, relative to the repository root (and to the
// runfiles tree of a target that has //models:configs as data).
inline constexpr const char* kProjectModelLists[] = {"models/configs/gpt.textproto", "models/configs/papers.textproto"};

// A tool's --model: the path of a GptConfig text proto (named after the
// file's stem when it sets no name) or of a GptConfigList (`entry` picks a
// list's entry; a one-entry list needs none), or else the
// name of an entry in the project's lists (`quickstart`, `gpt_1.3b`,
// `offload_10b`, ...). A relative path is the user's: taken from where
// `bazel run` started (runtime/launch.h's UserPath) when a file is there.
// Errors name what was looked for and list the names there are.
absl::StatusOr<GptConfig> ResolveModel(const std::string& model, const std::string& entry = "");


// Sum of per-token losses over the tokens whose target is >= 0.
struct LossSum {
  double sum = 0;
  int64_t tokens = 0;
  double mean() const { return tokens > 0 ? sum / double(tokens) : 0.0; }
};

class Gpt : public Module {
 public:
  static absl::StatusOr<std::unique_ptr<Gpt>> Create(const GptConfig& config);
  ~Gpt() override;

  const GptConfig& config() const { return config_; }

  // Fills every bound parameter value (see the file comment).
  absl::Status Initialize(uint64_t seed, Device& device);
  // Elements [begin, begin + count) of p's initial values in fp32: what
  // Initialize writes (before rounding to 16 bits), for any partition of
  // the parameters (ZeRO stage 3 initializes each rank's shard alone).
  void InitialValues(uint64_t seed, const Parameter& p, int64_t begin, int64_t count,
                     float* out) const;

  // One micro-batch of `batch` sequences of `t` tokens: ids and targets are
  // host arrays of batch * t (a negative target is ignored). Returns the
  // summed loss. With `backward`, also accumulates (+=) d(grad_scale * sum
  // of losses)/d(params) into the bound gradients. Synchronizes the device's
  // compute stream before returning.
  absl::StatusOr<LossSum> ForwardBackward(Device& device, const int32_t* ids,
                                          const int32_t* targets, int64_t batch, int64_t t,
                                          float grad_scale, bool backward);
  // Logits (batch * t, vocab) on the host: for tests and tools.
  absl::StatusOr<std::vector<float>> Logits(Device& device, const int32_t* ids, int64_t batch,
                                            int64_t t);

 private:
  explicit Gpt(const GptConfig& config);
  absl::StatusOr<LossSum> Run(Device& device, const int32_t* ids, const int32_t* targets,
                              int64_t batch, int64_t t, float grad_scale, bool backward,
                              std::vector<float>* logits_out);

  GptConfig config_;
  std::unique_ptr<LinearScratch> linear_scratch_;  // set per pass
  EmbeddingModule* wte_;
  EmbeddingModule* wpe_;
  std::vector<Block*> blocks_;
  LayerNormModule* ln_f_;
};

}  // namespace memwall::models

#endif  // MEMWALL_MODELS_GPT_H_
