#include "zero/trainer.h"

#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/agreement.h"
#include "runtime/files.h"
#include "runtime/status.h"
#include "runtime/thread_pool.h"
#include "zero/config.h"
#include "zero/stage_plan.h"

namespace memwall::zero {
namespace {

Tensor FlatF32(const Buffer& b, Device& device) { return Tensor::OfBuffer(b, DType::kF32, &device); }


}  // namespace

// The options without their config, so that the checked TrainingOptions is
// the only copy of it the trainer holds.
static TrainerOptions Wiring(TrainerOptions options) {
  options.training.Clear();
  return options;
}

Trainer::Trainer(models::Gpt& model, Device& device, Communicator& comm, const TrainerOptions& options,
                 TrainingOptions training)
    : model_(model),
      device_(device),
      comm_(comm),
      options_(Wiring(options)),
      training_(std::move(training)),
      loss_scaler_(LossScalingOf(training_.config())) {}

Trainer::~Trainer() {
  (void)device_.Synchronize();
  if (hook_id_ != 0) model_.RemoveHookRecursive(hook_id_);
  optimizer_.reset();
  gradients_.reset();
  params_.reset();
}

namespace {
// What every rank must be given alike: the model (its labels aside), the
// training config (each rank's local swap paths aside) and the world size.
Fingerprint RunFingerprint(const models::GptConfig& model, const TrainingConfig& training, int world_size) {
  Fingerprint f;
  f.AddMessage("model", model, {"name", "source", "paper_micro_batch"});
  f.AddMessage("training", training, {"zero.offload_optimizer.nvme_path", "zero.offload_param.nvme_path"});
  f.Add("world_size", absl::StrCat(world_size));
  return f;
}

// The token stream every rank reads its part of: its size, vocabulary and
// 4096 tokens spread over it.
Fingerprint DataFingerprint(const models::TokenSource& data) {
  constexpr int64_t kSamples = 4096;
  std::string sample;
  const int64_t n = data.size();
  for (int64_t k = 0; k < std::min(n, kSamples); ++k) {
    const int32_t t = data.token(n <= kSamples ? k : static_cast<int64_t>((static_cast<__int128>(k) * n) / kSamples));
    sample.append(reinterpret_cast<const char*>(&t), sizeof(t));
  }
  Fingerprint f;
  f.Add("data tokens", absl::StrCat(n)).Add("data vocab", absl::StrCat(data.vocab()));
  f.Add("data sample crc32", absl::StrCat(absl::Hex(crc32_z(0, reinterpret_cast<const Bytef*>(sample.data()), sample.size()))));
  return f;
}
}  // namespace

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(models::Gpt& model, Device& device,
                                                         Communicator& comm, Composition composition,
                                                         const TrainerOptions& options) {
  // The ranks agree on what they were given before any collective whose
  // shape depends on it (each rank checked its own arguments when its
  // composition was derived, and the ranks agreed on that outcome).
  MEMWALL_RETURN_IF_ERROR(AgreeOnFingerprint(
      comm, device, RunFingerprint(model.config(), composition.training.config(), comm.world_size()),
      "creating the trainer"));
  std::unique_ptr<Trainer> t(new Trainer(model, device, comm, options, composition.training));
  MEMWALL_RETURN_IF_ERROR(t->Agree(t->Build(composition), "building the trainer"));
  MEMWALL_RETURN_IF_ERROR(t->InitializeValues());
  return t;
}

absl::Status Trainer::Build(const Composition& composition) {
  const PlanShape& shape = composition.shape;
  const bool bandwidth = shape.zero.partitioning() == ZeroConfig::BANDWIDTH_CENTRIC;
  layout_ = FlatLayout(model_, shape.owners, shape.owners == 1 ? 0 : comm_.rank(), bandwidth);
  if (layout_.numel() != shape.numel || layout_.shard() != shape.shard || shape.ranks != comm_.world_size()) {
    return absl::InternalError(absl::StrCat("the composition was derived for ", shape.numel, " parameters in shards of ",
                                            shape.shard, " over ", shape.ranks, " rank(s), not this model's ",
                                            layout_.numel(), " in shards of ", layout_.shard(), " over ",
                                            comm_.world_size()));
  }
  // Refused before anything is allocated or written, with the plan's numbers.
  RankPlanInput activations;
  activations.model = &model_.config();
  activations.micro_batch = training_->micro_batch();
  activations.seq = training_->seq();
  activations.checkpointing = model_.config().activation_checkpointing();
  const MemoryPlan plan = RankPlan(shape, composition.parts, activations);
  if (absl::Status st = CheckPlanFits(plan, device_); !st.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("ZeRO stage ", shape.zero.stage(), " on ", comm_.world_size(),
                                                     " rank(s), ", models::CountParameters(model_.config()),
                                                     " parameters: ", st.message()));
  }
  if (composition.parts.comm_stream) {
    MEMWALL_ASSIGN_OR_RETURN(comm_stream_, device_.CreateStream(kCommStreamName));
  }
  const PartContext context{layout_, shape, model_, device_, comm_, coll(), options_.timeline};
  BuiltParts built;
  absl::Status all_built = absl::OkStatus();
  for (const auto& part : composition.parts.list) {
    all_built = part->Build(context, built);
    if (!all_built.ok()) break;
  }
  // Held by the trainer even when a part failed: its destructor waits for
  // the work the built ones enqueued before it frees their memory.
  params_ = std::move(built.parameters);
  gradients_ = std::move(built.gradients);
  optimizer_ = std::move(built.optimizer);
  MEMWALL_RETURN_IF_ERROR(all_built);
  agree_on_optimizer_ = (optimizer_->fails_alone() || params_->shard().fails_alone()) && comm_.world_size() > 1;
  const MemoryPlan scalars = TrainerScalarsPlan(comm_.world_size());
  MEMWALL_ASSIGN_OR_RETURN(norm_, AllocatePlanned(device_, scalars, "norm"));
  MEMWALL_ASSIGN_OR_RETURN(loss_, AllocatePlanned(device_, scalars, "loss"));
  if (scalars.contains("agreement")) {
    MEMWALL_ASSIGN_OR_RETURN(agreement_, AllocatePlanned(device_, scalars, "agreement"));
  }
  hook_id_ = model_.AddHookRecursive(
      [this](models::Module& m, models::HookPoint point) { return OnHook(m, point); });
  return absl::OkStatus();
}

absl::Status Trainer::InitializeValues() {
  Stream& s = device_.compute_stream();
  const int64_t shard = layout_.shard();
  // The master shard's initial values, a window of the shard at a time
  // through kInitWindow elements of host staging: never the whole shard
  // (4 bytes a parameter) beside the planned memory, which the host-memory
  // check would not see. The padding stays zero.
  constexpr int64_t kInitWindow = int64_t{1} << 24;
  std::vector<float> window(std::min(shard, kInitWindow));
  const std::vector<Piece> owned = layout_.Owned();
  ThreadPool pool(0);
  absl::Status initialized;
  for (int64_t w = 0; w < shard && initialized.ok(); w += kInitWindow) {
    const int64_t n = std::min(kInitWindow, shard - w);
    ZeroHost(window.data(), n * sizeof(float), pool);  // the padding's zeros
    for (const Piece& mine : owned) {
      // The piece's elements inside the window, as flat indices.
      const int64_t first = mine.begin + std::max<int64_t>(0, w - mine.shard_offset);
      const int64_t last = mine.begin + std::min(mine.size, w + n - mine.shard_offset);
      if (first >= last) continue;
      for (models::Parameter* p : layout_.params()) {
        const int64_t begin = std::max(first, layout_.offset(p));
        const int64_t end = std::min(last, layout_.offset(p) + p->numel());
        if (begin >= end) continue;
        constexpr int64_t kChunk = 1 << 16;
        pool.ParallelFor((end - begin + kChunk - 1) / kChunk, [&](int64_t c) {
          const int64_t lo = begin + c * kChunk, hi = std::min(end, lo + kChunk);
          model_.InitialValues(training_->seed(), *p, lo - layout_.offset(p), hi - lo,
                               window.data() + (mine.shard_offset + (lo - mine.begin) - w));
        });
      }
    }
    initialized = optimizer_->WriteState(OptimizerState::kMaster, w, n, window.data());
  }
  // Rounded to the parameter type, and the master widened back from that.
  if (initialized.ok()) initialized = optimizer_->WriteValues(params_->shard(), s);
  if (initialized.ok()) initialized = optimizer_->SetMasterFromValues(params_->shard(), s);
  MEMWALL_RETURN_IF_ERROR(AgreeOnOptimizer(initialized, "initializing the optimizer's states"));
  MEMWALL_RETURN_IF_ERROR(s.Synchronize());
  MEMWALL_RETURN_IF_ERROR(params_->Publish());
  MEMWALL_RETURN_IF_ERROR(coll().Synchronize());
  return s.Synchronize();
}

absl::Status Trainer::OnHook(models::Module& m, models::HookPoint point) {
  switch (point) {
    case models::HookPoint::kBeforeForward:
      return params_->Acquire(m);
    case models::HookPoint::kAfterForward:
    case models::HookPoint::kAfterBackward:
      return params_->Release(m);
    case models::HookPoint::kBeforeBackward:
      MEMWALL_RETURN_IF_ERROR(params_->Acquire(m));
      return gradients_->OnBackward(m);
  }
  return absl::OkStatus();
}

absl::Status Trainer::RefreshComputeCopy() {
  MEMWALL_RETURN_IF_ERROR(optimizer_->WriteValues(params_->shard(), device_.compute_stream()));
  return params_->Publish();
}

absl::Status Trainer::AgreeOnOptimizer(const absl::Status& local, absl::string_view what) {
  return agree_on_optimizer_ ? Agree(local, what) : local;
}

absl::Status Trainer::ApplyPendingUpdate() {
  Stream& s = device_.compute_stream();
  const absl::StatusOr<bool> changed = optimizer_->Flush(params_->shard(), s);
  MEMWALL_RETURN_IF_ERROR(AgreeOnOptimizer(changed.status(), "the optimizer's deferred update"));
  if (*changed) MEMWALL_RETURN_IF_ERROR(params_->Publish());
  MEMWALL_RETURN_IF_ERROR(coll().Synchronize());
  return s.Synchronize();
}

absl::StatusOr<std::vector<float>> Trainer::MasterWeights() {
  MEMWALL_RETURN_IF_ERROR(device_.Synchronize());
  Stream& s = device_.compute_stream();
  const int64_t shard = layout_.shard();
  std::vector<float> mine(shard);
  MEMWALL_RETURN_IF_ERROR(AgreeOnOptimizer(optimizer_->ReadState(OptimizerState::kMaster, 0, shard, mine.data()),
                                           "reading the master weights"));
  if (layout_.world() == 1) {  // one owner: this rank's shard is the whole
    mine.resize(layout_.numel());
    return mine;
  }
  // Every rank's shard, all-gathered through 1 MiB of device memory (a
  // chunk of each shard at a time, whatever the model's size); each of
  // rank r's pieces (the partition's Owned(r)) goes to its flat place.
  constexpr int64_t kStagingBytes = int64_t{1} << 20;
  const int world = layout_.world();
  const int64_t chunk = std::min(shard, std::max<int64_t>(1024, kStagingBytes / (world * int64_t{sizeof(float)})));
  MEMWALL_ASSIGN_OR_RETURN(Buffer staging, device_.Allocate(world * chunk * sizeof(float), MemoryTag::kOther));
  std::vector<std::vector<Piece>> owned(world);
  for (int r = 0; r < world; ++r) owned[r] = layout_.Owned(r);
  std::vector<size_t> next(world, 0);  // each rank's first piece not yet wholly placed
  std::vector<float> out(layout_.numel()), part(world * chunk);
  for (int64_t at = 0; at < shard; at += chunk) {
    const int64_t n = std::min(chunk, shard - at);
    const Tensor gathered = FlatF32(staging, device_).Slice(0, world * n);
    const Tensor slot = gathered.Slice(layout_.rank() * n, n);
    MEMWALL_RETURN_IF_ERROR(s.Copy(slot.data(), mine.data() + at, slot.bytes()));
    MEMWALL_RETURN_IF_ERROR(comm_.AllGather(slot, gathered, s));
    MEMWALL_RETURN_IF_ERROR(s.Copy(part.data(), gathered.data(), gathered.bytes()));
    MEMWALL_RETURN_IF_ERROR(s.Synchronize());
    for (int r = 0; r < world; ++r) {  // pieces in shard order: those overlapping [at, at + n)
      for (size_t i = next[r]; i < owned[r].size() && owned[r][i].shard_offset < at + n; ++i) {
        const Piece& p = owned[r][i];
        const int64_t lo = std::max(at, p.shard_offset), hi = std::min(at + n, p.shard_offset + p.size);
        if (lo < hi) {
          std::memcpy(out.data() + p.begin + (lo - p.shard_offset), part.data() + r * n + (lo - at),
                      (hi - lo) * sizeof(float));
        }
        if (p.shard_offset + p.size <= at + n) next[r] = i + 1;
      }
    }
  }
  return out;
}

// One training step, as in ZeRO §5 and ZeRO-Offload §5: forward and
// backward over this rank's micro-batches (each reduced gradient handed to
// its owner's shard as buckets fill), the shards' gradients, the loss and
// the global norm summed over the ranks, then the optimizer's step on each
// shard and the updated parameters published to the ranks that compute
// with them.
absl::StatusOr<StepStats> Trainer::Step(const models::TokenSource& data) {
  const auto start = std::chrono::steady_clock::now();
  // The step's window on the timeline: from here (before a deferred update
  // starts) to after the last synchronize.
  const int64_t step_begin_ns = TimelineNowNs();
  MEMWALL_RETURN_IF_ERROR(CheckData(data));
  Stream& s = device_.compute_stream();
  MEMWALL_RETURN_IF_ERROR(optimizer_->BeginStep());  // a delayed update runs under this step from here
  MEMWALL_RETURN_IF_ERROR(gradients_->ZeroGradients(s));
  MEMWALL_RETURN_IF_ERROR(optimizer_->ZeroGradients(s));

  MEMWALL_ASSIGN_OR_RETURN(const models::LossSum local, ForwardBackward(data));
  MEMWALL_ASSIGN_OR_RETURN(const GlobalSums sums, ReduceOverRanks(local));

  ++step_;
  StepStats stats;
  stats.step = step_;
  stats.loss = sums.tokens > 0 ? double(sums.loss) / double(sums.tokens) : 0.0;
  stats.loss_scale = loss_scaler_.scale();
  stats.lr = ScheduledLearningRate(training_.config(), step_, adam_step_);
  stats.tokens = GlobalTokens();
  stats.grad_norm = std::sqrt(double(sums.squares)) / loss_scaler_.scale();
  const StepOutcome outcome = DecideUpdate(sums, stats);
  const absl::StatusOr<bool> changed = optimizer_->Step(outcome, params_->shard(), s);
  MEMWALL_RETURN_IF_ERROR(AgreeOnOptimizer(changed.status(), "the optimizer step"));
  if (*changed) MEMWALL_RETURN_IF_ERROR(params_->Publish());
  MEMWALL_RETURN_IF_ERROR(coll().Synchronize());
  MEMWALL_RETURN_IF_ERROR(s.Synchronize());

  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MEMWALL_RETURN_IF_ERROR(Measure(step_begin_ns, stats));
  return stats;
}

models::BatchLayout Trainer::batch_layout() const {
  return {training_->seq(), training_->micro_batch(), training_->accumulation(), comm_.world_size()};
}

int64_t Trainer::GlobalTokens() const { return batch_layout().global_batch() * training_->seq(); }

absl::Status Trainer::CheckData(const models::TokenSource& data) {
  absl::Status usable = models::ValidateLayout(data, batch_layout());
  if (usable.ok() && data.vocab() > model_.config().vocab()) {
    usable = absl::InvalidArgumentError(absl::StrCat(data.description(), " has a vocabulary of ", data.vocab(),
                                                     "; the model's is ", model_.config().vocab()));
  }
  if (&data != agreed_data_) {  // a new source: every rank can read it, and it is the same stream
    MEMWALL_RETURN_IF_ERROR(Agree(usable, "checking the training data"));
    MEMWALL_RETURN_IF_ERROR(
        AgreeOnFingerprint(comm_, device_, DataFingerprint(data), "checking the training data", &agreement_));
    agreed_data_ = &data;
  }
  return usable;
}

absl::StatusOr<models::LossSum> Trainer::ForwardBackward(const models::TokenSource& data) {
  // The loss is the mean over the global batch's tokens, scaled by the loss
  // scale: each token's gradient is loss_scale / tokens.
  const float grad_scale = loss_scaler_.scale() / static_cast<float>(GlobalTokens());
  const models::BatchLayout layout = batch_layout();
  Stream& s = device_.compute_stream();
  std::vector<int32_t> ids(training_->micro_batch() * training_->seq()), targets(ids.size());
  models::LossSum local;
  for (int64_t micro = 0; micro < training_->accumulation(); ++micro) {
    optimizer_->BeginMicroBatch(micro, training_->accumulation());
    MEMWALL_RETURN_IF_ERROR(models::FillMicroBatch(data, layout, step_, comm_.rank(), micro,
                                                   ids.data(), targets.data()));
    if (options_.edit_micro_batch) {
      options_.edit_micro_batch(comm_.rank(), micro, ids.size(), ids.data(), targets.data());
    }
    params_->BeginPass();
    absl::StatusOr<models::LossSum> part;
    {
      StreamZone zone(options_.timeline, s, ZoneKind::kForwardBackward);
      part = model_.ForwardBackward(device_, ids.data(), targets.data(), training_->micro_batch(),
                                    training_->seq(), grad_scale, true);
    }
    absl::Status pass = part.status();
    if (pass.ok()) pass = gradients_->EndPass();
    if (pass.ok()) pass = params_->EndPass();
    if (!pass.ok()) {
      // A collective failing on the communication stream (a stage-3
      // divergence) explains a compute failure better than itself.
      absl::Status comm_status = coll().Synchronize();
      return comm_status.ok() ? pass : comm_status;
    }
    local.sum += part->sum;
    local.tokens += part->tokens;
  }
  return local;
}

absl::StatusOr<Trainer::GlobalSums> Trainer::ReduceOverRanks(const models::LossSum& local) {
  Stream& c = coll();
  // Data parallelism: each rank's gradient shard summed over the ranks, and
  // the loss.
  MEMWALL_RETURN_IF_ERROR(gradients_->Reduce());
  const float loss_host[2] = {static_cast<float>(local.sum), static_cast<float>(local.tokens)};
  MEMWALL_RETURN_IF_ERROR(c.Copy(loss_.data(), loss_host, sizeof(loss_host)));
  const Tensor loss = FlatF32(loss_, device_);
  MEMWALL_RETURN_IF_ERROR(comm_.AllReduce(loss, loss, ReduceOp::kSum, c));
  // Global norm and overflow flag in one pass: over the shards, summed.
  const Tensor norm = FlatF32(norm_, device_);
  MEMWALL_RETURN_IF_ERROR(optimizer_->GradientNorm(norm, c));
  MEMWALL_RETURN_IF_ERROR(gradients_->SumNorm(norm));
  float norm_host[2], loss_sum[2];
  MEMWALL_RETURN_IF_ERROR(c.Copy(norm_host, norm_.data(), sizeof(norm_host)));
  MEMWALL_RETURN_IF_ERROR(c.Copy(loss_sum, loss_.data(), sizeof(loss_sum)));
  MEMWALL_RETURN_IF_ERROR(c.Synchronize());
  MEMWALL_RETURN_IF_ERROR(device_.compute_stream().Synchronize());
  return GlobalSums{loss_sum[0], loss_sum[1], norm_host[0], norm_host[1] != 0.0f};
}

StepOutcome Trainer::DecideUpdate(const GlobalSums& sums, StepStats& stats) {
  // Overflow: the step is skipped (fp16 halves the loss scale); otherwise
  // Adam with the gradients unscaled and clipped as they are read.
  StepOutcome outcome{step_, std::nullopt};
  if (sums.overflow || !std::isfinite(sums.squares)) {
    stats.skipped = true;
    stats.grad_norm = NAN;
    if (training_->precision() == FP16) loss_scaler_.Update(/*overflow=*/true);
    return outcome;
  }
  const double clip = training_->clip_norm() > 0 && stats.grad_norm > training_->clip_norm()
                          ? training_->clip_norm() / (stats.grad_norm + 1e-6)
                          : 1.0;
  outcome.update = StepUpdate{stats.lr, ++adam_step_, static_cast<float>(clip / loss_scaler_.scale())};
  if (training_->precision() == FP16) loss_scaler_.Update(/*overflow=*/false);
  return outcome;
}

absl::Status Trainer::Measure(int64_t step_begin_ns, StepStats& stats) const {
  const double global_tokens = double(stats.tokens);
  stats.tokens_per_second = global_tokens / stats.seconds;
  const double forward = models::ForwardFlopsPerToken(model_.config(), training_->seq());
  const double rank_tokens = global_tokens / comm_.world_size();
  stats.tflops = 3.0 * forward * rank_tokens / stats.seconds / 1e12;
  stats.recompute_tflops = model_.config().activation_checkpointing()
                               ? forward * rank_tokens / stats.seconds / 1e12
                               : 0.0;
  Timeline* timeline = options_.timeline;
  if (timeline == nullptr) return absl::OkStatus();
  const int64_t step_end_ns = TimelineNowNs();
  std::vector<Zone> zones;
  for (const Zone& z : timeline->Zones()) {
    if (z.complete() && z.begin_ns >= step_begin_ns && z.end_ns <= step_end_ns) zones.push_back(z);
  }
  stats.device_idle_fraction =
      IdleFraction(Select(zones, device_.compute_stream().name()), step_begin_ns, step_end_ns);
  std::map<std::string, int64_t> by_name;  // sorted: a stable line
  std::map<std::string, std::vector<Zone>> transfers;  // zones that move bytes (swap-in, swap-out)
  for (const Zone& z : zones) {
    by_name[std::string(z.name())] += z.duration_ns();
    if (z.bytes > 0) transfers[std::string(z.name())].push_back(z);
  }
  for (const auto& [name, ns] : by_name) {
    absl::StrAppendFormat(&stats.breakdown, "%s%s %.3f", stats.breakdown.empty() ? "" : ", ", name, ns / 1e9);
    // A transfer's rate: its bytes over the time some were in flight.
    if (auto it = transfers.find(name); it != transfers.end()) {
      int64_t bytes = 0;
      for (const Zone& z : it->second) bytes += z.bytes;
      const int64_t busy = BusyNs(it->second);
      if (busy > 0) absl::StrAppendFormat(&stats.breakdown, " @ %.2f GB/s", double(bytes) / double(busy));
    }
  }
  if (options_.trace_dir.empty()) return absl::OkStatus();
  return WriteFileAtomically(absl::StrCat(options_.trace_dir, "/step_", step_, ".json"),
                             ChromeTraceJson(zones, comm_.rank()));
}

std::string Trainer::LogLine(const StepStats& st) const {
  std::string line = absl::StrFormat("step %d | loss %.4f | lr %.2e | grad norm %.3f", st.step,
                                     st.loss, st.lr, st.grad_norm);
  if (training_->precision() == FP16) absl::StrAppendFormat(&line, " | scale %g", st.loss_scale);
  if (st.skipped) line += " | SKIPPED (inf/NaN gradients)";
  absl::StrAppendFormat(&line, " | %.0f tokens/s | %.3f TFLOPS", st.tokens_per_second, st.tflops);
  if (st.recompute_tflops > 0) absl::StrAppendFormat(&line, " (+%.3f recompute)", st.recompute_tflops);
  absl::StrAppendFormat(&line, " | %.3f s", st.seconds);
  if (st.device_idle_fraction >= 0) {
    absl::StrAppendFormat(&line, " | device idle %.0f%% | %s", 100 * st.device_idle_fraction, st.breakdown);
  }
  return line;
}

absl::StatusOr<int32_t> Trainer::MaxOverRanks(int32_t mine) {
  MEMWALL_ASSIGN_OR_RETURN(
      const std::vector<char> all,
      AllGatherRecords(comm_, device_, absl::string_view(reinterpret_cast<const char*>(&mine), sizeof mine),
                       &agreement_));
  int32_t most = mine;
  for (size_t at = 0; at + sizeof mine <= all.size(); at += sizeof mine) {
    int32_t theirs;
    std::memcpy(&theirs, all.data() + at, sizeof theirs);
    most = std::max(most, theirs);
  }
  return most;
}

}  // namespace memwall::zero
