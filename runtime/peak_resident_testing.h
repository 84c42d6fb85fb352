// Test helper for bounding what an operation allocates on the host with
// runtime/memory.h's resident-set readings: under AddressSanitizer freed
// memory stays resident in its quarantine, so a peak says nothing there.
#ifndef MEMWALL_RUNTIME_PEAK_RESIDENT_TESTING_H_
#define MEMWALL_RUNTIME_PEAK_RESIDENT_TESTING_H_

namespace memwall::testing {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kPeakResidentMeaningful = false;
#else
inline constexpr bool kPeakResidentMeaningful = true;
#endif

}  // namespace memwall::testing

#endif  // MEMWALL_RUNTIME_PEAK_RESIDENT_TESTING_H_
