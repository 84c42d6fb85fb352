#include "zero/gradient_buckets.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "ops/ops.h"
#include "runtime/status.h"

namespace memwall::zero {

MemoryPlan GradientBuckets::Plan(const PlanShape& shape, int count) {
  MemoryPlan plan;
  for (int i = 0; i < count; ++i) {
    plan.Add(absl::StrCat("reduce bucket ", i), MemorySpace::kDevice, MemoryTag::kCommBuffers,
             shape.reduce_bucket_elements() * shape.elem());
  }
  return plan;
}

absl::StatusOr<std::unique_ptr<GradientBuckets>> GradientBuckets::Create(
    const FlatLayout& layout, const PlanShape& shape, Device& device, Communicator& comm, Stream& coll,
    int count, GradientSink& sink) {
  const int64_t capacity = shape.reduce_bucket_elements();
  if (capacity <= 0 || count < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce buckets: capacity ", capacity, " x ", count, " must be positive"));
  }
  const MemoryPlan plan = Plan(shape, count);
  std::unique_ptr<GradientBuckets> g(
      new GradientBuckets(layout, device, comm, coll, shape.dtype, capacity, sink));
  for (int i = 0; i < count; ++i) {
    Bucket b;
    MEMWALL_ASSIGN_OR_RETURN(b.memory, AllocatePlanned(device, plan, absl::StrCat("reduce bucket ", i)));
    b.top = capacity;
    MEMWALL_ASSIGN_OR_RETURN(b.free, device.CreateEvent());
    g->buckets_.push_back(std::move(b));
  }
  MEMWALL_ASSIGN_OR_RETURN(g->ready_, device.CreateEvent());
  g->UnbindAll();
  return g;
}

GradientBuckets::GradientBuckets(const FlatLayout& layout, Device& device, Communicator& comm,
                                 Stream& coll, DType dtype, int64_t capacity, GradientSink& sink)
    : layout_(layout),
      device_(device),
      comm_(comm),
      coll_(coll),
      dtype_(dtype),
      capacity_(capacity),
      sink_(sink) {}

void GradientBuckets::UnbindAll() {
  for (models::Parameter* p : layout_.params()) p->grad = Tensor(nullptr, dtype_, p->shape, &device_);
}

namespace {
// The elements of a slot that lays `units` out one after another.
int64_t SlotElements(const std::vector<GatherUnit>& units) {
  int64_t n = 0;
  for (const GatherUnit& u : units) n += u.gathered;
  return n;
}

// Where flat element `flat` sits in such a slot: in its unit, at its
// offset from the unit's first element.
int64_t SlotOffset(const std::vector<GatherUnit>& units, int64_t flat) {
  int64_t at = 0;
  for (const GatherUnit& u : units) {
    if (flat < u.range.end) return at + (flat - u.range.begin);
    at += u.gathered;
  }
  return at;
}
}  // namespace

Tensor GradientBuckets::Slice(const Bucket& b, int64_t at, int64_t n) const {
  return Tensor::Flat(b.memory.as<char>() + at * SizeOf(dtype_), dtype_, n, &device_);
}

absl::Status GradientBuckets::Bind(models::Module& m) {
  const auto& own = m.own_parameters();
  if (own.empty() || own.front()->grad.data() != nullptr) return absl::OkStatus();
  const FlatRange range = layout_.OwnRange(m);
  const std::vector<GatherUnit> units = layout_.partition().GatherUnits(range);
  const int64_t elements = SlotElements(units);
  if (elements > capacity_) {
    return absl::InternalError(absl::StrCat("reduce bucket of ", capacity_, " elements cannot hold '",
                                            m.path(), "' (", elements, ")"));
  }
  Stream& compute = device_.compute_stream();
  if (buckets_[current_].top < elements) {
    MEMWALL_RETURN_IF_ERROR(Flush(buckets_[current_]));
    current_ = (current_ + 1) % buckets_.size();
  }
  Bucket& b = buckets_[current_];
  // An empty bucket's previous reduction must be done before backward writes it.
  if (b.segments.empty()) MEMWALL_RETURN_IF_ERROR(compute.Wait(*b.free));
  b.top -= elements;
  b.segments.push_back({range, b.top, elements});
  const Tensor slot = Slice(b, b.top, elements);
  MEMWALL_RETURN_IF_ERROR(compute.Memset(slot.data(), 0, slot.bytes()));
  for (const auto& p : own) {
    const int64_t at = b.top + SlotOffset(units, layout_.offset(p.get()));
    p->grad = Tensor(b.memory.as<char>() + at * SizeOf(dtype_), dtype_, p->shape, &device_);
    b.bound.push_back(p.get());
  }
  return absl::OkStatus();
}

absl::Status GradientBuckets::Flush(Bucket& b) {
  if (b.segments.empty()) return absl::OkStatus();
  Stream& compute = device_.compute_stream();
  if (&coll_ != &compute) {
    MEMWALL_RETURN_IF_ERROR(compute.Record(*ready_));
    MEMWALL_RETURN_IF_ERROR(coll_.Wait(*ready_));
  }
  // Merge segments adjacent both in the bucket and in the flat order.
  std::sort(b.segments.begin(), b.segments.end(),
            [](const Segment& x, const Segment& y) { return x.at < y.at; });
  std::vector<Segment> merged;
  for (const Segment& s : b.segments) {
    if (!merged.empty() && merged.back().flat.end == s.flat.begin &&
        merged.back().at + merged.back().elements == s.at) {
      merged.back().flat.end = s.flat.end;
      merged.back().elements += s.elements;
    } else {
      merged.push_back(s);
    }
  }
  const int rank = layout_.rank();
  for (const Segment& s : merged) {
    int64_t at = s.at;
    for (const GatherUnit& u : layout_.partition().GatherUnits(s.flat)) {
      const Tensor unit = Slice(b, at, u.gathered);
      const std::vector<Piece> pieces = layout_.Pieces(u.range);
      if (u.chunk > 0) {  // equal chunks: one reduce-scatter, this rank's chunk summed in place
        MEMWALL_RETURN_IF_ERROR(
            comm_.ReduceScatter(unit, unit.Slice(rank * u.chunk, u.chunk), ReduceOp::kSum, coll_));
      }
      for (const Piece& piece : pieces) {
        const Tensor part = unit.Slice(piece.begin - u.range.begin, piece.size);
        if (u.chunk == 0) MEMWALL_RETURN_IF_ERROR(comm_.Reduce(part, part, ReduceOp::kSum, piece.rank, coll_));
        if (piece.rank == rank) MEMWALL_RETURN_IF_ERROR(sink_.AddPiece(part, piece.shard_offset, coll_));
      }
      at += u.gathered;
    }
  }
  MEMWALL_RETURN_IF_ERROR(coll_.Record(*b.free));
  for (models::Parameter* p : b.bound) p->grad = Tensor(nullptr, dtype_, p->shape, &device_);
  b.bound.clear();
  b.segments.clear();
  b.top = capacity_;
  return absl::OkStatus();
}

absl::Status GradientBuckets::FlushAll() { return Flush(buckets_[current_]); }

absl::Status DeviceGradientSink::AddPiece(const Tensor& reduced, int64_t shard_offset, Stream& coll) {
  const Tensor mine = shard_grad_.Slice(shard_offset, reduced.numel());
  return ops::Add(mine, reduced, mine, coll);
}

}  // namespace memwall::zero
