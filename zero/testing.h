// Shared by the engine's mpirun tests (zero/, offload/): the small GPT they
// train and the comparisons they make.
#ifndef MEMWALL_ZERO_TESTING_H_
#define MEMWALL_ZERO_TESTING_H_

#include <algorithm>
#include <cstring>
#include <vector>

#include "models/gpt.h"

namespace memwall::zero::test {

// 2 layers, hidden 32, 4 heads, byte vocabulary, 16 positions: about 30k
// parameters, seconds for 20 steps on 4 ranks of a 2-core machine.
inline models::GptConfig SmallGpt(int layers = 2, int hidden = 32) {
  models::GptConfig c;
  c.set_name("small");
  c.set_layers(layers);
  c.set_hidden(hidden);
  c.set_heads(4);
  c.set_vocab(256);
  c.set_positions(16);
  return c;
}

// How many elements differ in their bits (a size mismatch counts as all).
inline size_t CountBitDifferences(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

}  // namespace memwall::zero::test

#endif  // MEMWALL_ZERO_TESTING_H_
