// What every buffer of a rank's engine is sized from: the configuration and
// the flat layout alone (ZeRO §5's Ψ, N and shard), so that the engine and
// the memory estimator compute each size with the same function (each
// part's Plan, runtime/memory_plan.h) before anything is allocated.
#ifndef MEMWALL_ZERO_PLAN_SHAPE_H_
#define MEMWALL_ZERO_PLAN_SHAPE_H_

#include <algorithm>
#include <cstdint>

#include "runtime/dtype.h"
#include "runtime/memory.h"
#include "zero/zero_config.pb.h"

namespace memwall::zero {

struct PlanShape {
  int64_t numel = 0;           // Ψ
  int owners = 1;              // ranks the states are partitioned over (1 at stage 0)
  int ranks = 1;               // data-parallel ranks (the communicator's)
  int64_t shard = 0;           // ceil(Ψ / owners)
  DType dtype = DType::kBF16;  // the parameters and gradients
  int64_t largest_module = 0;  // the most elements one module owns directly
  int64_t persistent = 0;      // stage 3: elements of the parameters kept whole
  ZeroConfig zero;             // defaults filled

  int64_t padded() const { return shard * owners; }  // Ψ' = N shard
  int64_t elem() const { return static_cast<int64_t>(SizeOf(dtype)); }
  bool half() const { return dtype != DType::kF32; }
  // fp32 parameters are the master weights' type: tagged kMasterParams.
  MemoryTag values_tag() const { return half() ? MemoryTag::kParams16 : MemoryTag::kMasterParams; }
  // A reduce bucket's elements: reduce_bucket_bytes, but at least the
  // largest module's gradients (a module's gradients land in one bucket)
  // and at most the whole padded model.
  int64_t reduce_bucket_elements() const {
    return std::min(padded(), std::max(zero.reduce_bucket_bytes() / elem(), largest_module));
  }
};

}  // namespace memwall::zero

#endif  // MEMWALL_ZERO_PLAN_SHAPE_H_
