#include "zero/trainer.h"

#include <chrono>
#include <map>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/files.h"
#include "runtime/status.h"
#include "runtime/thread_pool.h"
#include "zero/config.h"

namespace memwall::zero {
namespace {

Tensor FlatF32(const Buffer& b, Device& device) { return Tensor::OfBuffer(b, DType::kF32, &device); }

DType HalfType(Precision p) { return p == Precision::kFp16 ? DType::kF16 : DType::kBF16; }

}  // namespace

absl::string_view PrecisionName(Precision p) {
  switch (p) {
    case Precision::kFp32: return "fp32";
    case Precision::kBf16: return "bf16";
    case Precision::kFp16: return "fp16";
  }
  return "?";
}

absl::StatusOr<Precision> ParsePrecision(absl::string_view name) {
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    if (PrecisionName(p) == name) return p;
  }
  return absl::InvalidArgumentError(absl::StrCat("precision '", name, "' is not one of fp32, bf16, fp16"));
}

absl::Status ValidateOptions(const TrainerOptions& o) {
  auto bad = [](absl::string_view field, auto value, absl::string_view need) {
    return absl::InvalidArgumentError(absl::StrCat("trainer option ", field, " = ", value, " ", need));
  };
  if (o.seq <= 0) return bad("seq", o.seq, "must be > 0");
  if (o.micro_batch <= 0) return bad("micro_batch", o.micro_batch, "must be > 0");
  if (o.accumulation <= 0) return bad("accumulation", o.accumulation, "must be > 0");
  MEMWALL_RETURN_IF_ERROR(ops::ValidateAdamOptions(o.adam, "trainer option adam."));
  if (o.warmup_steps < 0) return bad("warmup_steps", o.warmup_steps, "must be >= 0");
  if (o.decay_steps < 0) return bad("decay_steps", o.decay_steps, "must be >= 0");
  if (!(o.min_lr_ratio >= 0 && o.min_lr_ratio <= 1)) return bad("min_lr_ratio", o.min_lr_ratio, "must be in [0, 1]");
  if (!(o.clip_norm >= 0)) return bad("clip_norm", o.clip_norm, "must be >= 0 (0 disables clipping)");
  if (!(o.initial_loss_scale >= 1) || !std::isfinite(o.initial_loss_scale)) {
    return bad("initial_loss_scale", o.initial_loss_scale, "must be finite and >= 1");
  }
  if (o.loss_scale_growth_interval <= 0) {
    return bad("loss_scale_growth_interval", o.loss_scale_growth_interval, "must be > 0");
  }
  if (!(o.min_loss_scale > 0)) return bad("min_loss_scale", o.min_loss_scale, "must be > 0");
  return ValidateZeroConfig(o.zero);
}

Trainer::Trainer(models::Gpt& model, Device& device, Communicator& comm,
                 const TrainerOptions& options)
    : model_(model), device_(device), comm_(comm), options_(options), zero_(WithDefaults(options.zero)) {
  loss_scale_ = options.precision == Precision::kFp16 ? options.initial_loss_scale : 1.0f;
}

Trainer::~Trainer() {
  (void)device_.Synchronize();
  if (hook_id_ != 0) model_.RemoveHookRecursive(hook_id_);
  gather_.reset();
  buckets_.reset();
  sink_.reset();
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(models::Gpt& model, Device& device,
                                                         Communicator& comm,
                                                         const TrainerOptions& options) {
  MEMWALL_RETURN_IF_ERROR(ValidateOptions(options));
  if (options.seq > model.config().positions()) {
    return absl::InvalidArgumentError(absl::StrCat("trainer option seq = ", options.seq,
                                                   " exceeds the model's ",
                                                   model.config().positions(), " positions"));
  }
  if (options.zero.offload_optimizer().device() != OffloadOptimizerConfig::NONE &&
      !options.shard_optimizer_factory) {
    return absl::FailedPreconditionError(
        "ZeroConfig offload_optimizer.device = CPU: create the trainer with offload::CreateTrainer "
        "(//offload), which supplies the host optimizer");
  }
  if (options.shard_optimizer_factory && (options.zero.stage() < 1 || options.zero.stage() > 2)) {
    return absl::InvalidArgumentError(absl::StrCat("an offloaded optimizer needs ZeRO stage 1 or 2, not ",
                                                   options.zero.stage()));
  }
  std::unique_ptr<Trainer> t(new Trainer(model, device, comm, options));
  MEMWALL_RETURN_IF_ERROR(t->Allocate());
  return t;
}

DType Trainer::param_dtype() const {
  return options_.precision == Precision::kFp32 ? DType::kF32 : HalfType(options_.precision);
}

absl::Status Trainer::Allocate() {
  if (zero_.stage() > 0) return AllocatePartitioned();
  layout_ = FlatLayout(model_, comm_.world_size(), comm_.rank());  // the tensor table
  const bool half = options_.precision != Precision::kFp32;
  // 16-bit modes: params and grads 2 bytes each, fp32 master and Adam
  // moments 12: the 16 bytes per parameter of ZeRO Sec. 3.1.
  MEMWALL_ASSIGN_OR_RETURN(
      storage_, models::BindFlatStorage(model_, device_, true,
                                        half ? MemoryTag::kParams16 : MemoryTag::kMasterParams,
                                        half ? HalfType(options_.precision) : DType::kF32));
  MEMWALL_RETURN_IF_ERROR(model_.Initialize(options_.seed, device_));
  Stream& s = device_.compute_stream();
  // fp32: the model's values are the master weights. 16-bit: the master
  // starts from the 16-bit initial values, widened exactly.
  MEMWALL_ASSIGN_OR_RETURN(
      optimizer_, CreateDeviceShardOptimizer(device_, options_.adam, storage_.numel, storage_.Grads(device_),
                                             half ? std::nullopt : std::optional<Tensor>(storage_.Values(device_))));
  MEMWALL_RETURN_IF_ERROR(optimizer_->SetMasterFromValues(storage_.Values(device_), s));
  MEMWALL_ASSIGN_OR_RETURN(norm_, device_.Allocate(2 * sizeof(float), MemoryTag::kWorkspace));
  MEMWALL_ASSIGN_OR_RETURN(loss_, device_.Allocate(2 * sizeof(float), MemoryTag::kCommBuffers));
  return s.Synchronize();
}

Tensor Trainer::ValuesShard() const {
  const Tensor values = Tensor::OfBuffer(values_, param_dtype(), &device_);
  return zero_.stage() == 3 ? values : values.Slice(layout_.shard_begin(), layout_.shard());
}

Tensor Trainer::GradientShard() const {
  if (zero_.stage() == 0) return storage_.Grads(device_);
  const Tensor grads = Tensor::OfBuffer(grads_, param_dtype(), &device_);
  return zero_.stage() == 1 ? grads.Slice(layout_.shard_begin(), layout_.shard()) : grads;
}

absl::Status Trainer::AllocatePartitioned() {
  const int stage = zero_.stage();
  const DType dtype = param_dtype();
  const size_t elem = SizeOf(dtype);
  const bool half = options_.precision != Precision::kFp32;
  const MemoryTag values_tag = half ? MemoryTag::kParams16 : MemoryTag::kMasterParams;
  layout_ = FlatLayout(model_, comm_.world_size(), comm_.rank());
  const int64_t shard = layout_.shard(), padded = layout_.padded();
  Stream& s = device_.compute_stream();
  if (zero_.overlap_comm() && bucketed_gradients()) {
    MEMWALL_ASSIGN_OR_RETURN(comm_stream_, device_.CreateStream(kCommStreamName));
  }

  // Parameters: N shard padded (stage 1, 2) or the shard (stage 3).
  MEMWALL_ASSIGN_OR_RETURN(values_, device_.Allocate((stage == 3 ? shard : padded) * elem, values_tag));
  MEMWALL_RETURN_IF_ERROR(s.Memset(values_.data(), 0, values_.bytes()));
  if (stage < 3) {
    for (models::Parameter* p : layout_.params()) {
      p->value = Tensor(values_.as<char>() + layout_.offset(p) * elem, dtype, p->shape, &device_);
    }
  }
  // Gradients: N shard padded (stage 1) or the shard (stage 2, 3); none on
  // the device when the optimizer keeps them (offload).
  const bool offload = options_.shard_optimizer_factory != nullptr;
  if (!offload) {
    MEMWALL_ASSIGN_OR_RETURN(grads_, device_.Allocate((bucketed_gradients() ? shard : padded) * elem,
                                                      MemoryTag::kGrads));
    MEMWALL_RETURN_IF_ERROR(s.Memset(grads_.data(), 0, grads_.bytes()));
  }
  if (!bucketed_gradients()) {
    for (models::Parameter* p : layout_.params()) {
      p->grad = Tensor(grads_.as<char>() + layout_.offset(p) * elem, dtype, p->shape, &device_);
    }
  }
  // A reduce bucket holds at least the largest module's gradients.
  const int64_t capacity = std::min<int64_t>(
      padded, std::max<int64_t>(zero_.reduce_bucket_bytes() / elem, LargestModuleParameters(model_)));
  // fp32 master weights and Adam's moments: the shard.
  if (offload) {
    ShardOptimizerRequest request;
    request.device = &device_;
    request.elements = shard;
    request.grad_dtype = dtype;
    request.value_dtype = dtype;
    request.largest_piece = capacity;
    request.adam = options_.adam;
    request.zero = zero_;
    MEMWALL_ASSIGN_OR_RETURN(optimizer_, options_.shard_optimizer_factory(request));
  } else {
    MEMWALL_ASSIGN_OR_RETURN(optimizer_, CreateDeviceShardOptimizer(device_, options_.adam, shard, GradientShard()));
  }
  MEMWALL_ASSIGN_OR_RETURN(norm_, device_.Allocate(2 * sizeof(float), MemoryTag::kWorkspace));
  MEMWALL_ASSIGN_OR_RETURN(loss_, device_.Allocate(2 * sizeof(float), MemoryTag::kCommBuffers));

  // This rank's shard of the initial values (Gpt::InitialValues: the same
  // numbers as stage 0's Initialize), rounded to the parameter type; the
  // master starts from that rounded value, widened, as at stage 0.
  std::vector<float> init(shard, 0.0f);
  const FlatRange mine = layout_.OwnedReal();
  ThreadPool pool(0);
  for (models::Parameter* p : layout_.params()) {
    const int64_t begin = std::max(mine.begin, layout_.offset(p));
    const int64_t end = std::min(mine.end, layout_.offset(p) + p->numel());
    if (begin >= end) continue;
    constexpr int64_t kChunk = 1 << 16;
    pool.ParallelFor((end - begin + kChunk - 1) / kChunk, [&](int64_t c) {
      const int64_t lo = begin + c * kChunk, hi = std::min(end, lo + kChunk);
      model_.InitialValues(options_.seed, *p, lo - layout_.offset(p), hi - lo,
                           init.data() + (lo - layout_.shard_begin()));
    });
  }
  // Rounded to the parameter type, and the master widened back from that.
  MEMWALL_RETURN_IF_ERROR(optimizer_->WriteState(OptimizerState::kMaster, 0, shard, init.data()));
  MEMWALL_RETURN_IF_ERROR(optimizer_->WriteValues(ValuesShard(), s));
  MEMWALL_RETURN_IF_ERROR(optimizer_->SetMasterFromValues(ValuesShard(), s));
  MEMWALL_RETURN_IF_ERROR(s.Synchronize());

  if (stage < 3) {  // the all-gather bucket: N chunks of equal size
    const int64_t n = comm_.world_size();
    const int64_t cap = std::min<int64_t>(padded, zero_.allgather_bucket_bytes() / elem);
    const int64_t chunk = std::max<int64_t>(1, cap / n);
    MEMWALL_ASSIGN_OR_RETURN(gather_bucket_, device_.Allocate(chunk * n * elem, MemoryTag::kCommBuffers));
    MEMWALL_RETURN_IF_ERROR(AllGatherValues());
  }
  if (bucketed_gradients()) {
    GradientSink* sink = optimizer_->gradient_sink();
    if (sink == nullptr) {
      sink_ = std::make_unique<DeviceGradientSink>(Tensor::OfBuffer(grads_, dtype, &device_));
      sink = sink_.get();
    }
    MEMWALL_ASSIGN_OR_RETURN(buckets_, GradientBuckets::Create(layout_, device_, comm_, coll(), dtype,
                                                               capacity, comm_stream_ ? 2 : 1, *sink));
  }
  if (stage == 3) {
    MEMWALL_ASSIGN_OR_RETURN(gather_, ParameterGather::Create(layout_, model_, device_, comm_, coll(),
                                                              dtype, values_tag, ValuesShard(), zero_));
    MEMWALL_RETURN_IF_ERROR(gather_->RefreshPersistent());
  }
  if (bucketed_gradients()) {
    hook_id_ = model_.AddHookRecursive(
        [this](models::Module& m, models::HookPoint point) { return OnHook(m, point); });
  }
  MEMWALL_RETURN_IF_ERROR(coll().Synchronize());
  return s.Synchronize();
}

absl::Status Trainer::OnHook(models::Module& m, models::HookPoint point) {
  switch (point) {
    case models::HookPoint::kBeforeForward:
      return gather_ ? gather_->Acquire(m) : absl::OkStatus();
    case models::HookPoint::kAfterForward:
    case models::HookPoint::kAfterBackward:
      return gather_ ? gather_->Release(m) : absl::OkStatus();
    case models::HookPoint::kBeforeBackward:
      if (gather_) MEMWALL_RETURN_IF_ERROR(gather_->Acquire(m));
      return buckets_->Bind(m);
  }
  return absl::OkStatus();
}

absl::Status Trainer::AllGatherValues() {
  // Chunk k of every rank's shard travels together: rank r's piece goes to
  // bucket block r, the all-gather fills the others, and block r lands at
  // r shard + k chunk. Runs on the compute stream (stage 1, 2 update here).
  Stream& s = device_.compute_stream();
  const DType dtype = param_dtype();
  const int64_t n = comm_.world_size(), shard = layout_.shard();
  const int64_t chunk = static_cast<int64_t>(gather_bucket_.bytes() / SizeOf(dtype)) / n;
  const Tensor values = Tensor::OfBuffer(values_, dtype, &device_);
  const Tensor bucket = Tensor::OfBuffer(gather_bucket_, dtype, &device_);
  for (int64_t at = 0; at < shard; at += chunk) {
    const int64_t len = std::min(chunk, shard - at);
    const Tensor all = bucket.Slice(0, len * n);
    const Tensor mine = all.Slice(comm_.rank() * len, len);
    const Tensor src = values.Slice(layout_.shard_begin() + at, len);
    MEMWALL_RETURN_IF_ERROR(s.Copy(mine.data(), src.data(), mine.bytes()));
    MEMWALL_RETURN_IF_ERROR(comm_.AllGather(mine, all, s));
    for (int64_t r = 0; r < n; ++r) {
      if (r == comm_.rank()) continue;
      const Tensor dst = values.Slice(r * shard + at, len);
      MEMWALL_RETURN_IF_ERROR(s.Copy(dst.data(), all.Slice(r * len, len).data(), dst.bytes()));
    }
  }
  return absl::OkStatus();
}

absl::Status Trainer::RefreshComputeCopy() {
  Stream& s = device_.compute_stream();
  if (zero_.stage() == 0) return optimizer_->WriteValues(storage_.Values(device_), s);
  MEMWALL_RETURN_IF_ERROR(optimizer_->WriteValues(ValuesShard(), s));
  return GatherValues();
}

absl::Status Trainer::GatherValues() {
  if (zero_.stage() == 0) return absl::OkStatus();
  if (zero_.stage() < 3) return AllGatherValues();
  MEMWALL_RETURN_IF_ERROR(device_.compute_stream().Synchronize());  // coll reads the shard next
  return gather_->RefreshPersistent();
}

bool Trainer::delayed_update_active() const {
  const int64_t after = zero_.offload_optimizer().delayed_update_after_steps();
  return after > 0 && step_ > after && optimizer_->SupportsDelayedUpdate();
}

absl::Status Trainer::ApplyPendingUpdate() {
  if (!pending_.has_value()) return absl::OkStatus();
  Stream& s = device_.compute_stream();
  MEMWALL_RETURN_IF_ERROR(optimizer_->StartDelayedStep(*pending_));
  pending_.reset();
  MEMWALL_RETURN_IF_ERROR(optimizer_->FinishDelayedStep(zero_.stage() == 0 ? storage_.Values(device_) : ValuesShard(), s));
  MEMWALL_RETURN_IF_ERROR(GatherValues());
  MEMWALL_RETURN_IF_ERROR(coll().Synchronize());
  return s.Synchronize();
}

absl::StatusOr<std::vector<float>> Trainer::MasterWeights() {
  MEMWALL_RETURN_IF_ERROR(ApplyPendingUpdate());
  Stream& s = device_.compute_stream();
  if (zero_.stage() == 0) {
    std::vector<float> out(storage_.numel);
    MEMWALL_RETURN_IF_ERROR(optimizer_->ReadState(OptimizerState::kMaster, 0, out.size(), out.data()));
    return out;
  }
  // Each rank's shard, staged through device memory for the all-gather.
  const int64_t shard = layout_.shard();
  std::vector<float> mine(shard);
  MEMWALL_RETURN_IF_ERROR(optimizer_->ReadState(OptimizerState::kMaster, 0, shard, mine.data()));
  MEMWALL_ASSIGN_OR_RETURN(Buffer all, device_.Allocate(layout_.padded() * sizeof(float),
                                                        MemoryTag::kOther));
  const Tensor whole = FlatF32(all, device_);
  const Tensor slot = whole.Slice(layout_.shard_begin(), shard);
  MEMWALL_RETURN_IF_ERROR(s.Copy(slot.data(), mine.data(), slot.bytes()));
  MEMWALL_RETURN_IF_ERROR(comm_.AllGather(slot, whole, s));
  std::vector<float> out(layout_.numel());
  MEMWALL_RETURN_IF_ERROR(s.Copy(out.data(), all.data(), out.size() * sizeof(float)));
  MEMWALL_RETURN_IF_ERROR(s.Synchronize());
  return out;
}

float Trainer::LearningRate(int64_t step) const {
  const double lr = options_.adam.lr;
  if (step <= options_.warmup_steps) return static_cast<float>(lr * step / (options_.warmup_steps + 1));
  if (options_.decay_steps <= options_.warmup_steps) return static_cast<float>(lr);
  const double progress = std::min(1.0, double(step - options_.warmup_steps) /
                                            double(options_.decay_steps - options_.warmup_steps));
  const double cosine = 0.5 * (1.0 + std::cos(3.141592653589793 * progress));
  return static_cast<float>(lr * (options_.min_lr_ratio + (1.0 - options_.min_lr_ratio) * cosine));
}

absl::StatusOr<StepStats> Trainer::Step(const models::TokenSource& data) {
  const auto start = std::chrono::steady_clock::now();
  // The step's window on the timeline: from here (before a delayed update
  // starts) to after the last synchronize.
  const int64_t step_begin_ns = TimelineNowNs();
  const models::BatchLayout layout{options_.seq, options_.micro_batch, options_.accumulation,
                                   comm_.world_size()};
  MEMWALL_RETURN_IF_ERROR(models::ValidateLayout(data, layout));
  if (data.vocab() > model_.config().vocab()) {
    return absl::InvalidArgumentError(absl::StrCat(data.description(), " has a vocabulary of ",
                                                   data.vocab(), "; the model's is ",
                                                   model_.config().vocab()));
  }
  Stream& s = device_.compute_stream();
  Stream& c = coll();
  const int stage = zero_.stage();
  const Tensor grads = stage == 0 ? storage_.Grads(device_)
                                  : Tensor::OfBuffer(grads_, param_dtype(), &device_);
  // Delayed parameter update: the previous iteration's step runs on the
  // host while this iteration computes on the parameters it had. It
  // consumes the gradient shard, so it starts before a fresh one is zeroed.
  const bool finish_pending = pending_.has_value();
  if (finish_pending) {
    MEMWALL_RETURN_IF_ERROR(optimizer_->StartDelayedStep(*pending_));
    pending_.reset();
  }
  if (grads.data() != nullptr) MEMWALL_RETURN_IF_ERROR(s.Memset(grads.data(), 0, grads.bytes()));
  MEMWALL_RETURN_IF_ERROR(optimizer_->ZeroGradients(s));

  // Forward and backward over this rank's micro-batches.
  const int64_t global_tokens = layout.global_batch() * options_.seq;
  const float grad_scale = loss_scale_ / static_cast<float>(global_tokens);
  std::vector<int32_t> ids(options_.micro_batch * options_.seq), targets(ids.size());
  models::LossSum local;
  Timeline* timeline = options_.timeline;
  for (int64_t micro = 0; micro < options_.accumulation; ++micro) {
    optimizer_->BeginMicroBatch(micro, options_.accumulation);
    MEMWALL_RETURN_IF_ERROR(models::FillMicroBatch(data, layout, step_, comm_.rank(), micro,
                                                   ids.data(), targets.data()));
    if (options_.edit_micro_batch) {
      options_.edit_micro_batch(comm_.rank(), micro, ids.size(), ids.data(), targets.data());
    }
    if (gather_) gather_->BeginPass();
    absl::StatusOr<models::LossSum> part;
    {
      StreamZone zone(timeline, s, ZoneKind::kForwardBackward);
      part = model_.ForwardBackward(device_, ids.data(), targets.data(), options_.micro_batch,
                                    options_.seq, grad_scale, true);
    }
    // Stage 2, 3: what is left in the buckets is reduced now.
    absl::Status pass = part.status();
    if (pass.ok() && buckets_) pass = buckets_->FlushAll();
    if (pass.ok() && gather_) pass = gather_->EndPass();
    if (!pass.ok()) {
      // A collective failing on the communication stream (a stage-3
      // divergence) explains a compute failure better than itself.
      absl::Status comm_status = c.Synchronize();
      return comm_status.ok() ? pass : comm_status;
    }
    local.sum += part->sum;
    local.tokens += part->tokens;
  }
  // Data parallelism: sum gradients (stage 0) or reduce-scatter them to
  // their owners (stage 1; stage 2, 3 did it in backward), and the loss.
  if (stage == 0) MEMWALL_RETURN_IF_ERROR(comm_.AllReduce(grads, grads, ReduceOp::kSum, c));
  if (stage == 1 && !bucketed_gradients()) {
    MEMWALL_RETURN_IF_ERROR(comm_.ReduceScatter(grads, GradientShard(), ReduceOp::kSum, c));
  }
  const float loss_host[2] = {static_cast<float>(local.sum), static_cast<float>(local.tokens)};
  MEMWALL_RETURN_IF_ERROR(c.Copy(loss_.data(), loss_host, sizeof(loss_host)));
  const Tensor loss = FlatF32(loss_, device_);
  MEMWALL_RETURN_IF_ERROR(comm_.AllReduce(loss, loss, ReduceOp::kSum, c));
  // Global norm and overflow flag in one pass: over the shards, summed.
  const Tensor norm = FlatF32(norm_, device_);
  MEMWALL_RETURN_IF_ERROR(optimizer_->GradientNorm(norm, c));
  if (stage > 0) MEMWALL_RETURN_IF_ERROR(comm_.AllReduce(norm, norm, ReduceOp::kSum, c));
  float norm_host[2], loss_sum[2];
  MEMWALL_RETURN_IF_ERROR(c.Copy(norm_host, norm_.data(), sizeof(norm_host)));
  MEMWALL_RETURN_IF_ERROR(c.Copy(loss_sum, loss_.data(), sizeof(loss_sum)));
  MEMWALL_RETURN_IF_ERROR(c.Synchronize());
  MEMWALL_RETURN_IF_ERROR(s.Synchronize());

  ++step_;
  StepStats stats;
  stats.step = step_;
  stats.loss = loss_sum[1] > 0 ? double(loss_sum[0]) / double(loss_sum[1]) : 0.0;
  stats.loss_scale = loss_scale_;
  stats.lr = LearningRate(step_);
  stats.tokens = global_tokens;
  const bool overflow = norm_host[1] != 0.0f || !std::isfinite(norm_host[0]);
  stats.grad_norm = std::sqrt(double(norm_host[0])) / loss_scale_;
  if (overflow && finish_pending) {
    // The previous iteration's update still lands; only this one is skipped.
    MEMWALL_RETURN_IF_ERROR(
        optimizer_->FinishDelayedStep(stage == 0 ? storage_.Values(device_) : ValuesShard(), s));
    MEMWALL_RETURN_IF_ERROR(GatherValues());
    MEMWALL_RETURN_IF_ERROR(c.Synchronize());
    MEMWALL_RETURN_IF_ERROR(s.Synchronize());
  }
  if (overflow) {
    stats.skipped = true;
    stats.grad_norm = NAN;
    if (options_.precision == Precision::kFp16) {
      loss_scale_ = std::max(options_.min_loss_scale, loss_scale_ / 2);
    }
    clean_steps_ = 0;
  } else {
    const double clip = options_.clip_norm > 0 && stats.grad_norm > options_.clip_norm
                            ? options_.clip_norm / (stats.grad_norm + 1e-6)
                            : 1.0;
    ++adam_step_;
    const StepUpdate update{stats.lr, adam_step_, static_cast<float>(clip / loss_scale_)};
    const Tensor values = stage == 0 ? storage_.Values(device_) : ValuesShard();
    if (finish_pending) {
      MEMWALL_RETURN_IF_ERROR(optimizer_->FinishDelayedStep(values, s));
      MEMWALL_RETURN_IF_ERROR(GatherValues());
    }
    if (delayed_update_active()) {
      // This step's own update waits for the next iteration.
      pending_ = update;
    } else {
      {
        StreamZone zone(options_.shard_optimizer_factory ? nullptr : timeline, s, ZoneKind::kAdam);
        MEMWALL_RETURN_IF_ERROR(optimizer_->Step(update, values, s));
      }
      StreamZone zone(stage > 0 ? timeline : nullptr, s, ZoneKind::kAllGather);
      MEMWALL_RETURN_IF_ERROR(GatherValues());
    }
    MEMWALL_RETURN_IF_ERROR(c.Synchronize());
    MEMWALL_RETURN_IF_ERROR(s.Synchronize());
    if (options_.precision == Precision::kFp16 &&
        ++clean_steps_ >= options_.loss_scale_growth_interval) {
      loss_scale_ *= 2;
      clean_steps_ = 0;
    }
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (timeline) {
    const int64_t step_end_ns = TimelineNowNs();
    std::vector<Zone> zones;
    for (const Zone& z : timeline->Zones()) {
      if (z.complete() && z.begin_ns >= step_begin_ns && z.end_ns <= step_end_ns) zones.push_back(z);
    }
    stats.device_idle_fraction = IdleFraction(Select(zones, s.name()), step_begin_ns, step_end_ns);
    std::map<std::string, int64_t> by_name;  // sorted: a stable line
    for (const Zone& z : zones) by_name[std::string(z.name())] += z.duration_ns();
    for (const auto& [name, ns] : by_name) absl::StrAppendFormat(&stats.breakdown, "%s%s %.3f", stats.breakdown.empty() ? "" : ", ", name, ns / 1e9);
    if (!options_.trace_dir.empty()) {
      MEMWALL_RETURN_IF_ERROR(WriteFileAtomically(
          absl::StrCat(options_.trace_dir, "/step_", step_, ".json"), ChromeTraceJson(zones, comm_.rank())));
    }
  }
  stats.tokens_per_second = double(global_tokens) / stats.seconds;
  const double forward = models::ForwardFlopsPerToken(model_.config(), options_.seq);
  const double rank_tokens = double(global_tokens) / comm_.world_size();
  stats.tflops = 3.0 * forward * rank_tokens / stats.seconds / 1e12;
  stats.recompute_tflops = model_.config().activation_checkpointing()
                               ? forward * rank_tokens / stats.seconds / 1e12
                               : 0.0;
  return stats;
}

std::string Trainer::LogLine(const StepStats& st) const {
  std::string line = absl::StrFormat("step %d | loss %.4f | lr %.2e | grad norm %.3f", st.step,
                                     st.loss, st.lr, st.grad_norm);
  if (options_.precision == Precision::kFp16) absl::StrAppendFormat(&line, " | scale %g", st.loss_scale);
  if (st.skipped) line += " | SKIPPED (inf/NaN gradients)";
  absl::StrAppendFormat(&line, " | %.0f tokens/s | %.3f TFLOPS", st.tokens_per_second, st.tflops);
  if (st.recompute_tflops > 0) absl::StrAppendFormat(&line, " (+%.3f recompute)", st.recompute_tflops);
  absl::StrAppendFormat(&line, " | %.3f s", st.seconds);
  if (st.device_idle_fraction >= 0) {
    absl::StrAppendFormat(&line, " | device idle %.0f%% | %s", 100 * st.device_idle_fraction, st.breakdown);
  }
  return line;
}

}  // namespace memwall::zero
