// A stage is a composition (zero/trainer.h): which parameter placement,
// which gradient reduction, where the optimizer's states are. Those parts
// are a list, picked once from the configuration (ChooseStageParts, called
// by engine/'s front door); the memory plan iterates it (RankPlan) and so
// does the trainer that builds it (Trainer::Create), so neither decides or
// sizes anything on its own.
#ifndef MEMWALL_ZERO_STAGE_PLAN_H_
#define MEMWALL_ZERO_STAGE_PLAN_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "models/gpt.h"
#include "models/gpt_config.pb.h"
#include "ops/adam_options.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "runtime/memory_plan.h"
#include "runtime/timeline.h"
#include "zero/config.h"
#include "zero/gradient_reduction.h"
#include "zero/parameter_placement.h"
#include "zero/parameter_store.h"
#include "zero/partition.h"
#include "zero/plan_shape.h"
#include "zero/shard_optimizer.h"
#include "zero/zero_config.pb.h"

namespace memwall::zero {

// What a part is built against: the rank's layout and shape, the model it
// binds, and where it runs.
struct PartContext {
  const FlatLayout& layout;
  const PlanShape& shape;
  models::Gpt& model;
  Device& device;
  Communicator& comm;
  Stream& coll;        // where collectives run (zero/trainer.h's coll())
  Timeline* timeline;  // may be null
};

// The stage's parts once built; a part may use those built before it.
struct BuiltParts {
  std::unique_ptr<ParameterPlacement> parameters;
  std::unique_ptr<ShardOptimizer> optimizer;
  std::unique_ptr<GradientReduction> gradients;
};

// One part of a stage: what it allocates and how it is built.
class StagePart {
 public:
  virtual ~StagePart() = default;
  // "parameters", "gradients" or "optimizer": its buffers' prefix in the plan.
  virtual absl::string_view name() const = 0;
  virtual MemoryPlan Plan(const PlanShape& shape) const = 0;
  virtual absl::Status Build(const PartContext& context, BuiltParts& built) const = 0;
};

// The table in zero/trainer.h, as the list of parts in build order
// (parameters; an offloaded optimizer before the gradients, whose buckets
// feed its sink; the gradients; the device's optimizer after them, over
// their shard).
struct StageParts {
  std::vector<std::shared_ptr<const StagePart>> list;
  // overlap_comm with reduce buckets: collectives on their own stream, two
  // buckets so backward fills one while the other is reduced.
  bool comm_stream = false;
};

// Ranks the states are partitioned over: 1 at stage 0, else all.
inline int Owners(const ZeroConfig& zero, int ranks) { return zero.stage() == 0 ? 1 : ranks; }

// What the optimizer is made for: the rank's shard and its types.
ShardOptimizerRequest OptimizerRequest(const PlanShape& shape, const ops::AdamOptions& adam, Timeline* timeline);

// The parts for `shape` (shape.zero has defaults filled). `optimizer`, when
// set, makes the optimizer and keeps the gradient shard (ZeRO-Offload's
// host optimizer; stages 1-3), so the gradients travel in reduce buckets at
// every stage; `parameters`, when set, makes stage 3's shard store.
StageParts ChooseStageParts(const PlanShape& shape, const ops::AdamOptions& adam,
                            const ShardOptimizerProvider& optimizer, const ParameterStoreProvider& parameters);

// The trainer's two scalars: "norm" ([sum of squares, inf/NaN flag],
// kWorkspace) and "loss" ([loss sum, tokens], kCommBuffers), 8 bytes each;
// and on more than one rank "agreement" (kCommBuffers): the records through
// which the ranks agree (runtime/agreement.h).
MemoryPlan TrainerScalarsPlan(int ranks);

// Everything one rank allocates: each part's plan ("parameters: ...",
// "gradients: ...", "optimizer: ...") and "trainer: ..."; and, for a model,
// what its forward and backward allocate for one micro-batch ("model:
// ...", models::ActivationPlan). The trainer checks it against what is free
// before it allocates anything; the estimator reports it.
struct RankPlanInput {
  const models::GptConfig* model = nullptr;  // none: model states and buckets only
  int64_t micro_batch = 1, seq = 1;
  bool checkpointing = false;
};
MemoryPlan RankPlan(const PlanShape& shape, const StageParts& parts, const RankPlanInput& activations);

// One rank's engine, decided before anything is allocated: the checked
// configuration, the shape every buffer is sized from, and the stage's
// parts. engine/'s front door derives it (the only place that does);
// Trainer::Create builds it and the estimator plans it.
struct Composition {
  TrainingOptions training;
  PlanShape shape;
  StageParts parts;
};

}  // namespace memwall::zero

#endif  // MEMWALL_ZERO_STAGE_PLAN_H_
