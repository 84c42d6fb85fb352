// Ranks that agree before they act together. A collective whose shape
// depends on a rank's configuration, or that a rank skips because it failed
// alone, corrupts memory or waits for the watchdog; these exchanges happen
// first, over fixed-size records, so every rank returns the same Status:
//
//   AgreeAcrossRanks    each rank's local Status; every rank gets the
//                       first failing rank's story (its own when it failed):
//                       its code, message and errno (WithErrno)
//   AgreeOnFingerprint  "field: value" lines that must be the same on every
//                       rank (model, training config, world size, step
//                       directory); a difference names the field and the
//                       ranks' values
//
// Both are collectives: every rank calls them in the same order (on one
// rank they exchange nothing). Cost: one all-gather of 512 bytes per rank
// (a status), or of 16 bytes per rank (a fingerprint's length and digest)
// and, only when they differ, one of the fingerprints. The records travel
// through `records` (device memory of AgreementBytes(world) bytes, which a
// caller that plans its memory allocates once), else through a buffer
// allocated for the exchange.
#ifndef MEMWALL_RUNTIME_AGREEMENT_H_
#define MEMWALL_RUNTIME_AGREEMENT_H_

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "runtime/communicator.h"
#include "runtime/device.h"

namespace memwall {

// Device bytes an agreement among `world` ranks exchanges through (0 for one).
int64_t AgreementBytes(int world);

// Every rank's `mine` (the same size on every rank, a multiple of 4 bytes),
// in rank order: the exchange under both agreements, for any small record
// the ranks must share. Through `records` when it is large enough, else a
// buffer allocated for the exchange.
absl::StatusOr<std::vector<char>> AllGatherRecords(Communicator& comm, Device& device, absl::string_view mine,
                                                   const Buffer* records = nullptr);

absl::Status AgreeAcrossRanks(Communicator& comm, Device& device, const absl::Status& local, absl::string_view what,
                              const Buffer* records = nullptr);

// What must be the same on every rank, as named values in a fixed order.
class Fingerprint {
 public:
  Fingerprint& Add(absl::string_view field, absl::string_view value);
  // Every field of `message` (set or not: an unset field has its default),
  // named "<prefix>.<field>" with submessages flattened, except the paths
  // in `except` (relative to `message`: "zero.offload_param.nvme_path").
  Fingerprint& AddMessage(absl::string_view prefix, const google::protobuf::Message& message,
                          const std::set<std::string>& except = {});

  const std::vector<std::pair<std::string, std::string>>& fields() const { return fields_; }
  // One line per field, "field\tvalue\n" (values C-escaped); and back.
  std::string Serialize() const;
  static Fingerprint Parse(absl::string_view text);

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

// InvalidArgument when any rank's fingerprint differs from rank 0's:
// "<what>: the ranks disagree on training.zero.stage: rank 0 has 2, rank 3
// has 3", the same on every rank.
absl::Status AgreeOnFingerprint(Communicator& comm, Device& device, const Fingerprint& mine, absl::string_view what,
                                const Buffer* records = nullptr);

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_AGREEMENT_H_
