// SplitMix64 (Steele, Lea and Flood, OOPSLA 2014): a 64-bit mixing function
// that is a pure function of its input, so a counter-based draw (element i
// of stream `key` is SplitMix64(key + i)) is the same on every thread split
// and standard library, which std:: distributions are not.
#ifndef MEMWALL_RUNTIME_SPLITMIX_H_
#define MEMWALL_RUNTIME_SPLITMIX_H_

#include <cstdint>

namespace memwall {

inline constexpr uint64_t kSplitMix64Gamma = 0x9e3779b97f4a7c15ULL;

inline constexpr uint64_t SplitMix64(uint64_t x) {
  x += kSplitMix64Gamma;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The sequential generator: SplitMix64(s), SplitMix64(s + gamma), ...
struct SplitMix64Stream {
  uint64_t state;
  uint64_t Next() {
    const uint64_t z = SplitMix64(state);
    state += kSplitMix64Gamma;
    return z;
  }
};

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_SPLITMIX_H_
