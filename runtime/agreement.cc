#include "runtime/agreement.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/text_format.h"
#include "runtime/status.h"

namespace memwall {
namespace {

// A status record: its code and errno (WithErrno's, or 0) as int32, then
// the message's start, NUL-terminated.
constexpr int64_t kStatusRecord = 512;              // bytes per rank
constexpr int64_t kStatusHeader = 8;
constexpr int64_t kMaxFingerprintBytes = 1 << 20;   // far above any configuration's

}  // namespace

absl::StatusOr<std::vector<char>> AllGatherRecords(Communicator& comm, Device& device, absl::string_view mine,
                                                   const Buffer* given) {
  const int64_t record_bytes = static_cast<int64_t>(mine.size());
  if (record_bytes == 0 || record_bytes % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("a gathered record must be a positive multiple of 4 bytes, not ",
                                                   record_bytes));
  }
  const int world = comm.world_size();
  Stream& s = device.compute_stream();
  const int64_t bytes = int64_t{world} * record_bytes;
  Buffer own;
  if (given == nullptr || given->bytes() < size_t(bytes)) {
    MEMWALL_ASSIGN_OR_RETURN(own, device.Allocate(bytes, MemoryTag::kCommBuffers));
  }
  const Buffer& records = own.data() != nullptr ? own : *given;
  const Tensor all = Tensor::OfBuffer(records, DType::kI32, &device).Slice(0, bytes / 4);
  std::vector<char> host(bytes);
  // An early return still waits for the queued copies: they read `mine` and
  // write `records` and `host`, all freed on return (declared before this).
  absl::Cleanup drain = [&s] { (void)s.Synchronize(); };
  const Tensor slot = all.Slice(int64_t{comm.rank()} * (record_bytes / 4), record_bytes / 4);
  MEMWALL_RETURN_IF_ERROR(s.Copy(slot.data(), mine.data(), record_bytes));
  MEMWALL_RETURN_IF_ERROR(comm.AllGather(slot, all, s));
  MEMWALL_RETURN_IF_ERROR(s.Copy(host.data(), records.data(), host.size()));
  MEMWALL_RETURN_IF_ERROR(s.Synchronize());
  return host;
}

namespace {

// FNV-1a: the same digest in every process (absl::Hash is seeded per process).
uint64_t Digest(absl::string_view text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

void Flatten(const google::protobuf::Message& m, const std::string& prefix, const std::string& relative,
             const std::set<std::string>& except, int depth, Fingerprint& out) {
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  const google::protobuf::Reflection* r = m.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    const std::string rel = relative.empty() ? f->name() : absl::StrCat(relative, ".", f->name());
    if (except.count(rel) > 0) continue;
    const std::string name = absl::StrCat(prefix, ".", f->name());
    const bool message = f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE;
    if (f->is_repeated()) {
      const int n = r->FieldSize(m, f);
      out.Add(absl::StrCat(name, ".size"), absl::StrCat(n));
      for (int j = 0; j < n; ++j) {
        const std::string element = absl::StrCat(name, "[", j, "]");
        if (message) {
          if (depth < 8) Flatten(r->GetRepeatedMessage(m, f, j), element, rel, except, depth + 1, out);
        } else {
          std::string v;
          google::protobuf::TextFormat::PrintFieldValueToString(m, f, j, &v);
          out.Add(element, v);
        }
      }
    } else if (message) {
      if (depth < 8) Flatten(r->GetMessage(m, f), name, rel, except, depth + 1, out);
    } else {
      std::string v;
      google::protobuf::TextFormat::PrintFieldValueToString(m, f, -1, &v);
      out.Add(name, v);
    }
  }
}

// A value as a message shows it: at most 200 characters.
std::string Shown(const std::string* v) {
  if (v == nullptr) return "nothing";
  return v->size() <= 200 ? *v : absl::StrCat(v->substr(0, 200), "...");
}

const std::string* Find(const Fingerprint& f, const std::string& field) {
  for (const auto& [name, value] : f.fields()) {
    if (name == field) return &value;
  }
  return nullptr;
}

// The first field where `b` differs from `a` (in a's order, then b's extra
// fields), or "" when they are the same.
std::string FirstDifference(const Fingerprint& a, const Fingerprint& b) {
  for (const auto& [name, value] : a.fields()) {
    const std::string* other = Find(b, name);
    if (other == nullptr || *other != value) return name;
  }
  for (const auto& [name, value] : b.fields()) {
    if (Find(a, name) == nullptr) return name;
  }
  return "";
}

}  // namespace

int64_t AgreementBytes(int world) { return world > 1 ? int64_t{world} * kStatusRecord : 0; }

absl::Status AgreeAcrossRanks(Communicator& comm, Device& device, const absl::Status& local, absl::string_view what,
                              const Buffer* records) {
  if (comm.world_size() == 1) return local;
  char mine[kStatusRecord] = {};
  const int32_t header[2] = {local.ok() ? 0 : static_cast<int32_t>(local.code()), ErrnoOf(local)};
  std::memcpy(mine, header, sizeof(header));
  const absl::string_view message = local.message();
  if (!message.empty()) {  // an OK status's message may have no data at all
    std::memcpy(mine + kStatusHeader, message.data(),
                std::min<size_t>(message.size(), kStatusRecord - kStatusHeader - 1));
  }
  MEMWALL_ASSIGN_OR_RETURN(const std::vector<char> all, AllGatherRecords(comm, device, absl::string_view(mine, kStatusRecord), records));
  if (!local.ok()) return local;
  std::vector<int> failed;
  for (int r = 0; r < comm.world_size(); ++r) {
    int32_t c = 0;
    std::memcpy(&c, all.data() + int64_t{r} * kStatusRecord, sizeof(c));
    if (c != 0) failed.push_back(r);
  }
  if (failed.empty()) return absl::OkStatus();
  const char* first = all.data() + int64_t{failed.front()} * kStatusRecord;
  int32_t theirs[2] = {};
  std::memcpy(theirs, first, sizeof(theirs));
  // Its errno too: a full disk on one rank is a full disk on every rank.
  return WithErrno(absl::Status(static_cast<absl::StatusCode>(theirs[0]),
                                absl::StrCat(what, " failed on rank(s) ", absl::StrJoin(failed, ", "), "; rank ",
                                             failed.front(), ": ", std::string(first + kStatusHeader))),
                   theirs[1]);
}

Fingerprint& Fingerprint::Add(absl::string_view field, absl::string_view value) {
  fields_.emplace_back(std::string(field), std::string(value));
  return *this;
}

Fingerprint& Fingerprint::AddMessage(absl::string_view prefix, const google::protobuf::Message& message,
                                     const std::set<std::string>& except) {
  Flatten(message, std::string(prefix), "", except, 0, *this);
  return *this;
}

std::string Fingerprint::Serialize() const {
  std::string out;
  for (const auto& [name, value] : fields_) absl::StrAppend(&out, name, "\t", absl::CEscape(value), "\n");
  return out;
}

Fingerprint Fingerprint::Parse(absl::string_view text) {
  Fingerprint f;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const size_t tab = line.find('\t');
    std::string value;
    if (tab == absl::string_view::npos || !absl::CUnescape(line.substr(tab + 1), &value)) {
      f.Add(line, "(unreadable)");
      continue;
    }
    f.Add(line.substr(0, tab), value);
  }
  return f;
}

absl::Status AgreeOnFingerprint(Communicator& comm, Device& device, const Fingerprint& mine, absl::string_view what,
                                const Buffer* records) {
  const int world = comm.world_size();
  if (world == 1) return absl::OkStatus();
  const std::string text = mine.Serialize();
  // First each rank's length and digest; the texts only when they differ.
  const int64_t length = static_cast<int64_t>(text.size());
  const uint64_t digest = Digest(text);
  char head[16];
  std::memcpy(head, &length, 8);
  std::memcpy(head + 8, &digest, 8);
  MEMWALL_ASSIGN_OR_RETURN(const std::vector<char> heads, AllGatherRecords(comm, device, absl::string_view(head, sizeof(head)), records));
  int64_t longest = 0;
  bool same = true;
  std::vector<int64_t> lengths(world);
  for (int r = 0; r < world; ++r) {
    std::memcpy(&lengths[r], heads.data() + 16 * r, 8);
    longest = std::max(longest, lengths[r]);
    same &= std::memcmp(heads.data() + 16 * r, head, sizeof(head)) == 0;
  }
  if (same) return absl::OkStatus();
  if (longest > kMaxFingerprintBytes || *std::min_element(lengths.begin(), lengths.end()) < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the ranks disagree, and a rank's fingerprint is ",
                                                   longest, " bytes (more than ", kMaxFingerprintBytes, ")"));
  }
  const int64_t record = std::max<int64_t>(4, (longest + 3) / 4 * 4);
  std::vector<char> padded(record, 0);
  std::memcpy(padded.data(), text.data(), text.size());
  MEMWALL_ASSIGN_OR_RETURN(const std::vector<char> texts, AllGatherRecords(comm, device, absl::string_view(padded.data(), record), records));
  std::vector<Fingerprint> all;
  for (int r = 0; r < world; ++r) all.push_back(Fingerprint::Parse(absl::string_view(texts.data() + r * record, lengths[r])));
  std::string field;
  std::vector<int> differing;
  for (int r = 1; r < world; ++r) {
    const std::string d = FirstDifference(all[0], all[r]);
    if (d.empty()) continue;
    if (differing.empty()) field = d;
    differing.push_back(r);
  }
  if (differing.empty()) {  // texts that differ where Parse cannot tell (a repeated or unreadable line)
    for (int r = 1; r < world; ++r) {
      if (std::memcmp(heads.data() + 16 * r, heads.data(), 16) != 0) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": the ranks disagree: rank ", r,
                                                       "'s fingerprint differs from rank 0's"));
      }
    }
    return absl::OkStatus();
  }
  const int r = differing.front();
  std::string others;
  if (differing.size() > 1) {
    others = absl::StrCat(" (rank(s) ", absl::StrJoin(differing.begin() + 1, differing.end(), ", "),
                          " differ from rank 0 too)");
  }
  return absl::InvalidArgumentError(absl::StrCat(what, ": the ranks disagree on ", field, ": rank 0 has ",
                                                 Shown(Find(all[0], field)), ", rank ", r, " has ",
                                                 Shown(Find(all[r], field)), others,
                                                 "; it must be the same on every rank"));
}

}  // namespace memwall
