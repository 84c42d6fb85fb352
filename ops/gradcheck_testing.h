// Test helpers shared by the ops tests: seeded random vectors and central
// finite differences in fp64.
#ifndef MEMWALL_OPS_GRADCHECK_TESTING_H_
#define MEMWALL_OPS_GRADCHECK_TESTING_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace memwall::ops::testing {

inline std::vector<double> Random(size_t n, double lo, double hi, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// Central difference of f at x along every coordinate, step h.
inline std::vector<double> NumericGradient(
    const std::function<double(const std::vector<double>&)>& f, std::vector<double> x,
    double h = 1e-5) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double up = f(x);
    x[i] = saved - h;
    const double down = f(x);
    x[i] = saved;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

inline double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// |analytic - numeric| <= 1e-6 * max(1, |numeric|): central differences with
// h = 1e-5 in fp64 have truncation error O(h^2 f''') ~ 1e-10 and rounding
// error ~ eps/h ~ 1e-11 for these O(1) functions.
inline void ExpectGradientsMatch(const std::vector<double>& analytic,
                                 const std::vector<double>& numeric, const char* what) {
  ASSERT_EQ(analytic.size(), numeric.size());
  for (size_t i = 0; i < analytic.size(); ++i) {
    EXPECT_NEAR(analytic[i], numeric[i], 1e-6 * std::max(1.0, std::fabs(numeric[i])))
        << what << "[" << i << "]";
  }
}

}  // namespace memwall::ops::testing

#endif  // MEMWALL_OPS_GRADCHECK_TESTING_H_
