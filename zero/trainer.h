// The ZeRO data-parallel engine, one per rank: stage 0 holds every model
// state on every rank (the "PyTorch DDP" baseline of the papers, ZeRO Sec.
// 3); stages 1, 2 and 3 partition the optimizer states, then the gradients,
// then the 16-bit parameters over the N ranks (ZeRO Sec. 5; the flat layout
// is zero/partition.h, and zero/README.md maps each stage to its files).
//
// What each stage keeps, per rank, Ψ parameters, shard = ceil(Ψ / N):
//   stage 0  params Ψ, grads Ψ, master Ψ, Adam 2Ψ
//   stage 1  params Ψ (padded to N shard), grads Ψ (padded), master, Adam:
//            shard. After the micro-batches the gradients are
//            reduce-scattered; each rank steps its shard and the updated
//            params are all-gathered through an allgather_bucket_bytes bucket.
//   stage 2  as 1, but gradients exist only in reduce buckets during backward
//            and as one contiguous shard (zero/gradient_buckets.h).
//   stage 3  as 2, and the params too are a shard; modules gather theirs in
//            their hooks (zero/parameter_gather.h).
// Every stage computes the same step: equal losses and weights up to the
// order of floating-point sums (bitwise when those sums are exact), tested
// against stage 0 under mpirun.
//
// A stage is a composition, chosen once (zero/stage_plan.h's list of
// parts, FSDP2's sharding states; each part's header says what it holds):
//            parameters (zero/parameter_placement.h)   gradients (zero/gradient_reduction.h)
//   stage 0  replicated, one owner                     all-reduce
//   stage 1  replicated, all-gathered after the step   reduce-scatter after backward
//   stage 2  replicated, all-gathered after the step   reduce buckets to the owner
//   stage 3  sharded, gathered per module              reduce buckets to the owner
// and a ShardOptimizer (zero/shard_optimizer.h): the device's, or one
// that lives elsewhere (ZeRO-Offload's host optimizer, which keeps the
// gradient shard too, so its gradients always travel in reduce buckets,
// stage 1 included).
//
// Make one with engine::CreateTrainer (engine/engine.h): it checks the
// configuration, derives the composition and wires the placements the
// configuration asks for.
//
// One step (docs/architecture.md, "A stage is a composition"):
//   grads = 0
//   for each of `accumulation` micro-batches:
//     forward + backward, loss scaled by loss_scale / (global batch tokens),
//     gradients accumulating in the 16-bit (or fp32) gradient buffer (an
//     fp16 overflow becomes inf there)
//   all-reduce(sum) of the gradients over the data-parallel ranks
//   global gradient norm and inf/NaN flag (one fused pass)
//   overflow: skip the step; fp16 halves the loss scale (after `hysteresis`
//     overflows: zero/loss_scaler.h)
//   otherwise: Adam/AdamW on fp32 master weights with
//     grad_scale = min(1, clip / norm) / loss_scale, then the compute copy
//     of the parameters is refreshed (rounded to 16 bits in 16-bit modes)
//   fp16: after `growth_interval` clean steps in a row the scale doubles
//
// Memory per parameter (ZeRO Sec. 3.1, K = 12): in bf16/fp16 modes the
// model's parameters and gradients are 2-byte buffers (tags kParams16,
// kGrads), the fp32 master weights 4 bytes (kMasterParams) and Adam's two
// moments 8 (kOptimizerStates): 16 bytes. In fp32 mode the parameters are
// the master weights: 4 + 4 (gradients) + 8 = 16 bytes as well.
#ifndef MEMWALL_ZERO_TRAINER_H_
#define MEMWALL_ZERO_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/data.h"
#include "models/gpt.h"
#include "ops/ops.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "runtime/timeline.h"
#include "zero/loss_scaler.h"
#include "zero/config.h"
#include "zero/gradient_reduction.h"
#include "zero/parameter_placement.h"
#include "zero/parameter_store.h"
#include "zero/partition.h"
#include "zero/shard_optimizer.h"
#include "zero/stage_plan.h"
#include "zero/zero_config.pb.h"

namespace memwall::zero {

class CheckpointMetadata;  // zero/checkpoint.proto

// The stream collectives run on with overlap_comm (a timeline track).
inline constexpr absl::string_view kCommStreamName = "zero_comm";

// What the trainer is given: the training config (checked once in Create
// into the TrainingOptions the trainer keeps) and the run's wiring, which no
// config file can say.
struct TrainerOptions {
  TrainingConfig training;  // zero/training_config.proto; defaults in zero/config.h
  // When set, each step records zones on it (runtime/timeline.h): per
  // micro-batch kForwardBackward on the compute stream, kAdam (device
  // optimizer) and kAllGather; an offloaded optimizer adds its own. The
  // caller may write a Chrome trace and Clear() it between steps.
  Timeline* timeline = nullptr;
  // With a timeline: each step's zones are also written as a Chrome trace
  // (runtime/timeline.h; opens in Perfetto) to trace_dir/step_<k>.json, one
  // file per rank's process id in the trace (`pid` = rank). The directory
  // must exist. With more than one rank, give each rank its own directory.
  std::string trace_dir;
  // Tests: edits each micro-batch (rank, micro index, token count, ids,
  // targets) before
  // it runs, e.g. to ignore every target on ranks > 0 so that cross-rank
  // sums are exact and stages can be compared bit for bit.
  std::function<void(int, int64_t, int64_t, int32_t*, int32_t*)> edit_micro_batch;
};

struct StepStats {
  int64_t step = 0;        // 1-based, counts skipped steps too
  double loss = 0;         // mean over the global batch's tokens
  float lr = 0;
  double grad_norm = 0;    // before clipping, unscaled
  bool skipped = false;    // inf/NaN gradients
  float loss_scale = 1;    // the scale this step used
  double seconds = 0;
  int64_t tokens = 0;      // global batch tokens
  double tokens_per_second = 0;  // global
  double tflops = 0;             // per rank: 6 N + attention, per token
  double recompute_tflops = 0;   // per rank: the extra forward of checkpointing
  // With TrainerOptions.timeline: the fraction of the step in which the
  // compute stream ran nothing, and "name seconds" per zone kind, summed
  // (with " @ X GB/s" for a transfer: its bytes over the time some were in
  // flight, e.g. "swap-in 0.412 @ 1.93 GB/s" under NVMe offload).
  double device_idle_fraction = -1;
  std::string breakdown;
};

class Trainer {
 public:
  // Builds `composition` (derived from this model and options.training by
  // engine::CreateTrainer, which every caller goes through): binds the
  // model's parameters and gradients to this trainer's buffers on `device`
  // (at stage 3 partly as deferred bindings, filled by the hooks it
  // registers on the model) and initializes them from the seed. Every rank
  // calls it; the ranks first agree that they were given the same run.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(models::Gpt& model, Device& device,
                                                         Communicator& comm, Composition composition,
                                                         const TrainerOptions& options);
  ~Trainer();

  // One optimizer step over the next global batch of `data`.
  absl::StatusOr<StepStats> Step(const models::TokenSource& data);
  // "step 12 | loss 2.3456 | lr 3.00e-04 | ...": the per-step log line.
  std::string LogLine(const StepStats& stats) const;

  // Sharded checkpoints (zero/checkpoint.h); every rank must call these.
  // Save writes DIR/step_<steps_done()> and returns that path.
  absl::StatusOr<std::string> Save(const std::string& dir,
                                   const std::function<void(int)>& after_shard_written = {});
  // Restores master weights, Adam states, loss scale and step from a step
  // directory saved by any stage on any number of ranks.
  absl::Status Load(const std::string& step_dir);

  // The largest of every rank's `mine`: a collective every rank calls in
  // the same order (one all-gather of 4 bytes a rank through the planned
  // agreement records; nothing to exchange on one rank). For decisions the
  // ranks must take together, such as stopping on a signal one of them got.
  absl::StatusOr<int32_t> MaxOverRanks(int32_t mine);

  int64_t steps_done() const { return step_; }
  float loss_scale() const { return loss_scaler_.scale(); }
  int stage() const { return training_->zero().stage(); }
  const TrainingOptions& training() const { return training_; }
  const FlatLayout& layout() const { return layout_; }
  // All Ψ fp32 master weights on the host (tests, small models). At stages 1-3 a
  // collective: every rank must call it. Device memory: 1 MiB, staging the
  // all-gather. Under the delayed parameter update these are the weights
  // the next step computes with: the last step's update is still pending
  // (ApplyPendingUpdate applies it).
  absl::StatusOr<std::vector<float>> MasterWeights();
  // MasterWeights as a GPT-2 safetensors file (models::ExportGpt), written
  // by rank 0. Every rank must call it; every rank returns its Status. Rank
  // 0 holds one logical tensor at a time and asks the owners for each
  // parameter (zero/rank_zero_reads.h, 1 MiB of staging on every rank): no
  // Ψ-sized host copy beside the planned memory, at any stage.
  absl::Status Export(const std::string& path);
  // Applies a deferred update now (the delayed parameter update's pending
  // step) and publishes the values; nothing otherwise. For the end of a
  // run that wants every step's update in its weights: the steps after it
  // differ from those of a run that kept the update deferred (save and
  // export never apply it). Every rank must call it.
  absl::Status ApplyPendingUpdate();
  // Copies the master weights into the model's compute copy (after an
  // import into the master buffer, for instance); at stages 1-3 also
  // all-gathers them (every rank must call it).
  absl::Status RefreshComputeCopy();

 private:
  Trainer(models::Gpt& model, Device& device, Communicator& comm, const TrainerOptions& options,
          TrainingOptions training);
  // Builds the stage's parts (see "A stage is a composition") once their
  // plan fits: allocations only, no collective.
  absl::Status Build(const Composition& composition);
  // This rank's shard of the initial values (the same numbers at every
  // stage: Gpt::InitialValues), rounded to the parameter type, the master
  // widened back from them, then published.
  absl::Status InitializeValues();
  absl::Status OnHook(models::Module& m, models::HookPoint point);
  // All ranks agree on a local status: each gets the first failing rank's
  // story (its own message when it failed).
  absl::Status Agree(const absl::Status& local, absl::string_view what);
  // Agree when the optimizer or the parameter store it writes can fail
  // alone (fails_alone()) and there is more than one rank; else `local`.
  absl::Status AgreeOnOptimizer(const absl::Status& local, absl::string_view what);
  // FailedPrecondition naming the tensor and element of the first NaN or
  // infinity among `n` master weights from flat index `flat_begin`: a save
  // never writes weights no load would take.
  absl::Status CheckFiniteMaster(const float* values, int64_t n, int64_t flat_begin) const;
  // Verifies a checkpoint against this run: its metadata, tensor table,
  // batch, and the size and CRC-32 of every shard that holds this rank's
  // range; reads no states into memory and changes nothing.
  absl::Status VerifyCheckpoint(const std::string& step_dir, CheckpointMetadata& meta);
  // Where collectives run: a communication stream with overlap_comm and
  // reduce buckets, else the compute stream.
  Stream& coll() { return comm_stream_ ? *comm_stream_ : device_.compute_stream(); }

  // Step's parts, in its order.
  models::BatchLayout batch_layout() const;
  int64_t GlobalTokens() const;  // the global batch's tokens
  // Refuses data this run cannot train on; a new source is also checked to
  // be readable and the same stream on every rank (a collective).
  absl::Status CheckData(const models::TokenSource& data);
  // This rank's micro-batches: forward and backward, the gradients handed
  // to the reduction; the loss summed over them.
  absl::StatusOr<models::LossSum> ForwardBackward(const models::TokenSource& data);
  // Over the ranks (every rank calls it): the gradient shards reduced, the
  // loss, and the sum of squares of every gradient element (scaled by the
  // loss scale) with whether any was inf or NaN.
  struct GlobalSums {
    float loss = 0, tokens = 0;
    float squares = 0;
    bool overflow = false;
  };
  absl::StatusOr<GlobalSums> ReduceOverRanks(const models::LossSum& local);
  // The optimizer's update for this step, or none when the gradients
  // overflowed (stats.skipped); moves the fp16 loss scale.
  StepOutcome DecideUpdate(const GlobalSums& sums, StepStats& stats);
  // Rates, and with a timeline the device-idle fraction, the breakdown and
  // the step's Chrome trace.
  absl::Status Measure(int64_t step_begin_ns, StepStats& stats) const;

  models::Gpt& model_;
  Device& device_;
  Communicator& comm_;
  const TrainerOptions options_;    // the wiring only (its config cleared): the config is training_
  const TrainingOptions training_;  // checked, defaults filled
  // The tensor table and the partition: N owners at stages 1-3, one (every
  // rank owns everything) at stage 0.
  FlatLayout layout_;
  std::unique_ptr<Stream> comm_stream_;
  // The stage's parts, made once by Build(); each says what it holds.
  std::unique_ptr<ParameterPlacement> params_;
  std::unique_ptr<GradientReduction> gradients_;
  std::unique_ptr<ShardOptimizer> optimizer_;  // after gradients_: may read its shard
  int hook_id_ = 0;
  bool agree_on_optimizer_ = false;  // see AgreeOnOptimizer
  const models::TokenSource* agreed_data_ = nullptr;  // the data source the ranks last agreed on
  Buffer agreement_;  // the ranks' agreement records (planned: TrainerScalarsPlan)
  Buffer norm_;                  // [sum of squares, inf/NaN flag]
  Buffer loss_;                  // [loss sum, tokens] for the all-reduce
  int64_t step_ = 0;
  int64_t adam_step_ = 0;        // steps actually applied (bias correction)
  LossScaler loss_scaler_;       // fp16; at scale 1 and never updated otherwise
};

}  // namespace memwall::zero

#endif  // MEMWALL_ZERO_TRAINER_H_
