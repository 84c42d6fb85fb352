#include "infinity/swap_channel.h"

#include <unistd.h>

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
  aio_.reset();
  // Only a file this channel holds (locked), and before the lock goes with
  // file_.
  if (file_.held()) ::unlink(o_.path.c_str());
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
    return Break(absl::Status(st.code(), absl::StrCat(o_.what, ", sub-group ", k, " ",
                                                      reading ? "swap-in" : "swap-out", ": ", st.message())));
  }
  if (o_.timeline != nullptr) {
    o_.timeline->AddSpan(reading ? o_.in_track : o_.out_track, reading ? ZoneKind::kSwapIn : ZoneKind::kSwapOut,
                         request.submitted_ns(), request.completed_ns(), o_.group_bytes);
  }
  return absl::OkStatus();
}

absl::Status SwapChannel::Broken() const {
  if (broken_.ok()) return broken_;
  return absl::FailedPreconditionError(absl::StrCat(o_.what, ": resume from the last checkpoint: the swap file ",
                                                    o_.path, " may hold stale ", o_.contents,
                                                    " since an I/O error (", broken_.message(), ")"));
}

absl::Status SwapChannel::Break(absl::Status st) {
  if (broken_.ok()) broken_ = st;
  return st;
}

}  // namespace memwall::infinity
