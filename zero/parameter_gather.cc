#include "zero/parameter_gather.h"

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/status.h"

namespace memwall::zero {
namespace {

// Sentinels in the divergence check: no trace yet, past the trace's end,
// and the end of a pass.
constexpr int kNotRecorded = -1;
constexpr int kPastTrace = -2;
constexpr int kEndOfPass = -3;

void CollectModules(models::Module& m, std::vector<models::Module*>& out) {
  out.push_back(&m);
  for (models::Module* child : m.children()) CollectModules(*child, out);
}

}  // namespace

int64_t PersistentElements(models::Module& root, int64_t threshold, const Partition& partition) {
  int64_t n = 0;
  for (models::Parameter* p : root.Parameters()) {
    if (p->numel() <= threshold) n += partition.GatheredElements(p->numel());
  }
  return n;
}

int64_t PersistentElements(models::Module& root, int64_t threshold) {
  return PersistentElements(root, threshold, *ContiguousPartition(0, 1));
}

MemoryPlan ParameterGather::Plan(const PlanShape& shape) {
  const int64_t check = 2 * sizeof(int32_t) * shape.ranks;
  MemoryPlan plan;
  plan.Add("persistent", MemorySpace::kDevice, shape.values_tag(), shape.persistent * shape.elem())
      .Add("divergence check", MemorySpace::kDevice, MemoryTag::kCommBuffers, check)
      .Add("divergence check (host)", MemorySpace::kPinnedHost, MemoryTag::kStaging, check + 2 * sizeof(int32_t))
      .Add("gathered modules", MemorySpace::kDevice, MemoryTag::kCommBuffers,
           shape.elem() * shape.largest_module +
               std::min(shape.zero.prefetch_bucket_bytes(), shape.elem() * shape.numel),
           /*transient=*/true);
  // Kept: at most the distance, at most every module gathered (Ψ', which
  // holds the bandwidth-centric partition's padding).
  if (const int64_t kept = std::min(shape.zero.max_reuse_distance(), shape.padded()); kept > 0) {
    plan.Add("modules kept for reuse", MemorySpace::kDevice, MemoryTag::kCommBuffers, shape.elem() * kept,
             /*transient=*/true);
  }
  return plan;
}

absl::StatusOr<std::unique_ptr<ParameterGather>> ParameterGather::Create(
    const FlatLayout& layout, const PlanShape& shape, models::Module& root, Device& device,
    Communicator& comm, Stream& coll, ParameterStore& shard, Timeline* timeline) {
  const ZeroConfig& config = shape.zero;
  const DType dtype = shape.dtype;
  const MemoryPlan plan = Plan(shape);
  std::unique_ptr<ParameterGather> g(new ParameterGather(layout, device, comm, coll, dtype));
  g->shard_ = &shard;
  g->timeline_ = timeline;
  g->prefetch_bytes_ = config.prefetch_bucket_bytes();
  g->max_live_ = config.max_live_params();
  g->reuse_distance_ = config.max_reuse_distance();
  const size_t elem = SizeOf(dtype);

  // Persistent parameters: whole on every rank, bound once.
  for (models::Parameter* p : layout.params()) {
    const bool persistent = p->numel() <= config.param_persistence_threshold();
    g->persistent_.push_back(persistent);
    if (persistent) g->persistent_elements_ += g->GatheredElements(*p);
  }
  if (g->persistent_elements_ != shape.persistent) {
    return absl::InternalError(absl::StrCat("stage 3: ", g->persistent_elements_,
                                            " persistent elements, but the plan has ", shape.persistent));
  }
  MEMWALL_ASSIGN_OR_RETURN(g->persistent_memory_, AllocatePlanned(device, plan, "persistent"));
  int64_t at = 0;
  for (size_t i = 0; i < layout.params().size(); ++i) {
    models::Parameter* p = layout.params()[i];
    if (g->persistent_[i]) {
      p->value = Tensor(g->persistent_memory_.as<char>() + at * elem, dtype, p->shape, &device);
      at += g->GatheredElements(*p);
    } else {
      p->value = g->Deferred(*p);
    }
  }
  // Modules that need a gather: those with a non-persistent own parameter.
  std::vector<models::Module*> all;
  CollectModules(root, all);
  for (models::Module* m : all) {
    bool gathered = false;
    for (const auto& p : m->own_parameters()) {
      gathered |= p->numel() > config.param_persistence_threshold();
    }
    if (!gathered) continue;
    g->index_[m] = static_cast<int>(g->modules_.size());
    g->modules_.push_back(m);
  }
  MEMWALL_ASSIGN_OR_RETURN(g->check_device_, AllocatePlanned(device, plan, "divergence check"));
  MEMWALL_ASSIGN_OR_RETURN(g->check_host_, AllocatePlanned(device, plan, "divergence check (host)"));
  MEMWALL_ASSIGN_OR_RETURN(g->done_, device.CreateEvent());
  return g;
}

ParameterGather::ParameterGather(const FlatLayout& layout, Device& device, Communicator& comm,
                                 Stream& coll, DType dtype)
    : layout_(layout), device_(device), comm_(comm), coll_(coll), dtype_(dtype) {}

ParameterGather::~ParameterGather() { (void)coll_.Synchronize(); }

std::vector<ParameterGather::Chunk> ParameterGather::Chunks(const Piece& piece) const {
  std::vector<Chunk> chunks;
  for (int64_t at = 0; at < piece.size;) {
    const int64_t n = std::min(piece.size - at, shard_->FetchLimit(piece.shard_offset + at));
    chunks.push_back({piece.shard_offset + at, n, at});
    at += n;
  }
  return chunks;
}

absl::Status ParameterGather::FetchPiece(const Piece& piece, void* dst) {
  const size_t elem = SizeOf(dtype_);
  for (const Chunk& c : Chunks(piece)) {
    MEMWALL_ASSIGN_OR_RETURN(const Tensor fetched, shard_->Fetch(c.begin, c.n, coll_));
    MEMWALL_RETURN_IF_ERROR(coll_.Copy(static_cast<char*>(dst) + c.at * elem, fetched.data(), fetched.bytes()));
    MEMWALL_RETURN_IF_ERROR(shard_->Release(fetched, coll_));
  }
  return absl::OkStatus();
}

std::vector<Piece> ParameterGather::OwnPieces(const std::vector<models::Parameter*>& params) const {
  std::vector<Piece> mine;
  auto keep = [&](FlatRange range) {
    for (const Piece& piece : layout_.Pieces(range)) {
      if (piece.rank == layout_.rank()) mine.push_back(piece);
    }
  };
  if (params.empty()) return mine;
  keep({layout_.offset(params.front()), layout_.offset(params.back()) + params.back()->numel()});
  return mine;
}

absl::Status ParameterGather::CheckIo() {
  const int world = comm_.world_size();
  // [0, W): every rank's health; [2W]: mine. 0 is healthy, else the
  // failure's errno (EIO where it carries none), which every rank's Status
  // carries.
  int32_t* host = check_host_.as<int32_t>();
  ParameterStore* store = shard_;
  MEMWALL_RETURN_IF_ERROR(coll_.EnqueueHost([host, world, store]() {
    const absl::Status health = store->health();
    host[2 * world] = health.ok() ? 0 : ErrnoOf(health) > 0 ? ErrnoOf(health) : EIO;
    return absl::OkStatus();
  }));
  const Tensor all = Tensor::OfBuffer(check_device_, DType::kI32, &device_).Slice(0, world);
  const Tensor mine = all.Slice(layout_.rank(), 1);
  MEMWALL_RETURN_IF_ERROR(coll_.Copy(mine.data(), host + 2 * world, mine.bytes()));
  MEMWALL_RETURN_IF_ERROR(comm_.AllGather(mine, all, coll_));
  MEMWALL_RETURN_IF_ERROR(coll_.Copy(host, all.data(), all.bytes()));
  const int rank = layout_.rank();
  return coll_.EnqueueHost([host, world, store, rank]() -> absl::Status {
    if (host[rank] != 0) return store->health();
    for (int r = 0; r < world; ++r) {
      if (host[r] != 0) {
        return WithErrno(absl::DataLossError(absl::StrCat("ZeRO stage 3: rank ", r,
                                                          " could not read its parameter shard (its Status names the "
                                                          "file and the error); resume from the last checkpoint")),
                         host[r]);
      }
    }
    return absl::OkStatus();
  });
}

absl::Status ParameterGather::Check(int module, int expected) {
  const int world = comm_.world_size();
  int32_t* host = check_host_.as<int32_t>();  // [0, 2W): every rank's pair; [2W, 2W+2): mine
  MEMWALL_RETURN_IF_ERROR(coll_.EnqueueHost([host, world, module, expected]() {
    host[2 * world] = module;
    host[2 * world + 1] = expected;
    return absl::OkStatus();
  }));
  const Tensor all = Tensor::OfBuffer(check_device_, DType::kI32, &device_);
  const Tensor mine = all.Slice(2 * layout_.rank(), 2);
  MEMWALL_RETURN_IF_ERROR(coll_.Copy(mine.data(), host + 2 * world, mine.bytes()));
  MEMWALL_RETURN_IF_ERROR(comm_.AllGather(mine, all, coll_));
  MEMWALL_RETURN_IF_ERROR(coll_.Copy(host, all.data(), all.bytes()));
  const size_t request = position_;
  const int64_t pass = pass_;
  return coll_.EnqueueHost([this, host, world, request, pass]() -> absl::Status {
    auto name = [this](int id) -> std::string {
      if (id == kEndOfPass) return "the end of the pass";
      if (id == kPastTrace) return "nothing (the recorded order has ended)";
      return absl::StrCat("'", modules_[id]->path(), "'");
    };
    std::vector<std::string> per_rank;
    bool ranks_differ = false, trace_differs = false;
    for (int r = 0; r < world; ++r) {
      ranks_differ |= host[2 * r] != host[0];
      trace_differs |= host[2 * r + 1] != kNotRecorded && host[2 * r + 1] != host[2 * r];
      per_rank.push_back(absl::StrCat("rank ", r, " has ", name(host[2 * r])));
    }
    if (ranks_differ) {
      return absl::AbortedError(absl::StrCat(
          "ZeRO stage 3: ranks diverged at parameter request ", request + 1, " of pass ", pass,
          ": ", absl::StrJoin(per_rank, ", "),
          ". Every rank must run the modules in the same order."));
    }
    if (trace_differs) {
      return absl::AbortedError(absl::StrCat(
          "ZeRO stage 3: at parameter request ", request + 1, " of pass ", pass, " every rank has ",
          name(host[0]), " but the order recorded in the first pass has ", name(host[1]),
          ". The module order must not change between passes."));
    }
    return absl::OkStatus();
  });
}

absl::Status ParameterGather::Gather(int module, Live& live) {
  const std::vector<models::Parameter*> params = Own(*modules_[module]);
  live.elements = GatheredElements(params);
  MEMWALL_ASSIGN_OR_RETURN(live.memory,
                           device_.Allocate(live.elements * SizeOf(dtype_), MemoryTag::kCommBuffers, &coll_));
  MEMWALL_RETURN_IF_ERROR(GatherParameters(params, live.memory.data(), modules_[module]->path()));
  if (spare_events_.empty()) {
    MEMWALL_ASSIGN_OR_RETURN(live.ready, device_.CreateEvent());
  } else {
    live.ready = std::move(spare_events_.back());
    spare_events_.pop_back();
  }
  MEMWALL_RETURN_IF_ERROR(coll_.Record(*live.ready));
  live_elements_ += live.elements;
  return absl::OkStatus();
}

absl::Status ParameterGather::Acquire(models::Module& m) {
  const auto it = index_.find(&m);
  if (it == index_.end()) return absl::OkStatus();
  const int id = it->second;
  const int expected = recording_ ? kNotRecorded
                                  : (position_ < trace_.size() ? trace_[position_] : kPastTrace);
  MEMWALL_RETURN_IF_ERROR(Check(id, expected));
  if (recording_) trace_.push_back(id);
  auto [entry, inserted] = live_.try_emplace(id);
  Live& live = entry->second;
  if (inserted) MEMWALL_RETURN_IF_ERROR(Gather(id, live));
  if (live.kept) {  // released earlier, kept for this request
    kept_elements_ -= live.elements;
    live.kept = false;
  }
  live.request = position_++;
  ++live.refs;
  MEMWALL_RETURN_IF_ERROR(device_.compute_stream().Wait(*live.ready));
  const size_t elem = SizeOf(dtype_);
  int64_t at = 0;  // the parameter's position in the gathered layout
  for (const auto& p : m.own_parameters()) {
    if (p->numel() > 0 && p->value.data() == nullptr) {  // not persistent, not bound
      p->value = Tensor(live.memory.as<char>() + at * elem, dtype_, p->shape, &device_);
    }
    at += GatheredElements(*p);
  }
  return recording_ ? absl::OkStatus() : Prefetch();
}

absl::Status ParameterGather::Prefetch() {
  const size_t elem = SizeOf(dtype_);
  int64_t unused = 0;  // gathered ahead, not acquired yet
  for (const auto& [id, live] : live_) {
    if (live.refs == 0 && !live.kept) unused += live.elements;
  }
  size_t i = position_;
  for (; i < trace_.size(); ++i) {
    const int id = trace_[i];
    if (live_.contains(id)) continue;
    const int64_t size = GatheredElements(Own(*modules_[id]));
    if ((unused + size) * static_cast<int64_t>(elem) > prefetch_bytes_ ||
        live_elements_ + size > max_live_) {
      break;
    }
    MEMWALL_RETURN_IF_ERROR(Gather(id, live_[id]));
    unused += size;
  }
  // The first hop's own window: past the gathers, the store may start the
  // next modules' reads (its read-ahead buffers; a resident store declines
  // at once), in the order their gathers will fetch them.
  for (; i < trace_.size(); ++i) {
    if (live_.contains(trace_[i])) continue;
    for (const Piece& piece : OwnPieces(Own(*modules_[trace_[i]]))) {
      for (const Chunk& c : Chunks(piece)) {
        if (!shard_->ReadAhead(c.begin, c.n)) return absl::OkStatus();
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ParameterGather::Free(int module) {
  auto it = live_.find(module);
  Stream& compute = device_.compute_stream();
  if (&coll_ != &compute) {  // the compute stream's reads come before the free
    MEMWALL_RETURN_IF_ERROR(compute.Record(*done_));
    MEMWALL_RETURN_IF_ERROR(coll_.Wait(*done_));
  }
  live_elements_ -= it->second.elements;
  if (it->second.kept) kept_elements_ -= it->second.elements;
  spare_events_.push_back(std::move(it->second.ready));
  live_.erase(it);  // the memory returns in coll's order
  return absl::OkStatus();
}

absl::Status ParameterGather::Release(models::Module& m) {
  const auto it = index_.find(&m);
  if (it == index_.end()) return absl::OkStatus();
  auto live = live_.find(it->second);
  if (live == live_.end() || live->second.refs <= 0) {
    return absl::InternalError(absl::StrCat("ZeRO stage 3: '", m.path(), "' released but not acquired"));
  }
  if (--live->second.refs > 0) return absl::OkStatus();
  const char* begin = live->second.memory.as<char>();
  const char* end = begin + live->second.elements * SizeOf(dtype_);
  for (const auto& p : m.own_parameters()) {
    const char* at = static_cast<const char*>(p->value.data());
    if (at >= begin && at < end) p->value = Deferred(*p);
  }
  if (KeepForReuse(it->second, live->second)) {
    live->second.kept = true;
    kept_elements_ += live->second.elements;
    return absl::OkStatus();
  }
  return Free(it->second);
}

bool ParameterGather::KeepForReuse(int module, const Live& live) const {
  if (recording_ || live.elements > reuse_distance_ - kept_elements_) return false;
  // Only on the recorded order (a departure from it fails the stream at the
  // next request's divergence check).
  if (live.request >= trace_.size() || trace_[live.request] != module) return false;
  const size_t next = next_request_[live.request];
  if (next >= trace_.size() || next < position_) return false;
  // The requests still to come before the next use: positions [position_, next).
  return elements_before_[next] - elements_before_[position_] <= reuse_distance_;
}

void ParameterGather::BeginPass() {
  position_ = 0;
  ++pass_;
}

absl::Status ParameterGather::EndPass() {
  // The end of the pass is checked like a request: a rank that ran fewer
  // modules than another is caught here instead of hanging later.
  const int expected = recording_ ? kNotRecorded
                                  : (position_ < trace_.size() ? trace_[position_] : kEndOfPass);
  MEMWALL_RETURN_IF_ERROR(Check(kEndOfPass, expected));
  if (recording_) {
    recording_ = false;
    next_request_.assign(trace_.size(), trace_.size());
    elements_before_.assign(trace_.size() + 1, 0);
    absl::flat_hash_map<int, size_t> later;  // module -> its request after k
    for (size_t k = trace_.size(); k-- > 0;) {
      const auto found = later.find(trace_[k]);
      if (found != later.end()) next_request_[k] = found->second;
      later[trace_[k]] = k;
    }
    for (size_t k = 0; k < trace_.size(); ++k) {
      elements_before_[k + 1] = elements_before_[k] + GatheredElements(Own(*modules_[trace_[k]]));
    }
  }
  std::vector<int> unused;
  for (const auto& [id, live] : live_) {
    if (live.refs > 0) {
      return absl::InternalError(absl::StrCat("ZeRO stage 3: '", modules_[id]->path(),
                                              "' is still acquired at the end of the pass"));
    }
    unused.push_back(id);
  }
  for (int id : unused) MEMWALL_RETURN_IF_ERROR(Free(id));
  // A failed read breaks the store; the next gather's I/O check (or the
  // optimizer's agreement) makes it every rank's Status, not this one's.
  (void)shard_->CancelReadAhead();
  return absl::OkStatus();
}

absl::Status ParameterGather::RefreshPersistent() {
  const auto& params = layout_.params();
  for (size_t i = 0; i < params.size();) {
    if (!persistent_[i]) {
      ++i;
      continue;
    }
    // A run of persistent parameters, adjacent in the flat order and, in
    // the gathered layout, in memory.
    std::vector<models::Parameter*> run;
    for (; i < params.size() && persistent_[i]; ++i) run.push_back(params[i]);
    MEMWALL_RETURN_IF_ERROR(GatherParameters(run, run.front()->value.data(), "persistent parameters"));
  }
  MEMWALL_RETURN_IF_ERROR(coll_.Record(*done_));
  return device_.compute_stream().Wait(*done_);
}

std::vector<models::Parameter*> ParameterGather::Own(const models::Module& m) {
  std::vector<models::Parameter*> out;
  for (const auto& p : m.own_parameters()) out.push_back(p.get());
  return out;
}

int64_t ParameterGather::GatheredElements(const models::Parameter& p) const {
  return layout_.partition().GatheredElements(p.numel());
}

int64_t ParameterGather::GatheredElements(const std::vector<models::Parameter*>& params) const {
  int64_t n = 0;
  for (const models::Parameter* p : params) n += GatheredElements(*p);
  return n;
}

absl::Status ParameterGather::GatherParameters(const std::vector<models::Parameter*>& params, void* dst,
                                               absl::string_view label) {
  if (params.empty()) return absl::OkStatus();
  // The partition's collectives (Partition::GatherUnits), each filling its
  // place in `dst`: this rank first fetches its pieces of every unit into
  // place (a piece of the unit's flat range lands at its offset in the
  // unit), then each unit's collective fills in the other ranks' pieces.
  const size_t elem = SizeOf(dtype_);
  const FlatRange range{layout_.offset(params.front()), layout_.offset(params.back()) + params.back()->numel()};
  const auto at = [&](int64_t offset, int64_t n) {
    return Tensor::Flat(static_cast<char*>(dst) + offset * static_cast<int64_t>(elem), dtype_, n, &device_);
  };
  struct Unit {
    GatherUnit unit;
    int64_t at;                 // elements into dst
    std::vector<Piece> pieces;  // every owner's
  };
  std::vector<Unit> units;
  int64_t fetched = 0, gathered = 0;
  for (const GatherUnit& u : layout_.partition().GatherUnits(range)) {
    units.push_back({u, gathered, layout_.Pieces(u.range)});
    for (const Piece& piece : units.back().pieces) fetched += piece.rank == layout_.rank() ? piece.size : 0;
    gathered += u.gathered;
  }
  const auto place = [&](const Unit& u, const Piece& piece) {
    return at(u.at + (piece.begin - u.unit.range.begin), piece.size);
  };
  {
    StreamZone fetch(timeline_, coll_, ZoneKind::kParamFetch, label, fetched * int64_t(elem));
    for (const Unit& u : units) {
      for (const Piece& piece : u.pieces) {
        if (piece.rank == layout_.rank()) MEMWALL_RETURN_IF_ERROR(FetchPiece(piece, place(u, piece).data()));
      }
    }
  }
  if (shard_->fails_alone()) MEMWALL_RETURN_IF_ERROR(CheckIo());
  StreamZone gather(timeline_, coll_, ZoneKind::kParamGather, label, gathered * int64_t(elem));
  for (const Unit& u : units) {
    if (u.unit.chunk > 0) {  // equal chunks: one all-gather
      const Tensor whole = at(u.at, u.unit.gathered);
      MEMWALL_RETURN_IF_ERROR(comm_.AllGather(whole.Slice(layout_.rank() * u.unit.chunk, u.unit.chunk), whole, coll_));
      continue;
    }
    for (const Piece& piece : u.pieces) MEMWALL_RETURN_IF_ERROR(comm_.Broadcast(place(u, piece), piece.rank, coll_));
  }
  return absl::OkStatus();
}

}  // namespace memwall::zero
