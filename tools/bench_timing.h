// Timing helpers for the *_benchmark targets' same-run baselines: wall time
// of one call, and the median of interleaved rounds (robust to a noisy,
// shared machine).
#ifndef MEMWALL_TOOLS_BENCH_TIMING_H_
#define MEMWALL_TOOLS_BENCH_TIMING_H_

#include <algorithm>
#include <chrono>
#include <vector>

namespace memwall::bench {

template <typename Fn>
double Seconds(Fn fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace memwall::bench

#endif  // MEMWALL_TOOLS_BENCH_TIMING_H_
