#include "zero/config.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "runtime/bounds.h"
#include "runtime/files.h"
#include "runtime/status.h"

namespace memwall::zero {
namespace {

// "<what><field> = <value> <need>", e.g. "ZeroConfig stage = 4 must be 0,
// 1, 2 or 3".
template <typename T>
absl::Status BadField(absl::string_view what, absl::string_view field, T value, absl::string_view need) {
  return absl::InvalidArgumentError(absl::StrCat(what, field, " = ", value, " ", need));
}

// The upper bound of a field that sizes memory, threads or loops
// (runtime/bounds.h): "<what><field> = <value> must be <= <limit> (<why>)".
absl::Status AtMost(absl::string_view what, absl::string_view field, int64_t value, int64_t limit,
                    absl::string_view why) {
  if (value <= limit) return absl::OkStatus();
  return BadField(what, field, value, absl::StrCat("must be <= ", LimitString(limit), " (", why, ")"));
}

ops::AdamOptions AdamFromConfig(const AdamConfig& c) {
  ops::AdamOptions o;
  if (c.has_lr()) o.lr = c.lr();
  if (c.has_beta1()) o.beta1 = c.beta1();
  if (c.has_beta2()) o.beta2 = c.beta2();
  if (c.has_eps()) o.eps = c.eps();
  if (c.has_weight_decay()) o.weight_decay = c.weight_decay();
  if (c.has_adamw()) o.adamw = c.adamw();
  return o;
}

}  // namespace

absl::string_view PrecisionName(Precision p) {
  switch (p) {
    case FP32: return "fp32";
    case BF16: return "bf16";
    case FP16: return "fp16";
    default: return "?";
  }
}

absl::StatusOr<Precision> ParsePrecision(absl::string_view name) {
  for (Precision p : {FP32, BF16, FP16}) {
    if (PrecisionName(p) == name) return p;
  }
  return absl::InvalidArgumentError(absl::StrCat("precision '", name, "' is not one of fp32, bf16, fp16"));
}

DType ParamDType(Precision p) {
  switch (p) {
    case FP32: return DType::kF32;
    case FP16: return DType::kF16;
    default: return DType::kBF16;
  }
}

namespace {

// [Note: the config table]
// Every numeric field of TrainingConfig and its ZeroConfig: one row each,
// the one home of its default, its check, its upper bound and the help its
// error carries. WithDefaults fills from it, the Validate functions check
// it, and their messages are made from it; the proto comments point here.
//
// Where a row applies: a field outside its scope is neither filled nor
// allowed ("needs offload_optimizer.device = ...").
enum class Scope { kAlways, kOffloadedOptimizer, kNvmeOptimizer, kNvmeParameters, kNvmeAny };
enum class Check {
  kAny,
  kPositive,           // > 0
  kNonNegative,        // >= 0
  kAtLeastTwo,         // >= 2
  kUnitInterval,       // in [0, 1]
  kFiniteNonNegative,  // finite and >= 0
  kFiniteAtLeastOne,   // finite and >= 1
  kFinitePositive,     // finite and > 0
};
enum class Unit { kCount, kBytes };

struct Default {
  enum Kind { kNone, kInt, kFloat, kBool } kind = kNone;
  int64_t i = 0;
  double f = 0;
  bool b = false;
};
constexpr Default None() { return {}; }
constexpr Default Int(int64_t v) { return {Default::kInt, v, 0, false}; }
constexpr Default Float(double v) { return {Default::kFloat, 0, v, false}; }
constexpr Default Bool(bool v) { return {Default::kBool, 0, 0, v}; }

struct FieldRule {
  absl::string_view path;  // within its message: "reduce_bucket_bytes", "offload_optimizer.tile_elements"
  Default fill;
  Check check = Check::kAny;
  absl::string_view help;  // what special values mean, in the error: "0: no prefetch"
  int64_t max = 0;         // the upper bound of a field that sizes memory, threads or loops (0: none)
  absl::string_view max_why;
  Scope scope = Scope::kAlways;
  Unit unit = Unit::kCount;
  bool zero_is_off = false;  // 0 is allowed outside the scope too (it turns the feature off)
};

constexpr absl::string_view kBucket = "a bucket is one device buffer";

const FieldRule kZeroRules[] = {
    {"reduce_bucket_bytes", Int(kDefaultReduceBucketBytes), Check::kPositive, "", kMaxBucketBytes, kBucket,
     Scope::kAlways, Unit::kBytes},
    {"allgather_bucket_bytes", Int(kDefaultAllgatherBucketBytes), Check::kPositive, "", kMaxBucketBytes, kBucket,
     Scope::kAlways, Unit::kBytes},
    {"overlap_comm", Bool(true)},
    {"prefetch_bucket_bytes", Int(kDefaultPrefetchBucketBytes), Check::kNonNegative, "0: no prefetch",
     kMaxBucketBytes, kBucket, Scope::kAlways, Unit::kBytes},
    {"param_persistence_threshold", Int(kDefaultParamPersistenceThreshold), Check::kNonNegative, "elements",
     kMaxParameters, "elements; Ψ < 2^53"},
    {"max_live_params", Int(kDefaultMaxLiveParams), Check::kPositive, "elements", kMaxParameters,
     "elements; Ψ < 2^53"},
    {"max_reuse_distance", Int(0), Check::kNonNegative, "elements; 0: release a module after each use",
     kMaxParameters, "elements; Ψ < 2^53"},
    {"offload_optimizer.pin_memory", Bool(true), Check::kAny, "", 0, "", Scope::kOffloadedOptimizer},
    {"offload_optimizer.tile_elements", Int(kDefaultOffloadTileElements), Check::kPositive, "", kMaxTileElements,
     "a tile is two pinned buffers", Scope::kOffloadedOptimizer},
    {"offload_optimizer.delayed_update_after_steps", Int(0), Check::kNonNegative,
     "0: no delayed parameter update; the paper uses 40", kMaxSteps, "steps", Scope::kOffloadedOptimizer,
     Unit::kCount, /*zero_is_off=*/true},
    {"offload_optimizer.delayed_values_on_device", Bool(false), Check::kAny, "", 0, "",
     Scope::kOffloadedOptimizer},
    {"offload_optimizer.gradients_on_nvme", Bool(false), Check::kAny, "", 0, "", Scope::kNvmeOptimizer},
    {"offload_optimizer.pinned_budget_bytes", None(), Check::kNonNegative, "0: three swap buffers", kMaxBudgetBytes,
     "bytes", Scope::kNvmeOptimizer},
    {"offload_param.buffer_count", Int(kDefaultParamSwapBuffers), Check::kAtLeastTwo,
     "one buffer read while the other is copied", kMaxSwapBuffers, "each is a pinned swap buffer",
     Scope::kNvmeParameters},
    // Unset: the I/O engine's defaults (infinity/aio.h).
    {"aio.block_bytes", None(), Check::kPositive, "a multiple of 4096", kMaxAioBlockBytes, "one transfer's block",
     Scope::kNvmeAny, Unit::kBytes},
    {"aio.queue_depth", None(), Check::kPositive, "blocks in flight per thread", kMaxAioQueueDepth, "io_uring entries",
     Scope::kNvmeAny},
    {"aio.threads", None(), Check::kPositive, "submitting threads", kMaxAioThreads, "threads", Scope::kNvmeAny},
    // Unset: offload_optimizer.tile_elements (infinity/nvme_parameter_store.cc).
    {"offload_param.buffer_elements", None(), Check::kPositive, "unset: offload_optimizer.tile_elements",
     kMaxTileElements, "a swap buffer", Scope::kNvmeParameters},
    {"offload_param.host_elements", Int(0), Check::kNonNegative, "0: the whole shard on the drive", kMaxParameters,
     "elements; Ψ < 2^53", Scope::kNvmeParameters, Unit::kCount, /*zero_is_off=*/true},
    // Its default and range follow buffer_count (ValidateZeroConfig, WithDefaults).
    {"offload_param.read_ahead_buffers", None(), Check::kAny, "", kMaxSwapBuffers, "at most buffer_count - 1",
     Scope::kNvmeParameters},
};

const FieldRule kTrainingRules[] = {
    {"seq", Int(kDefaultSeq), Check::kPositive, "", kMaxCount, "tokens"},
    {"micro_batch", Int(1), Check::kPositive, "", kMaxCount, "sequences"},
    {"accumulation", Int(1), Check::kPositive, "", kMaxCount, "micro-batches a step"},
    {"schedule.warmup_steps", None(), Check::kNonNegative, "", kMaxSteps, "steps"},
    {"schedule.decay_steps", None(), Check::kNonNegative, "0: no decay", kMaxSteps, "steps"},
    {"schedule.min_lr_ratio", Float(kDefaultMinLrRatio), Check::kUnitInterval},
    {"clip_norm", Float(kDefaultClipNorm), Check::kFiniteNonNegative, "0 disables clipping"},
    {"loss_scaling.initial_scale", Float(kDefaultInitialLossScale), Check::kFiniteAtLeastOne},
    {"loss_scaling.growth_interval", Int(kDefaultLossScaleGrowthInterval), Check::kPositive, "", kMaxSteps, "steps"},
    {"loss_scaling.min_scale", Float(kDefaultMinLossScale), Check::kFinitePositive},
    {"loss_scaling.hysteresis", Int(1), Check::kPositive, "overflows to halve the scale; 1: every overflow",
     kMaxSteps, "overflows"},
    {"loss_scaling.consecutive_hysteresis", Bool(false)},
    {"seed", Int(static_cast<int64_t>(kDefaultSeed))},
};

// The field at `path` in `m`: its message and descriptor (nested messages
// created when `mutable_path`).
struct Located {
  const google::protobuf::Message* message;
  const google::protobuf::FieldDescriptor* field;
};
Located Locate(const google::protobuf::Message& root, absl::string_view path) {
  const google::protobuf::Message* m = &root;
  for (;;) {
    const size_t dot = path.find('.');
    const google::protobuf::FieldDescriptor* f =
        m->GetDescriptor()->FindFieldByName(std::string(path.substr(0, dot)));
    if (dot == absl::string_view::npos) return {m, f};
    m = &m->GetReflection()->GetMessage(*m, f);
    path.remove_prefix(dot + 1);
  }
}
google::protobuf::Message* LocateMutable(google::protobuf::Message& root, absl::string_view path,
                                         const google::protobuf::FieldDescriptor** field) {
  google::protobuf::Message* m = &root;
  for (;;) {
    const size_t dot = path.find('.');
    *field = m->GetDescriptor()->FindFieldByName(std::string(path.substr(0, dot)));
    if (dot == absl::string_view::npos) return m;
    m = m->GetReflection()->MutableMessage(m, *field);
    path.remove_prefix(dot + 1);
  }
}

// A field's value as a number and as its error text shows it.
struct Value {
  double number = 0;
  int64_t integer = 0;  // int64 fields: the exact value
  std::string text;
};
Value Read(const Located& at) {
  const google::protobuf::Reflection* r = at.message->GetReflection();
  switch (at.field->cpp_type()) {
    case google::protobuf::FieldDescriptor::CPPTYPE_INT64: {
      const int64_t v = r->GetInt64(*at.message, at.field);
      return {static_cast<double>(v), v, absl::StrCat(v)};
    }
    case google::protobuf::FieldDescriptor::CPPTYPE_UINT64: {
      const uint64_t v = r->GetUInt64(*at.message, at.field);
      return {static_cast<double>(v), 0, absl::StrCat(v)};
    }
    case google::protobuf::FieldDescriptor::CPPTYPE_FLOAT: {
      const float v = r->GetFloat(*at.message, at.field);
      return {v, 0, absl::StrCat(v)};
    }
    case google::protobuf::FieldDescriptor::CPPTYPE_BOOL: {
      const bool v = r->GetBool(*at.message, at.field);
      return {v ? 1.0 : 0.0, 0, v ? "true" : "false"};
    }
    default:
      return {0, 0, "?"};
  }
}

bool Passes(Check check, double v) {
  switch (check) {
    case Check::kAny: return true;
    case Check::kPositive: return v > 0;
    case Check::kNonNegative: return v >= 0;
    case Check::kAtLeastTwo: return v >= 2;
    case Check::kUnitInterval: return v >= 0 && v <= 1;
    case Check::kFiniteNonNegative: return std::isfinite(v) && v >= 0;
    case Check::kFiniteAtLeastOne: return std::isfinite(v) && v >= 1;
    case Check::kFinitePositive: return std::isfinite(v) && v > 0;
  }
  return true;
}

absl::string_view Needs(Check check) {
  switch (check) {
    case Check::kAny: return "";
    case Check::kPositive: return "must be > 0";
    case Check::kNonNegative: return "must be >= 0";
    case Check::kAtLeastTwo: return "must be >= 2";
    case Check::kUnitInterval: return "must be in [0, 1]";
    case Check::kFiniteNonNegative: return "must be finite and >= 0";
    case Check::kFiniteAtLeastOne: return "must be finite and >= 1";
    case Check::kFinitePositive: return "must be finite and > 0";
  }
  return "";
}

std::string DefaultText(const FieldRule& rule) {
  switch (rule.fill.kind) {
    case Default::kNone: return "";
    case Default::kBool: return rule.fill.b ? "true" : "false";
    case Default::kFloat: return absl::StrCat(rule.fill.f);
    case Default::kInt:
      if (rule.unit == Unit::kBytes && rule.fill.i > 0 && rule.fill.i % (int64_t{1} << 30) == 0) {
        return absl::StrCat(rule.fill.i >> 30, " GiB");
      }
      if (rule.unit == Unit::kBytes && rule.fill.i > 0 && rule.fill.i % (int64_t{1} << 20) == 0) {
        return absl::StrCat(rule.fill.i >> 20, " MiB");
      }
      return absl::StrCat(rule.fill.i);
  }
  return "";
}

// "must be > 0 (0: no prefetch; unset: 32 MiB)".
std::string Requirement(const FieldRule& rule) {
  std::vector<std::string> notes;
  if (!rule.help.empty()) notes.emplace_back(rule.help);
  if (rule.fill.kind != Default::kNone) notes.push_back(absl::StrCat("unset: ", DefaultText(rule)));
  std::string out(Needs(rule.check));
  if (!notes.empty()) absl::StrAppend(&out, " (", absl::StrJoin(notes, "; "), ")");
  return out;
}

bool InScope(Scope scope, const ZeroConfig* zero) {
  if (scope == Scope::kAlways) return true;
  const OffloadOptimizerConfig::Device optimizer = zero->offload_optimizer().device();
  switch (scope) {
    case Scope::kAlways: return true;
    case Scope::kOffloadedOptimizer: return optimizer != OffloadOptimizerConfig::NONE;
    case Scope::kNvmeOptimizer: return optimizer == OffloadOptimizerConfig::NVME;
    case Scope::kNvmeParameters: return zero->offload_param().device() == OffloadParamConfig::NVME;
    case Scope::kNvmeAny:
      return optimizer == OffloadOptimizerConfig::NVME || zero->offload_param().device() == OffloadParamConfig::NVME;
  }
  return true;
}

absl::string_view ScopeNeeds(Scope scope) {
  switch (scope) {
    case Scope::kAlways: return "";
    case Scope::kOffloadedOptimizer: return "needs offload_optimizer.device = CPU or NVME";
    case Scope::kNvmeOptimizer: return "needs offload_optimizer.device = NVME";
    case Scope::kNvmeParameters: return "needs offload_param.device = NVME";
    case Scope::kNvmeAny: return "needs offload_optimizer.device = NVME or offload_param.device = NVME";
  }
  return "";
}

// Every unset field of `rules` in scope set to its default.
template <size_t N>
void FillDefaults(google::protobuf::Message& config, const FieldRule (&rules)[N], const ZeroConfig* zero) {
  for (const FieldRule& rule : rules) {
    if (rule.fill.kind == Default::kNone || !InScope(rule.scope, zero)) continue;
    const google::protobuf::FieldDescriptor* f = nullptr;
    google::protobuf::Message* m = LocateMutable(config, rule.path, &f);
    const google::protobuf::Reflection* r = m->GetReflection();
    if (r->HasField(*m, f)) continue;
    switch (f->cpp_type()) {
      case google::protobuf::FieldDescriptor::CPPTYPE_INT64: r->SetInt64(m, f, rule.fill.i); break;
      case google::protobuf::FieldDescriptor::CPPTYPE_UINT64: r->SetUInt64(m, f, static_cast<uint64_t>(rule.fill.i)); break;
      case google::protobuf::FieldDescriptor::CPPTYPE_FLOAT: r->SetFloat(m, f, static_cast<float>(rule.fill.f)); break;
      case google::protobuf::FieldDescriptor::CPPTYPE_BOOL: r->SetBool(m, f, rule.fill.b); break;
      default: break;
    }
  }
}

// The lower checks and scopes of `rules` (the first failure), or, with
// `upper`, their upper bounds.
template <size_t N>
absl::Status CheckRules(const google::protobuf::Message& config, const FieldRule (&rules)[N], const ZeroConfig* zero,
                        absl::string_view what, bool upper) {
  for (const FieldRule& rule : rules) {
    const Located at = Locate(config, rule.path);
    const bool set = at.field->has_presence() ? at.message->GetReflection()->HasField(*at.message, at.field) : true;
    if (!set) continue;
    const Value v = Read(at);
    if (upper) {
      // Every bounded field is an int64.
      if (rule.max > 0) MEMWALL_RETURN_IF_ERROR(AtMost(what, rule.path, v.integer, rule.max, rule.max_why));
      continue;
    }
    if (!InScope(rule.scope, zero) && !(rule.zero_is_off && v.number == 0)) {
      return BadField(what, rule.path, v.text, ScopeNeeds(rule.scope));
    }
    if (!Passes(rule.check, v.number)) return BadField(what, rule.path, v.text, Requirement(rule));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::pair<std::string, std::string>> ConfigTable() {
  std::vector<std::pair<std::string, std::string>> rows;
  for (const FieldRule& rule : kTrainingRules) rows.emplace_back(std::string(rule.path), Requirement(rule));
  for (const FieldRule& rule : kZeroRules) rows.emplace_back(absl::StrCat("zero.", rule.path), Requirement(rule));
  return rows;
}

ZeroConfig WithDefaults(const ZeroConfig& c) {
  ZeroConfig out = c;
  FillDefaults(out, kZeroRules, &out);
  if (out.offload_param().device() == OffloadParamConfig::NVME && !out.offload_param().has_read_ahead_buffers()) {
    out.mutable_offload_param()->set_read_ahead_buffers(out.offload_param().buffer_count() - 1);
  }
  return out;
}

absl::Status ValidateZeroConfig(const ZeroConfig& c, absl::string_view what) {
  auto Bad = [what](absl::string_view field, int64_t value, absl::string_view need) {
    return BadField(what, field, value, need);
  };
  if (c.stage() < 0 || c.stage() > 3) return Bad("stage", c.stage(), "must be 0, 1, 2 or 3");
  const OffloadOptimizerConfig& o = c.offload_optimizer();
  if (!OffloadOptimizerConfig::Device_IsValid(o.device())) {
    return Bad("offload_optimizer.device", o.device(), "must be NONE, CPU or NVME");
  }
  const OffloadParamConfig& param = c.offload_param();
  if (!OffloadParamConfig::Device_IsValid(param.device())) {
    return Bad("offload_param.device", param.device(), "must be NONE, CPU or NVME");
  }
  MEMWALL_RETURN_IF_ERROR(CheckRules(c, kZeroRules, &c, what, /*upper=*/false));
  // What no single row says: the paths, the stages each placement needs,
  // read_ahead_buffers against buffer_count.
  if (o.device() != OffloadOptimizerConfig::NVME && !o.nvme_path().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, "offload_optimizer.nvme_path = \"", o.nvme_path(),
                                                   "\" needs offload_optimizer.device = NVME"));
  }
  // A NUL would end the path early at the system calls: swap files under
  // another directory, or a file where the directory was meant.
  for (const auto& [field, path] : {std::pair<const char*, const std::string*>{"offload_optimizer", &o.nvme_path()},
                                    {"offload_param", &param.nvme_path()}}) {
    if (path->find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(what, field, ".nvme_path holds a NUL byte"));
    }
  }
  if (o.device() == OffloadOptimizerConfig::NVME && o.nvme_path().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, "offload_optimizer.nvme_path is empty: device = NVME "
                                                   "needs the directory of the swap files"));
  }
  if (o.gradients_on_nvme() && o.delayed_update_after_steps() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, "offload_optimizer.gradients_on_nvme = true with delayed_update_after_steps = ",
        o.delayed_update_after_steps(), ": the delayed update shares the gradient shard in pinned host memory with "
        "the next backward; turn one of them off"));
  }
  if (o.delayed_values_on_device()) {
    if (o.delayed_update_after_steps() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, "offload_optimizer.delayed_values_on_device = true needs "
                                                     "the delayed update (offload_optimizer.delayed_update_after_steps > 0)"));
    }
    if (param.device() != OffloadParamConfig::NONE) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, "offload_optimizer.delayed_values_on_device = true needs the parameters on the device "
          "(offload_param.device = NONE, not ", OffloadParamConfig::Device_Name(param.device()), ")"));
    }
  }
  if (const OffloadParamConfig::Device p = param.device(); p != OffloadParamConfig::NONE && c.stage() != 3) {
    return Bad(absl::StrCat("offload_param.device = ", OffloadParamConfig::Device_Name(p), " with stage"), c.stage(),
               "needs stage 3 (only stage 3 partitions the 16-bit parameters)");
  }
  if (!ZeroConfig::Partitioning_IsValid(c.partitioning())) {
    return Bad("partitioning", c.partitioning(), "must be CONTIGUOUS or BANDWIDTH_CENTRIC");
  }
  if (c.partitioning() == ZeroConfig::BANDWIDTH_CENTRIC && c.stage() != 3) {
    return Bad("partitioning = BANDWIDTH_CENTRIC with stage", c.stage(),
               "needs stage 3 (below it every rank holds every parameter)");
  }
  if (c.aio().has_block_bytes() && c.aio().block_bytes() % kDirectIoAlignment != 0) {
    return Bad("aio.block_bytes", c.aio().block_bytes(),
               absl::StrCat("must be a multiple of ", kDirectIoAlignment, " (O_DIRECT's alignment)"));
  }
  if (param.device() != OffloadParamConfig::NVME && !param.nvme_path().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, "offload_param.nvme_path = \"", param.nvme_path(),
                                                   "\" needs offload_param.device = NVME"));
  }
  if (param.device() == OffloadParamConfig::NVME) {
    if (param.nvme_path().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(what, "offload_param.nvme_path is empty: device = NVME "
                                                     "needs the directory of the parameter swap files"));
    }
    const int64_t buffers = WithDefaults(c).offload_param().buffer_count();
    if (param.has_read_ahead_buffers() && (param.read_ahead_buffers() < 0 || param.read_ahead_buffers() > buffers - 1)) {
      return Bad("offload_param.read_ahead_buffers", param.read_ahead_buffers(),
                 absl::StrCat("must be in [0, buffer_count - 1 = ", buffers - 1,
                              "] (one swap-in buffer stays free for a gather's own reads; unset: buffer_count - 1)"));
    }
    if (o.device() == OffloadOptimizerConfig::NONE) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, "offload_param.device = NVME needs offload_optimizer.device = CPU or NVME: the CPU Adam writes "
                "the updated 16-bit parameters straight to the file, and the device's Adam cannot"));
    }
  }
  if (o.device() != OffloadOptimizerConfig::NONE && c.stage() == 0) {
    return Bad(absl::StrCat("offload_optimizer.device = ", OffloadOptimizerConfig::Device_Name(o.device()),
                            " with stage"),
               c.stage(), "needs stage 1, 2 or 3 (the offloaded optimizer steps this rank's shard)");
  }
  // Upper bounds: each of these sizes a buffer or a loop.
  return CheckRules(c, kZeroRules, &c, what, /*upper=*/true);
}

absl::Status CheckWorldSize(int64_t configured, int launched) {
  if (configured == launched) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "the experiment's world size is ", configured, " but ", launched,
      launched == 1 ? " rank was" : " ranks were",
      " launched (run it with mpirun -np ", configured, ")"));
}

absl::StatusOr<ZeroConfig> ParseZeroConfig(const std::string& text, const std::string& origin) {
  ZeroConfig c;
  if (absl::Status st = ParseTextProto(text, origin, &c); !st.ok()) return st;
  if (absl::Status st = ValidateZeroConfig(c); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": ", st.message()));
  }
  return c;
}

}  // namespace memwall::zero

namespace memwall::zero {

TrainingConfig WithDefaults(const TrainingConfig& c) {
  TrainingConfig out = c;
  FillDefaults(out, kTrainingRules, &out.zero());
  if (out.precision() == PRECISION_UNSPECIFIED) out.set_precision(kDefaultPrecision);
  // Adam's defaults have one home, ops::AdamOptions.
  const ops::AdamOptions adam = AdamFromConfig(c.adam());
  AdamConfig& a = *out.mutable_adam();
  a.set_lr(adam.lr);
  a.set_beta1(adam.beta1);
  a.set_beta2(adam.beta2);
  a.set_eps(adam.eps);
  a.set_weight_decay(adam.weight_decay);
  a.set_adamw(adam.adamw);
  *out.mutable_zero() = WithDefaults(c.zero());
  return out;
}

namespace {

// LrSchedule::MEMWALL: step s of every step.
double MemwallRate(const LrSchedule& s, double lr, int64_t step) {
  const int64_t w = s.warmup_steps();
  if (step <= w) return lr * double(step) / double(w + 1);
  if (s.decay_steps() <= w) return lr;
  const double progress = std::min(1.0, double(step - w) / double(s.decay_steps() - w));
  // The fraction of the way from min_lr_ratio * lr back up to lr.
  const double remaining =
      s.decay() == LrSchedule::LINEAR ? 1.0 - progress : 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return lr * (s.min_lr_ratio() + (1.0 - s.min_lr_ratio()) * remaining);
}

// LrSchedule::DEEPSPEED: DeepSpeed's scheduler at iteration i = applied - 1,
// in DeepSpeed's order of operations, so the doubles agree.
double DeepSpeedRate(const LrSchedule& s, double lr, int64_t applied) {
  const int64_t i = applied - 1, w = std::max<int64_t>(2, s.warmup_steps()), t = s.decay_steps();
  if (i < 0) return 0.0;
  if (i < w) {
    return lr * (s.warmup() == LrSchedule::LOG_WARMUP ? std::log(double(i + 1)) * (1.0 / std::log(double(w)))
                                                      : double(i) / double(w));
  }
  if (t <= 0) return lr;
  if (s.decay() == LrSchedule::LINEAR) return lr * std::max(0.0, double(t - i) / double(std::max<int64_t>(1, t - w)));
  const double m = s.min_lr_ratio();
  const double cosine = (1.0 + std::cos(std::numbers::pi * double(i - w + 1) / double(t - w))) / 2.0;
  return lr * std::max(0.0, m + (1.0 - m) * cosine);
}

}  // namespace

float ScheduledLearningRate(const TrainingConfig& filled, int64_t step, int64_t applied) {
  const LrSchedule& s = filled.schedule();
  const double lr = filled.adam().lr();
  return static_cast<float>(s.convention() == LrSchedule::DEEPSPEED ? DeepSpeedRate(s, lr, applied)
                                                                    : MemwallRate(s, lr, step));
}

absl::Status ValidateTrainingConfig(const TrainingConfig& c, absl::string_view what) {
  MEMWALL_RETURN_IF_ERROR(CheckRules(c, kTrainingRules, &c.zero(), what, /*upper=*/false));
  MEMWALL_RETURN_IF_ERROR(CheckRules(c, kTrainingRules, &c.zero(), what, /*upper=*/true));
  // A micro-batch's tokens index its activations' rows.
  const TrainingConfig filled = WithDefaults(c);
  if (absl::Status st = CheckedProduct(absl::StrCat(what, "tokens of a micro-batch"),
                                       {{"micro_batch", filled.micro_batch()}, {"seq", filled.seq()}}, kMaxCount)
                            .status();
      !st.ok()) {
    return st;
  }
  if (!Precision_IsValid(c.precision())) {
    return BadField(what, "precision", static_cast<int>(c.precision()), "must be FP32, BF16 or FP16 (unset: BF16)");
  }
  if (!LrSchedule::Decay_IsValid(c.schedule().decay())) {
    return BadField(what, "schedule.decay", static_cast<int>(c.schedule().decay()), "must be COSINE or LINEAR");
  }
  if (!LrSchedule::Convention_IsValid(c.schedule().convention())) {
    return BadField(what, "schedule.convention", static_cast<int>(c.schedule().convention()),
                    "must be MEMWALL or DEEPSPEED");
  }
  if (!LrSchedule::Warmup_IsValid(c.schedule().warmup())) {
    return BadField(what, "schedule.warmup", static_cast<int>(c.schedule().warmup()),
                    "must be LINEAR_WARMUP or LOG_WARMUP");
  }
  if (c.schedule().warmup() == LrSchedule::LOG_WARMUP && c.schedule().convention() != LrSchedule::DEEPSPEED) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "schedule.warmup = LOG_WARMUP is DeepSpeed's: it needs convention: DEEPSPEED"));
  }
  if (const LrSchedule& s = filled.schedule(); s.convention() == LrSchedule::DEEPSPEED && s.decay_steps() > 0) {
    if (s.decay() == LrSchedule::LINEAR && s.min_lr_ratio() != 0.0f) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, "schedule.convention = DEEPSPEED decays linearly as WarmupDecayLR does, to 0: set min_lr_ratio: 0"));
    }
    if (s.decay() == LrSchedule::COSINE && s.decay_steps() <= std::max<int64_t>(2, s.warmup_steps())) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, "schedule.convention = DEEPSPEED with a COSINE decay (WarmupCosineLR) needs decay_steps = ",
          s.decay_steps(), " > warmup_steps (at least 2)"));
    }
  }
  if (absl::Status st = ops::ValidateAdamOptions(AdamFromConfig(c.adam()), absl::StrCat(what, "adam."));
      !st.ok()) {
    return st;
  }
  return ValidateZeroConfig(c.zero(), absl::StrCat(what, "zero."));
}

TrainingOptions::TrainingOptions() : TrainingOptions(WithDefaults(TrainingConfig())) {}

TrainingOptions::TrainingOptions(const TrainingConfig& filled)
    : config_(filled), adam_(AdamFromConfig(filled.adam())) {}

absl::StatusOr<TrainingOptions> TrainingOptions::Create(const TrainingConfig& config, absl::string_view what) {
  if (absl::Status st = ValidateTrainingConfig(config, what); !st.ok()) return st;
  return TrainingOptions(WithDefaults(config));
}

absl::StatusOr<TrainingOptions> TrainingOptions::Parse(const std::string& text, const std::string& origin) {
  TrainingConfig c;
  if (absl::Status st = ParseTextProto(text, origin, &c); !st.ok()) return st;
  return Create(c, absl::StrCat(origin, ": TrainingConfig "));
}

}  // namespace memwall::zero
