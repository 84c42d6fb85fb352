#include "engine/deepspeed_config.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "google/protobuf/struct.pb.h"
#include "infinity/nvme_state_store.h"
#include "runtime/bounds.h"
#include "runtime/files.h"
#include "runtime/status.h"
#include "zero/config.h"

namespace memwall::engine {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;
using zero::OffloadOptimizerConfig;
using zero::OffloadParamConfig;
using zero::TrainingConfig;

// Keys memwall has no counterpart for, and what to do instead.
const std::map<std::string, std::string>& Refusals() {
  static const auto* refusals = new std::map<std::string, std::string>{
      {"amp", "use \"bf16\": {\"enabled\": true} or the \"fp16\" block"},
      {"zero_optimization.zero_hpz_partition_size", "ZeRO++ is not implemented; delete the key"},
      {"zero_optimization.zero_quantized_weights", "ZeRO++ is not implemented; delete the key"},
      {"zero_optimization.zero_quantized_gradients", "ZeRO++ is not implemented; delete the key"},
      {"flops_profiler", "the progress line reports TFLOPS; --trace_dir writes a Chrome trace per step"},
      {"tensorboard", "read the step log (OUT/train.log)"},
      {"wandb", "read the step log (OUT/train.log)"},
      {"csv_monitor", "read the step log (OUT/train.log)"},
      {"comms_logger", "--trace_dir writes every collective to a Chrome trace"},
      {"compression_training", "not implemented; delete the block"},
      {"data_efficiency", "not implemented; delete the block"},
      {"sparse_attention", "not implemented; delete the block"},
      {"pipeline", "memwall is data parallel only; delete the block"},
  };
  return *refusals;
}

// Walks the JSON object, translating each key it knows and collecting a
// refusal for every key it cannot honour.
class Translator {
 public:
  explicit Translator(DeepSpeedTranslation& out) : out_(out) {}

  void Refuse(const std::string& key, const std::string& why) { refused_.push_back(absl::StrCat(key, ": ", why)); }
  const std::vector<std::string>& refused() const { return refused_; }

  void Line(const std::string& key, const Value& v, const std::string& becomes) {
    out_.lines.push_back(absl::StrCat(key, " = ", JsonValueText(v), " -> ", becomes));
  }
  void Note(const std::string& key, const std::string& becomes) {
    out_.lines.push_back(absl::StrCat(key, " (absent) -> ", becomes));
  }

  // The Hugging Face Trainer's placeholder, refused saying what to write
  // in its place; true when `v` is it.
  bool RefusedAuto(const std::string& key, const Value& v, absl::string_view instead) {
    if (v.kind_case() != Value::kStringValue || v.string_value() != "auto") return false;
    Refuse(key, absl::StrCat("\"auto\" is filled in by the Hugging Face Trainer; write ", instead));
    return true;
  }

  // Typed reads; a wrong type is refused by name and yields nothing.
  std::optional<double> Number(const std::string& key, const Value& v) {
    if (RefusedAuto(key, v, "the number")) return std::nullopt;
    if (v.kind_case() != Value::kNumberValue || !std::isfinite(v.number_value())) {
      Refuse(key, absl::StrCat("must be a number, not ", JsonValueText(v)));
      return std::nullopt;
    }
    return v.number_value();
  }
  // A whole number in [lo, hi].
  std::optional<int64_t> Integer(const std::string& key, const Value& v, int64_t lo, int64_t hi) {
    const std::optional<double> d = Number(key, v);
    if (!d) return std::nullopt;
    if (*d != std::floor(*d) || *d < double(lo) || *d > double(hi)) {
      Refuse(key, absl::StrCat("must be a whole number in [", lo, ", ", hi, "], not ", JsonValueText(v)));
      return std::nullopt;
    }
    return static_cast<int64_t>(*d);
  }
  std::optional<bool> Bool(const std::string& key, const Value& v) {
    if (RefusedAuto(key, v, "true or false")) return std::nullopt;
    if (v.kind_case() != Value::kBoolValue) {
      Refuse(key, absl::StrCat("must be true or false, not ", JsonValueText(v)));
      return std::nullopt;
    }
    return v.bool_value();
  }
  std::optional<std::string> String(const std::string& key, const Value& v) {
    if (v.kind_case() != Value::kStringValue) {
      Refuse(key, absl::StrCat("must be a string, not ", JsonValueText(v)));
      return std::nullopt;
    }
    return v.string_value();
  }
  const Struct* Object(const std::string& key, const Value& v) {
    if (v.kind_case() != Value::kStructValue) {
      Refuse(key, absl::StrCat("must be an object, not ", JsonValueText(v)));
      return nullptr;
    }
    return &v.struct_value();
  }
  // A key that only keeps memwall's behaviour at `expected` (DeepSpeed's
  // value for what memwall does): accepted at that value, refused with
  // `why` otherwise.
  void Only(const std::string& key, const Value& v, bool expected, const std::string& why) {
    const std::optional<bool> b = Bool(key, v);
    if (!b) return;
    if (*b != expected) return Refuse(key, why);
    Line(key, v, "memwall's behaviour");
  }
  // A key whose null (DeepSpeed's default) is memwall's behaviour.
  void OnlyNull(const std::string& key, const Value& v, const std::string& why) {
    if (v.kind_case() != Value::kNullValue) return Refuse(key, why);
    Line(key, v, "memwall's behaviour");
  }
  void Only(const std::string& key, const Value& v, double expected, const std::string& why) {
    const std::optional<double> d = Number(key, v);
    if (!d) return;
    if (*d != expected) return Refuse(key, why);
    Line(key, v, "memwall's behaviour");
  }

  // Calls `handle(key, value)` for each entry of `object` (keys prefixed by
  // `prefix`) whose key `handlers` lists; the rest are refused.
  using Handler = std::function<void(const std::string&, const Value&)>;
  void Walk(const Struct& object, const std::string& prefix, const std::map<std::string, Handler>& handlers) {
    std::vector<std::string> names;  // in order, so the lines and refusals read the same every time
    for (const auto& field : object.fields()) names.push_back(field.first);
    std::sort(names.begin(), names.end());
    for (const std::string& name : names) {
      const Value& value = object.fields().at(name);
      const std::string key = prefix + name;
      if (auto h = handlers.find(name); h != handlers.end()) {
        h->second(key, value);
      } else if (auto r = Refusals().find(key); r != Refusals().end()) {
        if (value.kind_case() == Value::kStructValue && value.struct_value().fields().count("enabled") &&
            value.struct_value().fields().at("enabled").bool_value() == false) {
          Line(key, value, "disabled: nothing to do");
        } else {
          Refuse(key, r->second);
        }
      } else {
        Refuse(key, "not a DeepSpeed key memwall knows (docs/deepspeed.md lists those it translates)");
      }
    }
  }

 private:
  DeepSpeedTranslation& out_;
  std::vector<std::string> refused_;
};

std::string BytesLine(const char* field, int64_t elements, int64_t bytes_per_element) {
  return absl::StrCat(field, ": ", elements * bytes_per_element, " (", elements, " elements x ", bytes_per_element,
                      " bytes)");
}

// " (DeepSpeed key optimizer.params.lr)" for memwall's refusal
// "<as>adam.lr = -1 must be ...", from the translation line that set the
// field ("optimizer.params.lr = -1 -> adam.lr"); "" when no line did.
std::string DeepSpeedKeyOf(const std::vector<std::string>& lines, absl::string_view refusal, absl::string_view as) {
  if (!absl::ConsumePrefix(&refusal, as)) return "";
  const absl::string_view field = refusal.substr(0, refusal.find(' '));
  for (absl::string_view line : lines) {
    const size_t arrow = line.find(" -> ");
    if (arrow == absl::string_view::npos) continue;
    const absl::string_view target = line.substr(arrow + 4);
    if (target != field && !absl::StartsWith(target, absl::StrCat(field, " ")) &&
        !absl::StartsWith(target, absl::StrCat(field, ":"))) {
      continue;
    }
    const absl::string_view key = line.substr(0, std::min(line.find(" = "), line.find(" (absent)")));
    return absl::StrCat(" (DeepSpeed key ", key, ")");
  }
  return "";
}

}  // namespace

absl::StatusOr<DeepSpeedTranslation> TranslateDeepSpeedConfig(absl::string_view json, absl::string_view origin) {
  Struct root;
  if (const absl::Status st = ParseJsonObject(json, root); !st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": not a DeepSpeed JSON config (a JSON object): ", st.message()));
  }
  DeepSpeedTranslation out;
  TrainingConfig& t = out.training;
  Translator tr(out);
  const auto& top = root.fields();

  // Precision first: it gives the bucket sizes' bytes per element.
  bool fp16 = false, bf16 = false;
  auto enabled = [&](const char* block) {
    auto it = top.find(block);
    if (it == top.end() || it->second.kind_case() != Value::kStructValue) return false;
    auto e = it->second.struct_value().fields().find("enabled");
    return e != it->second.struct_value().fields().end() && e->second.kind_case() == Value::kBoolValue &&
           e->second.bool_value();
  };
  fp16 = enabled("fp16");
  bf16 = enabled("bf16") || enabled("bfloat16");
  if (fp16 && bf16) tr.Refuse("fp16.enabled", "bf16 is enabled too; enable one of them");
  t.set_precision(fp16 ? zero::FP16 : bf16 ? zero::BF16 : zero::FP32);
  if (!fp16 && !bf16) tr.Note("fp16, bf16", "precision: FP32 (DeepSpeed's default; memwall's is BF16)");
  const int64_t c = fp16 || bf16 ? 2 : 4;  // bytes of a 16-bit (or fp32) parameter or gradient

  auto& zero = *t.mutable_zero();
  auto& opt = *zero.mutable_offload_optimizer();
  auto& param = *zero.mutable_offload_param();
  auto offload_device = [&](const std::string& key, const Value& v, auto set) {
    const std::optional<std::string> s = tr.String(key, v);
    if (!s) return;
    const std::string d = absl::AsciiStrToLower(*s);
    if (d == "cpu" || d == "nvme" || d == "none") {
      set(d);
      tr.Line(key, v, absl::StrCat("device: ", absl::AsciiStrToUpper(d)));
    } else {
      tr.Refuse(key, absl::StrCat("must be \"cpu\", \"nvme\" or \"none\", not ", JsonValueText(v)));
    }
  };
  // DeepSpeed's pin_memory (false by default) asks for page-locked
  // buffers; memwall's transfers always go through pinned memory, planned
  // to the byte, so either value keeps memwall's (`keep` sets it).
  auto pinned = [&](const std::string& key, const Value& v, const std::function<void()>& keep) {
    const std::optional<bool> b = tr.Bool(key, v);
    if (!b) return;
    keep();
    tr.Line(key, v, *b ? "memwall's behaviour (pinned host memory)"
                       : "pinned all the same: memwall stages every host transfer through pinned buffers, exactly "
                         "the plan's bytes (//repro:estimate --buffers), without the rounding of a pinned allocator");
  };
  std::optional<int64_t> optimizer_buffers;  // offload_optimizer.buffer_count
  using H = Translator::Handler;
  const std::map<std::string, H> offload_optimizer = {
      {"device", [&](auto& k, auto& v) {
         offload_device(k, v, [&](const std::string& d) {
           opt.set_device(d == "cpu" ? OffloadOptimizerConfig::CPU
                                     : d == "nvme" ? OffloadOptimizerConfig::NVME : OffloadOptimizerConfig::NONE);
         });
       }},
      {"nvme_path", [&](auto& k, auto& v) {
         if (auto s = tr.String(k, v)) opt.set_nvme_path(*s), tr.Line(k, v, "zero.offload_optimizer.nvme_path");
       }},
      {"pin_memory", [&](auto& k, auto& v) { pinned(k, v, [&] { opt.set_pin_memory(true); }); }},
      {"buffer_count", [&](auto& k, auto& v) {
         if (auto n = tr.Integer(k, v, 1, zero::kMaxSwapBuffers)) {
           optimizer_buffers = *n, tr.Line(k, v, "zero.offload_optimizer.pinned_budget_bytes");  // completed below
         }
       }},
      {"pipeline_read", [&](auto& k, auto& v) { tr.Only(k, v, true, "memwall always overlaps swap-in with the step; set it to true or delete it"); }},
      {"pipeline_write", [&](auto& k, auto& v) { tr.Only(k, v, true, "memwall always overlaps swap-out with the step; set it to true or delete it"); }},
      {"pipeline", [&](auto& k, auto& v) { tr.Only(k, v, true, "memwall always pipelines NVMe swaps; set it to true or delete it"); }},
      {"fast_init", [&](auto& k, auto& v) { tr.Only(k, v, false, "memwall initializes the swap files one way; set it to false or delete it"); }},
      {"ratio", [&](auto& k, auto& v) { tr.Only(k, v, 1.0, "memwall offloads the whole optimizer; set it to 1 or delete it"); }},
  };
  const std::map<std::string, H> offload_param = {
      {"device", [&](auto& k, auto& v) {
         offload_device(k, v, [&](const std::string& d) {
           param.set_device(d == "cpu" ? OffloadParamConfig::CPU
                                       : d == "nvme" ? OffloadParamConfig::NVME : OffloadParamConfig::NONE);
         });
       }},
      {"nvme_path", [&](auto& k, auto& v) {
         if (auto s = tr.String(k, v)) param.set_nvme_path(*s), tr.Line(k, v, "zero.offload_param.nvme_path");
       }},
      {"pin_memory", [&](auto& k, auto& v) { pinned(k, v, [] {}); }},
      {"buffer_count", [&](auto& k, auto& v) {
         if (auto n = tr.Integer(k, v, 2, zero::kMaxSwapBuffers)) {
           param.set_buffer_count(*n), tr.Line(k, v, "zero.offload_param.buffer_count");
         }
       }},
      {"buffer_size", [&](auto& k, auto& v) {
         if (auto n = tr.Integer(k, v, 1, zero::kMaxTileElements)) {
           param.set_buffer_elements(*n), tr.Line(k, v, "zero.offload_param.buffer_elements (a swap buffer's elements)");
         }
       }},
      {"max_in_cpu", [&](auto& k, auto& v) {
         if (auto n = tr.Integer(k, v, 0, kMaxParameters)) {
           param.set_host_elements(*n);
           tr.Line(k, v, "zero.offload_param.host_elements (the shard's first elements, kept in pinned host memory)");
         }
       }},
  };
  // `least`: 1 for a bucket every pass fills; 0 where 0 turns the feature
  // off (stage 3's prefetch).
  auto bucket = [&](const char* field, void (zero::ZeroConfig::*set)(int64_t), int64_t max_elements,
                    int64_t least = 1) {
    return [&, field, set, max_elements, least](const std::string& k, const Value& v) {
      if (auto n = tr.Integer(k, v, least, max_elements)) {
        (zero.*set)(*n * c);
        tr.Line(k, v, BytesLine(field, *n, c));
      }
    };
  };
  const int64_t max_bucket_elements = zero::kMaxBucketBytes / 4;
  const std::map<std::string, H> zero_optimization = {
      {"stage", [&](auto& k, auto& v) {
         if (auto n = tr.Integer(k, v, 0, 3)) zero.set_stage(int32_t(*n)), tr.Line(k, v, "zero.stage");
       }},
      {"reduce_bucket_size", bucket("zero.reduce_bucket_bytes", &zero::ZeroConfig::set_reduce_bucket_bytes, max_bucket_elements)},
      {"allgather_bucket_size",
       bucket("zero.allgather_bucket_bytes", &zero::ZeroConfig::set_allgather_bucket_bytes, max_bucket_elements)},
      {"stage3_prefetch_bucket_size",
       bucket("zero.prefetch_bucket_bytes", &zero::ZeroConfig::set_prefetch_bucket_bytes, max_bucket_elements, 0)},
      {"stage3_param_persistence_threshold", [&](auto& k, auto& v) {
         if (auto n = tr.Integer(k, v, 0, int64_t{1} << 53)) {
           zero.set_param_persistence_threshold(*n), tr.Line(k, v, "zero.param_persistence_threshold (elements)");
         }
       }},
      {"stage3_max_live_parameters", [&](auto& k, auto& v) {
         if (auto n = tr.Integer(k, v, 1, int64_t{1} << 53)) {
           zero.set_max_live_params(*n), tr.Line(k, v, "zero.max_live_params (elements)");
         }
       }},
      {"sub_group_size", [&](auto& k, auto& v) {
         if (auto n = tr.Integer(k, v, 1, zero::kMaxTileElements)) {
           opt.set_tile_elements(*n), tr.Line(k, v, "zero.offload_optimizer.tile_elements (the offloaded optimizer's sub-group)");
         }
       }},
      {"overlap_comm", [&](auto& k, auto& v) {
         if (auto b = tr.Bool(k, v)) zero.set_overlap_comm(*b), tr.Line(k, v, "zero.overlap_comm");
       }},
      {"contiguous_gradients", [&](auto& k, auto& v) { tr.Only(k, v, true, "memwall's reduced gradients are always one contiguous shard; set it to true"); }},
      {"allgather_partitions", [&](auto& k, auto& v) { tr.Only(k, v, true, "memwall always all-gathers the updated partitions; set it to true"); }},
      {"reduce_scatter", [&](auto& k, auto& v) { tr.Only(k, v, true, "memwall always reduces gradients to their owners; set it to true"); }},
      {"round_robin_gradients", [&](auto& k, auto& v) { tr.Only(k, v, false, "not implemented; set it to false"); }},
      {"load_from_fp32_weights", [&](auto& k, auto& v) { tr.Only(k, v, true, "memwall's checkpoints always hold the fp32 master weights; set it to true"); }},
      {"stage3_gather_16bit_weights_on_model_save", [&](auto& k, auto& v) {
         if (tr.Bool(k, v)) tr.Line(k, v, "nothing: the train command's --export writes the full fp32 weights");
       }},
      {"stage3_gather_fp16_weights_on_model_save", [&](auto& k, auto& v) {
         if (tr.Bool(k, v)) tr.Line(k, v, "nothing: the train command's --export writes the full fp32 weights");
       }},
      {"ignore_unused_parameters", [&](auto& k, auto& v) { tr.Only(k, v, true, "every GPT parameter is used; set it to true"); }},
      // DeepSpeed's older spelling of offload_optimizer { device: cpu }.
      {"cpu_offload", [&](auto& k, auto& v) {
         const std::optional<bool> b = tr.Bool(k, v);
         if (!b) return;
         if (!*b) return tr.Line(k, v, "memwall's behaviour (no offload unless offload_optimizer says)");
         if (top.at("zero_optimization").struct_value().fields().count("offload_optimizer")) {
           return tr.Refuse(k, "give offload_optimizer alone (cpu_offload is its older spelling)");
         }
         opt.set_device(OffloadOptimizerConfig::CPU);
         tr.Line(k, v, "zero.offload_optimizer.device: CPU (DeepSpeed's older spelling of offload_optimizer)");
       }},
      {"memory_efficient_linear", [&](auto& k, auto& v) {
         if (tr.Bool(k, v)) tr.Line(k, v, "nothing: memwall's linear layers save only their input for backward");
       }},
      {"stage3_module_granularity_threshold", [&](auto& k, auto& v) {
         tr.Only(k, v, 0.0, "memwall gathers each module on its own; set it to 0 or delete it");
       }},
      {"stage3_max_reuse_distance", [&](auto& k, auto& v) {
         if (auto n = tr.Integer(k, v, 0, int64_t{1} << 53)) {
           zero.set_max_reuse_distance(*n);
           tr.Line(k, v, "zero.max_reuse_distance (elements; up to as many gathered elements kept, which the "
                         "estimate counts)");
         }
       }},
      {"elastic_checkpoint", [&](auto& k, auto& v) {
         if (tr.Bool(k, v)) tr.Line(k, v, "nothing: memwall's checkpoints re-partition to any world size");
       }},
      {"offload_optimizer", [&](auto& k, auto& v) {
         if (const Struct* s = tr.Object(k, v)) tr.Walk(*s, k + ".", offload_optimizer);
       }},
      {"offload_param", [&](auto& k, auto& v) {
         if (const Struct* s = tr.Object(k, v)) tr.Walk(*s, k + ".", offload_param);
       }},
  };

  const std::map<std::string, H> fp16_block = {
      {"enabled", [&](auto& k, auto& v) { if (tr.Bool(k, v)) tr.Line(k, v, absl::StrCat("precision: ", zero::PrecisionName(t.precision()))); }},
      {"loss_scale", [&](auto& k, auto& v) {
         if (auto d = tr.Number(k, v)) {
           if (*d != 0) return tr.Refuse(k, "memwall scales the loss dynamically only; set it to 0");
           tr.Line(k, v, "dynamic loss scaling");
         }
       }},
      {"initial_scale_power", [&](auto& k, auto& v) {
         if (auto n = tr.Integer(k, v, 0, 127)) {
           t.mutable_loss_scaling()->set_initial_scale(std::ldexp(1.0f, int(*n)));
           tr.Line(k, v, absl::StrCat("loss_scaling.initial_scale: ", std::ldexp(1.0, int(*n))));
         }
       }},
      {"loss_scale_window", [&](auto& k, auto& v) {
         if (auto n = tr.Integer(k, v, 1, int64_t{1} << 40)) {
           t.mutable_loss_scaling()->set_growth_interval(*n), tr.Line(k, v, "loss_scaling.growth_interval");
         }
       }},
      {"min_loss_scale", [&](auto& k, auto& v) {
         if (auto d = tr.Number(k, v)) {
           t.mutable_loss_scaling()->set_min_scale(float(*d)), tr.Line(k, v, "loss_scaling.min_scale");
         }
       }},
      {"hysteresis", [&](auto& k, auto& v) {
         if (auto n = tr.Integer(k, v, 1, 1 << 20)) {
           t.mutable_loss_scaling()->set_hysteresis(*n), tr.Line(k, v, "loss_scaling.hysteresis");
         }
       }},
      {"consecutive_hysteresis", [&](auto& k, auto& v) {
         if (auto b = tr.Bool(k, v)) {
           t.mutable_loss_scaling()->set_consecutive_hysteresis(*b), tr.Line(k, v, "loss_scaling.consecutive_hysteresis");
         }
       }},
      {"auto_cast", [&](auto& k, auto& v) { tr.Only(k, v, false, "memwall's GPT runs in the parameters' type; set it to false"); }},
      {"fp16_master_weights_and_grads", [&](auto& k, auto& v) {
         tr.Only(k, v, false, "memwall keeps fp32 master weights; set it to false or delete it");
       }},
  };
  // ZeRO-Infinity's I/O engine (infinity/aio.h) for the NVMe swap files.
  auto aio_count = [&](void (zero::AioConfig::*set)(int64_t), int64_t max, const char* field) {
    return [&, set, max, field](const std::string& k, const Value& v) {
      if (auto n = tr.Integer(k, v, 1, max)) (zero.mutable_aio()->*set)(*n), tr.Line(k, v, field);
    };
  };
  const std::map<std::string, H> aio_block = {
      {"block_size", aio_count(&zero::AioConfig::set_block_bytes, zero::kMaxAioBlockBytes, "zero.aio.block_bytes")},
      {"queue_depth", aio_count(&zero::AioConfig::set_queue_depth, zero::kMaxAioQueueDepth, "zero.aio.queue_depth")},
      {"thread_count", aio_count(&zero::AioConfig::set_threads, zero::kMaxAioThreads, "zero.aio.threads")},
      {"intra_op_parallelism", aio_count(&zero::AioConfig::set_threads, zero::kMaxAioThreads, "zero.aio.threads")},
      {"single_submit", [&](auto& k, auto& v) { tr.Only(k, v, false, "memwall submits a thread's blocks together; set it to false"); }},
      {"overlap_events", [&](auto& k, auto& v) { tr.Only(k, v, true, "memwall overlaps submissions and completions; set it to true"); }},
      {"use_gds", [&](auto& k, auto& v) { tr.Only(k, v, false, "GPUDirect Storage is not implemented; set it to false"); }},
  };

  const std::map<std::string, H> bf16_block = {
      {"enabled", [&](auto& k, auto& v) { if (tr.Bool(k, v)) tr.Line(k, v, absl::StrCat("precision: ", zero::PrecisionName(t.precision()))); }},
      {"immediate_grad_update", [&](auto& k, auto& v) { if (tr.Bool(k, v)) tr.Line(k, v, "nothing: gradients accumulate in the parameters' type"); }},
  };

  auto& adam = *t.mutable_adam();
  std::optional<bool> adam_w_mode;
  std::string optimizer_type;
  const std::map<std::string, H> optimizer_params = {
      {"lr", [&](auto& k, auto& v) { if (auto d = tr.Number(k, v)) adam.set_lr(float(*d)), tr.Line(k, v, "adam.lr"); }},
      {"eps", [&](auto& k, auto& v) { if (auto d = tr.Number(k, v)) adam.set_eps(float(*d)), tr.Line(k, v, "adam.eps"); }},
      {"weight_decay", [&](auto& k, auto& v) {
         if (auto d = tr.Number(k, v)) adam.set_weight_decay(float(*d)), tr.Line(k, v, "adam.weight_decay");
       }},
      {"betas", [&](auto& k, auto& v) {
         if (tr.RefusedAuto(k, v, "the two numbers, [beta1, beta2]")) return;
         if (v.kind_case() != Value::kListValue || v.list_value().values_size() != 2) {
           return tr.Refuse(k, absl::StrCat("must be a list of two numbers, not ", JsonValueText(v)));
         }
         auto b1 = tr.Number(k, v.list_value().values(0)), b2 = tr.Number(k, v.list_value().values(1));
         if (b1 && b2) adam.set_beta1(float(*b1)), adam.set_beta2(float(*b2)), tr.Line(k, v, "adam.beta1, adam.beta2");
       }},
      {"adam_w_mode", [&](auto& k, auto& v) { if (auto b = tr.Bool(k, v)) adam_w_mode = *b; }},
      {"torch_adam", [&](auto& k, auto& v) { if (tr.Bool(k, v)) tr.Line(k, v, "nothing: memwall has one Adam (cpu_adam/ on the host)"); }},
      {"amsgrad", [&](auto& k, auto& v) { tr.Only(k, v, false, "AMSGrad is not implemented; set it to false"); }},
  };
  const std::map<std::string, H> optimizer = {
      {"type", [&](auto& k, auto& v) {
         if (auto s = tr.String(k, v)) {
           optimizer_type = absl::AsciiStrToLower(*s);
           if (optimizer_type != "adam" && optimizer_type != "adamw") {
             tr.Refuse(k, absl::StrCat("memwall's optimizer is Adam or AdamW, not ", JsonValueText(v)));
           }
         }
       }},
      {"params", [&](auto& k, auto& v) {
         if (const Struct* s = tr.Object(k, v)) tr.Walk(*s, k + ".", optimizer_params);
       }},
  };

  auto& schedule = *t.mutable_schedule();
  std::string scheduler_type;
  std::optional<std::string> warmup_type;
  const std::map<std::string, H> scheduler_params = {
      {"warmup_min_lr", [&](auto& k, auto& v) {
         if (auto d = tr.Number(k, v)) {
           if (*d != 0) return tr.Refuse(k, "memwall's warmup starts from 0; set it to 0");
           tr.Line(k, v, "memwall's behaviour (warmup from 0)");
         }
       }},
      {"warmup_max_lr", [&](auto& k, auto& v) {
         if (auto d = tr.Number(k, v)) adam.set_lr(float(*d)), tr.Line(k, v, "adam.lr (the schedule's peak)");
       }},
      {"warmup_num_steps", [&](auto& k, auto& v) {
         if (auto n = tr.Integer(k, v, 0, int64_t{1} << 40)) schedule.set_warmup_steps(*n), tr.Line(k, v, "schedule.warmup_steps");
       }},
      {"total_num_steps", [&](auto& k, auto& v) {
         if (auto n = tr.Integer(k, v, 0, int64_t{1} << 40)) schedule.set_decay_steps(*n), tr.Line(k, v, "schedule.decay_steps");
       }},
      {"warmup_type", [&](auto& k, auto& v) {
         if (auto s = tr.String(k, v)) {
           warmup_type = *s;
           if (*s == "linear") {
             schedule.set_warmup(zero::LrSchedule::LINEAR_WARMUP), tr.Line(k, v, "schedule.warmup: LINEAR_WARMUP");
           } else if (*s == "log") {
             schedule.set_warmup(zero::LrSchedule::LOG_WARMUP), tr.Line(k, v, "schedule.warmup: LOG_WARMUP");
           } else {
             tr.Refuse(k, absl::StrCat("must be \"linear\" or \"log\", not ", JsonValueText(v)));
           }
         }
       }},
      {"warmup_min_ratio", [&](auto& k, auto& v) {
         if (auto d = tr.Number(k, v)) {
           if (*d != 0) return tr.Refuse(k, "memwall's warmup starts from 0; set it to 0");
           tr.Line(k, v, "memwall's behaviour (warmup from 0)");
         }
       }},
      {"cos_min_ratio", [&](auto& k, auto& v) {
         if (auto d = tr.Number(k, v)) schedule.set_min_lr_ratio(float(*d)), tr.Line(k, v, "schedule.min_lr_ratio");
       }},
      {"last_batch_iteration", [&](auto& k, auto& v) {
         if (auto n = tr.Integer(k, v, -1, -1)) tr.Line(k, v, "memwall's behaviour (the step comes from a checkpoint)");
       }},
  };
  const std::map<std::string, H> scheduler = {
      {"type", [&](auto& k, auto& v) {
         if (auto s = tr.String(k, v)) {
           scheduler_type = *s;
           // DeepSpeed's own step for step (LrSchedule.convention), so a
           // config gives the learning rates DeepSpeed would.
           schedule.set_convention(zero::LrSchedule::DEEPSPEED);
           constexpr absl::string_view kStepForStep = ", step for step as DeepSpeed (schedule.convention: DEEPSPEED)";
           if (*s == "WarmupLR") {
             schedule.set_decay_steps(0);
             tr.Line(k, v, absl::StrCat("warmup, then a constant lr (schedule.decay_steps: 0)", kStepForStep));
           } else if (*s == "WarmupDecayLR") {
             schedule.set_decay(zero::LrSchedule::LINEAR), schedule.set_min_lr_ratio(0);
             tr.Line(k, v, absl::StrCat("warmup, then linear decay to 0 (schedule.decay: LINEAR, min_lr_ratio: 0)",
                                        kStepForStep));
           } else if (*s == "WarmupCosineLR") {
             schedule.set_decay(zero::LrSchedule::COSINE);
             tr.Line(k, v, absl::StrCat("warmup, then cosine decay (schedule.decay: COSINE)", kStepForStep));
           } else {
             tr.Refuse(k, absl::StrCat("memwall's schedules are WarmupLR, WarmupDecayLR and WarmupCosineLR, not ",
                                       JsonValueText(v)));
           }
         }
       }},
      {"params", [&](auto& k, auto& v) {
         if (const Struct* s = tr.Object(k, v)) tr.Walk(*s, k + ".", scheduler_params);
       }},
  };

  const std::map<std::string, H> activation_checkpointing = {
      {"cpu_checkpointing", [&](auto& k, auto& v) {
         if (auto b = tr.Bool(k, v)) out.offload_activations = *b, tr.Line(k, v, "GptConfig.offload_activations");
       }},
      {"contiguous_memory_optimization", [&](auto& k, auto& v) {
         if (tr.Bool(k, v)) tr.Line(k, v, "nothing: checkpoints live in one planned buffer");
       }},
      {"number_checkpoints", [&](auto& k, auto& v) {
         if (tr.Integer(k, v, 0, int64_t{1} << 20)) tr.Line(k, v, "nothing: memwall checkpoints every layer");
       }},
      {"synchronize_checkpoint_boundary", [&](auto& k, auto& v) { tr.Only(k, v, false, "not implemented; set it to false"); }},
      {"partition_activations", [&](auto& k, auto& v) {
         tr.Only(k, v, false, "memwall does not partition activation checkpoints; set it to false");
       }},
      {"profile", [&](auto& k, auto& v) { tr.Only(k, v, false, "--trace_dir writes a Chrome trace; set it to false"); }},
  };

  const std::map<std::string, H> data_types = {
      {"grad_accum_dtype", [&](auto& k, auto& v) {
         tr.OnlyNull(k, v, "memwall accumulates gradients where its placement keeps them; set it to null or delete it");
       }},
  };
  // DeepSpeed's checkpoint block: how its own checkpoints are checked and
  // written. memwall's always carry the model and config, checked on load.
  const std::map<std::string, H> checkpoint_block = {
      {"tag_validation", [&](auto& k, auto& v) {
         if (auto s = tr.String(k, v)) {
           const std::string t = absl::AsciiStrToLower(*s);
           if (t != "ignore" && t != "warn" && t != "fail") {
             return tr.Refuse(k, absl::StrCat("must be \"Ignore\", \"Warn\" or \"Fail\", not ", JsonValueText(v)));
           }
           tr.Line(k, v, "nothing: every rank's checkpoint is checked against the model and config on load");
         }
       }},
      {"load_universal", [&](auto& k, auto& v) {
         tr.Only(k, v, false, "memwall reads its own checkpoints, which re-partition to any world size; set it to false");
       }},
      {"use_node_local_storage", [&](auto& k, auto& v) {
         tr.Only(k, v, false, "every rank saves under --save_dir; set it to false");
       }},
  };
  const std::map<std::string, H> top_level = {
      {"train_batch_size", [&](auto& k, auto& v) {
         if (auto n = tr.Integer(k, v, 1, int64_t{1} << 40)) {
           out.train_batch_size = *n, tr.Line(k, v, "checked: micro_batch x accumulation x ranks");
         }
       }},
      {"train_micro_batch_size_per_gpu", [&](auto& k, auto& v) {
         if (auto n = tr.Integer(k, v, 1, int64_t{1} << 31)) t.set_micro_batch(*n), tr.Line(k, v, "micro_batch");
       }},
      {"gradient_accumulation_steps", [&](auto& k, auto& v) {
         if (auto n = tr.Integer(k, v, 1, int64_t{1} << 31)) t.set_accumulation(*n), tr.Line(k, v, "accumulation");
       }},
      {"gradient_clipping", [&](auto& k, auto& v) {
         if (auto d = tr.Number(k, v)) t.set_clip_norm(float(*d)), tr.Line(k, v, "clip_norm");
       }},
      {"steps_per_print", [&](auto& k, auto& v) {
         if (auto n = tr.Integer(k, v, 1, int64_t{1} << 40)) out.steps_per_print = *n, tr.Line(k, v, "a progress line every N steps");
       }},
      {"prescale_gradients", [&](auto& k, auto& v) {
         tr.Only(k, v, false, "memwall divides the loss, not the gradients; set it to false or delete it");
       }},
      {"gradient_predivide_factor", [&](auto& k, auto& v) {
         tr.Only(k, v, 1.0, "memwall divides the loss, not the gradients; set it to 1 or delete it");
       }},
      {"wall_clock_breakdown", [&](auto& k, auto& v) {
         if (tr.Bool(k, v)) tr.Line(k, v, "nothing: every step's log line has its breakdown");
       }},
      {"zero_allow_untested_optimizer", [&](auto& k, auto& v) { if (tr.Bool(k, v)) tr.Line(k, v, "nothing"); }},
      {"zero_force_ds_cpu_optimizer", [&](auto& k, auto& v) { if (tr.Bool(k, v)) tr.Line(k, v, "nothing: offload always steps with memwall's CPU Adam"); }},
      {"memory_breakdown", [&](auto& k, auto& v) {
         if (tr.Bool(k, v)) tr.Line(k, v, "nothing: the run ends with its device and pinned peaks beside the estimate");
       }},
      {"dump_state", [&](auto& k, auto& v) { if (tr.Bool(k, v)) tr.Line(k, v, "nothing: these lines are the config"); }},
      {"sparse_gradients", [&](auto& k, auto& v) { tr.Only(k, v, false, "memwall's gradients are dense; set it to false"); }},
      {"disable_allgather", [&](auto& k, auto& v) {
         tr.Only(k, v, false, "memwall all-gathers the updated partitions; set it to false");
       }},
      {"communication_data_type", [&](auto& k, auto& v) {
         tr.OnlyNull(k, v, "memwall reduces gradients in the parameters' type; set it to null or delete the key");
       }},
      {"data_types", [&](auto& k, auto& v) {
         if (const Struct* s = tr.Object(k, v)) tr.Walk(*s, k + ".", data_types);
       }},
      {"checkpoint", [&](auto& k, auto& v) {
         if (const Struct* s = tr.Object(k, v)) tr.Walk(*s, k + ".", checkpoint_block);
       }},
      {"fp16", [&](auto& k, auto& v) {
         const Struct* s = tr.Object(k, v);
         if (s == nullptr) return;
         if (fp16) return tr.Walk(*s, k + ".", fp16_block);
         // Not enabled: DeepSpeed reads none of the block's settings (a
         // bf16 config often keeps the fp16 block with "enabled": false).
         // Its names are still checked, and "enabled" read as ever.
         std::map<std::string, H> unused;
         for (const auto& [name, handler] : fp16_block) {
           unused[name] = name == "enabled" ? handler : [&](auto& key, auto& value) {
             tr.Line(key, value, "nothing: fp16 is not enabled");
           };
         }
         tr.Walk(*s, k + ".", unused);
       }},
      {"bf16", [&](auto& k, auto& v) { if (const Struct* s = tr.Object(k, v)) tr.Walk(*s, k + ".", bf16_block); }},
      {"bfloat16", [&](auto& k, auto& v) { if (const Struct* s = tr.Object(k, v)) tr.Walk(*s, k + ".", bf16_block); }},
      {"zero_optimization", [&](auto& k, auto& v) { if (const Struct* s = tr.Object(k, v)) tr.Walk(*s, k + ".", zero_optimization); }},
      {"aio", [&](auto& k, auto& v) { if (const Struct* s = tr.Object(k, v)) tr.Walk(*s, k + ".", aio_block); }},
      {"optimizer", [&](auto& k, auto& v) { if (const Struct* s = tr.Object(k, v)) tr.Walk(*s, k + ".", optimizer); }},
      {"scheduler", [&](auto& k, auto& v) { if (const Struct* s = tr.Object(k, v)) tr.Walk(*s, k + ".", scheduler); }},
      {"activation_checkpointing", [&](auto& k, auto& v) {
         if (const Struct* s = tr.Object(k, v)) {
           out.activation_checkpointing = true;
           tr.Line(k, v, "GptConfig.activation_checkpointing: true");
           tr.Walk(*s, k + ".", activation_checkpointing);
         }
       }},
  };
  tr.Walk(root, "", top_level);

  // DeepSpeed reads the NVMe keys of an offload block only when its device
  // is nvme; so does the translation, and their lines say so.
  // The line of zero_optimization.<block>.<key>, now saying `becomes`.
  auto say = [&](const std::string& block, const std::string& key, const std::string& becomes) {
    const std::string name = absl::StrCat("zero_optimization.", block, ".", key, " = ");
    for (std::string& line : out.lines) {
      if (absl::StartsWith(line, name)) line = absl::StrCat(line.substr(0, line.find(" -> ")), " -> ", becomes);
    }
  };
  auto no_nvme = [&](const std::string& block, const std::vector<std::string>& keys) {
    for (const std::string& key : keys) say(block, key, absl::StrCat("nothing: ", block, ".device is not nvme"));
  };
  // DeepSpeed reads offload_param at stage 3 only (below it the parameters
  // are not partitioned); so does the translation.
  const auto zero_block = top.find("zero_optimization");
  const bool param_unread = zero.stage() < 3 && zero_block != top.end() &&
                            zero_block->second.kind_case() == Value::kStructValue &&
                            zero_block->second.struct_value().fields().count("offload_param");
  if (param_unread) {
    param.Clear();
    for (std::string& line : out.lines) {
      if (absl::StartsWith(line, "zero_optimization.offload_param.")) {
        line = absl::StrCat(line.substr(0, line.find(" -> ")), " -> nothing: offload_param is stage 3's");
      }
    }
  } else if (param.device() != OffloadParamConfig::NVME) {
    param.clear_nvme_path(), param.clear_buffer_count(), param.clear_buffer_elements(), param.clear_host_elements();
    no_nvme("offload_param", {"nvme_path", "buffer_count", "buffer_size", "max_in_cpu"});
  } else if (!param.has_host_elements()) {
    param.set_host_elements(1000000000);
    tr.Note("zero_optimization.offload_param.max_in_cpu",
            "zero.offload_param.host_elements: 1000000000 (DeepSpeed's default: its stage-3 optimizer keeps up to "
            "that many of a rank's parameter elements in pinned host memory; memwall's is 0, all on the drive)");
  }
  if (opt.device() != OffloadOptimizerConfig::NVME) {
    opt.clear_nvme_path();
    no_nvme("offload_optimizer", {"nvme_path", "buffer_count"});
  } else if (optimizer_buffers) {
    // DeepSpeed pins b buffers of one fp32 state of a sub-group each (4
    // bytes an element); a memwall swap buffer holds a sub-group's master,
    // exp_avg and exp_avg_sq. The same pinned bytes, in whole buffers, at
    // least memwall's 3 (pinned_budget_bytes 0).
    const int64_t sub_group = opt.has_tile_elements() ? opt.tile_elements() : zero::kDefaultOffloadTileElements;
    const int64_t g = infinity::SwapBufferBytes(sub_group);
    const int64_t deepspeed_bytes = *optimizer_buffers * 4 * sub_group;
    const int64_t count = std::max<int64_t>(infinity::kMinSwapBuffers, deepspeed_bytes / g);
    opt.set_pinned_budget_bytes(count == infinity::kMinSwapBuffers ? 0 : count * g);
    say("offload_optimizer", "buffer_count",
        absl::StrCat("zero.offload_optimizer.pinned_budget_bytes: ", opt.pinned_budget_bytes(), " (", count,
                     " swap buffers of a sub-group's master, exp_avg and exp_avg_sq, ", g, " bytes each: DeepSpeed's ",
                     *optimizer_buffers, " buffers of one fp32 state pin ", deepspeed_bytes,
                     count == infinity::kMinSwapBuffers
                         ? absl::StrCat(" bytes; memwall's least is ", infinity::kMinSwapBuffers, ")")
                         : " bytes)"));
  }

  // DeepSpeed reads the aio block only for NVMe offload; memwall's config
  // refuses zero.aio without it, so the block's lines say it does nothing.
  if (zero.has_aio() && opt.device() != OffloadOptimizerConfig::NVME && param.device() != OffloadParamConfig::NVME) {
    zero.clear_aio();
    for (std::string& line : out.lines) {
      if (!absl::StartsWith(line, "aio.")) continue;
      line = absl::StrCat(line.substr(0, line.find(" -> ")), " -> nothing: no NVMe offload");
    }
  }

  // What DeepSpeed assumes where a key is absent, when memwall's default differs.
  if (!t.has_clip_norm()) {
    t.set_clip_norm(0), tr.Note("gradient_clipping", "clip_norm: 0, no clipping (DeepSpeed's default; memwall's is 1.0)");
  }
  if (!optimizer_type.empty()) {
    // DeepSpeed's "Adam" is AdamW unless adam_w_mode is false.
    const bool adamw = optimizer_type == "adamw" || adam_w_mode.value_or(true);
    if (optimizer_type == "adamw" && adam_w_mode == false) {
      tr.Refuse("optimizer.params.adam_w_mode", "AdamW has decoupled weight decay; use \"type\": \"Adam\" for L2");
    }
    adam.set_adamw(adamw);
    out.lines.push_back(absl::StrCat("optimizer.type = \"", optimizer_type, "\"",
                                     adam_w_mode ? absl::StrCat(", adam_w_mode = ", *adam_w_mode ? "true" : "false") : "",
                                     " -> adam.adamw: ", adamw ? "true" : "false"));
  } else if (top.count("optimizer")) {
    tr.Refuse("optimizer.type", "is missing; give \"Adam\" or \"AdamW\"");
  } else {
    tr.Note("optimizer", "memwall's Adam with its defaults (ops/adam_options.h)");
  }
  // DeepSpeed's stage 3 swaps each sub-group's gradient partition to NVMe
  // beside its optimizer states; memwall's pinned default would need the
  // host memory a DeepSpeed run of the same config does not.
  if (zero.stage() == 3 && opt.device() == OffloadOptimizerConfig::NVME) {
    opt.set_gradients_on_nvme(true);
    out.lines.push_back(
        "zero_optimization.offload_optimizer.device = \"nvme\" at stage 3 -> zero.offload_optimizer.gradients_on_nvme: "
        "true (DeepSpeed's stage 3 swaps the gradient partition with the optimizer states; "
        "--set='zero { offload_optimizer { gradients_on_nvme: false } }' keeps it in pinned host memory)");
  }
  if (fp16 && !t.loss_scaling().has_hysteresis()) {
    t.mutable_loss_scaling()->set_hysteresis(2);
    tr.Note("fp16.hysteresis", "loss_scaling.hysteresis: 2 (DeepSpeed's default; memwall's is 1)");
  }
  if (!scheduler_type.empty()) {
    if (!warmup_type) {
      schedule.set_warmup(zero::LrSchedule::LOG_WARMUP);
      tr.Note("scheduler.params.warmup_type", "schedule.warmup: LOG_WARMUP (DeepSpeed's default, \"log\")");
    }
    if (scheduler_type != "WarmupLR" && schedule.decay_steps() == 0) {
      tr.Refuse("scheduler.params.total_num_steps", absl::StrCat(scheduler_type, " needs it"));
    }
    if (scheduler_type != "WarmupCosineLR" && !adam.has_lr()) {
      adam.set_lr(0.001f), tr.Note("scheduler.params.warmup_max_lr", "adam.lr: 0.001 (DeepSpeed's default)");
    }
    if (scheduler_type == "WarmupCosineLR" && !schedule.has_min_lr_ratio()) {
      schedule.set_min_lr_ratio(0.0001f);
      tr.Note("scheduler.params.cos_min_ratio", "schedule.min_lr_ratio: 0.0001 (DeepSpeed's default)");
    }
  }
  if (top.count("scheduler") == 0) {
    schedule.set_warmup_steps(0), schedule.set_decay_steps(0);
    tr.Note("scheduler", "a constant lr (no warmup, no decay)");
  }

  if (!tr.refused().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": ", tr.refused().size(),
                                                   tr.refused().size() == 1 ? " key" : " keys",
                                                   " memwall cannot honour:\n  ", absl::StrJoin(tr.refused(), "\n  ")));
  }
  const std::string as = absl::StrCat(origin, " as TrainingConfig ");
  if (absl::Status st = zero::ValidateTrainingConfig(t, as); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat(st.message(), DeepSpeedKeyOf(out.lines, st.message(), as)));
  }
  return out;
}

absl::Status CheckTrainBatchSize(DeepSpeedTranslation& translation, int world_size) {
  if (translation.train_batch_size == 0) return absl::OkStatus();
  TrainingConfig& t = translation.training;
  const int64_t micro = t.has_micro_batch() ? t.micro_batch() : 1;
  const int64_t per_step = micro * world_size;
  if (!t.has_accumulation()) {
    if (translation.train_batch_size % per_step != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "train_batch_size ", translation.train_batch_size, " is not a multiple of train_micro_batch_size_per_gpu ",
          micro, " x ", world_size, " ranks"));
    }
    t.set_accumulation(translation.train_batch_size / per_step);
    translation.lines.push_back(absl::StrCat("gradient_accumulation_steps (absent) -> accumulation: ",
                                             t.accumulation(), " (train_batch_size / (micro batch x ranks))"));
    return absl::OkStatus();
  }
  const std::optional<int64_t> total = CheckedMul(per_step, t.accumulation());  // up to 2^31 x 2^20 x 2^31
  if (total != translation.train_batch_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train_batch_size ", translation.train_batch_size, " != train_micro_batch_size_per_gpu ", micro,
        " x gradient_accumulation_steps ", t.accumulation(), " x ", world_size, " ranks = ",
        total ? absl::StrCat(*total) : "more than 2^63"));
  }
  return absl::OkStatus();
}

}  // namespace memwall::engine
