#include "infinity/swap_channel.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace memwall::infinity {

absl::StatusOr<std::unique_ptr<SwapChannel>> SwapChannel::Create(const Options& o) {
  std::unique_ptr<SwapChannel> channel(new SwapChannel(o));
  MEMWALL_ASSIGN_OR_RETURN(channel->aio_, AioEngine::Create(o.aio));
  if (o.fault_injector) channel->aio_->SetFaultInjector(o.fault_injector);
  MEMWALL_ASSIGN_OR_RETURN(channel->file_, CreateSwapFile(*channel->aio_, o.path, o.sub_groups * o.group_bytes, o.what,
                                                          "offload_optimizer.nvme_path"));
  return channel;
}

SwapChannel::~SwapChannel() {
  if (aio_ != nullptr && file_.id() >= 0) (void)aio_->Close(file_.id());
}

absl::StatusOr<AioRequest> SwapChannel::Read(int64_t k, void* buffer) {
  absl::StatusOr<AioRequest> read = aio_->Read(file_.id(), k * o_.group_bytes, buffer, o_.group_bytes);
  if (!read.ok()) return Break(read.status());
  return read;
}

absl::StatusOr<AioRequest> SwapChannel::Write(int64_t k, const void* buffer) {
  absl::StatusOr<AioRequest> write = aio_->Write(file_.id(), k * o_.group_bytes, buffer, o_.group_bytes);
  if (!write.ok()) return Break(write.status());
  return write;
}

absl::Status SwapChannel::Wait(AioRequest& request, bool reading, int64_t k) {
  absl::Status st;
  {
    HostZone wait(o_.timeline, ZoneKind::kSwapWait, kSwapTrack);
    st = aio_->Wait(request);
  }
  if (!st.ok()) {
    return Break(Annotate(st, absl::StrCat(o_.what, ", sub-group ", k, " ", reading ? "swap-in" : "swap-out")));
  }
  if (o_.timeline != nullptr) {
    o_.timeline->AddSpan(reading ? o_.in_track : o_.out_track, reading ? ZoneKind::kSwapIn : ZoneKind::kSwapOut,
                         request.submitted_ns(), request.completed_ns(), o_.group_bytes);
  }
  return absl::OkStatus();
}

absl::Status SwapChannel::Broken() const {
  if (broken_.ok()) return broken_;
  return WithErrno(absl::FailedPreconditionError(absl::StrCat(o_.what, ": resume from the last checkpoint: the swap file ",
                                                              o_.path, " may hold stale ", o_.contents,
                                                              " since an I/O error (", broken_.message(), ")")),
                   ErrnoOf(broken_));
}

absl::Status SwapChannel::Break(absl::Status st) {
  if (broken_.ok()) broken_ = st;
  return st;
}

absl::StatusOr<std::unique_ptr<SwapBuffers>> SwapBuffers::Create(Device& device, const MemoryPlan& plan,
                                                                  absl::string_view name, int64_t count,
                                                                  const SwapChannel::Options& channel) {
  std::unique_ptr<SwapBuffers> buffers(new SwapBuffers());
  for (int64_t i = 0; i < count; ++i) {
    Slot s;
    MEMWALL_ASSIGN_OR_RETURN(s.buffer, AllocatePlanned(device, plan, absl::StrCat(name, " ", i)));
    buffers->slots_.push_back(std::move(s));
  }
  MEMWALL_ASSIGN_OR_RETURN(buffers->channel_, SwapChannel::Create(channel));
  return buffers;
}

SwapBuffers::~SwapBuffers() {
  if (channel_ != nullptr) (void)SettleAll();
}

SwapBuffers::Slot* SwapBuffers::Find(int64_t k) {
  for (Slot& s : slots_) {
    if (s.group == k) return &s;
  }
  return nullptr;
}

absl::StatusOr<SwapBuffers::Slot*> SwapBuffers::Evict() {
  Slot* best = nullptr;
  for (Slot& s : slots_) {
    if (s.held) continue;
    if (s.group < 0 && s.transfer == Slot::Transfer::kNone) return &s;
    if (best == nullptr || s.last_use < best->last_use) best = &s;
  }
  if (best == nullptr) return best;
  if (best->dirty) MEMWALL_RETURN_IF_ERROR(StartWrite(*best));
  MEMWALL_RETURN_IF_ERROR(Settle(*best));
  best->group = -1;
  return best;
}

SwapBuffers::Slot* SwapBuffers::Spare() {
  Slot* spare = nullptr;
  for (Slot& s : slots_) {
    if (s.held || s.dirty || s.transfer != Slot::Transfer::kNone) continue;
    if (s.group < 0) return &s;
    if (spare == nullptr || s.last_use < spare->last_use) spare = &s;
  }
  return spare;
}

absl::Status SwapBuffers::StartRead(Slot& s, int64_t k) {
  MEMWALL_ASSIGN_OR_RETURN(s.request, channel_->Read(k, s.buffer.data()));
  s.group = k;
  s.dirty = false;
  s.transfer = Slot::Transfer::kReading;
  Touch(s);
  return absl::OkStatus();
}

absl::Status SwapBuffers::StartWrite(Slot& s) {
  MEMWALL_ASSIGN_OR_RETURN(s.request, channel_->Write(s.group, s.buffer.data()));
  s.dirty = false;
  s.transfer = Slot::Transfer::kWriting;
  return absl::OkStatus();
}

absl::Status SwapBuffers::Settle(Slot& s) {
  if (s.transfer == Slot::Transfer::kNone) return absl::OkStatus();
  const absl::Status st = channel_->Wait(s.request, s.transfer == Slot::Transfer::kReading, s.group);
  s.transfer = Slot::Transfer::kNone;
  if (!st.ok()) s.group = -1;
  return st;
}

absl::Status SwapBuffers::SettleAll() {
  absl::Status first;
  for (Slot& s : slots_) {
    const absl::Status st = Settle(s);
    if (first.ok()) first = st;
  }
  return first;
}

}  // namespace memwall::infinity
