// How many host threads a rank's pools take when no count is given: the
// CPU Adam (cpu_adam/), the CpuDevice's ops (ops/), the host gradient
// accumulation. A rank takes the CPUs it may run on (its affinity mask: a
// launcher's binding, taskset), and no more than its share of the machine
// when several ranks of the job share it:
//
//   threads = max(1, min(allowed, machine / local_ranks))
//
// where `machine` is what the machine offers the job: the CPUs of process
// 1's affinity (a container's cpuset; every online CPU on a plain host).
//
// So mpirun's default binding of 2 or fewer ranks to one core each gives 1
// thread a rank; 4 unbound ranks on 16 cores get 4 each, not 16 each (64
// threads on 16 cores, which slows a memory-bound CPU Adam down).
#ifndef MEMWALL_RUNTIME_HOST_CPUS_H_
#define MEMWALL_RUNTIME_HOST_CPUS_H_

#include <string>

namespace memwall {

struct HostCpus {
  int machine = 1;      // CPUs the machine (or container) offers
  int allowed = 1;      // CPUs this process may run on
  int local_ranks = 1;  // ranks of the job on this machine
  int threads = 1;      // the default pool size (the formula above)

  // Whether the binding leaves this rank fewer CPUs than its share.
  bool narrowed() const { return allowed < machine / local_ranks; }
  // "4 threads (4 of 16 CPUs allowed, 2 ranks on this machine)".
  std::string Describe() const;
};

// The formula, from the three counts (each taken as at least 1).
HostCpus HostCpusOf(int machine, int allowed, int local_ranks);

// This process: its and process 1's sched_getaffinity and the launch's
// ranks on this machine (runtime/launch.h), read once.
const HostCpus& CurrentHostCpus();

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_HOST_CPUS_H_
