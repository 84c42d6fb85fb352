// Test helper for bounding what an operation allocates on the host: Linux's
// peak resident set since the last reset ("VmHWM" in /proc/self/status),
// the current one ("VmRSS"), and the reset (5 written to
// /proc/self/clear_refs). Under AddressSanitizer freed memory stays resident
// in its quarantine, so a peak says nothing there.
#ifndef MEMWALL_RUNTIME_PEAK_RESIDENT_TESTING_H_
#define MEMWALL_RUNTIME_PEAK_RESIDENT_TESTING_H_

#include <cstddef>
#include <fstream>
#include <string>

namespace memwall::testing {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kPeakResidentMeaningful = false;
#else
inline constexpr bool kPeakResidentMeaningful = true;
#endif

// `field` ("VmHWM" or "VmRSS") in bytes; 0 where it cannot be read.
inline size_t ResidentBytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1)) * 1024;
  }
  return 0;
}

// Starts a new peak at the current resident set; false where Linux refuses.
inline bool ResetPeakResident() { return static_cast<bool>(std::ofstream("/proc/self/clear_refs") << "5"); }

}  // namespace memwall::testing

#endif  // MEMWALL_RUNTIME_PEAK_RESIDENT_TESTING_H_
