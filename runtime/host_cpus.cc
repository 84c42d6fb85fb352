#include "runtime/host_cpus.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/launch.h"

namespace memwall {

HostCpus HostCpusOf(int machine, int allowed, int local_ranks) {
  HostCpus c;
  c.allowed = std::max(1, allowed);
  c.machine = std::max(c.allowed, machine);  // a process 1 narrower than this one does not narrow it
  c.local_ranks = std::max(1, local_ranks);
  c.threads = std::max(1, std::min(c.allowed, c.machine / c.local_ranks));
  return c;
}

std::string HostCpus::Describe() const {
  return absl::StrCat(threads, threads == 1 ? " thread" : " threads", " (", allowed, " of ", machine,
                      " CPUs allowed, ", local_ranks, local_ranks == 1 ? " rank" : " ranks", " on this machine)");
}

const HostCpus& CurrentHostCpus() {
  static const HostCpus cpus = [] {
    const int online = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
    auto cpus_of = [online](pid_t pid) {
      cpu_set_t set;
      CPU_ZERO(&set);
      return ::sched_getaffinity(pid, sizeof set, &set) == 0 ? CPU_COUNT(&set) : online;
    };
    return HostCpusOf(cpus_of(1), cpus_of(0), CurrentLaunch().local_world_size);
  }();
  return cpus;
}

}  // namespace memwall
