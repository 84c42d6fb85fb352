// A stage is a composition (zero/trainer.h): which parameter placement,
// which gradient reduction, where the optimizer's states are. The trainer
// builds those parts and the memory estimator sums their plans; both take
// the choice from ChooseStageParts and the sizes from each part's Plan, so
// neither decides or sizes anything on its own.
#ifndef MEMWALL_ZERO_STAGE_PLAN_H_
#define MEMWALL_ZERO_STAGE_PLAN_H_

#include "models/gpt_config.pb.h"
#include "ops/adam_options.h"
#include "runtime/memory_plan.h"
#include "runtime/timeline.h"
#include "zero/parameter_store.h"
#include "zero/plan_shape.h"
#include "zero/shard_optimizer.h"
#include "zero/zero_config.pb.h"

namespace memwall::zero {

struct StageParts {
  enum class Parameters {
    kReplicated,              // stage 0: one owner, nothing to publish
    kReplicatedAllGathered,   // stages 1, 2: all-gathered after the step
    kSharded,                 // stage 3: gathered per module
  };
  enum class Gradients {
    kAllReduce,       // stage 0
    kReduceScatter,   // stage 1 after backward
    kReduceBuckets,   // stages 2, 3, and whenever the optimizer keeps the gradient shard
  };
  Parameters parameters = Parameters::kReplicated;
  Gradients gradients = Gradients::kAllReduce;
  // The optimizer keeps the gradient shard (ZeRO-Offload): no device one.
  bool optimizer_keeps_gradients = false;
  // fp32 stage 0: the master weights are the model's values.
  bool master_is_values = false;
  // overlap_comm with reduce buckets: collectives on their own stream, two
  // buckets so backward fills one while the other is reduced.
  bool comm_stream = false;
  int reduce_buckets() const { return comm_stream ? 2 : 1; }
};

// The table in zero/trainer.h. `zero` has defaults filled.
StageParts ChooseStageParts(const ZeroConfig& zero, DType dtype, bool optimizer_keeps_gradients);

// Ranks the states are partitioned over: 1 at stage 0, else all.
inline int Owners(const ZeroConfig& zero, int ranks) { return zero.stage() == 0 ? 1 : ranks; }

// What the optimizer is made for: the rank's shard and its types.
ShardOptimizerRequest OptimizerRequest(const PlanShape& shape, const ops::AdamOptions& adam, Timeline* timeline);

// The trainer's two scalars: "norm" ([sum of squares, inf/NaN flag],
// kWorkspace) and "loss" ([loss sum, tokens], kCommBuffers), 8 bytes each;
// and on more than one rank "agreement" (kCommBuffers): the records through
// which the ranks agree (runtime/agreement.h).
MemoryPlan TrainerScalarsPlan(int ranks);

// The optimizer's plan: `provider`'s when set (an offloaded optimizer),
// else the device's states.
MemoryPlan OptimizerPlan(const ShardOptimizerRequest& request, const StageParts& parts,
                         const ShardOptimizerProvider& provider);

// Everything one rank allocates: for the model's states and their traffic
// "parameters: ...", "gradients: ...", "optimizer: ..." (`optimizer` is the
// device's or a provider's plan, OptimizerPlan; `parameters`, when set,
// makes stage 3's shard store) and "trainer: ..."; and, for a model, what
// its forward and backward allocate for one micro-batch ("model: ...",
// models::ActivationPlan). The trainer checks it against what is free
// before it allocates anything; the estimator reports it.
struct RankPlanInput {
  const models::GptConfig* model = nullptr;  // none: model states and buckets only
  int64_t micro_batch = 1, seq = 1;
  bool checkpointing = false;
};
MemoryPlan RankPlan(const PlanShape& shape, const StageParts& parts, const MemoryPlan& optimizer,
                    const ParameterStoreProvider& parameters, const RankPlanInput& activations);

}  // namespace memwall::zero

#endif  // MEMWALL_ZERO_STAGE_PLAN_H_
