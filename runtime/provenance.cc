#include "runtime/provenance.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "runtime/files.h"

namespace memwall {
namespace {

// stdout of a shell command ("" when it fails).
std::string Capture(const std::string& command) {
  FILE* p = ::popen((command + " 2>/dev/null").c_str(), "r");
  if (p == nullptr) return "";
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  return ::pclose(p) == 0 ? std::string(absl::StripAsciiWhitespace(out)) : "";
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    }
  }
  return "unknown";
}

double MemoryGiB() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  long long kib = 0;
  while (in >> key >> kib) {
    if (key == "MemTotal:") return kib / 1048576.0;
    in.ignore(1 << 10, '\n');
  }
  return 0;
}

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

std::string WorkspaceDir() {
  const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  return ws != nullptr && *ws != 0 ? ws : std::filesystem::current_path().string();
}

std::string ShellQuote(const std::string& arg) {
  std::string out = "'";
  for (char c : arg) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

absl::Status WriteProvenance(const std::string& path, const Provenance& p) {
  const std::string git = absl::StrCat("git -C ", ShellQuote(WorkspaceDir()), " ");
  // The binaries of tools/gpu_bundle.sh (on a GPU machine) carry the
  // commit they were built from in MEMWALL_COMMIT (its env.sh exports it):
  // that, not whatever checkout they run in, is the code that measured.
  const char* built_from = std::getenv("MEMWALL_COMMIT");
  std::string commit = built_from != nullptr ? built_from : Capture(git + "rev-parse HEAD");
  if (commit.empty()) commit = "unknown (not a git checkout)";
  const bool dirty =
      built_from != nullptr
          ? absl::StrContains(commit, "dirty")
          : !Capture(git + "status --porcelain --untracked-files=no -- . ':(exclude)results'").empty();
  const std::string gpu = Capture("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader");
  std::string json = "{\n";
  auto field = [&](const std::string& key, const std::string& value, bool last = false) {
    absl::StrAppend(&json, "  ", JsonString(key), ": ", value, last ? "\n" : ",\n");
  };
  field("experiment", JsonString(p.experiment));
  field("description", JsonString(p.description));
  field("paper", JsonString(p.paper));
  field("measured_or_modeled", JsonString(p.measured_or_modeled));
  field("commit", JsonString(commit));
  field("uncommitted_changes", dirty ? "true" : "false");
  field("date", JsonString(UtcNow()));
  field("command", JsonString(p.command));
  std::string machine = absl::StrCat(
      "{\"cpu\": ", JsonString(CpuModel()), ", \"cores\": ", std::thread::hardware_concurrency(),
      ", \"memory_gib\": ", absl::StrFormat("%.1f", MemoryGiB()),
      ", \"gpu\": ", JsonString(gpu.empty() ? "none" : gpu), "}");
  field("machine", machine);
  std::vector<std::string> files;
  for (const auto& [name, what] : p.files) files.push_back(absl::StrCat("    ", JsonString(name), ": ", JsonString(what)));
  field("files", absl::StrCat("{\n", absl::StrJoin(files, ",\n"), "\n  }"), /*last=*/true);
  json += "}\n";
  return WriteFileAtomically(path, json);
}

}  // namespace memwall
