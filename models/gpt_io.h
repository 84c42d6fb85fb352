// GPT-2 weights as safetensors with Hugging Face names and layouts
// (wte.weight, wpe.weight, h.N.ln_1.weight, h.N.attn.c_attn.weight (in, out),
// ..., ln_f.bias), so a file loads into transformers' GPT2LMHeadModel and a
// Hugging Face GPT-2 file loads here.
#ifndef MEMWALL_MODELS_GPT_IO_H_
#define MEMWALL_MODELS_GPT_IO_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/gpt.h"
#include "models/safetensors.h"
#include "runtime/device.h"

namespace memwall::models {

// A parameter of the untiled model: memory-centric tiling (GptConfig.tiling)
// stores a projection's weight and bias as tiles (Parameter::slice); files
// and comparisons use the whole.
struct LogicalParameter {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};
// `values` (every parameter of `model`, back to back in Module::Parameters()
// order) as the untiled model's parameters, in its order: each tiled
// projection's tiles joined into one weight and one bias. An untiled model's
// parameters pass through.
absl::StatusOr<std::vector<LogicalParameter>> JoinTiles(Gpt& model, const std::vector<float>& values);

// Writes every parameter of `model` to `path` as fp32 (bound values,
// widened exactly when bound as 16-bit), with metadata {"format": "pt"} as
// transformers expects, and {"memwall_gpt_config": layers, hidden, heads,
// vocab and positions as a GptConfig text proto}, whose heads ImportGpt
// checks (the tensors do not show them). A tiled model writes its
// projections whole: the untiled model's file, byte for byte. A NaN or infinite weight is refused with InvalidArgument naming the
// tensor and element; nothing is written then.
absl::Status ExportGpt(Gpt& model, Device& device, const std::string& path);
// The metadata every export writes for `config` (//zero:consolidate too).
std::map<std::string, std::string> ExportMetadata(const GptConfig& config);
// Hugging Face's config.json for `config` (GPT2Config: model_type "gpt2",
// n_layer, n_embd, n_head, vocab_size, n_positions, the tanh GELU and
// LayerNorm epsilon memwall's GPT computes with, a tied LM head).
std::string HfConfigJson(const GptConfig& config);
// Writes HfConfigJson beside `weights_path`: DIR/config.json for
// DIR/F.safetensors, so the directory loads with from_pretrained. Every
// export writes one.
absl::Status WriteHfConfig(const GptConfig& config, const std::string& weights_path);
// The head count recorded with a weights file: its memwall_gpt_config
// metadata, else the n_head of the config.json beside it; NotFound when
// neither says (a bare tensor file), InvalidArgument when they disagree or
// config.json is not readable JSON.
absl::StatusOr<int64_t> RecordedHeads(const SafetensorsFile& file);
// The same layout from flat fp32 host values in Module::Parameters() order
// (a trainer's master weights, say): `values` holds every parameter, back to
// back.
absl::Status ExportGpt(Gpt& model, const std::vector<float>& values, const std::string& path);
// The same file from flat fp32 values read a range at a time: read(offset,
// n, out) fills elements [offset, offset + n) of that order (one parameter
// a call). One logical tensor is in host memory at a time, so a trainer's
// master weights are never whole on the host.
using FlatValueReader = std::function<absl::Status(int64_t offset, int64_t n, float* out)>;
absl::Status ExportGpt(Gpt& model, const FlatValueReader& read, const std::string& path);

// Loads `file` into the model's bound values. Accepted: every parameter name,
// optionally prefixed "transformer." (GPT2LMHeadModel.save_pretrained), in
// F32, F16 or BF16 (converted to the bound dtype, rounding to nearest even). Ignored: "attn.bias" and
// "attn.masked_bias" mask buffers, and "lm_head.weight" when it holds wte's
// values (the head is tied to wte: one tensor here). Any missing name, other
// extra name, name present both with and without the prefix, wrong shape,
// integer dtype or an lm_head.weight that differs from wte is an
// InvalidArgument naming the tensor, reported before any value is written;
// so are a NaN or infinite weight and a file exported from a model with
// other heads.
// A tiled model takes each projection's tiles from the whole tensor.
absl::Status ImportGpt(const SafetensorsFile& file, Gpt& model, Device& device);

// The config a file holds: layers from the h.N blocks, hidden and vocabulary
// from wte, positions from wpe; heads, which the tensors cannot show, from
// RecordedHeads when `heads` is 0. A `heads` that contradicts the recorded
// count, or 0 with nothing recorded, is an InvalidArgument saying which.
absl::StatusOr<GptConfig> InferGptConfig(const SafetensorsFile& file, int64_t heads = 0);

}  // namespace memwall::models

#endif  // MEMWALL_MODELS_GPT_IO_H_
