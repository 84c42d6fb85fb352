#include "offload/tile_pipeline.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace memwall::offload {

MemoryPlan TilePipeline::Plan(int64_t tile_elements, DType dtype) {
  MemoryPlan plan;
  plan.Add("staging values", MemorySpace::kPinnedHost, MemoryTag::kStaging, 2 * tile_elements * SizeOf(dtype));
  return plan;
}

TilePipeline::TilePipeline(Device& device, int64_t tile_elements, DType dtype, Timeline* timeline,
                           std::function<absl::Status(int64_t)> copy_starting)
    : device_(device),
      tile_(std::max<int64_t>(1, tile_elements)),
      dtype_(dtype),
      timeline_(timeline),
      copy_starting_(std::move(copy_starting)) {}

TilePipeline::~TilePipeline() {
  if (copy_) (void)copy_->Synchronize();
}

absl::Status TilePipeline::Init(const MemoryPlan& plan) {
  MEMWALL_ASSIGN_OR_RETURN(staging_, AllocatePlanned(device_, plan, "staging values"));
  MEMWALL_ASSIGN_OR_RETURN(copy_, device_.CreateStream(kCopyStreamName));
  for (auto& e : slot_free_) {
    MEMWALL_ASSIGN_OR_RETURN(e, device_.CreateEvent());
  }
  MEMWALL_ASSIGN_OR_RETURN(copied_, device_.CreateEvent());
  return absl::OkStatus();
}

absl::Status TilePipeline::Send(zero::ParameterStore& values, Stream& stream, const Fill& fill) {
  if (values.dtype() != dtype_) {
    return absl::InvalidArgumentError(absl::StrCat("offload: values are ", DTypeName(values.dtype()), ", the tiles ",
                                                   DTypeName(dtype_)));
  }
  const int64_t n = values.elements();
  const size_t size = SizeOf(dtype_);
  MEMWALL_RETURN_IF_ERROR(stream.Synchronize());
  // An early return (a fill that failed: an NVMe swap-in error) leaves
  // tiles queued that still write `values`: wait for them, so that later
  // work on `stream` never reads values being written (found by
  // ThreadSanitizer in nvme_offload_mpi_test's fault cases).
  absl::Cleanup drain_on_error = [this] { (void)copy_->Synchronize(); };
  for (int64_t k = 0, begin = 0; begin < n; ++k, begin += tile_) {
    const int64_t len = std::min(tile_, n - begin);
    const int slot = static_cast<int>(k % 2);
    // The staging tile is free once its previous copy is done.
    if (k >= 2) MEMWALL_RETURN_IF_ERROR(slot_free_[slot]->Synchronize());
    char* tile = staging_.as<char>() + slot * tile_ * size;
    MEMWALL_RETURN_IF_ERROR(fill(k, begin, len, tile));
    for (int64_t at = 0; at < len;) {  // the store's updates are at most FetchLimit elements
      const int64_t part = std::min(len - at, values.FetchLimit(begin + at));
      MEMWALL_ASSIGN_OR_RETURN(const Tensor to, values.BeginUpdate(begin + at, part, *copy_));
      {
        StreamZone h2d(timeline_, *copy_, ZoneKind::kParamH2D);
        if (copy_starting_ && at == 0) {
          MEMWALL_RETURN_IF_ERROR(copy_->EnqueueHost([this, k] { return copy_starting_(k); }));
        }
        MEMWALL_RETURN_IF_ERROR(copy_->Copy(to.data(), tile + at * size, part * size));
      }
      if (at + part == len) MEMWALL_RETURN_IF_ERROR(copy_->Record(*slot_free_[slot]));
      MEMWALL_RETURN_IF_ERROR(values.EndUpdate(to, *copy_));
      at += part;
    }
  }
  std::move(drain_on_error).Cancel();
  MEMWALL_RETURN_IF_ERROR(copy_->Record(*copied_));
  MEMWALL_RETURN_IF_ERROR(values.Sync());
  return stream.Wait(*copied_);
}

absl::Status TilePipeline::SendWhole(zero::ParameterStore& values, const void* src, Stream& stream) {
  const std::optional<Tensor> resident = values.resident();
  if (!resident.has_value()) {  // through the tiles, and the store's update memory
    const size_t size = SizeOf(dtype_);
    return Send(values, stream, [&](int64_t, int64_t begin, int64_t len, void* tile) {
      std::memcpy(tile, static_cast<const char*>(src) + begin * size, len * size);
      return absl::OkStatus();
    });
  }
  MEMWALL_RETURN_IF_ERROR(stream.Synchronize());  // the device is done reading the old values
  {
    StreamZone h2d(timeline_, *copy_, ZoneKind::kParamH2D);
    MEMWALL_RETURN_IF_ERROR(copy_->Copy(resident->data(), src, resident->bytes()));
  }
  MEMWALL_RETURN_IF_ERROR(copy_->Record(*copied_));
  return stream.Wait(*copied_);
}

absl::Status TilePipeline::Receive(zero::ParameterStore& values, Stream& stream, const Read& read) {
  const int64_t n = values.elements();
  const size_t size = SizeOf(values.dtype());
  if (values.dtype() != dtype_) return absl::InvalidArgumentError("offload: values do not match the tiles");
  MEMWALL_RETURN_IF_ERROR(Synchronize());
  for (int64_t k = 0, begin = 0; begin < n; ++k, begin += tile_) {
    const int64_t len = std::min(tile_, n - begin);
    for (int64_t at = 0; at < len;) {  // the store's fetches are at most FetchLimit elements
      const int64_t part = std::min(len - at, values.FetchLimit(begin + at));
      MEMWALL_ASSIGN_OR_RETURN(const Tensor from, values.Fetch(begin + at, part, stream));
      MEMWALL_RETURN_IF_ERROR(stream.Copy(staging_.as<char>() + at * size, from.data(), part * size));
      MEMWALL_RETURN_IF_ERROR(values.Release(from, stream));
      at += part;
    }
    MEMWALL_RETURN_IF_ERROR(stream.Synchronize());
    MEMWALL_RETURN_IF_ERROR(values.health());
    MEMWALL_RETURN_IF_ERROR(read(k, begin, len, staging_.data()));
  }
  return absl::OkStatus();
}

absl::Status TilePipeline::SendTile(int64_t len, void* dst, const std::function<absl::Status(void* tile)>& fill) {
  if (len <= 0 || len > tile_) {
    return absl::InternalError(absl::StrCat("offload: a tile of ", len, " values; tiles hold ", tile_));
  }
  const size_t size = SizeOf(dtype_);
  const int slot = static_cast<int>(tiles_sent_ % 2);
  // The staging tile is free once its previous copy is done.
  if (tiles_sent_ >= 2) MEMWALL_RETURN_IF_ERROR(slot_free_[slot]->Synchronize());
  char* tile = staging_.as<char>() + slot * tile_ * size;
  MEMWALL_RETURN_IF_ERROR(fill(tile));
  {
    StreamZone h2d(timeline_, *copy_, ZoneKind::kParamH2D);
    MEMWALL_RETURN_IF_ERROR(copy_->Copy(dst, tile, len * size));
  }
  MEMWALL_RETURN_IF_ERROR(copy_->Record(*slot_free_[slot]));
  ++tiles_sent_;
  return absl::OkStatus();
}

absl::Status TilePipeline::Synchronize() { return copy_ ? copy_->Synchronize() : absl::OkStatus(); }

}  // namespace memwall::offload
