#include "offload/host_optimizer.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "cpu_adam/cpu_adam.h"
#include "runtime/status.h"
#include "runtime/thread_pool.h"
#include "zero/config.h"

namespace memwall::offload {
namespace {

using zero::OptimizerState;

// Updated values travel to the device in tiles of this many elements.
int64_t TileElements(const zero::ShardOptimizerRequest& r) {
  return std::max<int64_t>(1, std::min(r.zero.offload_optimizer().tile_elements(), r.elements));
}
bool Delayed(const zero::ShardOptimizerRequest& r) {
  return r.zero.offload_optimizer().delayed_update_after_steps() > 0;
}
// Where the delayed step's 16-bit result waits (none for fp32 values: the
// master weights are the values).
std::optional<MemorySpace> DelayedValuesSpace(const zero::ShardOptimizerRequest& r) {
  if (!Delayed(r) || r.value_dtype == DType::kF32) return std::nullopt;
  return r.zero.offload_optimizer().delayed_values_on_device() ? MemorySpace::kDevice : MemorySpace::kPinnedHost;
}

// ZeRO-Offload's optimizer as a composition: a resident pinned state store
// in sub-groups of one tile (zero/optimizer_state_store.h), the host
// gradient shard (host_gradient_shard.h), the tile pipeline that sends
// updated values to the device (tile_pipeline.h), and the CPU Adam. The
// delayed update's thread is the one thing it adds.
class HostOptimizer : public DelayableOptimizer {
 public:
  HostOptimizer(const zero::ShardOptimizerRequest& r, const HostOptimizerHooks* hooks)
      : hooks_(hooks ? *hooks : HostOptimizerHooks{}),
        device_(*r.device),
        n_(r.elements),
        value_dtype_(r.value_dtype),
        wide_(r.value_dtype == DType::kF32),
        delayed_(Delayed(r)),
        values_on_device_(DelayedValuesSpace(r) == MemorySpace::kDevice),
        timeline_(r.timeline),
        tiles_(*r.device, TileElements(r), r.value_dtype, r.timeline, hooks_.copy_starting) {}

  absl::Status Init(const zero::ShardOptimizerRequest& r, const HostStateStore& states,
                    const GradientShardStore& gradients) {
    const MemoryPlan plan = HostOptimizerPlan(r, states, gradients);
    // One sub-group per tile: the Adam of sub-group k fills tile k.
    MEMWALL_ASSIGN_OR_RETURN(states_, states.create(r, tiles_.tile_elements()));
    if (states_->sub_group_elements() != tiles_.tile_elements() || states_->elements() != n_) {
      return absl::InternalError(absl::StrCat("offload: the state store has ", states_->elements(),
                                              " elements in sub-groups of ", states_->sub_group_elements(),
                                              "; the optimizer needs ", n_, " in tiles of ", tiles_.tile_elements()));
    }
    MEMWALL_ASSIGN_OR_RETURN(grads_, gradients.create(r, tiles_.tile_elements()));
    if (delayed_) {
      // The delayed step shares one shard with the next backward
      // (host_gradient_shard.h), which only the pinned shard does.
      shared_grads_ = dynamic_cast<HostGradientShard*>(grads_.get());
      if (shared_grads_ == nullptr) {
        return absl::InvalidArgumentError(
            "offload: the delayed parameter update needs the gradient shard in pinned host memory "
            "(offload_optimizer.gradients_on_nvme = false)");
      }
    }
    MEMWALL_RETURN_IF_ERROR(tiles_.Init(plan));
    if (plan.contains("delayed values")) {
      MEMWALL_ASSIGN_OR_RETURN(delayed_values_, AllocatePlanned(device_, plan, "delayed values"));
      // First touched here on every thread, as the state store is, not by
      // the CPU Adam inside the first delayed step (a CpuDevice's memory,
      // or pinned memory, is host memory whose pages fault in on first use).
      if (delayed_values_.allocator()->host_accessible()) ZeroHost(delayed_values_.data(), delayed_values_.bytes());
    }
    cpu_adam::CpuAdam::Options o;
    o.adam = r.adam;
    MEMWALL_ASSIGN_OR_RETURN(adam_, cpu_adam::CpuAdam::Create(o));
    return absl::OkStatus();
  }

  ~HostOptimizer() override {
    if (worker_.joinable()) worker_.join();
    (void)tiles_.Synchronize();
  }

  int64_t elements() const override { return n_; }
  bool fails_alone() const override { return states_->fails_alone() || grads_->fails_alone(); }
  zero::GradientSink* gradient_sink() override { return grads_.get(); }
  absl::Status ZeroGradients(Stream& stream) override { return grads_->ZeroGradients(stream); }
  void BeginMicroBatch(int64_t index, int64_t count) override { grads_->BeginMicroBatch(index, count); }
  absl::Status GradientNorm(const Tensor& norm, Stream& stream) override { return grads_->Norm(norm, stream); }

  // Sub-group by sub-group: the CPU Adam writes tile k, rounded, while the
  // copy stream sends tile k - 1.
  absl::StatusOr<bool> Step(const zero::StepOutcome& outcome, zero::ParameterStore& values, Stream& stream) override {
    MEMWALL_RETURN_IF_ERROR(grads_->Failure());  // before the skip its Norm asked for
    if (!outcome.update.has_value()) return false;
    const zero::StepUpdate update = *outcome.update;
    MEMWALL_RETURN_IF_ERROR(CheckValues(values));
    MEMWALL_RETURN_IF_ERROR(adam_->SetLearningRate(update.lr));
    MEMWALL_RETURN_IF_ERROR(tiles_.Send(values, stream, [&](int64_t k, int64_t, int64_t len, void* tile) {
      HostZone zone(timeline_, ZoneKind::kCpuAdam);
      if (hooks_.adam_started) hooks_.adam_started(k);
      return WithSubGroup(k, /*written=*/true, [&](const zero::StateSubGroup& g) -> absl::Status {
        MEMWALL_ASSIGN_OR_RETURN(const char* grads, grads_->Gradients(g.begin, g.numel));
        MEMWALL_RETURN_IF_ERROR(adam_->Step(Buffers(g, grads, wide_ ? nullptr : tile), update.step, update.grad_scale));
        if (wide_) std::memcpy(tile, g.master.data(), len * sizeof(float));
        return absl::OkStatus();
      });
    }));
    MEMWALL_RETURN_IF_ERROR(states_->Sync());  // every sub-group written back
    return true;
  }

  // The step on the gradients accumulated so far, on a host thread (zone
  // kCpuAdamDelayed on track kDelayedUpdateTrack), its 16-bit result kept
  // whole. It hands the gradient shard back sub-group by sub-group to the
  // next iteration's backward, which copies its pieces over what the step
  // read ([Note: one shard under the delayed step], host_gradient_shard.h).
  absl::Status StartDelayedStep(const zero::StepUpdate& update) override {
    if (!delayed_) return absl::FailedPreconditionError("offload: the delayed update is not configured");
    if (worker_.joinable()) return absl::FailedPreconditionError("offload: a delayed step is already running");
    MEMWALL_RETURN_IF_ERROR(adam_->SetLearningRate(update.lr));
    MEMWALL_RETURN_IF_ERROR(tiles_.Synchronize());  // the last copies from delayed_values_
    // One sub-group of the state store is one sub-group of the shard.
    shared_grads_->BeginConsuming(states_->sub_group_elements());
    worker_status_ = absl::OkStatus();
    worker_ = std::thread([this, update] {
      absl::Cleanup release = [this] { shared_grads_->StopConsuming(); };
      HostZone zone(timeline_, ZoneKind::kCpuAdamDelayed, kDelayedUpdateTrack);
      if (hooks_.delayed_step_running) hooks_.delayed_step_running();
      const size_t v = SizeOf(value_dtype_);
      const size_t g16 = SizeOf(shared_grads_->dtype());
      for (int64_t k; worker_status_.ok() && (k = shared_grads_->NextToConsume()) >= 0;) {
        worker_status_ = WithSubGroup(k, /*written=*/true, [&](const zero::StateSubGroup& g) -> absl::Status {
          char* out16 = wide_ ? nullptr : delayed_values_.as<char>() + g.begin * v;
          const char* grads = shared_grads_->shard() + g.begin * g16;
          cpu_adam::AdamBuffers b = Buffers(g, grads, out16);
          if (!values_on_device_) return adam_->Step(b, update.step, update.grad_scale);
          // Into a staging tile, and from there to the device's copy.
          return tiles_.SendTile(g.numel, out16, [&](void* tile) {
            b.params16 = tile;
            return adam_->Step(b, update.step, update.grad_scale);
          });
        });
        if (worker_status_.ok()) shared_grads_->Consumed(k);
      }
      if (worker_status_.ok()) worker_status_ = states_->Sync();
    });
    return absl::OkStatus();
  }

  absl::Status FinishDelayedStep(zero::ParameterStore& values, Stream& stream) override {
    if (!worker_.joinable()) return absl::FailedPreconditionError("offload: no delayed step is running");
    worker_.join();
    MEMWALL_RETURN_IF_ERROR(worker_status_);
    MEMWALL_RETURN_IF_ERROR(CheckValues(values));
    if (wide_) return WriteValues(values, stream);  // fp32: the values are the master weights
    if (!values_on_device_) return tiles_.SendWhole(values, delayed_values_.data(), stream);
    // Already on the device: every tile's copy done, then one device copy
    // in `stream`'s order, after its compute on the old values.
    const std::optional<Tensor> resident = values.resident();
    if (!resident.has_value()) {
      return absl::InternalError("offload: delayed_values_on_device with parameters that are not on the device");
    }
    MEMWALL_RETURN_IF_ERROR(tiles_.Synchronize());
    return stream.Copy(resident->data(), delayed_values_.data(), resident->bytes());
  }

  absl::Status ReadGradients(int64_t begin, int64_t n, float* out) override {
    if (worker_.joinable()) return absl::FailedPreconditionError("offload: a delayed step is running");
    return grads_->ReadActive(begin, n, out);
  }
  absl::Status WriteGradients(int64_t begin, int64_t n, const float* in) override {
    if (worker_.joinable()) return absl::FailedPreconditionError("offload: a delayed step is running");
    return grads_->WriteActive(begin, n, in);
  }

  absl::Status WriteValues(zero::ParameterStore& values, Stream& stream) override {
    MEMWALL_RETURN_IF_ERROR(CheckValues(values));
    return tiles_.Send(values, stream, [&](int64_t k, int64_t, int64_t len, void* tile) {
      return WithSubGroup(k, /*written=*/false, [&](const zero::StateSubGroup& g) {
        return ConvertOnThreads(g.master.data(), DType::kF32, tile, value_dtype_, len);
      });
    });
  }

  absl::Status SetMasterFromValues(zero::ParameterStore& values, Stream& stream) override {
    MEMWALL_RETURN_IF_ERROR(CheckValues(values));
    MEMWALL_RETURN_IF_ERROR(tiles_.Receive(values, stream, [&](int64_t k, int64_t, int64_t len, const void* tile) {
      return WithSubGroup(k, /*written=*/true, [&](const zero::StateSubGroup& g) {
        return ConvertOnThreads(tile, value_dtype_, g.master.data(), DType::kF32, len);
      });
    }));
    return states_->Sync();
  }

  // A step whose gradients failed leaves nothing to read or save.
  absl::Status ReadState(OptimizerState state, int64_t begin, int64_t n, float* out) override {
    if (worker_.joinable()) return absl::FailedPreconditionError("offload: a delayed step is running");
    MEMWALL_RETURN_IF_ERROR(grads_->Failure());
    MEMWALL_RETURN_IF_ERROR(tiles_.Synchronize());
    return states_->Read(state, begin, n, out, device_.compute_stream());
  }

  absl::Status WriteState(OptimizerState state, int64_t begin, int64_t n, const float* in) override {
    if (worker_.joinable()) return absl::FailedPreconditionError("offload: a delayed step is running");
    MEMWALL_RETURN_IF_ERROR(tiles_.Synchronize());
    return states_->Write(state, begin, n, in, device_.compute_stream());
  }

 private:
  absl::Status CheckValues(const zero::ParameterStore& values) const {
    if (values.elements() != n_ || values.dtype() != value_dtype_) {
      return absl::InvalidArgumentError(absl::StrCat("offload: values hold ", values.elements(), " ",
                                                     DTypeName(values.dtype()), " elements, the shard ", n_, " ",
                                                     DTypeName(value_dtype_)));
    }
    return absl::OkStatus();
  }

  // Convert on the CPU Adam's threads, in pieces: set-up and a
  // checkpoint's load round and widen every parameter of the shard here,
  // and one thread converts about 1G elements/s (dtype_benchmark, 64 Mi
  // elements on the dev VM), some 8 s a pass for an 8B model.
  absl::Status ConvertOnThreads(const void* src, DType from, void* dst, DType to, int64_t n) {
    constexpr int64_t kPiece = int64_t{1} << 18;
    std::mutex mu;
    absl::Status first;
    adam_->pool().ParallelFor((n + kPiece - 1) / kPiece, [&](int64_t p) {
      const int64_t begin = p * kPiece;
      absl::Status st = Convert(static_cast<const char*>(src) + begin * SizeOf(from), from,
                                static_cast<char*>(dst) + begin * SizeOf(to), to, std::min(kPiece, n - begin));
      if (st.ok()) return;
      std::lock_guard<std::mutex> lock(mu);
      if (first.ok()) first = std::move(st);
    });
    return first;
  }

  // fn(sub-group k) between its Acquire and Release.
  template <typename Fn>
  absl::Status WithSubGroup(int64_t k, bool written, Fn fn) {
    MEMWALL_ASSIGN_OR_RETURN(const zero::StateSubGroup g, states_->Acquire(k));
    MEMWALL_RETURN_IF_ERROR(fn(g));
    return states_->Release(g, written);
  }

  // The CPU Adam's view of sub-group g, its gradients at `grads` (g.numel
  // of them), its rounded result into out16 (null: none).
  cpu_adam::AdamBuffers Buffers(const zero::StateSubGroup& g, const char* grads, void* out16) const {
    cpu_adam::AdamBuffers b;
    b.params = g.master.data_as<float>();
    b.exp_avg = g.exp_avg.data_as<float>();
    b.exp_avg_sq = g.exp_avg_sq.data_as<float>();
    b.grads = grads;
    b.grad_dtype = grads_->dtype();
    b.n = g.numel;
    b.params16 = out16;
    b.params16_dtype = value_dtype_;
    return b;
  }

  const HostOptimizerHooks hooks_;
  Device& device_;
  const int64_t n_;
  const DType value_dtype_;
  const bool wide_;  // fp32 values: the values are the master weights, nothing to round
  const bool delayed_;
  const bool values_on_device_;  // the delayed step's result goes to the device tile by tile
  Timeline* timeline_;  // may be null
  std::unique_ptr<zero::OptimizerStateStore> states_;
  std::unique_ptr<GradientShard> grads_;
  HostGradientShard* shared_grads_ = nullptr;  // grads_, under the delayed update
  TilePipeline tiles_;
  Buffer delayed_values_;  // the delayed step's 16-bit result, whole
  std::thread worker_;     // the delayed step
  absl::Status worker_status_;
  std::unique_ptr<cpu_adam::CpuAdam> adam_;
};

}  // namespace

HostStateStore PinnedStateStore() {
  HostStateStore s;
  s.plan = [](const zero::ShardOptimizerRequest& r, int64_t) {
    return zero::ResidentStateStorePlan(MemorySpace::kPinnedHost, r.elements);
  };
  s.create = [](const zero::ShardOptimizerRequest& r, int64_t sub_group) {
    return zero::CreateResidentStateStore(*r.device, MemorySpace::kPinnedHost, r.elements, sub_group);
  };
  return s;
}

GradientShardStore PinnedGradientShard() {
  GradientShardStore s;
  s.plan = [](const zero::ShardOptimizerRequest& r, int64_t) {
    return HostGradientShard::Plan(r.elements, r.grad_dtype, r.largest_piece);
  };
  s.create = [](const zero::ShardOptimizerRequest& r,
                int64_t) -> absl::StatusOr<std::unique_ptr<GradientShard>> {
    auto shard = std::make_unique<HostGradientShard>(*r.device, r.elements, r.grad_dtype, r.largest_piece, r.timeline);
    MEMWALL_RETURN_IF_ERROR(shard->Init(HostGradientShard::Plan(r.elements, r.grad_dtype, r.largest_piece)));
    return std::unique_ptr<GradientShard>(std::move(shard));
  };
  return s;
}

MemoryPlan HostOptimizerPlan(const zero::ShardOptimizerRequest& r, const HostStateStore& states,
                             const GradientShardStore& gradients) {
  MemoryPlan plan = states.plan(r, TileElements(r));
  // The delayed update keeps its 16-bit result whole (its gradients share
  // the one shard with the next iteration's: host_gradient_shard.h).
  plan.Append(gradients.plan(r, TileElements(r)));
  if (const std::optional<MemorySpace> space = DelayedValuesSpace(r); space.has_value()) {
    plan.Add("delayed values", *space, MemoryTag::kStaging, SizeOf(r.value_dtype) * r.elements);
  }
  plan.Append(TilePipeline::Plan(TileElements(r), r.value_dtype));
  return plan;
}

zero::ShardOptimizerProvider HostOptimizerProvider(const HostOptimizerHooks* hooks, HostStateStore states,
                                                   GradientShardStore gradients) {
  zero::ShardOptimizerProvider p;
  p.plan = [states, gradients](const zero::ShardOptimizerRequest& r) {
    return HostOptimizerPlan(r, states, gradients);
  };
  p.create = [hooks, states, gradients](const zero::ShardOptimizerRequest& r) {
    return CreateHostOptimizer(r, hooks, states, gradients);
  };
  return p;
}

absl::StatusOr<std::unique_ptr<zero::ShardOptimizer>> CreateHostOptimizer(const zero::ShardOptimizerRequest& r,
                                                                         const HostOptimizerHooks* hooks,
                                                                         const HostStateStore& states,
                                                                         const GradientShardStore& gradients) {
  if (r.device == nullptr || r.elements <= 0 || r.largest_piece <= 0) {
    return absl::InvalidArgumentError("offload: a host optimizer needs a device, a shard and a bucket size");
  }
  const zero::OffloadOptimizerConfig& c = r.zero.offload_optimizer();
  if (!c.pin_memory()) {
    return absl::InvalidArgumentError(
        "ZeroConfig offload_optimizer.pin_memory = false is not supported: memwall stages every "
        "transfer through pinned host memory (pageable copies would be synchronous)");
  }
  auto opt = std::make_unique<HostOptimizer>(r, hooks);
  MEMWALL_RETURN_IF_ERROR(opt->Init(r, states, gradients));
  const int64_t after = c.delayed_update_after_steps();
  if (after > 0) return DelayParameterUpdates(std::move(opt), after);
  return std::unique_ptr<zero::ShardOptimizer>(std::move(opt));
}

}  // namespace memwall::offload
