#include "offload/host_optimizer.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cpu_adam/cpu_adam.h"
#include "ops/host_accumulate.h"
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

class HostOptimizer : public DelayableOptimizer, public zero::GradientSink {
 public:
  HostOptimizer(const zero::ShardOptimizerRequest& r, Timeline* timeline, const HostOptimizerHooks* hooks)
      : hooks_(hooks ? *hooks : HostOptimizerHooks{}),
        device_(*r.device),
        n_(r.elements),
        grad_dtype_(r.grad_dtype),
        value_dtype_(r.value_dtype),
        tile_(TileElements(r)),
        staging_elements_(r.largest_piece),
        delayed_(Delayed(r)),
        timeline_(timeline),
        pool_(0) {}

  absl::Status Init(const zero::ShardOptimizerRequest& r) {
    const MemoryPlan plan = HostOptimizerPlan(r);
    MEMWALL_ASSIGN_OR_RETURN(master_, AllocatePlanned(device_, plan, "master"));
    MEMWALL_ASSIGN_OR_RETURN(m_, AllocatePlanned(device_, plan, "exp_avg"));
    MEMWALL_ASSIGN_OR_RETURN(v_, AllocatePlanned(device_, plan, "exp_avg_sq"));
    for (int i = 0; i < 2; ++i) {
      const std::string name = absl::StrCat("gradients ", i);
      if (!plan.contains(name)) continue;
      MEMWALL_ASSIGN_OR_RETURN(grads_[i], AllocatePlanned(device_, plan, name));
      std::memset(grads_[i].data(), 0, grads_[i].bytes());
    }
    if (plan.contains("delayed values")) {
      MEMWALL_ASSIGN_OR_RETURN(delayed_values_, AllocatePlanned(device_, plan, "delayed values"));
    }
    MEMWALL_ASSIGN_OR_RETURN(staging_grads_, AllocatePlanned(device_, plan, "staging gradients"));
    MEMWALL_ASSIGN_OR_RETURN(staging_values_, AllocatePlanned(device_, plan, "staging values"));
    MEMWALL_ASSIGN_OR_RETURN(norm_host_, AllocatePlanned(device_, plan, "norm"));
    for (const Buffer* b : {&master_, &m_, &v_}) std::memset(b->data(), 0, b->bytes());
    MEMWALL_ASSIGN_OR_RETURN(copy_stream_, device_.CreateStream(kCopyStreamName));
    for (auto& e : slot_free_) {
      MEMWALL_ASSIGN_OR_RETURN(e, device_.CreateEvent());
    }
    MEMWALL_ASSIGN_OR_RETURN(copied_, device_.CreateEvent());
    cpu_adam::CpuAdam::Options o;
    o.adam = r.adam;
    MEMWALL_ASSIGN_OR_RETURN(adam_, cpu_adam::CpuAdam::Create(o));
    return absl::OkStatus();
  }

  ~HostOptimizer() override {
    if (worker_.joinable()) worker_.join();
    if (copy_stream_) (void)copy_stream_->Synchronize();
  }

  int64_t elements() const override { return n_; }
  zero::GradientSink* gradient_sink() override { return this; }

  absl::Status ZeroGradients(Stream& stream) override {
    const Buffer* grads = &grads_[active_];
    return stream.EnqueueHost([this, grads] {
      std::memset(grads->data(), 0, grads->bytes());
      folded_ = {};
      folded_ranges_.clear();
      return absl::OkStatus();
    });
  }

  void BeginMicroBatch(int64_t index, int64_t count) override { last_pass_ = index + 1 == count; }

  // A reduced piece this rank owns: D2H into staging, then the host add, both
  // in the collective stream's order (the bucket is reused after them).
  absl::Status AddPiece(const Tensor& reduced, int64_t shard_offset, Stream& coll) override {
    const int64_t n = reduced.numel();
    if (n > staging_elements_ || shard_offset < 0 || shard_offset + n > n_) {
      return absl::InternalError(absl::StrCat("offload: gradient piece of ", n, " elements at ", shard_offset,
                                              " does not fit the staging (", staging_elements_,
                                              ") or the shard (", n_, ")"));
    }
    {
      StreamZone d2h(timeline_, coll, ZoneKind::kGradD2H);
      MEMWALL_RETURN_IF_ERROR(coll.Copy(staging_grads_.data(), reduced.data(), reduced.bytes()));
    }
    StreamZone add(timeline_, coll, ZoneKind::kGradAccumulate);
    char* dst = grads_[active_].as<char>() + shard_offset * SizeOf(grad_dtype_);
    // The last pass completes the gradient: its adds also sum the squares
    // of their results (ZeRO-Offload §5.1: no extra pass for the norm and
    // the overflow check). Host functions on one stream run in order, so
    // folded_ needs no lock.
    const bool fold = last_pass_;
    return coll.EnqueueHost([this, dst, n, shard_offset, fold] {
      if (fold) folded_ranges_.emplace_back(shard_offset, shard_offset + n);
      return ops::HostAdd(dst, staging_grads_.data(), dst, grad_dtype_, n, fold ? &folded_ : nullptr, &pool_);
    });
  }

  // The folded sum, unless one pass added to some element twice (GPT's
  // tied wte when a flush falls between its head and embedding gradients):
  // the first add's square would count too, so then one pass over the
  // gradient shard recomputes the norm (zone kGradNormPass).
  absl::Status GradientNorm(const Tensor& norm, Stream& stream) override {
    StreamZone zone(timeline_, stream, ZoneKind::kGradNorm);
    const Buffer* grads = &grads_[active_];
    MEMWALL_RETURN_IF_ERROR(stream.EnqueueHost([this, grads]() -> absl::Status {
      ops::SquareSum g = folded_;
      std::sort(folded_ranges_.begin(), folded_ranges_.end());
      bool twice = false;
      for (size_t i = 1; i < folded_ranges_.size(); ++i) twice |= folded_ranges_[i].first < folded_ranges_[i - 1].second;
      if (twice) {
        HostZone pass(timeline_, ZoneKind::kGradNormPass);
        MEMWALL_ASSIGN_OR_RETURN(g, ops::HostSquaredNorm(grads->data(), grad_dtype_, n_, &pool_));
      }
      float* out = norm_host_.as<float>();
      out[0] = static_cast<float>(g.sum_of_squares);
      out[1] = g.nonfinite ? 1.0f : 0.0f;
      return absl::OkStatus();
    }));
    return stream.Copy(norm.data(), norm_host_.data(), 2 * sizeof(float));
  }

  absl::StatusOr<bool> Step(const zero::StepOutcome& outcome, const Tensor& values, Stream& stream) override {
    if (!outcome.update.has_value()) return false;
    const zero::StepUpdate& update = *outcome.update;
    MEMWALL_RETURN_IF_ERROR(adam_->SetLearningRate(update.lr));
    MEMWALL_RETURN_IF_ERROR(SendValues(values, stream, [&](int64_t begin, int64_t len, void* out16) -> absl::Status {
      HostZone zone(timeline_, ZoneKind::kCpuAdam);
      if (hooks_.adam_started) hooks_.adam_started(tile_index_);
      cpu_adam::AdamBuffers b;
      b.params = master_.as<float>() + begin;
      b.exp_avg = m_.as<float>() + begin;
      b.exp_avg_sq = v_.as<float>() + begin;
      b.grads = grads_[active_].as<char>() + begin * SizeOf(grad_dtype_);
      b.grad_dtype = grad_dtype_;
      b.n = len;
      b.params16 = out16;
      b.params16_dtype = value_dtype_;
      return adam_->Step(b, update.step, update.grad_scale);
    }));
    return true;
  }

  // The step on the gradients accumulated so far, on a host thread (zone
  // kCpuAdamDelayed on track kDelayedUpdateTrack), its 16-bit result kept whole;
  // accumulation moves to the other gradient shard.
  absl::Status StartDelayedStep(const zero::StepUpdate& update) override {
    if (!delayed_) return absl::FailedPreconditionError("offload: the delayed update is not configured");
    if (worker_.joinable()) return absl::FailedPreconditionError("offload: a delayed step is already running");
    MEMWALL_RETURN_IF_ERROR(adam_->SetLearningRate(update.lr));
    MEMWALL_RETURN_IF_ERROR(copy_stream_->Synchronize());  // the last copies from delayed_values_
    const int consume = active_;
    active_ ^= 1;
    worker_status_ = absl::OkStatus();
    worker_ = std::thread([this, consume, update] {
      HostZone zone(timeline_, ZoneKind::kCpuAdamDelayed, kDelayedUpdateTrack);
      if (hooks_.delayed_step_running) hooks_.delayed_step_running();
      cpu_adam::AdamBuffers b;
      b.params = master_.as<float>();
      b.exp_avg = m_.as<float>();
      b.exp_avg_sq = v_.as<float>();
      b.grads = grads_[consume].data();
      b.grad_dtype = grad_dtype_;
      b.n = n_;
      b.params16 = value_dtype_ == DType::kF32 ? nullptr : delayed_values_.data();
      b.params16_dtype = value_dtype_;
      worker_status_ = adam_->Step(b, update.step, update.grad_scale);
    });
    return absl::OkStatus();
  }

  absl::Status FinishDelayedStep(const Tensor& values, Stream& stream) override {
    if (!worker_.joinable()) return absl::FailedPreconditionError("offload: no delayed step is running");
    worker_.join();
    MEMWALL_RETURN_IF_ERROR(worker_status_);
    if (values.numel() != n_ || values.dtype() != value_dtype_) {
      return absl::InvalidArgumentError("offload: values do not match the shard");
    }
    MEMWALL_RETURN_IF_ERROR(stream.Synchronize());  // the device is done reading the old values
    const void* src = value_dtype_ == DType::kF32 ? master_.data() : delayed_values_.data();
    {
      StreamZone h2d(timeline_, *copy_stream_, ZoneKind::kParamH2D);
      MEMWALL_RETURN_IF_ERROR(copy_stream_->Copy(values.data(), src, values.bytes()));
    }
    MEMWALL_RETURN_IF_ERROR(copy_stream_->Record(*copied_));
    return stream.Wait(*copied_);
  }

  absl::Status WriteValues(const Tensor& values, Stream& stream) override {
    return SendValues(values, stream, [&](int64_t begin, int64_t len, void* out16) -> absl::Status {
      if (out16 == nullptr) return absl::OkStatus();
      return Convert(master_.as<float>() + begin, DType::kF32, out16, value_dtype_, len);
    });
  }

  absl::Status SetMasterFromValues(const Tensor& values, Stream& stream) override {
    if (values.numel() != n_ || values.dtype() != value_dtype_) {
      return absl::InvalidArgumentError("offload: values do not match the shard");
    }
    for (int64_t begin = 0; begin < n_; begin += tile_) {  // through a staging tile
      const int64_t len = std::min(tile_, n_ - begin);
      const size_t vsize = SizeOf(value_dtype_);
      MEMWALL_RETURN_IF_ERROR(stream.Copy(staging_values_.data(), values.data_as<char>() + begin * vsize, len * vsize));
      MEMWALL_RETURN_IF_ERROR(stream.Synchronize());
      MEMWALL_RETURN_IF_ERROR(Convert(staging_values_.data(), value_dtype_, master_.as<float>() + begin, DType::kF32, len));
    }
    return absl::OkStatus();
  }

  absl::Status ReadState(OptimizerState state, int64_t begin, int64_t n, float* out) override {
    MEMWALL_ASSIGN_OR_RETURN(float* p, Of(state, begin, n));
    if (worker_.joinable()) return absl::FailedPreconditionError("offload: a delayed step is running");
    MEMWALL_RETURN_IF_ERROR(copy_stream_->Synchronize());
    std::memcpy(out, p, n * sizeof(float));
    return absl::OkStatus();
  }

  absl::Status WriteState(OptimizerState state, int64_t begin, int64_t n, const float* in) override {
    MEMWALL_ASSIGN_OR_RETURN(float* p, Of(state, begin, n));
    if (worker_.joinable()) return absl::FailedPreconditionError("offload: a delayed step is running");
    MEMWALL_RETURN_IF_ERROR(copy_stream_->Synchronize());
    std::memcpy(p, in, n * sizeof(float));
    return absl::OkStatus();
  }

 private:
  // Tile by tile: `produce` fills tile [begin, begin + len) of the values
  // (into a 16-bit staging tile, or into the fp32 master itself when the
  // values are fp32 and out16 is null), then the copy stream sends it to
  // `values` while the next tile is produced. Two staging tiles alternate.
  template <typename Produce>
  absl::Status SendValues(const Tensor& values, Stream& stream, Produce produce) {
    if (values.numel() != n_ || values.dtype() != value_dtype_) {
      return absl::InvalidArgumentError(absl::StrCat("offload: values hold ", values.numel(), " elements, the shard ",
                                                     n_));
    }
    const size_t vsize = SizeOf(value_dtype_);
    const bool wide = value_dtype_ == DType::kF32;
    // The device must be done with `values` (and the staging tiles with the
    // previous step's copies) before they are overwritten.
    MEMWALL_RETURN_IF_ERROR(stream.Synchronize());
    for (int64_t k = 0, begin = 0; begin < n_; ++k, begin += tile_) {
      const int64_t len = std::min(tile_, n_ - begin);
      const int slot = static_cast<int>(k % 2);
      if (k >= 2) MEMWALL_RETURN_IF_ERROR(slot_free_[slot]->Synchronize());
      void* out16 = wide ? nullptr : staging_values_.as<char>() + slot * tile_ * vsize;
      tile_index_ = k;
      MEMWALL_RETURN_IF_ERROR(produce(begin, len, out16));
      const void* src = wide ? static_cast<const void*>(master_.as<float>() + begin) : out16;
      {
        StreamZone h2d(timeline_, *copy_stream_, ZoneKind::kParamH2D);
        if (hooks_.copy_starting) {
          MEMWALL_RETURN_IF_ERROR(copy_stream_->EnqueueHost([this, k] { return hooks_.copy_starting(k); }));
        }
        MEMWALL_RETURN_IF_ERROR(copy_stream_->Copy(values.data_as<char>() + begin * vsize, src, len * vsize));
      }
      MEMWALL_RETURN_IF_ERROR(copy_stream_->Record(*slot_free_[slot]));
    }
    // Work on `stream` after this sees the values.
    MEMWALL_RETURN_IF_ERROR(copy_stream_->Record(*copied_));
    return stream.Wait(*copied_);
  }

  absl::StatusOr<float*> Of(OptimizerState state, int64_t begin, int64_t n) const {
    if (begin < 0 || n < 0 || begin + n > n_) {
      return absl::OutOfRangeError(absl::StrCat("optimizer state elements [", begin, ", ", begin + n,
                                                ") outside the shard's ", n_));
    }
    switch (state) {
      case OptimizerState::kMaster: return master_.as<float>() + begin;
      case OptimizerState::kExpAvg: return m_.as<float>() + begin;
      case OptimizerState::kExpAvgSq: return v_.as<float>() + begin;
    }
    return absl::InvalidArgumentError("unknown optimizer state");
  }

  const HostOptimizerHooks hooks_;
  int64_t tile_index_ = 0;
  Device& device_;
  const int64_t n_;
  const DType grad_dtype_, value_dtype_;
  const int64_t tile_;
  const int64_t staging_elements_;
  const bool delayed_;
  Timeline* timeline_;  // may be null
  ThreadPool pool_;
  Buffer master_, m_, v_, grads_[2], staging_grads_, staging_values_, norm_host_, delayed_values_;
  int active_ = 0;  // the gradient shard backward accumulates into
  std::thread worker_;  // the delayed step
  absl::Status worker_status_;
  std::unique_ptr<Stream> copy_stream_;
  std::unique_ptr<Event> slot_free_[2];
  std::unique_ptr<Event> copied_;
  std::unique_ptr<cpu_adam::CpuAdam> adam_;
  bool last_pass_ = true;                    // set on the host before each micro-batch
  ops::SquareSum folded_;                    // written by host functions, in stream order
  std::vector<std::pair<int64_t, int64_t>> folded_ranges_;
};

}  // namespace

MemoryPlan HostOptimizerPlan(const zero::ShardOptimizerRequest& r) {
  const int64_t n = r.elements, g = SizeOf(r.grad_dtype), v = SizeOf(r.value_dtype);
  const bool delayed = Delayed(r);
  MemoryPlan plan;
  plan.Add("master", MemorySpace::kPinnedHost, MemoryTag::kMasterParams, 4 * n)
      .Add("exp_avg", MemorySpace::kPinnedHost, MemoryTag::kOptimizerStates, 4 * n)
      .Add("exp_avg_sq", MemorySpace::kPinnedHost, MemoryTag::kOptimizerStates, 4 * n)
      .Add("gradients 0", MemorySpace::kPinnedHost, MemoryTag::kGrads, g * n);
  // The delayed update steps one gradient shard while the next iteration
  // accumulates into the other, and keeps its 16-bit result whole.
  if (delayed) plan.Add("gradients 1", MemorySpace::kPinnedHost, MemoryTag::kGrads, g * n);
  if (delayed && r.value_dtype != DType::kF32) {
    plan.Add("delayed values", MemorySpace::kPinnedHost, MemoryTag::kStaging, v * n);
  }
  // The largest piece a flush delivers (one reduce bucket), two tiles of
  // updated values (the H2D of one under the Adam of the next), the norm pair.
  plan.Add("staging gradients", MemorySpace::kPinnedHost, MemoryTag::kStaging, g * r.largest_piece)
      .Add("staging values", MemorySpace::kPinnedHost, MemoryTag::kStaging, 2 * TileElements(r) * v)
      .Add("norm", MemorySpace::kPinnedHost, MemoryTag::kStaging, 2 * sizeof(float));
  return plan;
}

zero::ShardOptimizerProvider HostOptimizerProvider(const HostOptimizerHooks* hooks) {
  zero::ShardOptimizerProvider p;
  p.plan = HostOptimizerPlan;
  p.create = [hooks](const zero::ShardOptimizerRequest& r) { return CreateHostOptimizer(r, hooks); };
  return p;
}

absl::StatusOr<std::unique_ptr<zero::ShardOptimizer>> CreateHostOptimizer(const zero::ShardOptimizerRequest& r,
                                                                         const HostOptimizerHooks* hooks) {
  if (r.device == nullptr || r.elements <= 0 || r.largest_piece <= 0) {
    return absl::InvalidArgumentError("offload: a host optimizer needs a device, a shard and a bucket size");
  }
  const zero::OffloadOptimizerConfig& c = r.zero.offload_optimizer();
  if (!c.pin_memory()) {
    return absl::InvalidArgumentError(
        "ZeroConfig offload_optimizer.pin_memory = false is not supported: memwall stages every "
        "transfer through pinned host memory (pageable copies would be synchronous)");
  }
  auto opt = std::make_unique<HostOptimizer>(r, r.timeline, hooks);
  MEMWALL_RETURN_IF_ERROR(opt->Init(r));
  const int64_t after = c.delayed_update_after_steps();
  if (after > 0) return DelayParameterUpdates(std::move(opt), after);
  return std::unique_ptr<zero::ShardOptimizer>(std::move(opt));
}

absl::StatusOr<std::unique_ptr<zero::Trainer>> CreateTrainer(models::Gpt& model, Device& device, Communicator& comm,
                                                             zero::TrainerOptions options,
                                                             const HostOptimizerHooks* hooks) {
  if (options.training.zero().offload_optimizer().device() == zero::OffloadOptimizerConfig::CPU) {
    options.shard_optimizer = HostOptimizerProvider(hooks);
  }
  return zero::Trainer::Create(model, device, comm, options);
}

}  // namespace memwall::offload
